"""A split solve's budget counts CP-SAT's search, not only the probing it does while loading.

CP-SAT 9.15 (one worker, presolve off, as ``split_model`` runs it) probes the Boolean encoding of
the model when it loads it, for up to 1.0 deterministic unit — a cap of its own, not a parameter
(log: ``[Probing] deterministic_time: 1.0001 (limit: 1)``; ``probing_deterministic_time_limit``
and ``inprocessing_probing_dtime`` do not move it, and ``cp_model_probing_level`` 0 or 1 made the
solve slower: 1.82 units). The search's first solve of a configuration has a budget of 2 s ×
``solver_limits.DET_PER_SECOND`` = 1.0 unit, so on a program whose probing reaches the cap the
budget ends before the search starts: the solve returns no split and no bound, and the frontier
solves it again at its retry budget, where the same proof takes 1.02–1.05 units.

Measured on DeepSeek-V3-like, 1024 H100, batch 4096 (the MoE must-show of issue 27): 23 of the
search's 93 CP-SAT solves (23.1 of 92 units, a quarter of the command's CPU time) were such
solves, all on ZeRO-3 interleaved layouts (dp512·pp2, dp256·pp4; 145 variables, 7,861 Booleans
after encoding). ``allow_load_probing`` raises a budget of 1.0 to 1.25 units to 1.25: the solves
that failed in probing alone now finish, and one that fails anyway costs at most 0.25 unit more.
The search stays exact: a budget decides only how soon a proof comes, never what it proves.
"""
from __future__ import annotations

LOAD_PROBING_DET = 1.0   # CP-SAT's cap on its load-time probing (module docstring)
SEARCH_DET = 0.25        # the search after it: the retries above proved in 0.02–0.05 unit
FLOOR_DET = LOAD_PROBING_DET + SEARCH_DET


def allow_load_probing(solver) -> None:
    """Raise ``solver``'s deterministic budget to ``FLOOR_DET`` where it is at least the probing
    cap but under ``FLOOR_DET`` (the search's 2 s first solves, the memory fit checks). A budget
    set smaller on purpose (a test's, a quick probe's) is left as it is."""
    p = solver.parameters
    if LOAD_PROBING_DET <= p.max_deterministic_time < FLOOR_DET:
        p.max_deterministic_time = FLOOR_DET
