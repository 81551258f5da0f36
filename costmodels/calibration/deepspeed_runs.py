"""Published runs of the Megatron-DeepSpeed stack (``deepspeed_published.csv``,
tests/data/validation/, source per row; ``kernel_stack = "megatron-deepspeed"``):

* BLOOM 176B on 384 A100 80GB (BigScience tr11-176B-ml, 2022: the training log's 104.70 s per
  iteration at global batch 2048; tp 4, pp 12, dp 8, micro-batch 2, full recompute, from its
  launch script) — the stack's CALIBRATION row: its one constant, the matmul curve's scale on
  the A100 (``kernel_stacks.toml``), is fitted on it alone (``costmodels.calibration.stack_fit``);
* Megatron-Turing NLG 530B on 2240 to 3360 A100s (Smith et al. 2022), a strong-scaling sweep at a
  fixed global batch under DeepSpeed's pipeline engine with Megatron's tensor slicing — CHECK
  rows, never fitted on.

The split is by source (the stack's one open run outside the paper whose rows are checked), set
before the fit. What each row states and what was assumed is in its ``notes``; the ``role``
column carries the split, ``tied`` the embedding sharing where the source states it.
"""
from __future__ import annotations

from pathlib import Path

from costmodels.calibration.open_runs import OpenRun
from costmodels.calibration.validation import read_csv
from costmodels.contracts.plan import Plan

DEEPSPEED_FILE = "deepspeed_published.csv"


def deepspeed_runs(directory: Path | None = None) -> list[OpenRun]:
    out = []
    for r in read_csv(DEEPSPEED_FILE, directory):
        gpus, seq, gb, mb = int(r["gpus"]), int(r["seq"]), int(r["global_batch"]), int(r["micro_batch"])
        spec = (f"gpt:layers={r['layers']},hidden={r['hidden']},heads={r['heads']},vocab={r['vocab']},"
                f"seq={seq},dropout={r['dropout']}" + (f",tied={r['tied']}" if r.get("tied") else ""))
        plan = Plan(dp=int(r["dp"]), tp=int(r["tp"]), pp=int(r["pp"]), micro_batch_size=mb,
                    zero=int(r["zero"]), recompute=r["recompute"], attention=r["attention"],
                    runtime=r["runtime"])
        step = float(r["published_step_s"])
        out.append(OpenRun(
            source="deepspeed_published", hardware=r["hardware"], model=r["model"], spec=spec, plans=(plan,),
            gpus=gpus, global_batch=gb, seq=seq, published_step_s=step,
            published_tokens_per_s_per_gpu=gb * seq / step / gpus, published_mfu=None,
            published_memory_gib=None, role=r.get("role") or "check",
            sweep=f"deepspeed_published/{r['hardware']}/{r['model']}",
            label=f"{r['model']} {gpus} GPUs {plan.label()}", notes=(r["row_id"],)))
    return out
