"""How search time grows: with the GPU count, with the layer count, and with each dimension of the
space switched on (issue 30's benchmark; the figures go in docs/guide.md, measured on a quiet
machine).

    python benchmarks/bench_search_growth.py                  # all three sweeps
    python benchmarks/bench_search_growth.py --sweep gpus     # one of gpus, layers, dims
    python benchmarks/bench_search_growth.py --time-limit 120 # per search

Tables are analytic (``tests/synthetic_tables.py``: a GPT of the given shape), so the figures are
the search alone, not the tracer. Each line: the case, the search time, proved or not, the
configurations, the CP-SAT splits, and the best plan. A dimension that this autopar does not
search yet prints the one line it is refused with.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from synthetic_tables import gpt_table  # noqa: E402

from costmodels.contracts.errors import AutoparError  # noqa: E402

GPUS = (64, 256, 1024, 4096, 16384, 65536, 262144)
LAYERS = (24, 48, 96, 128, 200)
# (label, search keyword arguments) — each switches one dimension on over the default space
DIMS = (("default", {}),
        ("zero-bubble schedules", {"zero_bubble": True}),
        ("context parallel (cp=2 pinned)", {"fix": "cp=2"}),
        ("HSDP (dp_shard=8 pinned)", {"fix": "dp_shard=8,zero=3"}),
        ("FP8 (precision=fp8 pinned)", {"fix": "precision=fp8"}),
        ("runtime megatron", {"fix": "runtime=megatron"}))


def gpt(layers: int, hidden: int = 12288, heads: int = 96, seq: int = 2048):
    return gpt_table(layers, hidden, heads, 51200, seq,
                     model=f"gpt:layers={layers},hidden={hidden},heads={heads},vocab=51200,seq={seq}")


def run(label: str, table, hw: str, gpus: int, batch: int, limit: float, **kw) -> None:
    from autopar.search import search
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        res = search(table.model, hw, gpus, batch, top=5, table=table, time_limit_s=limit, **kw)
    except AutoparError as e:
        print(f"{label:<44} refused: {str(e)[:140]}")
        return
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    best = res.plans[0].plan.label() if res.plans else "-"
    print(f"{label:<44} {wall:8.2f} s (CPU {cpu:6.2f} s, load {os.getloadavg()[0]:4.1f})  "
          f"{'proved' if res.optimal else 'NOT proved':<10} "
          f"{res.stats.configurations:>7} configs {res.stats.solved:>5} splits  best {best}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", choices=("gpus", "layers", "dims"), default=None)
    ap.add_argument("--time-limit", type=float, default=300.0)
    args = ap.parse_args()
    import ortools.sat.python.cp_model  # noqa: F401  (a one-time import, not counted)
    if args.sweep in (None, "gpus"):
        print("## GPUs (gpt3-175b shape, h100-80g-sxm, global batch 2 × GPUs, at least 1536)")
        for g in GPUS:
            run(f"{g} GPUs", gpt(96), "h100-80g-sxm", g, max(1536, 2 * g), args.time_limit)
    if args.sweep in (None, "layers"):
        print("## layers (hidden 12288, 1024 × a100-80g-sxm, global batch 1536)")
        for n in LAYERS:
            run(f"{n} layers", gpt(n), "a100-80g-sxm", 1024, 1536, args.time_limit)
    if args.sweep in (None, "dims"):
        print("## dimensions (gpt3-175b shape, 1024 × h100-80g-sxm, global batch 1536)")
        for label, kw in DIMS:
            run(label, gpt(96), "h100-80g-sxm", 1024, 1536, args.time_limit, **kw)


if __name__ == "__main__":
    main()
