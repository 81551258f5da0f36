"""Fit the attention rate of (h100-80g-sxm, transformer-engine-1.3) on its one calibration row
(``costmodels.calibration.nemo_releases.TE13_CALIBRATION``: NeMo 24.03's Llama 2 7B run at 1M
tokens, cp 32, where attention is 97 % of the predicted step) and print it; every other run of
that release is a check row (docs/validation-cp.md).

    python benchmarks/fit_te13_attention.py
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cp_bench_rows import DATA, PRESET, _profile, _published_steps, _runtime, _sweep_plan, table  # noqa: E402

from costmodels.calibration.nemo_releases import TE13_CALIBRATION, TE13_STACK  # noqa: E402
from costmodels.calibration.stack_fit import stack_override  # noqa: E402
from costmodels.model.estimate import estimate  # noqa: E402

GRID = tuple(round(0.40 + 0.01 * i, 2) for i in range(71))   # 0.40 .. 1.10 of peak at the counted FLOPs


def calibration_rows() -> list[dict]:
    """(plan, table, published step) of each calibration row, priced as the bench prices it."""
    rows = list(csv.DictReader(open(DATA / "cp_runs.csv")))
    out = []
    for r in rows:
        if r["row_id"] not in TE13_CALIBRATION:
            continue
        plan = _sweep_plan(r, _runtime(r))
        batch = int(r["global_batch"])
        pub, _ = _published_steps(r, rows, plan, batch)
        out.append(dict(id=r["row_id"], hw=_profile(r["gpu"]), plan=plan, batch=batch, published=pub,
                        table=table(PRESET[r["model"]], int(r["seq"]))))
    return out


def fit() -> tuple[float, float, list[str]]:
    """(attention_efficiency, loss, row ids): least squared log step error over GRID."""
    rows = calibration_rows()
    best = None
    for x in GRID:
        with stack_override("h100-80g-sxm", TE13_STACK, attention_efficiency=x):
            loss = sum(math.log(estimate(r["table"], r["hw"], r["plan"], r["plan"].world_size,
                                         r["batch"]).step_time_s / r["published"]) ** 2 for r in rows)
        if best is None or loss < best[1]:
            best = (x, loss)
    return best[0], best[1], [r["id"] for r in rows]


def main() -> int:
    x, loss, ids = fit()
    print(f"h100-80g-sxm {TE13_STACK}: attention_efficiency {x} (loss {loss:.5f} over {len(ids)} "
          f"calibration row(s): {', '.join(ids)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
