"""Price fixed no-CP layouts against the published baselines of NeMo's long-sequence sweeps
(docs/validation-cp.md, "... what NeMo's baselines read as"): Llama 2 7B on H100 (NeMo 24.03) at TP
up to 16 across two nodes (the largest TP whose FP8 GEMMs keep the ffn slice a multiple of 16,
11008 / 16 = 688: TE v1.3 ``assert_dim_for_fp8_exec`` on ``fc2_weight``), Llama 3 8B on B200 (NeMo
25.04) at TP 8 (its query groups), each with the pipeline the GPU count then needs, with and
without full activation recompute. Not scored: the baselines' layouts are not published; this
prints which priced layout meets each published step.

    python benchmarks/cp_baseline_probe.py                  # the fixed layouts
    python benchmarks/cp_baseline_probe.py --full-recompute # the searched baseline, recompute pinned full
    python benchmarks/cp_baseline_probe.py --same-share     # each cp run beside its no-CP twin's memory
    python benchmarks/cp_baseline_probe.py --megatron-figure  # Megatron-LM's CP figure, priced
    python benchmarks/cp_baseline_probe.py --footnote         # Llama 3 8B at 1M without CP (footnote 1)

``--full-recompute``: per sweep point, the best cp = 1 plan in the source's space (the bench's
scored space: node-bounded with or without TP-comm overlap, or TP across nodes without it; the FP8
shape rule applied) with ``recompute=full`` pinned (docs/validation-cp.md, "Still missed"). A
reading of what NeMo's baselines look like, not a scored one: which lengths ran recompute is not
published, and choosing it per length from these rows would be fitting to them.

``--same-share``: each sweep's cp run beside the no-CP layout that gives every GPU the same share
of the sequence (tp' = cp · tp, the same dp and pp, no recompute, TP-comm overlap only inside a
node), with the memory ``estimate`` gives both (docs/validation-cp.md, "The baselines'
recompute"). Where both are priced, the activations are the same bytes: a memory term the model
lacks that grows with the activations would push the cp run, which ran without recompute, as far
as the baseline, so it cannot be why NeMo's baseline needed recompute there.

``--megatron-figure``: the layouts of Megatron-LM's context-parallel doc, Figure 2 (NVIDIA/Megatron-LM
``docs/source/images/context_parallel/CP_results.png``, added in 2407ddf, 2024-03-16: GPT 175B, BF16,
speed-ups over full recompute at TP8CP1, 16K and 32K tokens), priced on H100 at an assumed pipeline
depth and batch (pp 8, 32 GPUs a stage, batch 64: the figure states neither), with the H100 default
attention and with Transformer Engine 1.3's (the release of that month, ``nemo_releases``). Values
read off its bars, printed beside the model's; not scored.

``--footnote``: the page's footnote 1 says Llama 3 8B cannot run 1024K tokens without CP on the
row's B200s, TP bounded by its 8 query groups, "even with full activation recomputation". The
no-CP search on the row's GPUs (and on 4x as many), under the cp run's runtime (TP-comm overlap
on: userbuffers of ``S · h`` per GPU, ``long_sequence_memory``) and without TP-comm overlap, shows
which of the two the footnote agrees with. Then, for the Llama 3 points whose cp run has TP-comm
overlap, the baseline searched under the cp run's runtime only.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cp_bench_rows import DATA, PRESET, _profile, _published_steps, _runtime, _sweep_plan, table  # noqa: E402

from costmodels.model.estimate import estimate  # noqa: E402

LAYOUTS = {"nemolong-llama2-7b-128k-cp4": [(16, 8, 1), (8, 16, 1)],   # (dp, tp, pp) on the row's GPUs
           "nemolong-llama2-7b-256k-cp8": [(16, 16, 1)],
           "nemolong-llama2-7b-512k-cp16": [(8, 16, 4)],
           "nemolong-llama2-7b-1024k-cp32": [(4, 16, 16)],
           # Llama 3 8B on B200: TP up to its 8 query groups (the page's footnote 1), one node
           "nemolong-llama3-8b-128k-cp4": [(4, 8, 1)],
           "nemolong-llama3-8b-256k-cp4": [(8, 8, 1)],
           "nemolong-llama3-8b-512k-cp8": [(8, 8, 2)]}


def full_recompute_reading() -> int:
    from cp_bench_rows import _int

    from autopar.search import search
    from costmodels.contracts.errors import AutoparError
    rows = list(csv.DictReader(open(DATA / "cp_runs.csv")))
    print("| sweep row | published | best no-CP plan, full recompute pinned | speed-up | error |")
    print("| --- | ---: | --- | ---: | ---: |")
    for r in rows:
        if not r["row_id"].startswith("nemolong") or _int(r["cp"], 1) < 2 or not r["speedup_vs_pair"]:
            continue
        spec, hw, seq, batch = PRESET[r["model"]], _profile(r["gpu"]), int(r["seq"]), int(r["global_batch"])
        runtime = _runtime(r)
        plan = _sweep_plan(r, runtime)
        tbl = table(spec, seq)
        cp_step = estimate(tbl, hw, plan, plan.world_size, batch).step_time_s
        bare = runtime.replace(",tp_comm_overlap", "")
        best = None
        for rt, cross in ((runtime, False), (bare, False), (bare, True)):
            try:
                res = search(spec, hw, plan.world_size, batch, top=1, table=tbl, time_limit_s=10,
                             fix={"cp": 1, "runtime": rt, "precision": plan.precision, "recompute": "full"},
                             allow_cross_node_tp=cross)
            except AutoparError:
                continue
            if best is None or res.plans[0].prediction["step_time_s"] < best.prediction["step_time_s"]:
                best = res.plans[0]
        pub = float(r["speedup_vs_pair"])
        sp = best.prediction["step_time_s"] / cp_step
        print(f"| {r['row_id']} | {pub:.2f} | {best.plan.label().split(' runtime')[0]} | {sp:.2f} "
              f"| {100 * (sp / pub - 1):+.1f}% |", flush=True)
    return 0


def same_share_reading() -> int:
    from cp_bench_rows import _int

    from costmodels.contracts.errors import AutoparError
    rows = list(csv.DictReader(open(DATA / "cp_runs.csv")))
    print("| sweep row | cp run | its GiB (activations / total) | same-share no-CP layout "
          "| its GiB (activations / total) |")
    print("| --- | --- | ---: | --- | ---: |")
    for r in rows:
        if not r["row_id"].startswith("nemolong") or _int(r["cp"], 1) < 2 or not r["speedup_vs_pair"]:
            continue
        runtime, hw = _runtime(r), _profile(r["gpu"])
        plan = _sweep_plan(r, runtime)
        tbl, batch = table(PRESET[r["model"]], int(r["seq"])), int(r["global_batch"])
        e = estimate(tbl, hw, plan, plan.world_size, batch).memory_bytes
        tp = plan.cp * plan.tp
        twin = plan.with_(cp=1, tp=tp, sequence_parallel=True,
                          runtime=runtime if tp <= 8 else runtime.replace(",tp_comm_overlap", ""))
        try:
            t = estimate(tbl, hw, twin, plan.world_size, batch).memory_bytes
            twin_gib = f"{t['activations'] / 2 ** 30:.2f} / {t['total'] / 2 ** 30:.1f}"
        except AutoparError as err:   # e.g. tp' past the query groups or the FP8 shape rule
            twin_gib = "refused: " + str(err).splitlines()[0][:70]
        print(f"| {r['row_id']} | {plan.label().split(' runtime')[0]} | {e['activations'] / 2 ** 30:.2f} / "
              f"{e['total'] / 2 ** 30:.1f} | {twin.label().split(' runtime')[0]} | {twin_gib} |", flush=True)
    return 0


# Megatron-LM CP doc, Figure 2 (BF16 training w/ MHA), read off the bars: (tp, cp) -> speed-up
MEGATRON_FIGURE = {16384: {(8, 1): 1.00, (16, 1): 1.13, (8, 2): 1.25},
                   32768: {(8, 1): 1.00, (32, 1): 0.85, (16, 2): 1.15, (8, 4): 1.20}}


def megatron_figure_reading() -> int:
    from costmodels.contracts.plan import Plan
    base = "megatron:overlap_grad_reduce,overlap_param_gather"
    print("| tokens | attention stack | layout | figure | model | fits |")
    print("| ---: | --- | --- | ---: | ---: | --- |")
    for seq, bars in MEGATRON_FIGURE.items():
        tbl = table("gpt3-175b", seq)
        for release in ("", ",te_1_3"):   # the H100 default, and NeMo 24.03's TE 1.3 (nemo_releases)
            ref = None
            for (tp, cp), bar in bars.items():
                rec = "full" if (tp, cp) == (8, 1) else "none"   # the figure's reference is full recompute
                rt = base + (",tp_comm_overlap" if tp <= 8 else "") + release
                # pp 8 and a batch of 64 assumed (not stated); pp 16 / batch 128 moves each ratio by <= 0.01
                p = Plan(dp=32 // (tp * cp), tp=tp, cp=cp, pp=8, micro_batch_size=1, zero=1, recompute=rec,
                         sequence_parallel=True, runtime=rt)
                e = estimate(tbl, "h100-80g-sxm", p, 32 * 8, 64)
                ref = ref or e.step_time_s
                print(f"| {seq} | {release.strip(',') or 'transformer-engine'} | TP{tp}CP{cp}, {rec} recompute "
                      f"| {bar:.2f} | {ref / e.step_time_s:.2f} | {'yes' if e.fits else 'NO'} |", flush=True)
    return 0


def footnote_reading() -> int:
    from autopar.search import search
    from costmodels.contracts.errors import AutoparError
    rows = {r["row_id"]: r for r in csv.DictReader(open(DATA / "cp_runs.csv"))}

    def best(r, n, runtimes):
        tbl, spec = table(PRESET[r["model"]], int(r["seq"])), PRESET[r["model"]]
        try:
            res = [search(spec, _profile(r["gpu"]), n, int(r["global_batch"]), top=1, table=tbl, time_limit_s=20,
                          fix={"cp": 1, "runtime": rt, "precision": "fp8"}) for rt in runtimes]
        except AutoparError as err:
            return None, str(err).splitlines()[0][:150]
        c = min((x.plans[0] for x in res), key=lambda c: c.prediction["step_time_s"])
        return c, c.plan.label().split(" runtime")[0] + ("" if all(x.optimal for x in res) else " (not proved)")

    r = rows["nemolong-llama3-8b-1024k-cp16"]
    rt = _runtime(r)
    n = _sweep_plan(r, rt).world_size
    print("Llama 3 8B, 1024K tokens, no CP (footnote 1: impossible even with full recompute):")
    for gpus in (n, 4 * n):
        for label, r_t in (("TP-comm overlap on (the cp run's)", rt),
                           ("TP-comm overlap off", rt.replace(",tp_comm_overlap", ""))):
            print(f"  {gpus} GPUs, {label}: {best(r, gpus, [r_t])[1]}", flush=True)
    print("Llama 3 8B points, baseline under the cp run's runtime only (TP-comm overlap kept):")
    for rid in ("nemolong-llama3-8b-128k-cp4", "nemolong-llama3-8b-256k-cp4", "nemolong-llama3-8b-512k-cp8"):
        r = rows[rid]
        rt = _runtime(r)
        plan = _sweep_plan(r, rt)
        tbl, batch = table(PRESET[r["model"]], int(r["seq"])), int(r["global_batch"])
        cp_step = estimate(tbl, _profile(r["gpu"]), plan, plan.world_size, batch).step_time_s
        c, label = best(r, plan.world_size, [rt])
        pub = float(r["speedup_vs_pair"])
        sp = c.prediction["step_time_s"] / cp_step if c else float("nan")
        print(f"  {rid}: {label}: {sp:.2f} against {pub:.2f} ({100 * (sp / pub - 1):+.1f} %)", flush=True)
    return 0


def main() -> int:
    if "--full-recompute" in sys.argv[1:]:
        return full_recompute_reading()
    if "--footnote" in sys.argv[1:]:
        return footnote_reading()
    if "--megatron-figure" in sys.argv[1:]:
        return megatron_figure_reading()
    if "--same-share" in sys.argv[1:]:
        return same_share_reading()
    rows = list(csv.DictReader(open(DATA / "cp_runs.csv")))
    print("| sweep row | layout | recompute | predicted s | published baseline s | error | fits (GiB) "
          "| speed-up | published |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: |")
    for rid, layouts in LAYOUTS.items():
        r = next(x for x in rows if x["row_id"] == rid)
        runtime = _runtime(r)
        cp_plan = _sweep_plan(r, runtime)
        batch = int(r["global_batch"])
        tbl = table(PRESET[r["model"]], int(r["seq"]))
        hw = _profile(r["gpu"])
        cp_step = estimate(tbl, hw, cp_plan, cp_plan.world_size, batch).step_time_s
        _, pub_base = _published_steps(r, rows, cp_plan, batch)
        for dp, tp, pp in layouts:
            for rec in ("none", "full"):
                # across nodes no userbuffers: the baseline runs without TP-comm overlap
                p = cp_plan.with_(dp=dp, cp=1, tp=tp, pp=pp, recompute=rec,
                                  runtime=runtime.replace(",tp_comm_overlap", ""))
                e = estimate(tbl, hw, p, cp_plan.world_size, batch)
                print(f"| {rid} | dp{dp}·tp{tp}·pp{pp} | {rec} | {e.step_time_s:.2f} | {pub_base:.2f} "
                      f"| {100 * (e.step_time_s / pub_base - 1):+.1f}% | {'yes' if e.fits else 'NO'} "
                      f"({e.memory_bytes['total'] / 2 ** 30:.0f}) | {e.step_time_s / cp_step:.2f} "
                      f"| {float(r['speedup_vs_pair']):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
