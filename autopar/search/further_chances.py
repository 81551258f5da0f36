"""More chances for a configuration CP-SAT leaves unproved, while the time limit allows (issue 30/27).

Why: a configuration whose split CP-SAT could not prove gets a retry, then one end-of-search
second chance (``Frontier._second_chance``) with a fixed budget. Whether that budget suffices is
the landscape's, not the rule's: after the moemla cost-model change, DeepSeek-V3-like on 1024 H100
(batch 4096, issue 27's must-show) ended NOT proved with dp256·pp4 vpp6 ZeRO-2 mb2 (the 3rd plan,
held split 13.9307 s) unproved by its second chance — cut 0.3 % above the held split, 10
CP-SAT units, its bound stalled at 13.508 s. The same program proves the held split optimal in
11.25 units; the uncut program (the retry's, unproved in 5 units) in 7.34; a cut 5e-6 s higher in
4.39 (``SplitModel`` alone, from scratch, the search's own terms). No fixed budget or cut proves
every landscape, so a rule that does not depend on it keeps going: the configuration gets
another chance, each with twice the budget of the one before and the other of ``own_cut``'s two
programs (uncut, then cut just above the held split, …), up to ``MAX_CHANCES`` in all and never
past the search's deadline (``Frontier.run`` checks it before every solve, and each solve's wall
time is capped by what is left). A configuration proved on its first chance costs nothing more;
the search's answer is still what it was: a budget decides only how soon a proof comes, never
what it proves.
"""
from __future__ import annotations

MAX_CHANCES = 3          # end-of-search chances per unproved configuration: 10, 20, 40 CP-SAT units
CHANCE_GROWTH = 2.0      # each chance's budget over the one before (the second chance's over the retry's)


def chances(frontier, c) -> int:
    """How many end-of-search chances ``c`` has had (0: none)."""
    return frontier.chance_counts.get(c, 0)


def may_have_another(frontier, c) -> bool:
    """Whether ``c`` (unproved) may be solved once more at the end of the search."""
    return chances(frontier, c) < MAX_CHANCES


def count_chance(frontier, c) -> None:
    """``c`` goes back on the heap for one more chance (``Frontier._second_chance``)."""
    frontier.chance_counts[c] = chances(frontier, c) + 1
    frontier.second_chances.add(c)


def budget_factor(frontier, c) -> float:
    """The factor on the retry's budget of ``c``'s next solve: 1 before any chance, then
    ``CHANCE_GROWTH`` to the number of chances (2, 4, 8)."""
    return CHANCE_GROWTH ** chances(frontier, c)


def own_cut_chance(frontier, c) -> bool:
    """Whether this chance of ``c`` is cut at its own held split (``own_cut``): the odd chances
    (the first, the third); the even ones solve the uncut program, as the retry did."""
    return chances(frontier, c) % 2 == 1
