"""The flat-sweep rule of docs/validation.md (costmodels/calibration/sweep_ranking.py): a sweep
whose published figures lie within the range that identical runs would show at the open data's
noise is not ranked, and passes only if the prediction is flat too."""
from __future__ import annotations

import pytest

from costmodels.calibration.sweep_ranking import expected_range, noise_sigma, rank_sweep, repeat_pairs


def test_expected_range_of_normal_draws():
    assert expected_range(2) == pytest.approx(2 / 3.141592653589793 ** 0.5, abs=1e-3)   # 2/sqrt(pi)
    assert expected_range(5) == pytest.approx(2.326, abs=2e-3)
    assert expected_range(1) == 0.0


def test_noise_from_repeated_configurations():
    pairs = repeat_pairs()
    assert len(pairs) >= 5
    assert 0.0 < noise_sigma() < 0.05


def test_flat_sweep_is_not_ranked_and_must_be_predicted_flat():
    flat = [450.6, 448.0, 444.0, 454.6, 449.0]          # within 2.4 %
    ok = rank_sweep(flat, [451.0, 450.5, 450.2, 450.1, 450.0], sigma=0.02)
    assert ok["flat"] and ok["spearman"] is None and ok["predicted_flat"]
    bad = rank_sweep(flat, [300.0, 350.0, 400.0, 450.0, 500.0], sigma=0.02)
    assert bad["flat"] and not bad["predicted_flat"]
    steep = rank_sweep([100.0, 120.0, 140.0, 160.0, 180.0], [101.0, 119.0, 142.0, 158.0, 185.0], sigma=0.02)
    assert not steep["flat"] and steep["spearman"] == pytest.approx(1.0)
