"""A configuration its end-of-search second chance leaves unproved gets more chances, each longer.

DeepSeek-V3-like on 1024 H100 (after moemla) ended NOT proved: dp256·pp4 vpp6 ZeRO-2 was unproved
by its one second chance (10 CP-SAT units), which 20 would have proved (``further_chances``).
Here the same happens on a synthetic GPT at a small per-solve budget: the first solve, the retry
and the second chance stall, the next chance proves it, and the plan is the one a generous budget
finds."""
from __future__ import annotations

import math

import pytest
from synthetic_tables import gpt_table

import autopar.search.further_chances as further_chances
from autopar.search.costs import Costs
from autopar.search.frontier import Frontier
from autopar.search.space import Config
from costmodels.profiles.hardware_files import load_profile


def _search(costs, c: Config, solve_limit_s: float) -> Frontier:
    f = Frontier(costs, objective="step_time", top=1, target_step_time_s=None, fixed_stages=None,
                 solve_limit_s=solve_limit_s, deadline=math.inf)
    f.offer(c)
    assert f.run(lambda describe: None)
    return f


def test_an_unproved_second_chance_gets_another_longer_chance(monkeypatch):
    t = gpt_table(24, 1024, 16, 32000, 1024, model="gpt:layers=24,hidden=1024,heads=16,vocab=32000,seq=1024")
    costs = Costs(t, load_profile("a100-80g-sxm"), 256)
    c = Config(dp=2, tp=1, pp=4, vpp=3, micro_batch_size=1, zero=1, recompute="none", sequence_parallel=False,
               schedule="interleaved-1f1b")
    from autopar.search import busiest_rank
    # the premise is a program CP-SAT cannot prove at a 0.01 s budget; with the whole-block floors
    # (busiest_rank) it proves this one at once, so they are off in this test of the chances
    monkeypatch.setattr(busiest_rank, "dense", lambda terms: False)
    reference = _search(costs, c, 2.0)     # one solve proves it
    assert reference.proved() and reference.stats.solved == 1
    best_s = reference.results[0].prediction["step_time_s"]

    monkeypatch.setattr(further_chances, "MAX_CHANCES", 1)   # the rule before: one second chance
    once = _search(costs, c, 0.01)
    assert not once.proved() and once.stats.not_proved == 1 and once.stats.solved == 3

    monkeypatch.undo()
    monkeypatch.setattr(busiest_rank, "dense", lambda terms: False)
    more = _search(costs, c, 0.01)
    assert more.proved() and more.stats.not_proved == 0 and more.stats.solved > 3
    assert further_chances.chances(more, c) == more.stats.solved - 2 <= further_chances.MAX_CHANCES
    assert [r.config for r in more.results] == [c]
    assert more.results[0].prediction["step_time_s"] == pytest.approx(best_s, rel=1e-9)


def test_the_chances_alternate_the_cut_and_double_the_budget():
    f = Frontier(None, objective="step_time", top=1, target_step_time_s=None, fixed_stages=None,
                 solve_limit_s=2.0, deadline=math.inf)
    c = Config(dp=2, tp=1, pp=4, vpp=3, micro_batch_size=1, zero=1, recompute="none", sequence_parallel=False,
               schedule="interleaved-1f1b")
    seen = []
    while further_chances.may_have_another(f, c):
        further_chances.count_chance(f, c)
        seen.append((further_chances.budget_factor(f, c), further_chances.own_cut_chance(f, c)))
    assert seen == [(2.0, True), (4.0, False), (8.0, True)][:further_chances.MAX_CHANCES]
    assert c in f.second_chances
