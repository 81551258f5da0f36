"""Fit the (gb200-nvl72, transformer-engine) matmul scale on the FP8 split's GB200 calibration
pairs (their BF16 steps; costmodels/calibration/blackwell_te_fit.py), print it beside the value
kernel_stacks.toml ships, and exit 1 when they differ (the shipped figure must be this fit's).

    python benchmarks/fit_blackwell_te.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from costmodels.calibration.blackwell_te_fit import HARDWARE, STACK, fit_blackwell_te  # noqa: E402
from costmodels.profiles.hardware_files import load_profile  # noqa: E402
from costmodels.profiles.kernel_stacks import load_stacks  # noqa: E402

DEFAULT_CSV = Path("/work/shared/validation/fp8_runs.csv")   # as bench_costmodels_fp8.py reads it


def table_of(spec, seq=None):
    from autopar.trace.driver import table_for
    return table_for(spec, seq=seq)


def main() -> int:
    shipped = load_stacks()[(HARDWARE, STACK)]["matmul_scale"][0]   # read before the fit overrides it
    out = fit_blackwell_te(DEFAULT_CSV, table_of, lambda: load_profile(HARDWARE))
    print(f"{out['hardware']} {out['stack']}: matmul_scale {out['matmul_scale']} (shipped {shipped}; "
          f"loss {out['loss']:.4f} over {out['rows']} calibration pairs: {', '.join(out['row_ids'])})")
    return 0 if abs(shipped - out["matmul_scale"]) < 1e-9 else 1


if __name__ == "__main__":
    raise SystemExit(main())
