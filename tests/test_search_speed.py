"""Issue 30's search-speed pieces: the seeded first plans, the deterministic solve budget and the
affine-run test of the split program (``autopar.search.incumbents``, ``solver_limits``,
``split_model._kink_counts``)."""
from __future__ import annotations

import random

import numpy as np
from synthetic_tables import gpt_table

from autopar.search.costs import Costs
from autopar.search.engine import enumerate_plans, run_search
from autopar.search.frontier import Frontier
from autopar.search.incumbents import incumbent_split
from autopar.search.solver_limits import DET_PER_SECOND, set_limits
from autopar.search.space import Shape, configurations
from autopar.search.split_model import _kink_counts
from costmodels.profiles.hardware_files import load_profile


def test_kink_counts_find_exactly_the_affine_runs():
    """``table`` is affine on [lo, hi] iff no second difference inside is non-zero — the same
    answer as the np.diff test it replaced, on random integer tables."""
    rng = random.Random(3)
    for _ in range(300):
        t = [int(x) for x in np.cumsum([rng.choice([0, 1, 2]) for _ in range(rng.randint(1, 10))])]
        k = _kink_counts(t)
        for lo in range(len(t)):
            for hi in range(lo, len(t)):
                seg = t[lo:hi + 1]
                affine = len(seg) < 3 or not np.any(np.diff(seg) != seg[1] - seg[0])
                assert affine == (hi - lo < 2 or k[hi - 1] == k[lo]), (t, lo, hi)


def test_solve_budget_is_deterministic_time_capped_by_the_wall():
    from ortools.sat.python import cp_model
    s = cp_model.CpSolver()
    set_limits(s, 2.0, wall_limit_s=7.0)
    assert s.parameters.max_deterministic_time == 2.0 * DET_PER_SECOND
    assert s.parameters.max_time_in_seconds == 7.0
    set_limits(s, 2.0)   # no deadline: a cap of many budgets, so a busy machine still finishes
    assert s.parameters.max_time_in_seconds > 2.0


def test_a_configurations_first_plan_is_scored_before_its_first_solve():
    """``Frontier._seed``: the min-max split of the row times, scored by the evaluator, is a
    known plan of the configuration (an upper bound on its optimum) before CP-SAT runs."""
    table = gpt_table(8, 256, 4, 5000, 128, model="gpt-8")
    prof = load_profile("a100-80g-sxm")
    costs = Costs(table, prof, 16)
    c = next(c for c in configurations(Shape.of(table), 4, 16, prof.gpus_per_node, {"pp": 2, "tp": 1})
             if c.schedule == "1f1b")
    fr = Frontier(costs, objective="step_time", top=1, target_step_time_s=None, fixed_stages=None,
                  solve_limit_s=2.0, deadline=float("inf"))
    terms = costs.terms(c)
    fr._seed(c, terms)
    pred = costs.evaluate(c.plan(incumbent_split(terms)))
    assert fr.known[c] == (pred["step_time_s"],)
    # and the search with seeds still returns the enumeration's best
    res = run_search(costs, gpus=4, global_batch=16, top=3, fix={"tp": 1, "pp": 2, "recompute": "none"})
    best = enumerate_plans(costs, gpus=4, global_batch=16, fix={"tp": 1, "pp": 2, "recompute": "none"})
    assert res.optimal
    assert [round(p.prediction["step_time_s"], 12) for p in res.plans] == \
        [round(p[2]["step_time_s"], 12) for p in best[:3]]
