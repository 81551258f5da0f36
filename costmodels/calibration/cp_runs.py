"""The runtime of each context-parallel open run (``cp_runs.csv``, the cp rows of
``dgxc_nemo_h100.csv``): which stack ran it and which of its overlaps were on.

The Llama 3.1 rows of ``dgxc_nemo_h100.csv`` carry no yaml notes; the same runs (release,
README table, GPU count) in ``cp_runs.csv`` do (``ub_tp_comm_overlap true`` for 70B, ``false``
for 8B, not stated for 405B): ``nemo_recipes.recipe_notes`` joins the copies, so a run is priced
with the switches its yaml set whichever CSV it is read from, and ``nemo_recipes.nemo_runtime``
turns the notes into the ``megatron`` runtime (its docstring says what is read and what
inferred). torchtitan and NeMo AutoModel rows run ``fsdp``.

A row whose CSV leaves its recompute to a file it did not read gets it from that file where it
has been read (``STATED_RECOMPUTE``, each with its source): the AutoModel Llama 3 70B run
("per examples/llm_benchmark yaml (not read)") was priced without recompute and predicted at
145 GiB on an 80 GB H100, a run that ran predicted not to fit.
"""
from __future__ import annotations

from costmodels.calibration.nemo_recipes import nemo_runtime, with_p2p_overlap


def cp_runtime(framework: str, notes: str, tp: int, pp: int = 1, vpp: int = 1) -> str:
    """The runtime spec of a cp run (module docstring); NeMo's interleaved sends overlapped as
    its recipe set (``nemo_recipes.with_p2p_overlap``)."""
    if "torchtitan" in framework or "AutoModel" in framework:
        return "fsdp"
    return with_p2p_overlap(nemo_runtime(notes, tp)[0], notes, framework, pp, vpp)


STATED_RECOMPUTE = {
    # NVIDIA-NeMo/Automodel examples/llm_benchmark/llama3_3/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml
    # (commit f5b942f): the row's layout (64 ranks, tp 1, cp 2, dp 32, global batch 128, local
    # batch 1, seq 8192, fsdp2) with ``distributed.activation_checkpointing: True``, i.e. every
    # decoder layer checkpointed whole
    "automodel-h100-llama3-70b-64": "full",
}


def cp_recompute(row: dict) -> str:
    """The recompute a cp run ran: its CSV field, or what its source file states
    (``STATED_RECOMPUTE``) where the CSV did not read it."""
    if row.get("row_id") in STATED_RECOMPUTE:
        return STATED_RECOMPUTE[row["row_id"]]
    return "full" if row["recompute"].startswith("full") else "none"


def nemo_long_sequence_plan(plan):
    """A NeMo long-sequence sweep run (``nemolong-*`` rows of ``cp_runs.csv``, whose CSV leaves
    the optimizer and sequence parallelism blank) with the settings NeMo ran it under:

    * the distributed optimizer (ZeRO-1): NeMo-Framework-Launcher's base config of the model
      (``launcher_scripts/conf/training/llama/llama2_7b.yaml``, commit 064e676: ``optim.name:
      distributed_fused_adam``; NeMo 2's llama recipes build ``distributed_fused_adam_with_cosine_annealing``,
      ``use_distributed_optimizer=True``);
    * sequence parallelism wherever tp > 1: INFERRED, the runtime already infers TP-comm overlap
      on at tp > 1 (``nemo_recipes.nemo_runtime``) and Megatron refuses that overlap without it
      (Megatron-LM ``megatron/training/arguments.py``: "Tensor parallel communication/GEMM
      overlap can happen only when sequence parallelism is enabled").

    The searched no-CP baselines already draw both; priced without them, the cp runs held whole
    activations per TP rank and most were predicted not to fit (runs that ran)."""
    return plan.with_(zero=max(plan.zero, 1), sequence_parallel=plan.tp > 1)
