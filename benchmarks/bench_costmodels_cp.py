"""Context parallelism against published runs: the cost model's step time on the cp rows of
``cp_runs.csv`` and ``dgxc_nemo_h100.csv``, and the CP speed-up over each NeMo long-sequence
sweep's no-CP baseline.

    python benchmarks/bench_costmodels_cp.py            # both tables; rewrites docs/validation-cp.md's results
    python benchmarks/bench_costmodels_cp.py --quick    # the step-time table only (no searches), prints only

**Split.** Nothing is fitted here: the cp model (``costmodels.model.context_parallel``) adds
no constant, and every constant it uses was fitted before on other rows (docs/validation.md:
the mpt-1b calibration rows and Korthikanti's Table 5). So the calibration set of this benchmark
is EMPTY and every row below is a check row; a row is never used to tune anything.

**Rows scored** (``step_rows``): every row with cp ≥ 2 whose plan the model can state — BF16
(the FP8 cp rows are scored by bench_costmodels_fp8.py with the FP8 model), a dense model (no
MoE: Grok-1 and Mixtral need expert parallelism), a GPU with a shipped profile (H100 SXM, B200;
not GB200), its dp/tp/pp/cp given, and a published step time. The dgxc_nemo_h100.csv rows come
with their model spec; cp_runs.csv rows already in dgxc_nemo_h100.csv (same model, GPUs, plan) are scored once.
Per-row runtime (``costmodels.calibration.cp_runs``): NeMo / Megatron-core →
``megatron:overlap_grad_reduce,overlap_param_gather`` plus the switches the row's yaml sets
(``costmodels.calibration.nemo_recipes``: TP-comm overlap as stated, inferred on at tp > 1 where
not stated; a dgxc_nemo_h100.csv row reads the notes of the same run in cp_runs.csv),
torchtitan / AutoModel → ``fsdp``.

**Speed-ups** (``speedup_rows``): NeMo's long-sequence tables (performance_long_sequence.md:
Llama 2 7B on H100, Llama 3 8B on B200) give, per sequence length, the cp run and the best run
without CP as TFLOP/s per GPU, i.e. a step-time ratio. Those runs are FP8, and both sides of
the ratio are priced in FP8: the cp plan as published, against the best cp = 1 plan ``autopar
search`` finds for the same GPUs and batch under the same Megatron runtime, with or without its
TP-comm overlap (``_baseline_runtimes``; the baseline's own plan is not published; the search's
default space, tp inside a node). A prediction within 10 % of the published ratio passes.
The ratio is of TFLOP/s PER GPU, so the baseline is also searched on fewer GPUs (each smaller
whole-node count, ``baseline_counts``: one fixed-count search each, cut at 10 s) and the best
per-GPU figure over the counts is printed beside the scored one. It is not scored: the published
baselines read as runs on all of the row's GPUs (104 and 26.5 TFLOP/s per GPU at 512K and 1M
tokens on 512 and 1024 H100s, a quarter of the previous length's each time), and the model puts
the same batches on 64 and 16 GPUs (tp 8, full recompute) at 4 and 13 times those figures
(docs/validation-cp.md, "What this says").
"""
from __future__ import annotations

import argparse
import csv
import functools
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodels.calibration.cp_runs import cp_recompute, cp_runtime  # noqa: E402
from costmodels.calibration.nemo_recipes import recipe_notes, row_notes  # noqa: E402
from costmodels.contracts.errors import AutoparError  # noqa: E402
from costmodels.contracts.plan import Plan  # noqa: E402
from costmodels.model.estimate import estimate  # noqa: E402

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


def _runtime(r: dict) -> str:
    return cp_runtime(r["framework"], row_notes(r, _notes()), _int(r["tp"], 1), _int(r["pp"], 1), _int(r["vpp"], 1))


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


def _best_at(spec, hw, gpus, batch, tbl, runtimes, precision, time_limit_s):
    """The best cp = 1 plan on exactly ``gpus`` GPUs over ``runtimes`` (one fixed-count search
    each, cut at ``time_limit_s``): (candidate, proved) or (None, why)."""
    from autopar.search import search
    best, proved, why = None, True, None
    for rt in runtimes:
        try:
            res = search(spec, hw, gpus, batch, fix={"cp": 1, "runtime": rt, "precision": precision},
                         top=1, table=tbl, time_limit_s=time_limit_s)
        except AutoparError as err:
            why = err
            continue
        proved = proved and res.optimal
        if best is None or res.plans[0].prediction["step_time_s"] < best.prediction["step_time_s"]:
            best = res.plans[0]
    return (best, proved) if best is not None else (None, why)


def speedup_rows(time_limit_s: float = 10.0) -> list[dict]:
    """NeMo long-sequence sweeps: predicted vs published CP speed-up (module docstring).

    The published speed-up is a TFLOP/s-per-GPU ratio, i.e. ``(base step · base GPUs) / (cp step
    · cp GPUs)`` at the same batch. The baseline is the best such figure over the fixed-count
    searches at ``baseline_counts`` (from the row's count down, stopping at the first count where
    nothing fits: fewer GPUs only hold more per GPU); ``predicted_same`` keeps the row's-count-only
    reading for comparison."""
    rows = list(csv.DictReader(open(DATA / "cp_runs.csv")))
    out = []
    for r in rows:
        if not r["row_id"].startswith("nemolong") or _int(r["cp"], 1) < 2 or not r["speedup_vs_pair"]:
            continue
        hw, spec = _profile(r["gpu"]), PRESET.get(r["model"])
        seq, gpus, batch = int(r["seq"]), int(r["gpus"]), int(r["global_batch"])
        # these sweeps ran FP8 (the rows' precision): the cp plan and its no-CP baseline are both
        # priced in FP8, so the ratio compares layouts, not number formats
        runtime = _runtime(r)
        plan = _plan(r, runtime).with_(precision="fp8" if "fp8" in r["precision"] else "bf16")
        # the B200 rows' published degrees multiply to gpus / 4 (the row's notes): taken as
        # published, on their own world; a speed-up is a per-GPU throughput ratio either way
        gpus = plan.world_size
        x = dict(id=r["row_id"], spec=spec, seq=seq, hw=hw, gpus=gpus, plan=plan,
                 published=float(r["speedup_vs_pair"]), counts=[])
        t0 = time.perf_counter()
        try:
            tbl = table(spec, seq)
            cp_gpu_s = estimate(tbl, hw, plan, gpus, batch).step_time_s * gpus
            best, why = None, None
            for n in baseline_counts(gpus):
                cand, proved = _best_at(spec, hw, n, batch, tbl, _baseline_runtimes(runtime),
                                        plan.precision, time_limit_s)
                if cand is None:
                    why = proved
                    break
                gpu_s = cand.prediction["step_time_s"] * n
                x["counts"].append(dict(gpus=n, plan=cand.plan.label(), speedup=gpu_s / cp_gpu_s, proved=proved))
                if best is None or gpu_s < best[0]:
                    best = (gpu_s, n, cand.plan.label(), proved)
            if best is None:
                raise why
            same = x["counts"][0] if x["counts"][0]["gpus"] == gpus else None
            if same is None:
                raise why
            # the scored reading: the baseline on the row's GPUs (module docstring, "Speed-ups")
            x["baseline"], x["proved"], x["predicted"] = same["plan"], same["proved"], same["speedup"]
            x["error"] = x["predicted"] / x["published"] - 1
            # the other reading: the best TFLOP/s per GPU over every whole-node count
            x["best_plan"], x["best_gpus"], x["best_proved"] = best[2], best[1], best[3]
            x["best_predicted"] = best[0] / cp_gpu_s
            x["best_error"] = x["best_predicted"] / x["published"] - 1
        except AutoparError as err:
            x["predicted"], x["error"], x["why"] = None, None, str(err).splitlines()[0][:120]
        x["search_s"] = time.perf_counter() - t0
        print(f"# {x['id']}: " + "; ".join(f"{c['gpus']} GPUs {_short(c['plan'])} {c['speedup']:.2f}"
                                           + ("" if c["proved"] else " (not proved)") for c in x["counts"])
              + f" [{x['search_s']:.0f} s]", file=sys.stderr, flush=True)
        out.append(x)
    return out


def _baseline_runtimes(runtime: str) -> list[str]:
    """The runtimes the no-CP baseline may run under: the cp run's, and without TP-comm overlap
    where the cp run has it (a switch of the configuration NeMo tunes for the baseline: its
    userbuffers hold ``seq / cp`` tokens per GPU, costmodels/model/long_sequence_memory.py)."""
    if ",tp_comm_overlap" not in runtime:
        return [runtime]
    return [runtime, runtime.replace(",tp_comm_overlap", "")]


DOC = ROOT / "docs" / "validation-cp.md"
BEGIN, END = ("<!-- generated by benchmarks/bench_costmodels_cp.py: begin -->",
              "<!-- generated by benchmarks/bench_costmodels_cp.py: end -->")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the step-time rows only (no baseline searches)")
    ap.add_argument("--stdout", action="store_true", help="print only (do not rewrite docs/validation-cp.md)")
    args = ap.parse_args()
    out: list[str] = []
    rows = step_rows()
    out += ["Step time, every check row (the last column: the same plan with cp folded into dp, cp = 1,",
            "where the batch allows it):", "",
            "| row | source | hardware | plan | published s | predicted s | error | error of the cp = 1 twin |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for x in rows:
        pred = f"{x['predicted']:.2f}" if x["predicted"] is not None else "refused"
        err = f"{100 * x['error']:+.1f}%" if x["error"] is not None else x.get("why", "")[:60]
        out.append(f"| {x['id']} | {x['source']} | {x['hw']} | {_short(x['plan'].label())} "
                   f"| {x['published']:.2f} | {pred} | {err} | "
                   + (f"{100 * x['twin_error']:+.1f}% |" if x.get("twin_error") is not None else "– |"))
    scored = [x for x in rows if x["error"] is not None]
    mape = sum(abs(x["error"]) for x in scored) / max(1, len(scored))
    twins = [x for x in scored if x.get("twin_error") is not None]
    twin_mape = sum(abs(x["twin_error"]) for x in twins) / max(1, len(twins))
    out += ["", f"check rows: {len(scored)} scored of {len(rows)}; MAPE {100 * mape:.1f}% "
            f"(target <= 10%); calibration rows: none (nothing fitted); the same plans with cp folded "
            f"into dp (cp = 1): MAPE {100 * twin_mape:.1f}% against the same published steps"]
    if not args.quick:
        sp = speedup_rows()
        out += ["", "| sweep row | GPUs | cp plan | published speed-up | no-CP plan on the row's GPUs (search) "
                "| predicted | error | best no-CP plan over whole-node counts | its GPUs | predicted | error |",
                "| --- | ---: | --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |"]

        def cell(x, plan, proved, pred, err):
            if x[pred] is None:
                return f"| – | – | {x.get('why', '')} "
            return (f"| {_short(x[plan])}{'' if x[proved] else ' (not proved)'} | {x[pred]:.2f} "
                    f"| {100 * x[err]:+.1f}% ")
        for x in sp:
            out.append(f"| {x['id']} | {x['gpus']} | {_short(x['plan'].label())} | {x['published']:.2f} "
                       + cell(x, "baseline", "proved", "predicted", "error")
                       + (cell(x, "best_plan", "best_proved", "best_predicted", "best_error").replace(
                          " | ", f" | {x['best_gpus']} | ", 1) if x["predicted"] is not None else "| – | – | – | – ")
                       + "|")
        ok = [x for x in sp if x["error"] is not None]

        def summary(key):
            within = sum(abs(x[key]) <= 0.10 for x in ok)
            return (f"{within} of {len(ok)} within 10%, mean |error| "
                    f"{100 * sum(abs(x[key]) for x in ok) / max(1, len(ok)):.1f}%")
        out += ["", f"speed-ups ({len(sp) - len(ok)} not predicted): baseline on the row's GPUs (scored): "
                f"{summary('error')}; best over whole-node counts: {summary('best_error')}; "
                f"{sum(not c['proved'] for x in ok for c in x['counts'])} of "
                f"{sum(len(x['counts']) for x in ok)} fixed-count searches cut by their time limit (not proved)",
                "", "Every count searched (the speed-up if the baseline were that count's best plan):", ""]
        out += [f"* {x['id']}: " + "; ".join(f"{c['gpus']} GPUs {_short(c['plan'])} → {c['speedup']:.2f}"
                                             + ("" if c["proved"] else " (not proved)") for c in x["counts"])
                for x in sp]
    print("\n".join(out))
    if not (args.quick or args.stdout) and DOC.is_file():
        text = DOC.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            DOC.write_text(head + BEGIN + "\n\n" + "\n".join(out) + "\n\n" + END + rest.split(END, 1)[1])
            print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
