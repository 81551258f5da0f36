"""The search over the zero-bubble schedules (interleaved-zb, zb-v, dualpipe-v): the split program
mirrors the estimate's simulated pipeline time and its memory at every peak moment (fixed splits,
both programs of ``autopar.search.split_schedules``), the bounds the best-first search prunes with
hold for every split, and CP-SAT's best equals exhaustive enumeration on small spaces."""
import dataclasses
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_tables import gpt_table, llama_table, no_host_runtime

from autopar.search.costs import Costs
from autopar.search.engine import all_splits, enumerate_plans, run_search
from autopar.search.space import Shape, configurations
from autopar.search.split_model import SplitModel, time_unit
from autopar.search.split_schedules import periods
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

NEW = ("interleaved-zb", "zb-v", "dualpipe-v")


def _random_split(rng, n, S):
    cuts = sorted(rng.sample(range(1, n), S - 1))
    b = [0] + cuts + [n]
    return tuple((b[i], b[i + 1]) for i in range(S))


@pytest.mark.parametrize("schedule", NEW)
def test_fixed_split_objective_and_memory_equal_estimate(schedule):
    """For fixed (uneven, random) split points: the exact program's objective is the estimate's
    step time, the fast program's never above it (equal where the steady state is rank-bound),
    and the memory program's optimum is the estimate's most loaded GPU — under V placement too,
    across ZeRO stages, recompute and micro-batch counts on both sides of the extrapolation."""
    table = llama_table(16, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")
    rng = random.Random(7)
    extrapolated = simulated = 0
    for hw, gpus, batch, runtime in (("h100-80g-sxm", 64, 256, "autopar"), ("a100-80g-sxm", 16, 64, "fsdp")):
        prof = load_profile(hw)
        costs = Costs(table, prof, batch)
        configs = list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node,
                                      fix={"schedule": schedule, "runtime": runtime}))
        assert configs
        for c in rng.sample(configs, min(8, len(configs))):
            stages = _random_split(rng, len(table.rows), c.pp * c.vpp)
            est = estimate(table, prof, c.plan(stages), gpus, batch)
            terms = costs.terms(c)
            roomy = dataclasses.replace(terms, hbm=float(2 ** 60))
            tol = time_unit(terms.time_lower_bound()) * len(table.rows) * 4 * (terms.m + 2)
            fast = SplitModel(roomy, fixed_stages=stages).solve()
            exact = SplitModel(roomy, fixed_stages=stages, exact=True).solve()
            assert fast.status == exact.status == "optimal" and exact.stages == stages
            assert abs(exact.objective_s - est.step_time_s) <= tol, (c, exact.objective_s, est.step_time_s)
            assert fast.objective_s <= est.step_time_s + tol
            assert terms.time_lower_bound() <= est.step_time_s * (1 + 1e-9)
            assert costs.quick_bound(c) <= est.step_time_s * (1 + 1e-9)
            mem = SplitModel(terms, objective="memory", fixed_stages=stages).solve()
            total = est.memory_bytes["total"]
            assert total - 1 <= mem.objective_s <= total + 4 * len(table.rows) + 8, (c, mem.objective_s, total)
            if periods(c.schedule, c.pp, terms.m):
                extrapolated += 1
            else:
                simulated += 1
    assert extrapolated and simulated   # both forms of the estimate were exercised


@pytest.mark.parametrize("schedule, pp", [("zb-v", 2), ("dualpipe-v", 2), ("interleaved-zb", 2), ("zb-v", 3)])
def test_split_is_the_best_of_every_split_and_bounds_hold(schedule, pp):
    """Against every split of a 10-block table scored by the estimate: CP-SAT's optimum (through
    the search's two-program solve) is the enumeration's, and no split beats the bounds."""
    table = gpt_table(10, 256, 4, 5000, 128, model="gpt-10")
    prof = load_profile("a100-80g-sxm")
    batch = 12 * pp
    costs = Costs(table, prof, batch)
    configs = [c for c in configurations(Shape.of(table), pp, batch, prof.gpus_per_node,
                                         fix={"recompute": "none", "tp": 1, "pp": pp, "schedule": schedule,
                                              "micro_batch_size": 1, "runtime": no_host_runtime()})]
    assert configs
    for c in configs[:2]:
        best = min(estimate(table, prof, c.plan(st_), pp, batch).step_time_s
                   for st_ in all_splits(len(table.rows), c.pp * c.vpp))
        terms = costs.terms(c)
        assert terms.time_lower_bound() <= best * (1 + 1e-9)
        assert costs.quick_bound(c) <= best * (1 + 1e-9)
        res = run_search(costs, gpus=pp, global_batch=batch, top=1,
                         fix={"schedule": schedule, "vpp": c.vpp, "recompute": "none", "tp": 1,
                              "micro_batch_size": 1, "zero": 0, "runtime": no_host_runtime()})
        assert res.optimal
        assert res.plans[0].prediction["step_time_s"] == pytest.approx(best, rel=1e-9)


spaces = st.fixed_dictionaries({
    "layers": st.sampled_from([4, 6]),
    "hidden": st.sampled_from([32, 64]),
    "heads": st.sampled_from([2, 4]),
    "seq": st.sampled_from([16, 64]),
    "gpus": st.sampled_from([2, 4]),
    "batch": st.sampled_from([4, 8, 16]),
    "hbm_fraction": st.sampled_from([0.3, 0.6, 2.0]),
    "schedule": st.sampled_from(NEW),
})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spaces)
def test_search_equals_enumeration_for_each_new_schedule(s):
    """Pinned to one new schedule (every configuration × every split through the estimate):
    the search's best and top-k equal the enumeration's, or both find nothing."""
    from costmodels.contracts.plan import Plan
    t = gpt_table(s["layers"], s["hidden"], s["heads"], 256, s["seq"], tied=True,
                  model=f"gpt:layers={s['layers']},hidden={s['hidden']},heads={s['heads']},vocab=256,seq={s['seq']}")
    base = load_profile("a100-80g-sxm")
    serial = estimate(t, dataclasses.replace(base, hbm_bytes=1e15), Plan(), 1, s["batch"]).memory_bytes["total"]
    prof = dataclasses.replace(base, name="tiny-test", hbm_bytes=s["hbm_fraction"] * serial,
                               memory_reserve_bytes=1000.0)
    costs = Costs(t, prof, s["batch"])
    fix = {"schedule": s["schedule"]}
    brute = enumerate_plans(costs, gpus=s["gpus"], global_batch=s["batch"], fix=fix)
    if not brute:
        return
    res = run_search(costs, gpus=s["gpus"], global_batch=s["batch"], fix=fix, top=3)
    assert res.optimal
    for cand, (_, _, pred) in zip(res.plans, brute):
        assert cand.plan.schedule == s["schedule"]
        assert cand.prediction["step_time_s"] == pytest.approx(pred["step_time_s"], rel=1e-6)


def test_top_plans_say_what_the_schedule_bought(tmp_path):
    """Each zero-bubble plan returned carries its configuration re-planned under interleaved 1F1B
    (its own best split: no split of that configuration beats it, checked by enumeration) with
    that estimate's bubble and step time; the plans file keeps it for ``autopar explain``, which
    prints both bubbles."""
    from autopar.search.explain import explain_plans, render_explanation
    from costmodels.contracts.plans_file import PlansFile
    table = gpt_table(6, 256, 4, 5000, 128, model="gpt:layers=6,hidden=256,heads=4,vocab=5000,seq=128")
    prof = load_profile("a100-80g-sxm")
    costs = Costs(table, prof, 16)
    res = run_search(costs, gpus=2, global_batch=16, fix={"schedule": "zb-v", "pp": 2, "runtime": no_host_runtime()},
                     top=2)
    for cand in res.plans:
        g = cand.prediction["schedule_gain"]
        base = cand.plan.with_(schedule="interleaved-1f1b")
        got = estimate(table, prof, base.with_(stages=tuple(map(tuple, g["stages"]))), 2, 16)
        assert g["schedule"] == "interleaved-1f1b" and g["vpp"] == 2
        assert g["bubble_s"] == got.breakdown_s["bubble"] and g["step_time_s"] == got.step_time_s
        best = min(e.step_time_s for e in (estimate(table, prof, base.with_(stages=st_), 2, 16)
                                           for st_ in all_splits(len(table.rows), 4)) if e.fits)
        assert g["step_time_s"] == pytest.approx(best, rel=1e-6)
        assert g["bubble_s"] > cand.prediction["breakdown_s"]["bubble"]   # what zb-v removes here
    path = tmp_path / "plans.json"
    PlansFile.read(res.plans_file()).write(str(path))
    text = render_explanation(explain_plans(PlansFile.read(str(path)).check_estimates().to_dict(filled=True)))
    assert "schedule: zb-v: bubble" in text and "under interleaved-1f1b (its own best split) would idle" in text


def test_dualpipe_v_without_enough_micro_batches_says_what_batch_it_needs():
    """llama3-405b on 16384 GPUs at batch 2048: tp ≤ 8 (kv heads) leaves dp·pp ≥ 2048, so no plan
    has the 2·pp micro-batches DualPipeV needs — one line naming the batch that would do."""
    from synthetic_tables import llama3_405b

    from costmodels.contracts.errors import NoFeasiblePlanError
    costs = Costs(llama3_405b(), load_profile("h100-80g-sxm"), 2048)
    with pytest.raises(NoFeasiblePlanError) as e:
        run_search(costs, gpus=16384, global_batch=2048, fix={"schedule": "dualpipe-v"})
    assert "raise the global batch to 4096" in str(e.value) and "\n" not in str(e.value)


def test_a_search_cut_by_its_deadline_still_answers_on_balanced_splits(monkeypatch):
    """The zero-bubble split programs at pp ≥ 8 can outlast --time-limit before any configuration
    is split (gpt3-175b --fix schedule=interleaved-zb did, at 300 s): the search then returns the
    best balanced-split plans, scored exactly by estimate, and says they are not proved."""
    from costmodels.contracts.split import balanced_stages
    table = gpt_table(8, 256, 4, 5000, 128, model="gpt-8")
    prof = load_profile("a100-80g-sxm")
    costs = Costs(table, prof, 16)
    fix = {"schedule": "zb-v", "pp": 2, "runtime": no_host_runtime()}
    # the frontier cut by its deadline before any split (the fallback keeps its share of the limit)
    from autopar.search.frontier import Frontier
    monkeypatch.setattr(Frontier, "run", lambda self, progress: False)
    res = run_search(costs, gpus=4, global_batch=16, top=2, fix=fix, time_limit_s=30.0)
    assert not res.optimal and res.plans
    balanced = []
    for c in configurations(Shape.of(table), 4, 16, prof.gpus_per_node, fix):
        e = estimate(table, prof, c.plan(balanced_stages(table, c.pp * c.vpp)), 4, 16)
        if e.fits:
            balanced.append(e.step_time_s)
    assert [c.prediction["rank"] for c in res.plans] == list(range(1, len(res.plans) + 1))
    assert res.plans_file()["search"]["balanced_fallback"]      # what the CLI prints the note from
    for cand in res.plans:
        assert cand.status == "balanced-fallback" and cand.plan.schedule == "zb-v"
        assert cand.prediction["step_time_s"] == estimate(table, prof, cand.plan, 4, 16).step_time_s
    assert res.plans[0].prediction["step_time_s"] == min(balanced)
