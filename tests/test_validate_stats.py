"""MAPE, Spearman, the plan spread and the summary of autopar validate (no processes)."""
import math

import pytest

from autopar.validate.run import summarize
from autopar.validate.stats import mape, spearman


def test_mape():
    assert mape([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)
    assert mape([2.0], [1.0]) == pytest.approx(1.0)


def test_spearman_matches_definition():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # monotone but not linear: still 1
    assert spearman([1, 2, 3, 4, 5], [1, 4, 9, 16, 1000]) == pytest.approx(1.0)
    # one swap among 5: 1 - 6·2/(5·24) = 0.9
    assert spearman([1, 2, 3, 4, 5], [1, 2, 4, 3, 5]) == pytest.approx(0.9)
    # ties take the mean rank (scipy.stats.spearmanr gives 0.9486832980505138 here)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_summary_over_measured_plans():
    plans = [{"predicted_step_s": 1.0, "measured_step_s": 1.1, "predicted_memory_bytes": 100,
              "measured_memory_bytes": 110},
             {"predicted_step_s": 2.0, "measured_step_s": 1.9, "predicted_memory_bytes": 200,
              "measured_memory_bytes": 190},
             {"predicted_step_s": 3.0, "measured_step_s": None, "error": "x",
              "predicted_memory_bytes": 1, "measured_memory_bytes": None}]
    s = summarize(plans)
    assert s["plans"] == 3 and s["plans_measured"] == 2
    assert s["step_time_spearman"] == pytest.approx(1.0)
    assert s["step_time_mape"] == pytest.approx((0.1 / 1.1 + 0.1 / 1.9) / 2)


def test_validate_output_can_be_validated_again(tmp_path):
    """validate --plans reads its own output: the plans come back, the measured keys beside them
    are kept apart (``Plan.from_dict`` alone refuses them)."""
    import json

    from costmodels.contracts.errors import PlanError
    from costmodels.contracts.plan import Plan
    from costmodels.contracts.plans_file import PlansFile
    item = {"dp": 2, "tp": 1, "pp": 1, "micro_batch_size": 2, "step_time_s": 1.0,
            "measured_step_s": 1.2, "predicted_memory_bytes": 5, "memory_error": 0.1}
    path = tmp_path / "v.json"
    path.write_text(json.dumps({"version": 1, "model": "m", "plans": [item],
                                "validate": {"summary": {}}}))
    [r] = PlansFile.read(str(path)).results
    assert r.plan == Plan(dp=2, micro_batch_size=2)
    assert r.values["measured_step_s"] == 1.2 and "dp" not in r.values
    with pytest.raises(PlanError, match="measured_step_s"):
        Plan.from_dict(item)


def test_default_plans_skip_plans_predicted_not_to_fit(monkeypatch):
    """The search's ranked list may hold plans over the HBM; validating them only spends the run
    on out-of-memory errors (seen on a 1×H100), so the default spread takes plans that fit."""
    from types import SimpleNamespace

    import autopar.search as search_mod
    from autopar.validate.run import default_plans

    def pred(mbs, recompute, fits):
        return {"dp": 1, "tp": 1, "pp": 1, "vpp": 1, "micro_batch_size": mbs, "zero": 0,
                "recompute": recompute, "sequence_parallel": False, "schedule": "1f1b", "fits": fits}
    ranked = [pred(4, "none", False), pred(8, "full", False), pred(2, "none", True), pred(1, "none", True)]
    fake = SimpleNamespace(plans=[SimpleNamespace(prediction=p) for p in ranked])
    monkeypatch.setattr(search_mod, "search", lambda *a, **k: fake)
    got = default_plans("gpt2-small", "h100-80g-sxm", 1, 8, count=4)
    assert [p["micro_batch_size"] for p in got] == [2, 1]
