"""Delayed scaling's amax all-reduces: a blocking collective over the tensor- AND data-parallel
ranks, twice per model chunk and micro-batch, that an FP8 run pays and its BF16 pair does not.

Why its own term: the paired NeMo sweeps (fp8_runs.csv) lose FP8 speed-up as dp grows at a fixed
per-GPU load (weak scaling: the same micro-batches per GPU), while the BF16 step stays nearly
flat — GPT-3 175B (tp4·pp8) 1.505 → 1.446 / 1.477 → 1.425 from 128 to 2048 GPUs in the two
releases, Nemotron-4 340B 1.459 → 1.387, Llama 3 70B 1.337 → 1.315. Every cost the model had for
those runs was either the same in FP8 and BF16 (the dp sync: NeMo reduces bf16 gradients in both)
or independent of dp. What grows with dp in FP8 only is read from the code:

* Megatron-core wraps each ``TransformerBlock.forward`` (one model chunk: a pipeline stage, or
  one of its vpp chunks under interleaving) in ``te.fp8_autocast(fp8_group=
  parallel_state.get_amax_reduction_group(with_context_parallel=True))``
  (megatron/core/transformer/transformer_block.py); that group is the tensor-, data- and
  context-parallel ranks of one pipeline stage (megatron/core/parallel_state.py: "Build the FP8
  amax reduction groups", ``amax_group_size = tensor_model_parallel_size * data_parallel_size``;
  later ``_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP``; ``tp_only_amax_red`` defaults to False);
* with Transformer Engine's DelayedScaling (``reduce_amax=True`` by default; every NeMo FP8 row
  here: NeMo 1's ``fp8_hybrid`` delayed recipe, NeMo 2's default), leaving the outermost autocast
  concatenates the forward amaxes of the region and all-reduces them with MAX over that group,
  ``async_op=False`` (transformer_engine/pytorch/fp8.py ``FP8GlobalStateManager.
  reduce_and_update_fp8_tensors(forward=True)`` at ``fp8_autocast_exit``), and the backward of the
  region's first FP8 module does the same for the gradient amaxes
  (``ctx.reduce_and_update_bwd_fp8_tensors = FP8GlobalStateManager.is_first_fp8_module()`` in
  linear.py / layernorm_linear.py / layernorm_mlp.py, ``reduce_and_update_fp8_tensors(forward=
  False)`` at the end of its backward). The recomputed forward of a checkpointed chunk reduces
  nothing (TE's ``in_fp8_activation_recompute_phase`` reuses the saved scaling state).

So per micro-batch and chunk: two all-reduces of a few hundred bytes (one fp32 amax per FP8
tensor of the chunk) over ``tp·dp·cp`` ranks, on the compute stream and waited for: exposed, and
latency-bound: ``2⌈log2 n⌉`` steps of the α of the two-level tier of a group of that many
consecutive ranks (``latency_steps``: NCCL's tree, or NVLink SHARP inside a node, for a buffer
this small; the bytes term is under 0.1 µs). GPT-3 175B at 1024 H100 (tp4·dp32, vpp 12, 64 micro-batches): 1536 a step,
≈ 80 µs each. Current and block scaling (fp8-rowwise, mxfp8, torchao's dynamic tensorwise) keep
no amax history across ranks and reduce none of this; Composer's TE autocast (fp8_group left
None: the whole world) is not priced here, its code was not read for this.

The runtime profile says it (``[communication]``, runtime-profiles/megatron.toml, 0 / 1 elsewhere):
``amax_reductions_per_chunk`` (2 for Megatron-core on TE >= 1.6; TE 1.4 / 1.5 read
``NVTE_DP_AMAX_REDUCE_INTERVAL=0`` / ``NVTE_ASYNC_AMAX_REDUCTION=1``, which dgxc's launchers still
export, as a TP-only asynchronous reduction, and TE 1.6+ no longer reads them: NVIDIA/
TransformerEngine v1.5 vs v1.6 transformer_engine/pytorch/fp8.py) and ``amax_reduce_over_dp``
(0 under the option ``tp_only_amax_red``: Megatron's TransformerConfig.tp_only_amax_red, which
NeMo 2's performance scripts set for GPT-3 175B only, NVIDIA/NeMo v2.2.0
scripts/llm/performance/pretrain_gpt3_175b.py; ``fp8_run_runtimes.nemo_fp8_runtime``).

How it enters the model: the two reductions of a chunk are a fixed cost per chunk, which the
per-row coefficients the search's split program sums cannot hold, so each block row carries
``2·t·(pp·vpp)/blocks`` of them (exact where every chunk holds the same number of blocks, as in
every open run here), as exposed collective time beside the TP collectives (``tp_fwd_s`` /
``tp_bwd_s``: it hides nothing and widens no dp window). It is added in
``coefficients._row_coefficients``, after ``plan_row_times``, so ``estimate`` and the search's
objective read it and the search's quick bound (``plan_row_times`` alone) stays under both. No
constant is fitted: the latency is the hardware profile's.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from costmodels.profiles.hardware import LinkTier
from costmodels.profiles.topology import two_level

DELAYED_SCALING_PRECISIONS = ("fp8",)   # per-tensor delayed scaling; rowwise / MX keep no amax history


def amax_group(plan, over_dp: int = 1) -> int:
    """Ranks of the amax reduction group: tp · dp · cp (cp folded into dp by the cp estimate, or
    named apart); tp · cp under ``tp_only_amax_red`` (``over_dp`` 0)."""
    dp = int(plan.dp) if over_dp else 1
    return int(plan.tp) * dp * int(getattr(plan, "cp", 1) or 1)


def amax_group_link(profile, plan, n: int) -> LinkTier:
    """The tier an all-reduce over the ``n`` ranks of one pipeline stage's tp·dp group runs on:
    ranks laid out innermost first (``plan.placement``), so the group is ``n`` consecutive ranks
    when pp is outside tp and dp (the default), else strided by pp."""
    order = plan.placement.split(",")
    stride = int(plan.pp) if order.index("pp") < max(order.index("tp"), order.index("dp")) else 1
    domain = profile.link_domain
    if n * stride <= domain:
        return profile.intra_node
    if profile.nics_per_node is None:
        return profile.inter_node
    per_node = max(1, min(n, domain // stride))
    per_node = min(per_node, profile.nics_per_node * max(1, domain // profile.gpus_per_node))
    alpha, beta = two_level(n, per_node, profile.intra_node, profile.inter_node, 1)
    return LinkTier("inter_node", beta, alpha, nccl_tree=True)


def amax_reduction_s(profile, plan, runtime) -> float:
    """Seconds of one amax all-reduce of ``plan`` on ``runtime`` (a RuntimeProfile; 0 where the
    plan reduces none: BF16, a runtime without the figure, rowwise / MX scaling, a group of one)."""
    if getattr(plan, "precision", "bf16") not in DELAYED_SCALING_PRECISIONS or not runtime.amax_reductions_per_chunk:
        return 0.0
    n = amax_group(plan, runtime.amax_reduce_over_dp)
    if n <= 1:
        return 0.0
    link = amax_group_link(profile, plan, n)
    return latency_steps(n) * link.alpha_beta("all_reduce")[0]


def latency_steps(n: int) -> int:
    """Latency steps of an all-reduce of a few hundred bytes over ``n`` ranks on any tier: NCCL's
    tuner takes the lowest-latency algorithm for a latency-bound buffer, a tree's (or NVLink
    SHARP's) ``2⌈log2 n⌉`` where fewer than the ring's ``2(n − 1)`` — inside an NVLink domain too,
    where ``collectives_at_scale`` keeps the ring because it prices bandwidth-bound buffers (a
    72-GPU NVL72 group would otherwise pay 142 steps for 200 bytes)."""
    return min(2 * (n - 1), 2 * math.ceil(math.log2(n))) if n > 2 else 2 * (n - 1)


def with_amax_reductions(rt, arr, profile, plan, runtime):
    """``rt`` (compute.RowTimes) with each block row's share of its chunk's amax all-reduces
    (``runtime.amax_reductions_per_chunk``, half in the forward, half in the backward) added to
    its exposed forward and backward collective time (module docstring)."""
    t = amax_reduction_s(profile, plan, runtime)
    blocks = int(np.count_nonzero(arr.is_block))
    if t <= 0.0 or blocks == 0:
        return rt
    chunks = int(plan.pp) * int(getattr(plan, "vpp", 1) or 1)
    per_row = np.where(arr.is_block, runtime.amax_reductions_per_chunk / 2 * t * chunks / blocks, 0.0)
    return replace(rt, tp_fwd_s=rt.tp_fwd_s + per_row, tp_bwd_s=rt.tp_bwd_s + per_row)
