"""Published runs of the Megatron-DeepSpeed stack (``deepspeed_published.csv``,
tests/data/validation/, source per row): Megatron-Turing NLG 530B on 2240 to 3360 A100s (Smith
et al. 2022), a strong-scaling sweep at a fixed global batch under DeepSpeed's pipeline engine
with Megatron's tensor slicing — the 2021 stack (``kernel_stack = "megatron-deepspeed"``).

Every row is a CHECK row: no constant of the stack is fitted on them (three runs of one model
cannot both fit and check one), so they say how far the GPU profile's constants (fitted on
Composer's FSDP) carry to this stack and give its regime an honest band. What each row states and
what was assumed is in its ``notes``.
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
                f"seq={seq},dropout={r['dropout']}")
        plan = Plan(dp=int(r["dp"]), tp=int(r["tp"]), pp=int(r["pp"]), micro_batch_size=mb,
                    zero=int(r["zero"]), recompute=r["recompute"], attention=r["attention"],
                    runtime=r["runtime"])
        step = float(r["published_step_s"])
        out.append(OpenRun(
            source="deepspeed_published", hardware=r["hardware"], model=r["model"], spec=spec, plans=(plan,),
            gpus=gpus, global_batch=gb, seq=seq, published_step_s=step,
            published_tokens_per_s_per_gpu=gb * seq / step / gpus, published_mfu=None,
            published_memory_gib=None, role="check", sweep=f"deepspeed_published/{r['hardware']}/{r['model']}",
            label=f"{r['model']} {gpus} GPUs {plan.label()}", notes=(r["row_id"],)))
    return out
