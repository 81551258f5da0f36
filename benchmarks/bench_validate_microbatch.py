"""The same samples in micro-batches of 1, 2, 4 and 8: measured against the cost model.

    python benchmarks/bench_validate_microbatch.py [MODEL] [--samples N] [--hardware PROFILE]

One process, one thread, as an ``autopar validate`` rank runs a plan's forward and backward
(torch.autocast bf16, flash attention, no optimizer): ``N`` sequences as ``N/b`` micro-batches of
``b``. The sizes take turns over ``--rounds`` rounds (so the machine's drift lands on all of
them); the median is set beside ``costmodels.model.compute.row_times`` summed over the micro-batches.

Why: ``autopar validate`` on the 2-core VM predicts every plan 1-10 % low. The last line fits
the time the model misses per micro-batch as ``c + r · predicted``: ``r`` is the share by which
the profile's rates run faster than a typical step by the wall clock (likely because they are
the best of 5 runs by CPU clock), ``c`` a fixed cost per micro-batch the model has no term for
(torch.profiler counts ~1,700 aten calls per micro-batch of the default gpt, at a few µs of
dispatch each). On this VM, 2026-11-21, with the defaults: r ≈ 10 % and c ≈ 3-8 ms (two runs);
measured 9-16 % above the prediction at every size.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="gpt:layers=4,hidden=256,heads=4,vocab=8192,seq=256")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--hardware", default="cpu-2core-measured")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from autopar.models import load_model
    from autopar.trace import table_for
    from costmodels.model.compute import row_times
    from costmodels.profiles.hardware_files import load_profile
    src = load_model(args.model)
    model = src.build("cpu", seed=0, attention="flash")
    prof = load_profile(args.hardware)
    table = table_for(args.model)
    sizes = [b for b in (1, 2, 4, 8) if args.samples % b == 0 and b <= args.samples]

    def run(b: int) -> float:
        t0 = time.perf_counter()
        for i in range(args.samples // b):
            x, y = src.make_batch(b, seed=i)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(*x)
            src.loss(out, y).backward()
        return time.perf_counter() - t0

    for b in sizes:                       # warm-up: allocator, caches, autograd
        run(b)
        run(b)
    times: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in range(args.rounds):
        order = sizes[:]
        random.shuffle(order)
        for b in order:
            times[b].append(run(b))
    print(f"{args.model}: {args.samples} samples, forward + backward, 1 thread, "
          f"median of {args.rounds} rounds; predicted on {prof.name}")
    print(f"{'micro-batch':>11} {'count':>5} {'measured s':>10} {'predicted s':>11} {'error':>6} "
          f"{'unmodelled per micro-batch':>27}")
    per_mb_pred, per_mb_miss = [], []
    for b in sizes:
        n = args.samples // b
        rt = row_times(table, prof, 1, False, b, "none", "flash", precision="amp")
        pred = n * float(rt.fwd_s.sum() + rt.bwd_s.sum())
        meas = statistics.median(times[b])
        per_mb_pred.append(pred / n)
        per_mb_miss.append((meas - pred) / n)
        print(f"{b:>11} {n:>5} {meas:>10.4f} {pred:>11.4f} {pred / meas - 1:>+6.1%} "
              f"{(meas - pred) / n * 1e3:>24.1f} ms")
    if len(sizes) > 1:
        r, c = np.polyfit(per_mb_pred, per_mb_miss, 1)
        print(f"unmodelled per micro-batch ~ {c * 1e3:.1f} ms + {r:.1%} of its predicted time")


if __name__ == "__main__":
    main()
