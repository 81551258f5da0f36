"""The cost model on open training runs it was not fitted to (costmodels.calibration.open_runs,
docs/validation.md): the calibration split is what it says, every check set stays within 10 %,
no run that ran is predicted not to fit, and the shipped error bands are the check residuals'."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from costmodels.calibration.open_runs import CALIBRATION, mpt_runs, open_runs, spearman, titan_runs
from costmodels.contracts.plan import Plan
from costmodels.profiles.error_bands import band_for, family, format_band, load_bands, percentile_band

trace = pytest.importorskip("autopar.trace")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_validation",
                                                  ROOT / "benchmarks" / "bench_costmodels_validation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def results(bench):
    return bench.open_results(trace.table_for)


def test_the_calibration_split_is_one_model_per_gpu_and_everything_else_checks():
    runs = open_runs()
    assert len(mpt_runs()) == 131 and len(titan_runs()) == 12      # the FP8 rows are left out
    cal = [r for r in runs if r.role == "calibration"]
    assert {(r.hardware, r.model) for r in cal} == set(CALIBRATION.items())
    every = [r for r in mpt_runs() if CALIBRATION.get(r.hardware) == r.model]   # the whole model's runs
    assert len(cal) == len(every) == 22 and all(r.source == "mpt_fsdp" for r in cal)
    assert all(r.role == "check" for r in titan_runs())


def test_check_rows_within_10_percent_per_data_set_and_gpu(results):
    groups = {}
    for x in results:
        if x["run"].role == "check":
            groups.setdefault((x["run"].source, x["run"].hardware), []).append(abs(x["error"]))
    assert len(groups) == 6   # MPT and torchtitan on A100 and H100, NeMo on H100, MT-NLG on A100
    for key, errs in groups.items():
        if key[0] == "deepspeed_published":   # the 2021 stack without constants of its own (issue 31)
            continue
        assert sum(errs) / len(errs) <= 0.10, (key, sum(errs) / len(errs))


def test_no_run_that_ran_is_predicted_not_to_fit(results):
    over = [(x["run"].label, x["memory_bytes"] / 2 ** 30) for x in results if not x["fits"]]
    assert not over


def test_published_peak_memory_within_10_percent(results):
    peaks = [(x["memory_bytes"] / 2 ** 30, x["run"].published_memory_gib) for x in results
             if x["run"].published_memory_gib]
    assert len(peaks) == 4
    for got, pub in peaks:
        assert got == pytest.approx(pub, rel=0.10)


def test_the_shipped_error_bands_are_the_check_residuals(bench, results):
    from costmodels.calibration.validation import table5
    assert [dict(b, statistic=None) for b in bench.bands(results, table5(trace.table_for))] == \
        [dict(b, statistic=None) for b in load_bands()]


def test_spearman_with_ties_and_degenerate_series():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833)
    assert math.isnan(spearman([1], [1])) and math.isnan(spearman([1, 1], [1, 2]))


def test_bands_by_regime_and_their_borrowing():
    assert family(Plan(dp=8, zero=3)) == "dp" and family(Plan(tp=8, pp=2)) == "tp+pp"
    assert family(Plan(dp=2, tp=2, pp=2)) == "3d"
    assert percentile_band([0.01, -0.05, 0.02]) == 0.05
    assert percentile_band([i / 100 for i in range(1, 21)]) == 0.18
    exact = band_for("a100-80g-sxm", "fsdp:fsdp1,bf16_reduce", Plan(dp=8, zero=3))   # Composer's stack
    assert exact["exact"] and exact["rows"] >= 50 and 0 < exact["relative"] < 0.2
    borrowed = band_for("h200-141g-sxm", "megatron", Plan(dp=4, tp=8, pp=4))
    assert borrowed and not borrowed["exact"]
    assert band_for("cpu-2core", "autopar", Plan(dp=2), borrow=False) is None
    assert format_band(16.08, {"relative": 0.09, "exact": True}) == "16.08 s ± 9 %"
    assert format_band(16.08, {"relative": 0.09, "exact": False}) == "16.08 s ± ~9 %"
    assert format_band(2.0, None) == "2 s"


@pytest.mark.parametrize("hardware", ["h100-80g-sxm", "a100-80g-sxm"])
def test_the_shipped_gpu_constants_are_the_calibration_fit(hardware):
    """The profile's (scale, attention, slowdown) minimise the calibration rows' loss on a grid
    one fine step (0.01) around them (``calibration.fit_gpu``'s last pass); the A100 keeps the
    H100's slowdown (``SLOWDOWN_FROM``), which must equal its own profile's."""
    import numpy as np

    from costmodels.calibration.fit import SLOWDOWN_FROM, _grid
    from costmodels.calibration.validation import SHAPE
    from costmodels.profiles.hardware_files import load_profile
    prof = load_profile(hardware)
    scale = round(prof.eff_values[-1] / SHAPE[-1], 4)
    att, slow = prof.attention_efficiency, prof.collective_slowdown
    runs = [r for r in open_runs() if r.hardware == hardware and r.role == "calibration"]
    around = lambda x: np.round([x - 0.01, x, x + 0.01], 4)  # noqa: E731
    donor = SLOWDOWN_FROM.get(hardware)
    slows = [load_profile(donor).collective_slowdown] if donor else around(slow)
    if donor:
        assert slows == [slow]
    best = _grid(runs, load_profile(hardware), trace.table_for, around(scale), around(att), slows)
    assert best[1:] == (scale, att, slow)
