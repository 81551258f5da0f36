"""Predicted vs published, for every row the cost model is checked on (docs/validation.md).

    python benchmarks/bench_costmodels_validation.py              # markdown tables
    python benchmarks/bench_costmodels_validation.py --calibrate  # re-run the fit (≈15 s)

Sources (tests/data/validation/, copied from the shared open-data folder): ZeRO Table 1 (Rajbhandari et
al. 2020), Korthikanti et al. 2022 Table 2 (activation formulas) and Tables 3/5 (iteration times on A100
80GB).
Real layer tables from ``autopar.trace.table_for``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodels.validation import CALIBRATION_ROWS, SHAPE, SHAPE_FLOPS, TABLE5_SPECS, fit, table2, table5, zero_table1  # noqa: E402


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", action="store_true", help="re-run the calibration grid fit")
    args = ap.parse_args(argv)
    from autopar.trace import table_for

    if args.calibrate:
        t0 = time.perf_counter()
        c, scale, curve, err = fit(table_for)
        print(f"calibration rows: {CALIBRATION_ROWS}")
        print(f"best C_FWD = {c} (C_BWD = {2 * c}), efficiency scale = {scale}, curve at "
              f"{SHAPE_FLOPS} FLOPs = {tuple(round(x, 4) for x in curve)} (shape {SHAPE}), "
              f"sum of squared log errors = {err:.3g}  [{time.perf_counter() - t0:.1f} s]")
        return 0

    print("### ZeRO Table 1: model states per GPU (GB), mixed-precision Adam, 16 bytes/parameter\n")
    print("| params | dp | ZeRO | published GB | predicted GB | error |")
    print("| ---: | ---: | :---: | ---: | ---: | ---: |")
    for r in zero_table1():
        stage = {1: "os (1)", 2: "os+g (2)", 3: "os+g+p (3)"}[r["zero"]]
        print(f"| {r['params_billion']} B | {r['dp']} | {stage} | {r['published_text']} | "
              f"{r['predicted_gb']:.4g} | {pct(r['error'])} |")

    t175 = table_for("gpt3-175b")
    print("\n### Korthikanti Table 2: activation bytes per layer, GPT-3 175B (s=2048, b=1, h=12288, "
          "a=96), math attention, t=8, traced table\n")
    print("| setting | formula | published (MB) | predicted (MB) | error |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in table2(t175, tp=8):
        print(f"| {r['setting']} (t={r['tp']}) | `{r['formula']}` | {r['published_bytes'] / 1e6:.1f} | "
              f"{r['predicted_bytes'] / 1e6:.1f} | {pct(r['error'])} |")

    print("\n### Korthikanti Table 5: iteration time (s) on A100 80GB (a100-80g-sxm profile), "
          "traced tables\n")
    print("| model | setting | tp·pp (vpp) | GPUs | batch | role | published s | predicted s | error "
          "| published MFU | predicted MFU |")
    print("| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    t0 = time.perf_counter()
    rows = table5(table_for)
    for r in rows:
        p = r["plan"]
        mfu = f"{r['published_mfu']:.3f}" if r["published_mfu"] is not None else "—"
        print(f"| {r['model']} | {r['setting']} | {p.tp}·{p.pp} ({p.vpp}) | {r['gpus']} | "
              f"{r['global_batch']} | {r['role']} | {r['published_s']:.2f} | {r['predicted_s']:.2f} | "
              f"{pct(r['error'])} | {mfu} | {r['predicted_mfu']:.3f} |")
    check = [abs(r["error"]) for r in rows if r["role"] == "check"]
    print(f"\ncheck rows: max |error| {100 * max(check):.1f}%, mean {100 * sum(check) / len(check):.1f}% "
          f"({len(check)} rows); calibration rows: {CALIBRATION_ROWS}; "
          f"models: {', '.join(f'{k} = {v}' for k, v in TABLE5_SPECS.items())}")
    print(f"(estimate time for the 8 rows: {1e3 * (time.perf_counter() - t0):.0f} ms incl. traces)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
