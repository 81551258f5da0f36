"""The whole plan-space grid through the runtime: every plan equals the serial model, or is refused
before launch with one line.

    python benchmarks/bench_runtime_sweep.py [--world 8] [--steps 3] [--only SUBSTRING] [--json OUT]

Runs ``autopar.runtime.verify.sweep.plan_grid()`` (270 plans: dp, tp, pp ∈ {1, 2}; every schedule;
micro-batch counts 1, pp, 2·pp, 3; ZeRO 0–3; recompute, sequence parallel, placements, uneven
split points and three tiny models rotating through it; then the cp / HSDP plans and the 20
expert parallel plans of the ``moe`` model, ``--only moe-``) with ``sweep.run``: the runtime's own
pre-launch check refuses what it must in this process, the rest run in one gloo world of
``--world`` processes (each plan on its first dp·tp·pp ranks, 1 to 8), compared with the
single-process model over ``--steps`` SGD steps. Prints the pass matrix — per (dp, tp, pp) and
schedule: passed / refused / failed — then every refusal line (distinct) and every failure.
Exits 1 when any plan failed (mismatch or error).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autopar.runtime.verify import sweep  # noqa: E402


def _key(case: sweep.SweepCase) -> tuple:
    p = dict(case.plan)
    return (p["dp"], p["tp"], p["pp"]), p["schedule"]


def matrix(cases, results) -> str:
    """Rows: (dp, tp, pp) and world size; columns: schedule, each 'passed/refused/failed'."""
    schedules = ("1f1b", "gpipe", "interleaved-1f1b")
    counts = collections.defaultdict(collections.Counter)
    for c in cases:
        status = results[c.name]["status"]
        counts[_key(c)][{"pass": "passed", "refused": "refused"}.get(status, "failed")] += 1
    lines = [f"{'dp tp pp':>9} {'ranks':>5}  " + "  ".join(f"{s:>17}" for s in schedules)
             + f"  {'all':>13}", f"{'':>9} {'':>5}  " + "  ".join(f"{'pass/ref/fail':>17}" for _ in schedules)
             + f"  {'pass/ref/fail':>13}"]
    total = collections.Counter()
    for dims in sorted({k[0] for k in counts}):
        cells, row = [], collections.Counter()
        for s in schedules:
            n = counts.get((dims, s))
            cells.append(f"{n['passed']:>7}/{n['refused']}/{n['failed']}" if n else f"{'-':>11}")
            row.update(n or {})
        total.update(row)
        lines.append(f"{' '.join(map(str, dims)):>9} {dims[0] * dims[1] * dims[2]:>5}  "
                     + "  ".join(f"{c:>17}" for c in cells)
                     + f"  {row['passed']:>7}/{row['refused']}/{row['failed']}")
    lines.append(f"{'total':>9} {'':>5}  " + "  ".join(" " * 17 for _ in schedules)
                 + f"  {total['passed']:>7}/{total['refused']}/{total['failed']}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=8, help="processes in the world (default 8)")
    ap.add_argument("--steps", type=int, default=3, help="SGD steps per plan (default 3)")
    ap.add_argument("--only", default=None, help="run only plans whose name contains this")
    ap.add_argument("--json", default=None, help="write every plan's result here")
    args = ap.parse_args()
    cases = [c for c in sweep.plan_grid() if args.only is None or args.only in c.name]
    cases = [c for c in cases if dict(c.plan)["dp"] * dict(c.plan)["tp"] * dict(c.plan)["pp"]
             <= args.world]
    out = sweep.run(cases, world=args.world, steps=args.steps)
    res = out.results
    print(f"{len(cases)} plans, {args.steps} steps each, world of {args.world} gloo processes: "
          f"{out.seconds:.0f} s ({out.worlds} world(s) started)\n")
    print(matrix(cases, res))
    refusals = collections.Counter(r["line"] for r in res.values() if r["status"] == "refused")
    print("\nrefused before launch (one line each; distinct lines, with counts):")
    for line, n in refusals.most_common():
        print(f"  {n:3d} × {line}")
    failed = {n: r for n, r in res.items() if r["status"] not in ("pass", "refused")}
    print(f"\nfailed: {len(failed)}")
    for name, r in failed.items():
        detail = r.get("line") or f"loss rel {r['rel']:.3g}, parameters rel {r['param_rel']:.3g}"
        print(f"  {name}: {r['status']}: {detail}")
    worst = max((r["rel"] for r in res.values() if r["status"] == "pass"), default=0.0)
    print(f"largest loss difference among passed plans: {worst:.3g} (tolerance {sweep.RTOL:g})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
