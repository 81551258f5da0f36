"""A configuration's own best split as the cut of its re-solves (issue 30, issue 27's search time).

Why: a configuration CP-SAT could not prove at its first budget is solved again (a retry, then
the end-of-search second chance), both under the k-th plan's cut before this module. Where the
configuration already holds a real split (a seed's, or one CP-SAT found on the way:
``Frontier.known_splits``) faster than that cut, the cut cannot prove it out (its split is under
it): the cut's one use there is gone, and what is left is proving the configuration's own
optimum. How long CP-SAT takes for that moves several-fold with the cut, either way round, so the
two re-solves are two different programs, not one program twice: the retry is uncut, the second
chance is cut just above the held split (``OWN_CUT_MARGIN``; a further chance, where the second
left it unproved, takes the other program: ``further_chances``). DeepSeek-V3-like on 1024 H100,
batch 4096 (issue 27's must-show), ZeRO-2 dp256·pp4 mb2 (63 rows), CP-SAT units for the proof of
``SplitModel`` alone ("-": unproved in 5–10 units):

    cut (s)       vpp8: held 13.3535  proved in    vpp6: held 13.5636  proved in
    held exactly                       2.22                              -
    held + 0.3 %  13.40                1.09        13.60                 2.22
    held + 1 %    13.50                1.79        13.70                 4.24
    held + 2 %    13.60                -
    k-th plan     13.81 / 14.04        - / -       13.81 / 14.04         - / 4.31
    uncut                              -                                 2.94

With the k-th plan's cut throughout (1.25 + 5 + 10 units), both stayed unproved and so did the
whole top 5. In the search (trace of CP-SAT units): retry own-cut / second chance uncut proved
all five plans in 39.9 units (vpp6's own cut at 13.604 s stalled 5 units, dp512·pp2 vpp11
ZeRO-3's at 14.011 s too); retry uncut / second chance own-cut (this module) in 34.8 units, only
vpp8's uncut retry stalling (5 units) before its own cut proved it (1.03).

Exact: the cut removes only splits slower than one the configuration already has. If CP-SAT
proves the cut program infeasible, no split beats the one held (up to the program's rounding
slack, the same the k-th plan's cut keeps), so that split is the configuration's optimum and goes
on the heap as its exact plan (``push_own_split``); a split found under the cut is scored as
usual.
"""
from __future__ import annotations

from autopar.search.frontier_keys import _step_to_beat

OWN_CUT_MARGIN = 0.003   # the second chance's cut: the held split's step time plus this fraction (table)


def own_cut(frontier, c, ub: float | None) -> tuple[float | None, tuple | None]:
    """The cut for a re-solve of ``c`` (a configuration in ``frontier.retried``) and the split it
    stands for: ``(cut, stages)``; ``stages`` None where the cut is not its own (the k-th plan's
    ``ub``, or none at all on the retry of a configuration holding a split under ``ub``)."""
    if c not in frontier.retried or frontier.fixed_stages is not None:
        return ub, None
    held = frontier.known_splits.get(c)
    if held is None:
        return ub, None
    key, stages = held
    step = _step_to_beat(frontier.objective, c, key)
    if step is None or (ub is not None and step >= ub):
        return ub, None
    from autopar.search.further_chances import own_cut_chance
    if not own_cut_chance(frontier, c):   # the retry (and the even further chances): uncut (docstring)
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
