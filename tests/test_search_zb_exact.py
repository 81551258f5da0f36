"""The zero-bubble schedules' exact split (``autopar.search.zb_exact``): its step time of a split is
the estimate's, and its branch-and-bound returns a split whose estimate is the best of every
split, on random row costs, for every split-backward schedule; a cut under the optimum leaves
it nothing to return."""
import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from test_search_zb_bound import random_configurations

from autopar.search.costs import Costs
from autopar.search.engine import all_splits
from autopar.search.zb_exact import ZbBranchAndBound
from autopar.search.zb_memory import RankMemory
from autopar.search.zb_stage_costs import StageCosts
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

NEW = ("interleaved-zb", "zb-v", "dualpipe-v")
PROFILE = load_profile("a100-80g-sxm")


def _case(seed: int):
    """A random small table, schedule, pp and configuration (runtime without host overheads, so
    that ZeRO-3's per-row gathers and the dp sync's split terms both occur), on a GPU whose
    memory lets only some of the splits fit (between the least and most loaded split's peak)."""
    rng = random.Random(seed)
    schedule = rng.choice(NEW)
    table, gpus, batch, configs = random_configurations(rng, [6, 7, 8, 9], schedule, PROFILE.gpus_per_node)
    c = rng.choice(configs)
    splits = list(all_splits(len(table.rows), c.pp * c.vpp))
    peaks = sorted(estimate(table, PROFILE, c.plan(st), gpus, batch).memory_bytes["total"] for st in splits)
    prof = dataclasses.replace(PROFILE, hbm_bytes=peaks[rng.randrange(len(peaks))] + 1.0)
    return table, gpus, batch, c, Costs(table, prof, batch).terms(c), prof, splits


@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_branch_and_bound_is_the_best_split_under_the_estimate(seed):
    """Against every split scored by the estimate: the step time of each is the estimate's, and
    the branch-and-bound's split is the best of those that fit (its memory prune never drops
    one that does)."""
    table, gpus, batch, c, terms, prof, splits = _case(seed)
    n = len(table.rows)
    sc = StageCosts(terms)
    scored = {}
    for stages in splits:
        est = estimate(table, prof, c.plan(stages), gpus, batch)
        mine = sc.step_time([a for a, _ in stages] + [n])
        assert abs(mine - est.step_time_s) <= 1e-9 * est.step_time_s, (f"seed {seed}", c, stages, mine, est)
        scored[stages] = est
    best = min(e.step_time_s for e in scored.values() if e.fits)
    memory = RankMemory(table, prof, c.plan(splits[0]), terms.m)
    bb = ZbBranchAndBound(terms, fits=lambda stages: scored[stages].fits, memory=memory)
    step, stages = bb.solve()
    assert bb.complete and scored[stages].fits
    got = scored[stages].step_time_s
    assert abs(got - best) <= 1e-9 * best and abs(step - best) <= 1e-9 * best, (f"seed {seed}", c, got, best)
    # a cut under the optimum: no split to return; at the optimum: the optimum
    fits = lambda stages: scored[stages].fits  # noqa: E731
    assert ZbBranchAndBound(terms, upper_bound_s=best * (1 - 1e-6), fits=fits, memory=memory).solve() is None
    at = ZbBranchAndBound(terms, upper_bound_s=best, fits=fits, memory=memory).solve()
    assert at is not None and abs(at[0] - best) <= 1e-9 * best, f"seed {seed}"
