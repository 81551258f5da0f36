"""The zero-bubble branch-and-bound's node bounds (``zb_node_bounds``) after issue 30's zbpin:
each free stage's least durations from the rows it must hold, its cuts' least p2p, and the dp
sync no backward can hide. A node's bound must stay at most the step time of every split that
completes it (else the search would drop a plan), on random row costs, every split-backward
schedule, pp 2 and 3, with and without ZeRO; and the new terms must be what lifts it."""
import random

import pytest
from test_search_zb_bound import random_configurations

from autopar.search.costs import Costs
from autopar.search.engine import all_splits
from autopar.search.zb_stage_costs import StageCosts
from costmodels.profiles.hardware_files import load_profile

NEW = ("interleaved-zb", "zb-v", "dualpipe-v")
PROFILE = load_profile("a100-80g-sxm")


def _cases(schedule: str, seed: int, count: int):
    """``count`` random (StageCosts, splits as cuts) of ``schedule`` on small random tables."""
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        table, gpus, batch, configs = random_configurations(rng, [6, 7, 8], schedule, PROFILE.gpus_per_node)
        if not configs:
            continue
        c = rng.choice(configs)
        terms = Costs(table, PROFILE, batch).terms(c)
        n = len(table.rows)
        cuts = [[a for a, _ in st] + [n] for st in all_splits(n, c.pp * c.vpp)]
        out.append((StageCosts(terms), cuts, rng))
    return out


@pytest.mark.parametrize("schedule", NEW)
def test_node_bound_never_exceeds_a_completion(schedule):
    """For every split and random subsets of its stages fixed, the node's bound (under a cut just
    above that split's step time) is at most the split's step time."""
    checked = 0
    for sc, splits, rng in _cases(schedule, 3000 + NEW.index(schedule), 3):
        for cuts in splits:
            step = sc.step_time(cuts)
            for _ in range(3):
                fixed = [sc.stage(v, cuts[v], cuts[v + 1]) if rng.random() < 0.5 else None
                         for v in range(sc.S)]
                bound = sc.node_bound(fixed, step * (1 + 1e-6))
                assert bound <= step * (1 + 1e-9), (schedule, cuts, fixed, bound, step)
                checked += 1
    assert checked > 50


def test_least_stages_lift_the_root_bound():
    """At the root (nothing fixed) the per-stage least durations and the exposed dp floor are
    above the old all-rows / hidden-sync floors somewhere, and never above the best split."""
    lifted = 0
    for schedule in NEW:
        for sc, splits, _ in _cases(schedule, 4000 + NEW.index(schedule), 2):
            best = min(sc.step_time(cuts) for cuts in splits)
            root = sc.node_bound([None] * sc.S, float("inf"))
            assert root <= best * (1 + 1e-9)
            # the old floors: one row of any kind; the dp sync as if the backward hid it all
            lifted += (any(f > sc.min_f for f in sc.least_f)
                       or sc._dp_exposed_floor(sc.p_mean) > sc._dp_floor(sc.p_mean))
    assert lifted
