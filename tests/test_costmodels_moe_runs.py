"""The cost model's expert parallelism against the open MoE runs (benchmarks/bench_costmodels_moe.py,
docs/validation-moe.md): the check rows, scored with the shipped profiles, within the issue's
12 % MAPE; the one calibration row kept out of the check; every skipped row says why."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_costmodels_moe as bench  # noqa: E402

CSV = Path("/work/shared/validation/moe_runs.csv")
if not CSV.exists():
    CSV = ROOT.parent / "shared" / "validation" / "moe_runs.csv"


@pytest.fixture(scope="module")
def scored():
    if not CSV.exists():
        pytest.skip("validation/moe_runs.csv is not on this machine")
    return bench.score(list(csv.DictReader(open(CSV))))


def test_check_mape_within_target(scored):
    check = [s for s in scored if s.get("split") == "check"]
    assert len(check) >= 8
    assert bench.mape(scored, "check") <= 12.0
    assert all(s["row_id"] not in bench.CALIBRATION for s in check)


def test_routing_assumption_per_row_and_skips_explained(scored):
    for s in scored:
        if "skipped" in s:
            assert s["skipped"]
            continue
        assert s["routing"] in ("balanced", "routed")
        assert (s["imbalance"] == 1.0) if s["routing"] == "balanced" else s["imbalance"] >= 1.0
        assert "force_balance" in s["runtime"] or s["routing"] == "routed" or "fsdp" in s["runtime"]
