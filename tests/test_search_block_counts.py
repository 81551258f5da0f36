"""The block-count split of a dense interleaved configuration (``autopar.search.block_counts``):
on small configurations whose every split is enumerated, the count program's split is the
enumeration's best, and the frontier takes it without a split program exactly when it reaches
the configuration's bound (a bound it does not reach leaves CP-SAT to run)."""
import itertools
import math

import pytest
from synthetic_tables import gpt_table

from autopar.search import block_counts
from autopar.search.costs import Costs
from autopar.search.frontier import Frontier
from autopar.search.space import Config
from costmodels.profiles.hardware_files import load_profile


def _setup(pp: int, vpp: int):
    t = gpt_table(7, 256, 4, 512, 64, model="gpt:layers=7,hidden=256,heads=4,vocab=512,seq=64")
    costs = Costs(t, load_profile("a100-80g-sxm"), 32)
    c = Config(dp=4, tp=1, pp=pp, vpp=vpp, micro_batch_size=1, zero=1, recompute="none",
               sequence_parallel=False, schedule="interleaved-1f1b")
    terms = costs.terms(c)
    terms.set_block_floor()
    best = math.inf
    for cuts in itertools.combinations(range(1, terms.n), pp * vpp - 1):
        xs = (0, *cuts, terms.n)
        pred = costs.evaluate(c.plan(tuple((xs[i], xs[i + 1]) for i in range(pp * vpp))))
        if pred["fits"]:
            best = min(best, pred["step_time_s"])
    return costs, c, terms, best


def _score(costs, c):
    def score(stages):
        pred = costs.evaluate(c.plan(stages))
        return pred["fits"], pred["step_time_s"]
    return score


@pytest.mark.parametrize("pp,vpp", [(2, 2), (2, 3)])
def test_the_count_split_is_the_best_split(pp, vpp):
    costs, c, terms, best = _setup(pp, vpp)
    assert block_counts.applies(terms)
    reached, found, det = block_counts.count_split(terms, _score(costs, c), terms.time_lower_bound())
    assert found is not None and det > 0
    assert found[0] == pytest.approx(best, rel=1e-12)
    assert reached == (found[0] <= terms.time_lower_bound() * (1 + 1e-9))
    stages = found[1]
    assert len(stages) == pp * vpp and stages[0][0] == 0 and stages[-1][1] == terms.n
    assert all(a < b for a, b in stages) and all(stages[i][1] == stages[i + 1][0] for i in range(len(stages) - 1))


def test_the_frontier_skips_the_split_program_only_at_the_bound():
    # pp 2 · vpp 3: the min-max seed lies 23 % above the optimum, so the count program runs
    costs, c, terms, best = _setup(2, 3)

    def frontier():
        return Frontier(costs, objective="step_time", top=1, target_step_time_s=None, fixed_stages=None,
                        solve_limit_s=2.0, deadline=math.inf)
    terms._bounds["time"] = best * (1 - 1e-6)   # a valid bound the best split does not reach
    f = frontier()
    assert not block_counts.reach_by_counts(f, c, terms)
    assert f.stats.count_splits == 0 and not f.heap
    assert f.known[c][0] == pytest.approx(best, rel=1e-12)   # its split still bounds the k-th plan
    terms._bounds["time"] = best   # the bound at the optimum: that split is the exact plan
    f = frontier()
    assert block_counts.reach_by_counts(f, c, terms)
    assert f.stats.count_splits == 1
    level, c2, cand = f.pop()
    assert level == 2 and c2 == c and cand.status == "optimal"
    assert cand.prediction["step_time_s"] == pytest.approx(best, rel=1e-12)
    assert not block_counts.reach_by_counts(f, c, terms)   # once per configuration
