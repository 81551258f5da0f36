"""Full recompute that stops at the last saved tensor: the block's tail is never re-run.

``compute.row_times`` charges a full recompute one whole block forward again. That is what a
*reentrant* checkpoint does (Megatron's ``tensor_parallel.random.CheckpointFunction``, DeepSpeed's
``deepspeed.runtime.activation_checkpointing.checkpointing``): it replays the wrapped function to
its end. torch's *non-reentrant* checkpoint does not. ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)`` defaults to ``early_stop=True`` (torch 2.1 on; ``_checkpoint_early_stop`` /
``set_checkpoint_early_stop``, torch 2.13 ``torch/utils/checkpoint.py``): the recompute raises
``_StopRecomputationError`` from the pack hook of the last tensor the backward needs. An aten op
saves its inputs *before* its kernel runs (the generated ``VariableType`` sets ``grad_fn``'s
``SavedVariable`` s, then redispatches), so the last saved tensors, the MLP's down projection's
input and weight, stop the recompute before that GEMM runs. Everything after it is skipped:

* the down projection's GEMM (w2 / c_proj / down_proj / fc2, the block's last linear);
* under tensor parallelism its collective (the row-parallel all-reduce, or the sequence-parallel
  reduce-scatter; under torch's micro-pipeline TP the fused matmul-reduce-scatter whole, its
  decomposed GEMM, the part of the scatter it leaves exposed and its partial-sum copies);
* the residual add (two reads, one write of the block's output, the sequence shard under sp).

A compiled block (``torch.compile`` over a checkpointed block: the checkpoint becomes a tagged
region, and AOTAutograd's min-cut partitioner puts in the backward graph only the recomputed
nodes some gradient needs) skips the same tail, whatever ``early_stop`` says.

Which runtime does it is a runtime-profile figure, ``[recompute] early_stop`` (0: the whole
forward again, the default), read from each runtime's code and carried with its source. Priced
per block row of the layer table whose last GEMM is a token linear (``LayerRow.matmul_dims``, trace
order) and, at tp > 1, that linear the row linear of the row's last TP pair
(``async_tp_windows.linear_roles``). Mixture-of-Experts rows (``LayerRow.experts``) are left whole:
their tail (the experts' down projections, the combine all-to-all) is priced by
``costmodels.model.experts`` as a pass of its own and is not read here. A dropout after the down
projection (p > 0) saves its mask after the GEMM and would make the GEMM run again: the shipped
presets train without dropout. Applied last in ``coefficients.plan_row_times``, so ``estimate``
and the search's linear terms read the same recompute.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np

from costmodels.model.async_tp_windows import (
    decomposed_gemm_s,
    gemm_rate,
    linear_roles,
    runs_micro_pipeline_tp,
    whole_gemm_s,
)
from costmodels.model.comm import collective_time

RESIDUAL_ADD_PASSES = 3.0   # the residual add reads two block outputs and writes one


@lru_cache(maxsize=256)
def block_tails(arr) -> tuple[np.ndarray, np.ndarray]:
    """``(flops, pair_row)`` per table row: the FLOPs of a dense block row's last GEMM at the
    table's micro-batch, no tp (0 where the row has no such tail: not a block, MoE experts, a last
    matmul that is not a token linear), and True where that GEMM is the row linear of the row's
    last TP pair (``linear_roles`` matched the row), so its collective is the tail's too."""
    t = arr.table
    tokens = t.micro_batch * t.seq
    roles = linear_roles(arr)
    flops = np.zeros(arr.n)
    for i, r in enumerate(t.rows):
        if r.kind != "block" or getattr(r, "experts", 0) or not r.matmul_dims:
            continue
        m, n, k = r.matmul_dims[-1]
        if m == tokens:
            flops[i] = 2.0 * m * n * k
    return flops, roles.matched & (flops > 0) & (arr.tp_comm_bytes > 0)


def skipped_recompute(rt, arr, kernels, plan, runtime, tier, tp: int, b: int):
    """``(compute_s, tp_s, tp_bytes)`` per row: what early stop leaves out of one micro-batch's
    full recompute (module docstring). ``rt`` is the RowTimes the rest of the pipeline priced,
    whose exposed TP recompute the tail's collective takes its share of."""
    flops, paired = block_tails(arr)
    k = b / arr.table.micro_batch
    size, rate = gemm_rate(arr, kernels, plan, runtime)   # FP8 plans: the GEMM at its FP8 rate
    f = flops * k / tp
    tail = np.where(flops > 0, whole_gemm_s(f, kernels, size, rate), 0.0)
    sp = bool(plan.sequence_parallel)
    out = arr.boundary * k / (tp if sp else 1)
    tail = tail + np.where(flops > 0, RESIDUAL_ADD_PASSES * out / kernels.elementwise_bw, 0.0)
    tp_s = np.zeros(arr.n)
    tp_b = np.zeros(arr.n)
    if tp > 1 and paired.any():
        v = arr.tp_comm_bytes * k
        if runs_micro_pipeline_tp(runtime, plan, tp):
            # the fused matmul-reduce-scatter (async_tp_windows / async_tp_fusion): its GEMM run
            # as tp shards (not whole), the scatter beyond what they hide, its copies
            g = decomposed_gemm_s(f, kernels, size, rate, tp)
            whole = whole_gemm_s(f, kernels, size, rate)
            rs_b, rs_s = collective_time("reduce_scatter", v, tp, tier)
            tail = tail + np.where(paired, g - whole + (v + v / tp) / kernels.elementwise_bw, 0.0)
            tp_s = np.where(paired, np.maximum(0.0, rs_s - g * (1.0 - 1.0 / tp)), 0.0)
            tp_b = np.where(paired, rs_b, 0.0)
        else:
            # one of the row's forward collectives (compute.row_times: per pair one all-reduce,
            # or under sp one all-gather + one reduce-scatter of the same bytes): its share of
            # what the runtime's overlap leaves exposed
            share = 1.0 / (np.maximum(arr.tp_collectives, 1.0) * (2.0 if sp else 1.0))
            tp_s = np.where(paired, rt.tp_recompute_s * share, 0.0)
            tp_b = np.where(paired, rt.tp_bytes_recompute * share, 0.0)
    return tail, tp_s, tp_b


def early_stop_recompute(rt, arr, kernels, plan, runtime, tier, tp: int, b: int, host_s: float = 0.0):
    """``rt`` with each block's full recompute less its tail where the runtime's checkpoint stops
    early (``runtime.recompute_early_stop``); unchanged otherwise. ``host_s``: the runtime's host
    floor per block pass (``compute.host_block_floor``), which a shorter pass still pays."""
    if plan.recompute != "full" or not getattr(runtime, "recompute_early_stop", 0):
        return rt
    tail, tp_s, tp_b = skipped_recompute(rt, arr, kernels, plan, runtime, tier, tp, b)
    on = rt.recompute_s > 0
    floor = np.where(arr.is_block, host_s, 0.0)
    rec = np.where(on, np.maximum(rt.recompute_s - tail, np.minimum(floor, rt.recompute_s)), rt.recompute_s)
    tp_rec = np.where(on, np.maximum(rt.tp_recompute_s - tp_s, 0.0), rt.tp_recompute_s)
    tp_rec_b = np.where(on, np.maximum(rt.tp_bytes_recompute - tp_b, 0.0), rt.tp_bytes_recompute)
    return replace(rt, recompute_s=rec, tp_recompute_s=tp_rec, tp_bytes_recompute=tp_rec_b)
