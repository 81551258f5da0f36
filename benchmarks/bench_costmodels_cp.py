"""Context parallelism against published runs: the cost model's step time on the cp rows of
``cp_runs.csv`` and ``dgxc_nemo_h100.csv``, and the CP speed-up over each NeMo long-sequence
sweep's no-CP baseline.

    python benchmarks/bench_costmodels_cp.py            # both tables; rewrites docs/validation-cp.md's results
    python benchmarks/bench_costmodels_cp.py --quick    # the step-time table only (no searches), prints only

The rows and the helpers they share with the searches below are in benchmarks/cp_bench_rows.py.

**Split.** The cp model (``costmodels.model.context_parallel``) adds no constant, and every
constant it uses was fitted before on other rows (docs/validation.md). One figure is fitted on a
row of this benchmark: the attention rate of Transformer Engine 1.3 on H100 (NeMo 24.03's kernel
stack, ``costmodels.calibration.nemo_releases``), on the ONE calibration row
``nemo_releases.TE13_CALIBRATION`` (the Llama 2 7B 1M-token cp 32 run, marked "(calibration)" and
left out of every MAPE; ``python benchmarks/fit_te13_attention.py``). Every other row is a check row.

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
the ratio are priced in FP8: the cp plan as published, with the distributed optimizer and
sequence parallelism NeMo ran it with (``cp_runs.nemo_long_sequence_plan``; the CSV leaves both
blank), against the best cp = 1 plan ``autopar search`` finds for the same GPUs and batch under
the same Megatron runtime IN THE SOURCE'S SPACE (``_query_group_baseline``): the page's footnote 1
bounds the baseline's TP by the query groups, not by the node, so the baseline is the faster of
the node-bounded search (with or without TP-comm overlap, ``_baseline_runtimes``) and the search
with TP across nodes up to the heads (without TP-comm overlap), under the stack's FP8 GEMM shape
rule (``costmodels.profiles.fp8_shapes``: Llama 2 7B's 11008-wide MLP stops TP at 16). The
baseline's own plan is not published anywhere (docs/validation-cp.md, "The baseline"), nor is its
recompute. The sources read for it are listed in "The baselines' recompute": NeMo's page at every
commit (5b47a94 … 19fadb6), the Launcher's llama2_7b.yaml (702ea64, 064e676: none), NeMo 2's
long-context recipes (8cfedd7: none) and Megatron-LM's CP doc (2407ddf: its own reference run is
TP8 with full recompute). None states it, so the search decides recompute by memory, as for any plan. A
prediction within 10 % of the published ratio passes. Each side's predicted step is also set
against the step its published TFLOP/s per GPU stands for (``costmodels.calibration.nemo_flops``:
NeMo's own FLOP count), which says whether a miss is the cp run's or the baseline's;
``sweep_step_rows`` does the same for every run of the sweeps whose layout is published. The
node-bounded reading alone (autopar's default space) is printed, not scored.
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
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cp_attention_reading import attention_reading, reading_lines  # noqa: E402
from cp_bench_rows import (  # benchmarks/, beside this script: the rows and their shared helpers
    DATA,
    PRESET,
    _baseline_runtimes,
    _int,
    _profile,
    _published_steps,
    _runtime,
    _short,
    _split,
    _sweep_plan,
    baseline_counts,
    step_rows,
    sweep_step_rows,
    table,
)

from costmodels.calibration.nemo_releases import TE13_CALIBRATION  # noqa: E402
from costmodels.contracts.errors import AutoparError  # noqa: E402
from costmodels.model.estimate import estimate  # noqa: E402


def _best_at(spec, hw, gpus, batch, tbl, runtimes, precision, time_limit_s, cross_node_tp=False):
    """The best cp = 1 plan on exactly ``gpus`` GPUs over ``runtimes`` (one fixed-count search
    each, cut at ``time_limit_s``; ``cross_node_tp``: tp up to the heads the model allows, not
    only inside a node): (candidate, proved) or (None, why)."""
    from autopar.search import search
    best, proved, why = None, True, None
    for rt in runtimes:
        try:
            res = search(spec, hw, gpus, batch, fix={"cp": 1, "runtime": rt, "precision": precision},
                         top=1, table=tbl, time_limit_s=time_limit_s, allow_cross_node_tp=cross_node_tp)
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
        plan = _sweep_plan(r, runtime)
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
                x["counts"].append(dict(gpus=n, plan=cand.plan.label(), speedup=gpu_s / cp_gpu_s, proved=proved,
                                        step=cand.prediction["step_time_s"], gpu_s=gpu_s, split=_split(cand.plan),
                                        agrees=_estimate_agrees(cand, tbl, hw, n, batch)))
                if best is None or gpu_s < best[0]:
                    best = (gpu_s, n, cand.plan.label(), proved)
            if best is None:
                raise why
            # the source's own space: TP up to the query groups (across nodes), TP-comm overlap
            # only for a TP group inside a node (``_query_group_baseline``)
            xq, xq_proved = _query_group_baseline(spec, hw, gpus, batch, tbl, runtime, plan.precision,
                                                  time_limit_s, x["counts"][0])
            same = x["counts"][0] if x["counts"][0]["gpus"] == gpus else None
            if same is None:
                raise why
            # the other reading, printed: autopar's default space (TP inside a node) on the row's GPUs
            x["qg_plan"], x["qg_proved"] = same["plan"], same["proved"]
            x["qg_predicted"] = same["speedup"]
            x["qg_error"] = x["qg_predicted"] / x["published"] - 1
            # the scored reading: the source's space on the row's GPUs (module docstring, "Speed-ups")
            x["baseline"], x["proved"], x["predicted"] = xq["plan"], xq_proved, xq["gpu_s"] / cp_gpu_s
            x["baseline_split"], x["baseline_agrees"] = xq["split"], xq["agrees"]
            x["error"] = x["predicted"] / x["published"] - 1
            # where the miss is: each side's step against the step its published TFLOP/s stands for
            pub_cp, pub_base = _published_steps(r, rows, plan, batch)
            x["cp_step_error"] = cp_gpu_s / gpus / pub_cp - 1
            x["base_step_error"] = xq["step"] / pub_base - 1
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


def _estimate_agrees(cand, tbl, hw, gpus: int, batch: int) -> bool:
    """The search's plan, split included, re-priced by ``estimate``: fits, and the same step."""
    e = estimate(tbl, hw, cand.plan, gpus, batch)
    return e.fits and abs(e.step_time_s / cand.prediction["step_time_s"] - 1) < 1e-9


def _query_group_baseline(spec, hw, gpus, batch, tbl, runtime, precision, time_limit_s, node_tp):
    """The no-CP baseline in the space the source describes (performance_long_sequence.md,
    footnote 1: "the maximum TP size is limited by the number of query groups", with full
    recompute in reach): the node-bounded search's plan (``node_tp``, a ``counts`` entry) or the
    best plan with TP across nodes, up to the heads the model allows, whichever is faster. The
    cross-node search runs without TP-comm overlap: Transformer Engine's userbuffers exchange
    over the node's NVLink (ASSUMED: not read in the 24.03 / 25.04 sources)."""
    cand, proved = _best_at(spec, hw, gpus, batch, tbl, [runtime.replace(",tp_comm_overlap", "")],
                            precision, time_limit_s, cross_node_tp=True)
    if cand is not None and cand.prediction["step_time_s"] * gpus < node_tp["gpu_s"]:
        return dict(plan=cand.plan.label(), gpu_s=cand.prediction["step_time_s"] * gpus,
                    step=cand.prediction["step_time_s"], split=_split(cand.plan),
                    agrees=_estimate_agrees(cand, tbl, hw, gpus, batch)), proved
    return dict(node_tp), node_tp["proved"]


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
    sw = sweep_step_rows()
    out += ["", "Step time of every NeMo long-sequence run whose layout is published (the cp runs and the",
            "short cp = 1 runs), against the step its TFLOP/s per GPU stands for (NeMo's FLOP count,",
            "costmodels/calibration/nemo_flops.py); FP8, priced with NeMo's distributed optimizer and",
            "sequence parallelism at tp > 1 (cp_runs.nemo_long_sequence_plan). Check rows, not in the MAPE above:", "",
            "| row | hardware | plan | published s | predicted s | error | fits (GiB) |",
            "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for x in sw:
        x["id"] += " (calibration)" * (x["id"] in TE13_CALIBRATION)   # fitted on: nemo_releases
        out.append(f"| {x['id']} | {x['hw']} | {_short(x['plan'].label())} | {x['published']:.2f} "
                   f"| {x['predicted']:.2f} | {100 * x['error']:+.1f}% | {'yes' if x['fits'] else 'NO'} "
                   f"({x['memory'] / 2 ** 30:.1f}) |")
    for hw in sorted({x["hw"] for x in sw}):
        xs = [x for x in sw if x["hw"] == hw and not x["id"].endswith("(calibration)")]
        out.append(f"\n{hw}: {len(xs)} runs, MAPE {100 * sum(abs(x['error']) for x in xs) / len(xs):.1f}%, "
                   f"errors from {100 * min(x['error'] for x in xs):+.1f}% "
                   f"to {100 * max(x['error'] for x in xs):+.1f}%; "
                   f"{sum(not x['fits'] for x in xs)} predicted not to fit (check rows)")
    out += reading_lines(attention_reading(sw), TE13_CALIBRATION)
    if not args.quick:
        sp = speedup_rows()
        out += ["", "Speed-ups, the scored reading (the best no-CP plan `autopar search` finds on the row's GPUs in",
                "the source's space: TP up to the query groups, across nodes where faster, FP8 shapes as the",
                "stack runs them; a pipelined one with its blocks per stage as the search split them, which",
                "its label leaves out). The last two columns split the miss: each side's predicted step against",
                "the step its published TFLOP/s per GPU stands for (speed-up error ≈ baseline − cp):", "",
                "| sweep row | GPUs | cp plan | published speed-up | no-CP plan (search) | predicted | error "
                "| cp step error | baseline step error |",
                "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
        for x in sp:
            if x["predicted"] is None:
                out.append(f"| {x['id']} | {x['gpus']} | {_short(x['plan'].label())} | {x['published']:.2f} "
                           f"| – | – | {x.get('why', '')} | – | – |")
                continue
            out.append(f"| {x['id']} | {x['gpus']} | {_short(x['plan'].label())} | {x['published']:.2f} "
                       f"| {_short(x['baseline'])}{x['baseline_split']}{'' if x['proved'] else ' (not proved)'} "
                       f"| {x['predicted']:.2f} "
                       f"| {100 * x['error']:+.1f}% | {100 * x['cp_step_error']:+.1f}% "
                       f"| {100 * x['base_step_error']:+.1f}% |")
        out += ["", "The other readings of the baseline (not scored; docs/validation-cp.md, \"The baseline\"):", "",
                "| sweep row | published | TP inside a node (autopar's default space) | predicted | error "
                "| best over whole-node counts | its GPUs | predicted | error |",
                "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |"]
        for x in sp:
            if x["predicted"] is None:
                continue
            out.append(f"| {x['id']} | {x['published']:.2f} | {_short(x['qg_plan'])}"
                       f"{'' if x['qg_proved'] else ' (not proved)'} "
                       f"| {x['qg_predicted']:.2f} | {100 * x['qg_error']:+.1f}% | {_short(x['best_plan'])}"
                       f"{'' if x['best_proved'] else ' (not proved)'} | {x['best_gpus']} | {x['best_predicted']:.2f} "
                       f"| {100 * x['best_error']:+.1f}% |")
        ok = [x for x in sp if x["error"] is not None]

        def summary(key):
            within = sum(abs(x[key]) <= 0.10 for x in ok)
            return (f"{within} of {len(ok)} within 10%, mean |error| "
                    f"{100 * sum(abs(x[key]) for x in ok) / max(1, len(ok)):.1f}%")
        out += ["", f"speed-ups ({len(sp) - len(ok)} not predicted): baseline on the row's GPUs (scored): "
                f"{summary('error')}; TP inside a node: {summary('qg_error')}; best over whole-node "
                f"counts: {summary('best_error')}; "
                f"{sum(not c['proved'] for x in ok for c in x['counts'])} of "
                f"{sum(len(x['counts']) for x in ok)} fixed-count searches cut by their time limit (not proved); "
                f"{sum(c['agrees'] for x in ok for c in x['counts']) + sum(x['baseline_agrees'] for x in ok)} of "
                f"{sum(len(x['counts']) for x in ok) + len(ok)} "
                "searched plans, split included, fit and step the same under `estimate` (search = estimate); "
                f"the cp side of {', '.join(TE13_CALIBRATION)} is the te_1_3 attention's calibration row",
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
