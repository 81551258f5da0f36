"""The cost model's expert parallelism against the open MoE runs (benchmarks/bench_costmodels_moe.py,
docs/validation-moe.md): every row the model can express is scored (FP8, cp and GB200 rows
included); the BF16 H100 check rows, with and without cp, within the issue's 12 % MAPE (the
whole check set is not yet: docs/validation-moe.md); the one calibration row kept out of the
check; every skipped row says why, and none for precision, cp or the GPU."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_costmodels_moe as bench  # noqa: E402

CSV = ROOT / "tests" / "data" / "validation" / "moe_runs.csv"   # a copy of the shared open data


@pytest.fixture(scope="module")
def scored():
    return bench.score(list(csv.DictReader(open(CSV))))


def test_check_mape_within_target(scored):
    check = [s for s in scored if s.get("split") == "check"]
    assert all(s["row_id"] not in bench.CALIBRATION for s in check)
    h100_bf16 = [s for s in check if s["hardware"] == "h100-80g-sxm" and s["precision"] == "bf16"]
    assert len(h100_bf16) >= 20 and any(s["cp"] > 1 for s in h100_bf16)
    assert sum(abs(s["error_pct"]) for s in h100_bf16) / len(h100_bf16) <= 12.0


def test_fp8_cp_and_blackwell_rows_are_scored(scored):
    reasons = " ".join(s["skipped"] for s in scored if "skipped" in s).lower()
    assert "fp8" not in reasons and "cp > 1" not in reasons and "gb200" not in reasons
    done = [s for s in scored if "skipped" not in s]
    assert len(done) >= 55
    assert {"fp8", "bf16"} <= {s["precision"] for s in done}
    assert {"gb200-nvl72", "b200-180g-sxm", "h100-80g-sxm"} <= {s["hardware"] for s in done}


def test_routing_assumption_per_row_and_skips_explained(scored):
    for s in scored:
        if "skipped" in s:
            assert s["skipped"]
            continue
        assert s["routing"] in ("balanced", "routed")
        assert (s["imbalance"] == 1.0) if s["routing"] == "balanced" else s["imbalance"] >= 1.0
        assert "force_balance" in s["runtime"] or s["routing"] == "routed" or "fsdp" in s["runtime"]
