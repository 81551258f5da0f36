"""What each open MoE run (``validation/moe_runs.csv``) ran where its CSV row leaves a setting to
its stack's default or to a file the CSV did not read: the expert tensor parallelism and the
recompute, each with its source (file and commit).

**Expert tensor parallelism when the row leaves ``etp`` blank** is the stack's default, not 1:

* Megatron-core / NeMo (every dgxc and NeMo row): ``--expert-tensor-parallel-size`` unset is the
  dense tensor-parallel size. ``megatron/training/arguments.py`` (NVIDIA/Megatron-LM
  000c4ac24f61159c138b0975def722c65245983c, ``validate_args``: ``if
  args.expert_tensor_parallel_size is None: args.expert_tensor_parallel_size =
  args.tensor_model_parallel_size``) and ``megatron/core/parallel_state.py``
  (00caa53af30912914981c86f39db123961678bbd, ``initialize_model_parallel``, the same default
  before it builds the expert mesh; NeMo passes its ``expert_tensor_parallel_size`` there). The
  Megatron-core of NeMo 1's 24.09 container predates the flag and shards each expert's linears
  over the tp group (its expert layers take the tp world size unless the deprecated
  ``moe_extended_tp`` is set): the same sharding. So the v24.11.1 / v25.04.02 Grok-1 rows
  (tp 4, etp blank) run ``etp = 4``.
* torchtitan: ``expert_tensor_parallel_degree`` defaults to 1 (``torchtitan/config/job_config.py``,
  torchtitan 0.2.2: "1 means disabled"; with ``tp > 1`` its ep then borrows the tp ranks).
* NeMo AutoModel: no expert tensor parallelism at all; its MoE parallelizer asserts tp = 1
  (``nemo_automodel/components/moe/parallelizer.py``, NVIDIA-NeMo/Automodel 8d9bfb90e,
  ``parallelize_model``): 1.

Megatron's default is applied only to Megatron / NeMo rows (``stack_of``), never to torchtitan's
or AutoModel's.

**Recompute the CSV did not read** (``STATED_RECOMPUTE``): the NeMo AutoModel performance summary
(``docs/performance-summary.md``, NVIDIA-NeMo/Automodel 8d9bfb90e, the commit that last changed
its MoE rows; the same figures as the cb97654 copy the CSV cites) points at
``examples/benchmark/configs/*.yaml`` of the same commit. The DeepSeek-V3 256- and 1024-GPU and
Qwen3-30B-A3B yamls have each row's layout (global batch, local batch, pp, ep, pp micro-batch,
sequence) and set ``parallelizer.activation_checkpointing: true``, which ``apply_ac`` turns
into ``checkpoint_wrapper`` around every decoder block (whole-block recompute: autopar's
``full``). The CSV's other rows state their recompute (``none``) or leave it to a recipe nobody
read (NeMo 2 rows): those stay at ``none``, the least memory-saving reading.

**NeMo AutoModel's precision and loss** (``AUTOMODEL_OPTIONS``): the same commit's model code
casts the whole model to bf16 before the yaml's ``torch.optim.Adam`` is built on it, so weights,
gradients and Adam's moments are all bf16 (8 bytes per parameter, not mixed precision's 16), and
its loss takes the bf16 logits without an fp32 upcast. Priced as mixed precision with fp32
logits, the Qwen3-30B-A3B run on 8 H100 needed 84 GiB even with its recompute. Its yamls' backend
runs attention, linear layers and RMSNorm on Transformer Engine (``attn / linear / rms_norm:
te``): the ``transformer-engine`` kernel stack, whose constants were fitted on NeMo's dense H100
runs (none on these rows). And its page states "Fake balanced gate is enabled" (every yaml:
``fake_balanced_gate: true``): the gate sends token ``t`` to the ``k`` consecutive experts from
``t·k`` (``FAKE_GATE_OPTION``), which DeepEP delivers to one node, not to the 4.6 nodes of
DeepSeek-V3's random top-8 over 8 nodes (``costmodels.model.experts.all_to_all_s``).
"""
from __future__ import annotations

import re

_AUTOMODEL_YAMLS = "NVIDIA-NeMo/Automodel 8d9bfb90e examples/benchmark/configs/"

STATED_RECOMPUTE = {
    # deepseek_v3_te_deepep.yaml: global_batch_size 512, local_batch_size 8, pp_size 4
    # (interleaved1f1b, pp_microbatch_size 1), ep_size 64, seq_len 4096;
    # parallelizer.activation_checkpointing: true
    "automodel-h100-deepseek-v3-256": ("full", _AUTOMODEL_YAMLS + "deepseek_v3_te_deepep.yaml"),
    # deepseek_v3_te_deepep_1024.yaml: global_batch_size 8192, local_batch_size 8, pp_size 4,
    # ep_size 64, seq_len 4096; parallelizer.activation_checkpointing: true
    "automodel-h100-deepseek-v3-1024": ("full", _AUTOMODEL_YAMLS + "deepseek_v3_te_deepep_1024.yaml"),
    # qwen3_moe_30b_te_deepep.yaml: global_batch_size 512, local_batch_size 4, pp_size 1,
    # ep_size 8, seq_len 4096; parallelizer.activation_checkpointing: true
    "automodel-h100-qwen3-30b-a3b-8": ("full", _AUTOMODEL_YAMLS + "qwen3_moe_30b_te_deepep.yaml"),
}


# What NeMo AutoModel's MoE benchmarks run beside FSDP2 and DeepEP (the ``fsdp`` runtime's options,
# each with its source in runtime-profiles/fsdp.toml): the whole model cast to bf16 before
# torch.optim.Adam is built on it (bf16 moments, no fp32 master) and MaskedCrossEntropy with
# ``fp32_upcast: false`` (every yaml of examples/benchmark/configs at 8d9bfb90e).
AUTOMODEL_OPTIONS = ("te", "bf16_states", "bf16_loss")
# and, where the row's page states "Fake balanced gate is enabled" (every yaml: fake_balanced_gate:
# true), its routing: each token to k consecutive experts (fsdp.toml [options.fake_balanced_gate])
FAKE_GATE_OPTION = "fake_balanced_gate"


def stack_of(framework: str) -> str:
    """``megatron``, ``torchtitan`` or ``automodel``: the software that ran a row, from its
    ``framework`` column (NeMo 1 and 2 both run Megatron-core)."""
    if "AutoModel" in framework:
        return "automodel"
    if "torchtitan" in framework:
        return "torchtitan"
    if "Megatron" in framework or "NeMo" in framework:
        return "megatron"
    raise ValueError(f"moe_runs: no stack known for framework {framework!r}")


def _int(text: str) -> int | None:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else None


def row_etp(row: dict) -> int:
    """The expert tensor-parallel size a row ran: its ``etp`` column where stated, else its
    stack's default (module docstring): Megatron / NeMo ``tp``, torchtitan and AutoModel 1."""
    stated = _int(row.get("etp", ""))
    if stated is not None:
        return stated
    tp = _int(row.get("tp", "")) or 1
    return tp if stack_of(row["framework"]) == "megatron" else 1


def row_recompute(row: dict) -> str:
    """The recompute a row ran: what its source file states (``STATED_RECOMPUTE``) where the CSV
    did not read it, ``full`` where the CSV says so, else ``none``."""
    if row["row_id"] in STATED_RECOMPUTE:
        return STATED_RECOMPUTE[row["row_id"]][0]
    return "full" if row.get("recompute", "").startswith("full") else "none"


# ---- DeepSeek-V3's attention and the launches' selective recompute (issue 27, moemla) ----------

def row_mla(row: dict):
    """The row's Multi-head Latent Attention shape (``costmodels.calibration.mla``), None where the
    row's attention is not MLA. The CSV marks MLA in ``kv_heads`` and states the two ranks in
    ``family`` ("MLA q_lora 1536 / kv_lora 512"); the head widths are DeepSeek-V3's
    (``mla.DEEPSEEK_V3``, NeMo's DeepSeekConfig), the only MLA model of the CSV."""
    from dataclasses import replace

    from costmodels.calibration.mla import DEEPSEEK_V3
    if (row.get("kv_heads") or "").strip() != "MLA":
        return None
    m = re.search(r"q_lora\s*(\d+)\s*/\s*kv_lora\s*(\d+)", row.get("family", ""))
    if not m or "deepseek" not in row.get("model", "").lower():
        raise ValueError(f"moe_runs: row {row.get('row_id')} has MLA without DeepSeek-V3's shape")
    return replace(DEEPSEEK_V3, q_lora_rank=int(m.group(1)), kv_lora_rank=int(m.group(2)))


# Megatron-core's --recompute-modules where a row's launch script states it (selective granularity):
# dgxc-benchmarking v25.05.05 deepseek_v3/pretraining/launch.sh (the tag's commit c5c765f2684f; the
# same file at 1f6d9f40e4117d) sets RM='mla_up_proj' on H100 and RM='core_attn' on GB200 and passes
# --recompute_modules $RM to NeMo's scripts/performance/llm/pretrain_deepseek_v3.py, which sets
# recompute_granularity = "selective" (NVIDIA/NeMo v2.3.1 abddc854389e line 65). core_attn drops
# the attention core's saved scores and re-runs its forward: on GB200 that release's Transformer
# Engine ran MLA's core unfused, so the plan's selective recompute with math attention
# (costmodels.calibration.mla_attention_kernel).
RECOMPUTE_MODULES = {
    "dgxc-v25.05.05-deepseek-v3-h100-": ("mla_up_proj",),
    "dgxc-v25.05.05-deepseek-v3-gb200-": ("core_attn",),
}


def row_recompute_modules(row: dict) -> tuple[str, ...]:
    """The selective-recompute modules a row's launch states (``RECOMPUTE_MODULES``), else ()."""
    return next((mods for prefix, mods in RECOMPUTE_MODULES.items() if row["row_id"].startswith(prefix)), ())


# Megatron-core's routing probabilities: multiplied in the combine's unpermute (kept tokens: the
# megatron profile's ``unpermute_probs`` option) up to core_v0.12.0, in the experts' activation from
# the core_r0.12.0 MoE cherry-pick on (runtime-profiles/megatron.toml, [moe] saved_token_copies).
# A row's container says which: NeMo v2.3.1 (nvcr.io/nvidia/nemo:25.04.01) pins Megatron-LM
# f98b1a008b76 (requirements/manifest.json), the later one; every earlier container (NeMo 1 24.09 /
# 24.12, NeMo 2 25.02 and 25.04.00 = v2.3.0, pinning 3cdfd613e68e) the earlier one.
PROBS_IN_ACTIVATION_CONTAINERS = ("nemo:25.04.01",)
UNPERMUTE_PROBS_OPTION = "unpermute_probs"
# NeMo AutoModel's DeepEP experts apply the probabilities in their activation (runtime-profiles/
# fsdp.toml [options.probs_in_activation]; every AutoModel row of the CSV runs DeepEP)
AUTOMODEL_DEEPEP_OPTION = "probs_in_activation"


def megatron_unpermutes_probs(row: dict) -> bool:
    """Whether a Megatron row's Megatron-core multiplies the tokens by the probabilities in the
    combine's unpermute (its container predates the MoE cherry-pick, module comment above)."""
    return stack_of(row["framework"]) == "megatron" and not any(
        c in row.get("container", "") for c in PROBS_IN_ACTIVATION_CONTAINERS)
