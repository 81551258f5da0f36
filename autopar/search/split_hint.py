"""A configuration's first further chance searches for the bound, from the split it holds (issue 30/27).

Why: a configuration CP-SAT left unproved at its retry gets end-of-search chances
(``further_chances``). What they lack is the lower bound, not a split: DeepSeek-V3-like on 1024
H100 (batch 4096, issue 27's must-show), dp256·pp4 vpp6 ZeRO-2 mb2 finds its held split
(13.9307 s) at once but its bound stalls near 13.50 s under CP-SAT's default search (the second
chance's 10 units; uncut it proves in 7.34). A hint of the held split alone changes nothing there
(6 units, same bound 13.4964, same split); CP-SAT's lower-bound tree search
(``optimize_with_lb_tree_search``, one worker) proves it in 2.04 units uncut, 2.25 cut 0.3 % above
the held split (``SplitModel`` alone, the search's own terms, measured by ``/tmp/hint/exp4.py``).
But that search is weak at finding splits, and on other programs it is the slower one: dp512·pp2
ZeRO-3 mb4 vpp11 uncut, default proved in 2.93 units, tree search unproved at 5; vpp16 under
the k-th plan's cut (14.3086 s) 2.10 vs unproved at 5. Used on every re-solve it cost the
DeepSeek search its proof order (the ZeRO-3 retries stalled); so it is one more program in the
chances' alternation: the odd chances (the first, the third: ``own_cut``'s cut just above the
held split) hint the held split and search for the bound; the retry and the even chances run as
before. Where the default search proves a configuration at its retry, nothing changes.

Measured (the search through the Python API, load 1.8-4, ``/tmp/hint/ds.py``): DeepSeek-V3-like
proved, the same top 5, 25 -> 24 CP-SAT solves, 56.6 -> 40.5 units, 115.5 -> 95.4 s CPU (vpp8's
first chance 1.87 -> 0.81 units, vpp6's 10.0 unproved + 7.34 -> 2.25 proved). The dense cases
have no further chances and are unchanged.

Exact: a hint and a search strategy decide only how soon CP-SAT proves, never what: the program,
its cut and its rounding slack are those of ``own_cut``.
"""

from __future__ import annotations


def bound_search_chance(frontier, c) -> bool:
    """Whether this solve of ``c`` is an odd end-of-search chance (``further_chances``)."""
    from autopar.search.further_chances import chances
    return chances(frontier, c) % 2 == 1


def held_split(frontier, c):
    """The split ``c`` holds where this solve of it searches for the bound (module docstring),
    else None."""
    if c not in frontier.retried or frontier.fixed_stages is not None or not bound_search_chance(frontier, c):
        return None
    held = frontier.known_splits.get(c)
    return None if held is None else held[1]


def add_held_hint(model) -> None:
    """Hint ``model``'s cut variables with ``model.hint_stages`` (a split of the same rows)."""
    stages = model.hint_stages
    if len(stages) != model.S:
        return
    for v in range(1, model.S):
        model.model.AddHint(model.x[v], int(stages[v][0]))


def prove_from_held(model, solver) -> None:
    """Where ``model`` starts from a held split, CP-SAT's one worker searches for the lower bound."""
    if model.hint_stages is not None and model.sched is None:
        solver.parameters.optimize_with_lb_tree_search = True
