"""A plan the report flags ⚠ (its whole schedule, simulated, is slower than its estimate) is
ranked by the simulated step time — the one the report trusts — not by the estimate it fails."""
from __future__ import annotations

import copy

from synthetic_tables import gpt3_175b

from autopar.report import build
from autopar.report.load import records_of
from autopar.report.timeline import schedule_check
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile


def test_flagged_plan_is_ranked_by_its_simulated_step_time():
    uneven = Plan(dp=16, tp=8, pp=2, vpp=2, schedule="interleaved-1f1b", zero=3, recompute="full",
                  stages=((0, 1), (1, 2), (2, 50), (50, 98)))
    d = estimate(gpt3_175b(), load_profile("a100-80g-sxm"), uneven, 256, 1536).to_dict()
    [flagged] = records_of(d)
    c = schedule_check(flagged)
    assert c.flagged and c.simulated_step_s > c.step_time_s
    other = copy.deepcopy(d)   # a plan between the two: slower than the estimate, faster than simulated
    other.update(recompute="selective", step_time_s=(c.step_time_s + c.simulated_step_s) / 2)
    other.pop("stages_detail", None)
    [steady] = records_of(other)
    rep = build([flagged, steady], one_gpu_time=lambda *k: (None, ""))
    [group] = rep.groups
    assert [r.plan.recompute for r in group] == ["selective", "full"]
    assert "ranked by that simulated step time" in rep.render("html")
