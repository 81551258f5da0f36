"""Wall time and peak RSS of ``autopar inspect llama3-405b`` (issue 2's target on the 2-core
CPU machine: <= 5 s and <= 1.5 GB).

    python benchmarks/bench_trace_inspect.py [--runs 3] [--model llama3-405b] [--json]

Each run is a fresh process (``python -m autopar.cli.main inspect MODEL``, output discarded),
so the time includes importing torch; peak RSS is that process's ``ru_maxrss`` from wait4.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TARGET_S, TARGET_GB = 5.0, 1.5


def run_once(model: str, extra: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in GB, CPU seconds user+sys) of one fresh process."""
    cmd = [sys.executable, "-m", "autopar.cli.main", "inspect", model, *extra]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=root)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode() if p.stderr else ""
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}): {err.strip()}")
    rss_gb = usage.ru_maxrss * 1024 / 1e9  # ru_maxrss is KiB on Linux
    return wall, rss_gb, usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3-405b")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="time 'inspect --json' instead of the table")
    args = ap.parse_args()
    extra = ["--json"] if args.json else []
    results = [run_once(args.model, extra) for _ in range(args.runs)]
    walls = [w for w, _, _ in results]
    rss = [r for _, r, _ in results]
    cpus = [c for _, _, c in results]
    for i, (w, r, c) in enumerate(results, 1):
        print(f"run {i}: wall {w:.2f} s, CPU {c:.2f} s, peak RSS {r:.2f} GB")
    best, worst, peak = min(walls), max(walls), max(rss)
    print(f"autopar inspect {args.model}: wall time best {best:.2f} s / median {sorted(walls)[len(walls) // 2]:.2f} s "
          f"/ worst {worst:.2f} s; peak RSS {peak:.2f} GB (target <= {TARGET_S} s, <= {TARGET_GB} GB; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; CPU time median "
          f"{sorted(cpus)[len(cpus) // 2]:.2f} s — wall exceeds CPU when other work shares the cores)")
    print(json.dumps({"model": args.model, "runs": args.runs, "wall_s": walls, "cpu_s": cpus, "peak_rss_gb": peak,
                      "target_wall_s": TARGET_S, "target_rss_gb": TARGET_GB,
                      "ok": sorted(walls)[len(walls) // 2] <= TARGET_S and peak <= TARGET_GB}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
