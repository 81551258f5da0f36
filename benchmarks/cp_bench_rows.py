"""The rows benchmarks/bench_costmodels_cp.py scores, read from the open data: the published cp
runs with the plan each ran (``step_rows``) and every NeMo long-sequence run whose layout is
published (``sweep_step_rows``), each priced by the cost model, plus the helpers both the rows and
the bench's speed-up searches share (the model presets, the per-row plan and runtime, the traced
tables). Data logic only; what is scored and how is the bench's docstring. Split out of the bench
to keep each file short; the bench's output is unchanged by the split.
"""
from __future__ import annotations

import csv
import functools
import re
from pathlib import Path

from costmodels.calibration.cp_runs import cp_recompute, cp_runtime, nemo_long_sequence_plan
from costmodels.calibration.nemo_flops import nemo_llama_flops, step_from_tflops
from costmodels.calibration.nemo_recipes import recipe_notes, row_notes
from costmodels.calibration.nemo_releases import with_release
from costmodels.contracts.errors import AutoparError
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate

DATA = Path("/work/shared/validation")
NEMO_RUNTIME = "megatron:overlap_grad_reduce,overlap_param_gather"
GPU_PROFILE = {"H100 80GB SXM": "h100-80g-sxm", "B200": "b200-180g-sxm"}
PRESET = {"llama3-8b": "llama3-8b", "llama3-70b": "llama3-70b", "llama3.1-405b": "llama3-405b",
          # Llama 2 7B (Touvron et al. 2023: 32 layers, 4096 hidden, 32 heads, MHA, ffn 11008, vocab 32000)
          "llama2-7b": "llama:layers=32,hidden=4096,heads=32,kv_heads=32,ffn=11008,vocab=32000"}
_TABLES: dict = {}


def table(spec: str, seq: int):
    from autopar.trace import table_for
    key = (spec, seq)
    if key not in _TABLES:
        _TABLES[key] = table_for(spec, micro_batch=1, seq=seq)
    return _TABLES[key]


def _int(x, default=None):
    m = re.match(r"\s*(\d+)", x or "")
    return int(m.group(1)) if m else default


def _short(label: str) -> str:
    """A plan label without NeMo's default runtime (its extra switches kept, after a +)."""
    return label.replace(" runtime:" + NEMO_RUNTIME + ",", " +").replace(" runtime:" + NEMO_RUNTIME, "")



def _split(plan: Plan) -> str:
    """A pipelined plan's blocks (layer-table rows) per stage as the search split them, e.g.
    ", rows 20+14": the plan label leaves the split out, and the same layout re-created with the
    default even split may not fit where the search's split does (docs/validation-cp.md, "The
    search's own plan against estimate")."""
    if plan.pp < 2 or not plan.stages:
        return ""
    return ", rows " + "+".join(str(end - start) for start, end in plan.stages)

def _runtime(r: dict) -> str:
    rt = cp_runtime(r["framework"], row_notes(r, _notes()), _int(r["tp"], 1), _int(r["pp"], 1),
                    _int(r["vpp"], 1))
    # the release underneath (costmodels.calibration.nemo_releases): TE 1.3's attention, B200's allocator
    return with_release(rt, r.get("container", ""), r.get("gpu", ""))


@functools.cache
def _notes() -> dict:
    """The yaml notes of every copy of a NeMo run (``nemo_recipes.recipe_notes``)."""
    return recipe_notes(DATA / "dgxc_nemo_h100.csv", DATA / "cp_runs.csv", DATA / "fp8_runs.csv")


def _profile(gpu: str) -> str | None:
    return next((v for k, v in GPU_PROFILE.items() if gpu.startswith(k)), None)


def _plan(r: dict, runtime: str) -> Plan:
    tp, pp, vpp = _int(r["tp"], 1), _int(r["pp"], 1), _int(r["vpp"], 1)
    rec = cp_recompute(r)   # the CSV's, or what the run's source file states
    sp = tp > 1 and r["sequence_parallel"].startswith("true")
    return Plan(dp=_int(r["dp"]), tp=tp, pp=pp, vpp=vpp, cp=_int(r["cp"], 1),
                micro_batch_size=_int(r["micro_batch"], 1), zero=_int(r["zero"], 0), recompute=rec,
                sequence_parallel=sp,
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b", runtime=runtime)


def step_rows() -> list[dict]:
    """Every scoreable cp row (module docstring), each with its prediction."""
    out, seen = [], set()
    for r in csv.DictReader(open(DATA / "dgxc_nemo_h100.csv")):
        if _int(r["cp"], 1) < 2:
            continue
        plan = _plan(r, _runtime(r))
        out.append(dict(id=r["row_id"], source="dgxc_nemo_h100", spec=r["model_spec"], seq=int(r["seq"]),
                        hw=r["hardware"], gpus=int(r["gpus"]), batch=int(r["global_batch"]), plan=plan,
                        published=float(r["published_step_s"])))
        seen.add((r["model_spec"].split(":")[0], int(r["gpus"]), plan.dp, plan.tp, plan.pp, plan.cp))
    for r in csv.DictReader(open(DATA / "cp_runs.csv")):
        hw, spec = _profile(r["gpu"]), PRESET.get(r["model"])
        if (_int(r["cp"], 1) < 2 or r["precision"] != "bf16" or hw is None or spec is None
                or not r["step_time_s"] or not r["dp"] or _int(r["layers"]) not in (None, table(spec, 4096).layers)):
            continue
        plan = _plan(r, _runtime(r))
        if (spec, int(r["gpus"]), plan.dp, plan.tp, plan.pp, plan.cp) in seen:
            continue
        seen.add((spec, int(r["gpus"]), plan.dp, plan.tp, plan.pp, plan.cp))
        out.append(dict(id=r["row_id"], source="cp_runs", spec=spec, seq=int(r["seq"]), hw=hw,
                        gpus=int(r["gpus"]), batch=int(r["global_batch"]), plan=plan,
                        published=float(r["step_time_s"])))
    for x in out:
        try:
            e = estimate(table(x["spec"], x["seq"]), x["hw"], x["plan"], x["gpus"], x["batch"])
            x["predicted"], x["fits"] = e.step_time_s, e.fits
            x["error"] = e.step_time_s / x["published"] - 1
        except AutoparError as err:
            x["predicted"], x["error"], x["why"] = None, None, str(err)
        try:   # the same GPUs with cp folded into dp (cp = 1): what of the error is cp's own
            twin = x["plan"].with_(dp=x["plan"].dp * x["plan"].cp, cp=1)
            x["twin_error"] = estimate(table(x["spec"], x["seq"]), x["hw"], twin, x["gpus"],
                                       x["batch"]).step_time_s / x["published"] - 1
        except AutoparError:   # e.g. a batch dp·cp does not divide
            x["twin_error"] = None
    return out


def _sweep_plan(r: dict, runtime: str) -> Plan:
    """A long-sequence sweep's cp run as NeMo ran it: the published degrees, NeMo's distributed
    optimizer and sequence parallelism at tp > 1 (``cp_runs.nemo_long_sequence_plan``; the CSV
    leaves both blank), in the row's number format (FP8: both sides of the ratio are priced so)."""
    return nemo_long_sequence_plan(_plan(r, runtime)).with_(precision="fp8" if "fp8" in r["precision"] else "bf16")


def _tflops(r: dict) -> float | None:
    """The TFLOP/s per GPU a long-sequence row publishes ("with CP: 1,624 TFLOPS/GPU ...")."""
    m = re.search(r"([\d,.]+)\s*TFLOPS", r["published"])
    return float(m.group(1).replace(",", "")) if m else None


def _published_steps(r: dict, rows: list[dict], plan: Plan, batch: int) -> tuple[float, float | None]:
    """The cp run's and its no-CP baseline's step times that the published TFLOP/s per GPU stand
    for (NeMo's FLOP count, ``costmodels.calibration.nemo_flops``), on the cp plan's world; the
    baseline's None where none ran (Llama 3 8B at 1M tokens)."""
    shape = table(PRESET[r["model"]], 4096)
    flops = nemo_llama_flops(batch, int(r["seq"]), shape.layers, shape.hidden, shape.heads, shape.kv_heads,
                             int(r["ffn"]), shape.vocab)
    base = next(b for b in rows if b["row_id"] == r["pair_row_id"])
    world = plan.world_size
    base_tflops = _tflops(base)
    return (step_from_tflops(flops, _tflops(r), world),
            step_from_tflops(flops, base_tflops, world) if base_tflops else None)


def sweep_step_rows() -> list[dict]:
    """Every NeMo long-sequence run whose layout is published (the cp runs and the short-sequence
    cp = 1 runs; not the no-CP baselines, whose layout is not): predicted step against the step
    its TFLOP/s per GPU stands for. Check rows (FP8, nothing fitted); not in the MAPE above,
    whose rows publish a step time."""
    rows = list(csv.DictReader(open(DATA / "cp_runs.csv")))
    out = []
    for r in rows:
        if not r["row_id"].startswith("nemolong") or r["row_id"].endswith("-nocp") or _tflops(r) is None:
            continue
        hw, spec = _profile(r["gpu"]), PRESET[r["model"]]
        plan = _sweep_plan(r, _runtime(r))
        seq, batch = int(r["seq"]), int(r["global_batch"])
        pub, _ = _published_steps(r, rows, plan, batch)
        e = estimate(table(spec, seq), hw, plan, plan.world_size, batch)
        out.append(dict(id=r["row_id"], hw=hw, plan=plan, published=pub, predicted=e.step_time_s,
                        error=e.step_time_s / pub - 1, fits=e.fits, memory=e.memory_bytes["total"],
                        spec=spec, seq=seq, batch=batch))
    return out


NODE_GPUS = 8   # a whole node of the sweeps' GPUs (DGX H100, DGX B200): the smallest baseline count


def baseline_counts(gpus: int) -> list[int]:
    """The GPU counts the no-CP baseline may use: the row's, then halving to whole nodes
    (``NODE_GPUS``). NeMo's baseline is "the most performant configuration without CP given the
    memory capacity" and the table compares TFLOP/s PER GPU, so a baseline on fewer GPUs than the
    cp run is within the published definition (16 sequences do not need 256 GPUs)."""
    out, c = [], gpus
    while c >= NODE_GPUS and c % NODE_GPUS == 0 or c == gpus:
        out.append(c)
        if c % 2:
            break
        c //= 2
    return out


def _baseline_runtimes(runtime: str) -> list[str]:
    """The runtimes the no-CP baseline may run under: the cp run's, and without TP-comm overlap
    where the cp run has it (a switch of the configuration NeMo tunes for the baseline: its
    userbuffers hold ``seq / cp`` tokens per GPU, costmodels/model/long_sequence_memory.py)."""
    if ",tp_comm_overlap" not in runtime:
        return [runtime]
    return [runtime, runtime.replace(",tp_comm_overlap", "")]
