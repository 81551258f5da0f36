"""NVIDIA's DGX Cloud benchmarks of NeMo (Megatron-core + Transformer Engine) on DGX H100
(``dgxc_nemo_h100.csv``, tests/data/validation/, source per row): the open runs of the
``transformer-engine`` kernel stack on H100.

The rows the CSV marks ``scored = no`` for context parallelism (the Llama 3.1 rows, cp = 2) are
scored with their cp since the cost model prices it, on the runtime their yaml sets (read from
the same runs' notes in ``cp_runs.csv``; ``costmodels.calibration.nemo_recipes``). Each scored row
becomes an ``OpenRun`` (``open_runs``) with the plan as
NeMo ran it: dp·tp·pp, virtual stages, micro-batch, sequence parallel, ZeRO-1 for
``distributed_fused_adam`` (Megatron's distributed optimizer), selective recompute where the yaml
says so, and the runtime ``megatron`` with the switches its yaml sets: ``overlap_grad_reduce,
overlap_param_gather`` always, ``tp_comm_overlap`` where ``ub_tp_comm_overlap true`` (the
GPT-3 175B and Nemotron-4 15B sweeps; the 340B yaml sets it false), ``distributed_fused_adam``
(NeMo's optimizer: 16-bit master-weight remainders) and ``bf16_grad_reduce`` (``grad_sync_dtype
bf16``).

**Calibration split** (a rule on what a run is, never on its error): the Nemotron-4 15B sweep
(8 runs, tp 4, no pipeline: compute, TP and the dp sync without a pipeline's bubble) is the
calibration set of the (h100-80g-sxm, transformer-engine) constants
(``costmodels.calibration.stack_fit``); the GPT-3 175B and Nemotron-4 340B sweeps (10 runs,
interleaved pipelines, one with selective recompute and no TP overlap) are check rows.
"""
from __future__ import annotations

from pathlib import Path

from costmodels.calibration.nemo_recipes import nemo_runtime, recipe_notes, row_notes, with_p2p_overlap
from costmodels.calibration.open_runs import OpenRun
from costmodels.calibration.validation import VALIDATION_DIR, read_csv
from costmodels.contracts.plan import Plan

DGXC_FILE = "dgxc_nemo_h100.csv"
NEMO_COPIES = (DGXC_FILE, "cp_runs.csv", "fp8_runs.csv")   # open CSVs listing the same NeMo runs
DGXC_CALIBRATION = {"h100-80g-sxm": "Nemotron4-15B"}   # GPU -> the model whose sweep calibrates


def runtime_of(row: dict[str, str]) -> str:
    """The megatron runtime with the switches the row's yaml sets (module docstring)."""
    notes = row["notes"]
    opts = [o for o in row["runtime"].partition(":")[2].split(",") if o]
    if "ub_tp_comm_overlap true" in notes:
        opts.append("tp_comm_overlap")
    if "distributed_fused_adam" in notes:
        opts.append("distributed_fused_adam")
    if "grad_sync_dtype bf16" in notes:
        opts.append("bf16_grad_reduce")
    return with_p2p_overlap("megatron" + (":" + ",".join(opts) if opts else ""), notes, row.get("framework", ""),
                            int(row["pp"] or 1), int(row["vpp"] or 1))   # interleaved sends (nemo_recipes)


def dgxc_runs(directory: Path | None = None) -> list[OpenRun]:
    out = []
    base = directory or VALIDATION_DIR
    copies = recipe_notes(*(base / f for f in NEMO_COPIES))
    for r in read_csv(DGXC_FILE, directory):
        cp = int(r["cp"] or 1)
        if r["scored"] != "yes" and cp < 2:
            continue   # the CSV's not_scored_reason; its cp rows are priced now (below)
        gpus, seq, gb, mb = int(r["gpus"]), int(r["seq"]), int(r["global_batch"]), int(r["micro_batch"])
        spec = r["model_spec"]
        if spec.startswith("hf:"):
            spec = "hf:" + str(base / spec[3:])
        plan = Plan(dp=int(r["dp"]), tp=int(r["tp"]), pp=int(r["pp"]), vpp=int(r["vpp"]),
                    micro_batch_size=mb, zero=int(r["zero"]), recompute=r["recompute_scoring"],
                    sequence_parallel=r["sequence_parallel"] == "true",
                    schedule=r["schedule"] if int(r["pp"]) > 1 else "1f1b", runtime=runtime_of(r))
        if cp > 1:   # context parallelism (nemo branch): the run's yaml switches read from its
            # copies in cp_runs.csv / fp8_runs.csv (nemo_recipes.recipe_notes), cp in the plan
            notes = row_notes(r, copies)
            rt = with_p2p_overlap(nemo_runtime(notes, plan.tp)[0], notes, r.get("framework", ""), plan.pp, plan.vpp)
            plan = plan.with_(cp=cp, runtime=rt)
        step = float(r["published_step_s"])
        calib = DGXC_CALIBRATION.get(r["hardware"]) == r["model"]
        out.append(OpenRun(
            source="dgxc_nemo_h100", hardware=r["hardware"], model=r["model"], spec=spec, plans=(plan,),
            gpus=gpus, global_batch=gb, seq=seq, published_step_s=step,
            published_tokens_per_s_per_gpu=gb * seq / step / gpus,
            published_mfu=float(r["published_mfu_pct"]) / 100 if r["published_mfu_pct"] else None,
            published_memory_gib=None, role="calibration" if calib else "check",
            sweep=f"dgxc_nemo_h100/{r['hardware']}/{r['model']}",
            label=f"{r['model']} {gpus} GPUs {plan.label()}",
            notes=(r["row_id"],)))
    return out
