"""A configuration's first further chance starts from its held split and searches for the bound.

``split_hint``: the odd end-of-search chances hint CP-SAT with the split the configuration holds
and run its lower-bound tree search; the retry and the even chances run as before. Either way
the plan the re-solve ends with is the enumerated optimum (the search stays exact)."""
from __future__ import annotations

import math

import pytest
from synthetic_tables import gpt_table

from autopar.search.costs import Costs
from autopar.search.engine import all_splits
from autopar.search.frontier import Frontier
from autopar.search.frontier_keys import objective_key
from autopar.search.further_chances import count_chance
from autopar.search.space import Config
from costmodels.profiles.hardware_files import load_profile


@pytest.mark.parametrize("chances", [0, 1, 2])
def test_the_first_chance_starts_from_the_held_split_and_ends_at_the_optimum(monkeypatch, chances):
    import autopar.search.split_model as split_model
    t = gpt_table(8, 64, 4, 256, 64, model="gpt:layers=8,hidden=64,heads=4,vocab=256,seq=64")
    costs = Costs(t, load_profile("a100-80g-sxm"), 16)
    c = Config(dp=2, tp=1, pp=2, vpp=2, micro_batch_size=1, zero=1, recompute="none", sequence_parallel=False,
               schedule="interleaved-1f1b")
    terms = costs.terms(c)
    scored = [(costs.evaluate(c.plan(st)), st) for st in all_splits(terms.n, terms.n_virtual)]
    scored = sorted((p["step_time_s"], st) for p, st in scored if p["fits"])
    f = Frontier(costs, objective="step_time", top=5, target_step_time_s=None, fixed_stages=None,
                 solve_limit_s=2.0, deadline=math.inf)
    f.offered.add(c)
    f.retried.add(c)
    for _ in range(chances):
        count_chance(f, c)
    f.seeded.add(c)
    step, held = scored[-1]           # the slowest split that fits: the optimum is elsewhere
    f._know(c, objective_key("step_time", c, step), held)
    seen = []

    class Spy(split_model.SplitModel):
        def solve(self):
            res = super().solve()
            seen.append((self.hint_stages, res.status))
            return res
    monkeypatch.setattr(split_model, "SplitModel", Spy)
    import autopar.search.split_solve as split_solve
    searched = []
    real = split_solve.stop_when_bound_passes

    def spy_stop(model, solver):
        searched.append(solver.parameters.optimize_with_lb_tree_search)
        return real(model, solver)
    monkeypatch.setattr(split_solve, "stop_when_bound_passes", spy_stop)
    f._split(c, terms)
    assert seen[0][0] == (held if chances == 1 else None)
    assert searched[0] is (chances == 1)
    level, c2, cand = f.pop()
    assert level == 2 and c2 == c and not f.heap
    assert cand.prediction["step_time_s"] == pytest.approx(scored[0][0], rel=1e-9)
