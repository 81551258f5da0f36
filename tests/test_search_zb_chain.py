"""The zero-bubble schedules' chain floor (``autopar.search.zb_chain``, issue 30 zbdef): the
level-0 bound (``Costs.quick_bound``) and the split-independent bound (``Terms.time_lower_bound``)
of interleaved-zb, zb-v and dualpipe-v must stay at most the estimate of every split, on random
row costs, pp 2 and 3, few and many micro-batches; and the chain must be what lifts them where
few micro-batches cross the pipeline."""
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_search_zb_bound import random_configurations

from autopar.search.costs import Costs
from autopar.search.engine import all_splits
from autopar.search.zb_chain import chain_s
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

NEW = ("interleaved-zb", "zb-v", "dualpipe-v")
PROFILE = load_profile("a100-80g-sxm")


def _best(table, c, gpus, batch) -> float:
    """The least estimated step time over every split of ``c`` (fitting or not)."""
    return min(estimate(table, PROFILE, c.plan(s), gpus, batch).step_time_s
               for s in all_splits(len(table.rows), c.pp * c.vpp))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 31 - 1), schedule=st.sampled_from(NEW))
def test_bounds_with_the_chain_never_exceed_the_best_split(seed, schedule):
    """Both bounds against every split's estimate, on the configurations of fewest and most
    micro-batches of a random table (the chain binds at the first, ``m·T*`` at the second)."""
    rng = random.Random(seed)
    table, gpus, batch, configs = random_configurations(rng, [6, 7, 8], schedule, PROFILE.gpus_per_node)
    if not configs:
        return
    costs = Costs(table, PROFILE, batch)
    by_m = sorted(configs, key=costs.m)
    for c in {by_m[0], by_m[-1], rng.choice(configs)}:
        best = _best(table, c, gpus, batch)
        quick, lb = costs.quick_bound(c), costs.terms(c).time_lower_bound()
        assert quick <= best * (1 + 1e-9), (seed, c, quick, best)
        assert lb <= best * (1 + 1e-9), (seed, c, lb, best)


@pytest.mark.parametrize("schedule", NEW[:2])
def test_the_chain_lifts_the_bounds_of_few_micro_batches(schedule):
    """At one or two micro-batches per step the W passes fill no bubble: the chain floor is above
    the old ``m·T* + O`` bound (so it is what decides), and still under the best split. (Not
    dualpipe-v: torch runs it with m ≥ 2·pp, where ``m·T*`` is at least twice the chain.)"""
    rng = random.Random(7 + NEW.index(schedule))
    lifted = 0
    for _ in range(6):
        table, gpus, batch, configs = random_configurations(rng, [6, 7, 8], schedule, PROFILE.gpus_per_node)
        costs = Costs(table, PROFILE, batch)
        few = [c for c in configs if costs.m(c) <= 2 and c.pp * c.vpp <= len(table.rows)]
        for c in few[:1]:
            terms = costs.terms(c)
            best = _best(table, c, gpus, batch)
            old = terms.m * max(terms.rank_time_bound(), float(terms.coef.row_s.sum()) / terms.pp)
            assert terms.time_lower_bound() <= best * (1 + 1e-9)
            lifted += chain_s(terms) > old * 1.05 and terms.time_lower_bound() >= chain_s(terms)
    assert lifted >= 1
