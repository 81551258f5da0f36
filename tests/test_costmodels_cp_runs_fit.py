"""Open cp runs that ran are predicted to fit when priced as their sources state them.

The AutoModel Llama 3 70B run's CSV row leaves its recompute to a yaml it did not read; priced
without recompute it needs 145 GiB on an 80 GB H100 (issue 31: no open run that ran is predicted
not to fit). ``costmodels.calibration.cp_runs.STATED_RECOMPUTE`` carries what that yaml sets.
"""
from __future__ import annotations

import csv
from pathlib import Path

from autopar.trace import table_for
from costmodels.calibration.cp_runs import STATED_RECOMPUTE, cp_recompute, cp_runtime
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate

ROWS = Path(__file__).parent / "data" / "validation" / "cp_runs.csv"


def _row(row_id: str) -> dict:
    return next(r for r in csv.DictReader(open(ROWS)) if r["row_id"] == row_id)


def test_a_row_whose_source_states_its_recompute_is_priced_with_it_and_fits():
    row = _row("automodel-h100-llama3-70b-64")
    assert row["recompute"].startswith("per examples")   # the CSV did not read it
    assert cp_recompute(row) == STATED_RECOMPUTE[row["row_id"]] == "full"
    assert cp_recompute({"row_id": "x", "recompute": "full (stated)"}) == "full"
    assert cp_recompute({"row_id": "x", "recompute": "not stated"}) == "none"
    table = table_for("llama3-70b", micro_batch=1, seq=int(row["seq"]))
    runtime = cp_runtime(row["framework"], row["notes"], int(row["tp"]))
    fits = {}
    for rec in ("none", cp_recompute(row)):
        plan = Plan(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), cp=int(row["cp"]),
                    micro_batch_size=int(row["micro_batch"]), zero=3, recompute=rec, runtime=runtime)
        fits[rec] = estimate(table, "h100-80g-sxm", plan, int(row["gpus"]), int(row["global_batch"])).fits
    assert fits == {"none": False, "full": True}
