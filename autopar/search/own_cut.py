"""A configuration's own best split as the cut of its re-solves (issue 30, issue 27's search time).

Why: a configuration CP-SAT could not prove at its first budget is solved again (a retry, then
the end-of-search second chance) under the k-th plan's cut. Where the configuration already holds
a real split (a seed's, or one CP-SAT found on the way: ``Frontier.known_splits``) that is
faster than that cut, every split that could change its plan is at most that split's step time:
the retry is cut just above it (``OWN_CUT_MARGIN``). CP-SAT proves a program cut just above its
optimum far sooner than one cut a few per cent higher. DeepSeek-V3-like on 1024 H100, batch 4096
(issue 27's must-show), ZeRO-2 dp256·pp4 mb2 (63 rows; CP-SAT units, quiet core, ``SplitModel``
alone; "-" = unproved in the budget of 5–10 units):

    cut (s)       vpp8: held 13.3535  proved in    vpp6: held 13.5636  proved in
    held exactly                       2.22                              -
    held + 0.3 %  13.40                1.09        13.60                 2.22
    held + 1 %    13.50                1.79        13.70                 4.24
    held + 2 %    13.60                -
    k-th plan     13.81 / 14.04        - / -       13.81 / 14.04         - / 4.31
    uncut                              -                                 2.94

On the search, these two were left unproved by 1.25 + 5 + 10 units (the first solve, the retry and
the second chance, all under the k-th plan's cut), which left the whole top 5 unproved. How long
CP-SAT takes moves several-fold with the cut, either way round (vpp6 in the search, cut at
13.604 s: unproved in 5 units), so the end-of-search second chance of a configuration holding
such a split solves a different program, uncut: the k-th plan's cut cannot prove it out (its split
is under that cut), so the cut's one use there is gone. In the search, vpp6's second chance then
proved 13.5636 s in 2.94 units, and dp512·pp2 vpp11 ZeRO-3's 13.737 s in 3.18 (in a run that
kept the k-th plan's cut, 1.67: uncut is not always the faster, only a different program).

Exact: the cut removes only splits slower than one the configuration already has. If CP-SAT
proves the cut program infeasible, no split beats the one held (up to the program's rounding
slack, the same the k-th plan's cut keeps), so that split is the configuration's optimum and goes
on the heap as its exact plan (``push_own_split``); a split found under the cut is scored as
usual.
"""
from __future__ import annotations

from autopar.search.frontier_keys import _step_to_beat

OWN_CUT_MARGIN = 0.003   # the retry's cut: the held split's step time plus this fraction (table above)


def own_cut(frontier, c, ub: float | None) -> tuple[float | None, tuple | None]:
    """The cut for a re-solve of ``c`` (a configuration in ``frontier.retried``) and the split it
    stands for: ``(cut, stages)``; ``stages`` None where the cut is not its own (the k-th plan's
    ``ub``, or none at all on a second chance of a configuration holding a split under ``ub``)."""
    if c not in frontier.retried or frontier.fixed_stages is not None:
        return ub, None
    held = frontier.known_splits.get(c)
    if held is None:
        return ub, None
    key, stages = held
    step = _step_to_beat(frontier.objective, c, key)
    if step is None or (ub is not None and step >= ub):
        return ub, None
    if c in frontier.second_chances:   # the k-th plan's cut cannot prove it out: uncut (docstring)
        return None, None
    cut = step * (1 + OWN_CUT_MARGIN)
    return (cut if ub is None else min(cut, ub)), stages


def push_own_split(frontier, c, stages) -> None:
    """CP-SAT proved no split of ``c`` beats ``stages`` (the cut of ``own_cut``): score that split
    and put it on the heap as ``c``'s exact plan."""
    from autopar.search.frontier_keys import Candidate
    plan = c.plan(stages)
    pred = frontier._evaluate(plan)
    if frontier._misses_target(pred["step_time_s"]):
        return
    cand = Candidate(c, plan, pred, pred["step_time_s"], "optimal")
    frontier._know(c, frontier.push(c, pred["step_time_s"], 2, cand), stages)
