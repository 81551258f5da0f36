"""How fast ``costmodels.model.estimate.estimate`` scores plans (the search calls it a lot).

    python benchmarks/bench_costmodels_estimate.py

Scores every divisor combination (dp, tp, pp) × micro-batch × recompute × ZeRO × schedule (1f1b,
interleaved-1f1b and the split-backward interleaved-zb, zb-v, dualpipe-v at vpp 2) for
gpt3-175b on 1024 × a100-80g-sxm (global batch 1536) and llama3-405b (seq 8192) on 16384 ×
h100-80g-sxm (global batch 2048), on real traced tables; prints plans/s (and ms per scored plan
for each schedule: the split-backward ones simulate their first three periods) and the best plan; then
times ``costmodels.contracts.split.balanced_stages`` (the default split every estimate without explicit
stages uses) on a 128-layer table for 2 … 128 stages.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodels.contracts.errors import PlanError  # noqa: E402
from costmodels.contracts.plan import Plan  # noqa: E402
from costmodels.model.estimate import estimate  # noqa: E402
from costmodels.profiles.hardware_files import load_profile


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def grid(table, gpus, batch):
    for tp in (1, 2, 4, 8):
        for pp in divisors(gpus // tp):
            dp = gpus // (tp * pp)
            if pp > len(table.rows) or batch % dp:
                continue
            for mb in (1, 2, 4):
                for rc in ("none", "selective", "full"):
                    for zero in (0, 1, 3):
                        for sched, vpp in (("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-zb", 2),
                                           ("zb-v", 2), ("dualpipe-v", 2)):
                            if sched != "1f1b" and pp < 2:
                                continue
                            try:
                                yield Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch_size=mb, zero=zero,
                                           recompute=rc, sequence_parallel=tp > 1, schedule=sched)
                            except PlanError:
                                continue


def run(spec, seq, hw, gpus, batch):
    from autopar.trace import table_for
    t0 = time.perf_counter()
    table = table_for(spec, seq=seq)
    t_trace = time.perf_counter() - t0
    prof = load_profile(hw)
    plans = list(grid(table, gpus, batch))
    best, n_ok, n_err = None, 0, 0
    per_schedule: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    for p in plans:
        t1 = time.perf_counter()
        try:
            e = estimate(table, prof, p, gpus, batch)
        except PlanError:
            n_err += 1
            continue
        per_schedule.setdefault(p.schedule, []).append(time.perf_counter() - t1)
        n_ok += 1
        if e.fits and (best is None or e.step_time_s < best.step_time_s):
            best = e
    dt = time.perf_counter() - t0
    print(f"{spec} on {gpus} x {hw}, batch {batch}: {len(plans)} plans ({n_ok} scored, {n_err} rejected) "
          f"in {dt:.2f} s = {1e3 * dt / max(1, len(plans)):.2f} ms/plan (trace {t_trace:.1f} s)")
    print("  scored, ms/plan: " + ", ".join(f"{k} {1e3 * sum(v) / len(v):.2f} ({len(v)})"
                                            for k, v in per_schedule.items()))
    if best:
        p = best.plan
        print(f"  best that fits: dp{p.dp} tp{p.tp} pp{p.pp} vpp{p.vpp} mb{p.micro_batch_size} z{p.zero} "
              f"{p.recompute} {p.schedule}: {best.step_time_s:.2f} s/step, MFU {best.mfu:.3f}, "
              f"{best.memory_bytes['total'] / 1e9:.1f} GB")


def run_split():
    from autopar.trace import table_for
    from costmodels.contracts.split import balanced_stages
    table = table_for("gpt:layers=128,hidden=1024,heads=16,vocab=50000,seq=1024")
    t0 = time.perf_counter()
    for n in (2, 4, 8, 16, 32, 64, 128):
        balanced_stages(table, n)
    print(f"balanced_stages on {len(table.rows)} rows for 2 ... 128 stages (7 splits): "
          f"{time.perf_counter() - t0:.3f} s")


if __name__ == "__main__":
    run_split()
    run("gpt3-175b", None, "a100-80g-sxm", 1024, 1536)
    run("llama3-405b", 8192, "h100-80g-sxm", 16384, 2048)
