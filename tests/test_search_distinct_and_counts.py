"""The top-k shows distinct layouts, and a GPU count no plan can use whole still gets an answer.

* Two plans that differ only in their ZeRO stage at the same step time are one plan of the top-k
  (the one with less memory): on a small GPT on 8 CPU ranks ZeRO-1 and ZeRO-2 tie (both reduce
  once per step), and the search used to list both as #1 and #2.
* 11 GPUs (a prime above the table's 8 rows, with a batch of 16) admit no dp·tp·pp: the search
  plans on 10 (the nearest count below), names 12 above, and says so in the plans file.
"""
from synthetic_tables import tiny_gpt

from autopar.search import search
from autopar.search.costs import Costs
from autopar.search.frontier import same_but_zero
from costmodels.contracts.errors import PlanError
from costmodels.profiles.hardware_files import load_profile


def test_zero_stage_ties_are_shown_once_with_less_memory():
    table, profile = tiny_gpt(layers=6), load_profile("cpu-2core")
    res = search("tiny", "cpu-2core", 8, 16, top=3, table=table, time_limit_s=120)
    plans = res.plans
    assert res.stats.ties_merged >= 1 and len(plans) == 3
    assert not any(same_but_zero(a, b) for i, a in enumerate(plans) for b in plans[i + 1:])
    # every plan shown has no ZeRO twin of the same step time that needs less memory
    costs = Costs(table, profile, 16)
    for cand in plans:
        for z in {1, 2, 3} - {cand.plan.zero}:
            try:
                twin = costs.evaluate(cand.plan.with_(zero=z))
            except PlanError:   # a stage the runtime does not run this plan with (HSDP needs 2/3)
                continue
            if abs(twin["step_time_s"] - cand.prediction["step_time_s"]) <= 1e-9 * twin["step_time_s"]:
                assert cand.prediction["memory_bytes"]["total"] <= twin["memory_bytes"]["total"], (cand.plan, z)


def test_gpu_count_no_plan_can_use_is_planned_on_the_nearest_below():
    res = search("tiny", "cpu-2core", 11, 16, top=2, table=tiny_gpt(layers=6), time_limit_s=120)
    assert res.nearest_gpu_counts == (10, 12)
    assert all(p.plan.world_size == 10 for p in res.plans) and res.plans
    pf = res.plans_file()
    assert pf["gpus"] == 11 and pf["search"]["nearest_gpu_counts"] == [10, 12]
    assert "planned on 10 GPUs" in pf["search"]["gpu_count_note"] and "leaving 1 idle" in pf["search"]["gpu_count_note"]
