"""A second chance's entry under the last plan is resolved, and its plan enters the top k.

``Frontier._second_chance`` puts an unproved configuration back at its proved bound, under the
last plan's key; ``Frontier.done`` used to end the search with it still on the heap (GPT 1T at a
20 % stop margin lost its second plan, 66.03 s, and said proved)."""
from __future__ import annotations

import math

from autopar.search.frontier import Candidate, Frontier
from autopar.search.result_order import replace_last_if_better
from autopar.search.space import Config


def _config(dp: int) -> Config:
    return Config(dp=dp, tp=8, pp=16, vpp=4, micro_batch_size=2, zero=2, recompute="none",
                  sequence_parallel=True, schedule="interleaved-1f1b")


def _cand(dp: int, step: float) -> Candidate:
    return Candidate(_config(dp), None, {"step_time_s": step, "memory_bytes": {"total": 1}}, step, "optimal")


def _frontier(top: int) -> Frontier:
    return Frontier(None, objective="step_time", top=top, target_step_time_s=None, fixed_stages=None,
                    solve_limit_s=1.0, deadline=math.inf)


def test_done_waits_for_an_entry_under_the_last_plan():
    f = _frontier(top=2)
    f.results = [_cand(1, 63.5), _cand(2, 69.2)]
    f.push(_config(3), 72.3, 2)
    assert f.done()                   # the next entry sorts after the last plan: done
    f.push(_config(4), 65.6, 1)       # a second chance at its proved bound, under the last plan
    assert not f.done()
    f.pop()
    f.push(_config(5), 69.2 * (1 + 1e-12), 1)   # a tie with the last plan is still looked at
    assert not f.done()


def test_a_plan_under_the_last_one_replaces_it_in_order():
    f = _frontier(top=3)
    f.results = [_cand(1, 63.5), _cand(2, 66.3), _cand(3, 69.2)]
    f._add_result(_cand(4, 66.0))
    assert [r.prediction["step_time_s"] for r in f.results] == [63.5, 66.0, 66.3]
    assert not replace_last_if_better(f.results, _cand(5, 70.0), "step_time")
    assert [r.config.dp for r in f.results] == [1, 4, 2]
