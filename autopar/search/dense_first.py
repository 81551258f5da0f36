"""Dense plans first, then the zero-bubble schedules (issue 30, zbdef).

Why: the split-backward schedules' bounds (``m·T* + D + O``, the chain floor of ``zb_chain``)
count no bubble, so best-first pops them ahead of every dense configuration. On gpt3-175b with
``--zero-bubble`` the first ~100 zero-bubble split solves ran with no k-th plan at all (no cut
but the next entry's key), so each configuration whose optimum lay past the next entry was
deferred and solved again, partly, each time it came back up. The dense configurations
(1F1B, interleaved 1F1B, GPipe) are proved in seconds; their top plans are real plans, so once
they are known every zero-bubble solve runs under the k-th of them and one whose best split
cannot enter the top ``k`` is dismissed in one solve.

How, keeping the search exact: ``hold_back`` makes ``Frontier.offer`` keep the split-backward
configurations aside; the frontier runs to its ``top`` dense plans; ``release`` puts those plans
back on the heap at their exact keys (level 2: popped again, in order, as plans), offers the held
configurations at their level-0 bounds, and the same frontier runs on. Every configuration then
waits on the heap under a valid bound or as an exact plan, which is all the ranking argument of
``autopar.search.engine`` asks; only the order of the solves changed.
"""
from __future__ import annotations

from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES


def held(frontier, c) -> bool:
    """Whether ``Frontier.offer`` keeps ``c`` aside (a split-backward configuration, while held)."""
    if getattr(frontier, "held_back", None) is None or c.pp < 2 or c.schedule not in SPLIT_BACKWARD_SCHEDULES:
        return False
    frontier.offered.add(c)
    frontier.held_back.append(c)
    return True


def hold_back(frontier) -> None:
    """From now on ``offer`` keeps the split-backward configurations aside (``release``)."""
    frontier.held_back = []


def release(frontier) -> bool:
    """The dense phase is over: its plans back on the heap as plans, the held configurations
    offered; False where nothing was held (the frontier's run stands as it is)."""
    rest = getattr(frontier, "held_back", None)
    frontier.held_back = None
    if not rest:
        return False
    for cand in frontier.results:
        frontier.push(cand.config, cand.prediction["step_time_s"], 2, cand)
    frontier.results = []
    for c in rest:
        frontier.offer(c)
    return True
