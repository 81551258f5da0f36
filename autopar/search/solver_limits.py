"""How long one CP-SAT solve of the search may run: in CP-SAT's deterministic time, not seconds.

Why: a split solve's budget (``--solve-limit``-like ``solve_limit_s``, 2 s by default, five times
that on a retry) was wall time, so on a busy machine the same solve ran out of its budget
before its proof and the search came back ``optimal: false`` where a quiet machine proves it
(gpt3-175b at load average 20 on 2 cores: a dp64·tp2·pp8 interleaved split took 1.06 s wall for
0.09 s of CPU). CP-SAT's deterministic time counts the solver's work, whatever the load, so the
same search proves the same configurations on either machine. ``DET_PER_SECOND`` converts the
budget: measured on this repository's split programs, CP-SAT does 0.38–0.67 deterministic units
per CPU second (gpt3-175b, 1024 A100: interleaved vpp 12 0.034 / 0.09 s, vpp 6 0.12 / 0.18 s,
zb-v 1.83 / 3.03 s), so a 2 s budget is about 2 s of a quiet core's work. The wall clock still
caps a solve (``wall_limit_s``: the search's ``--time-limit`` deadline, or ``LOAD_ALLOWANCE``
times the budget), so a search never runs past its deadline.
"""
from __future__ import annotations

DET_PER_SECOND = 0.5     # CP-SAT deterministic units per second of a quiet core (docstring)
LOAD_ALLOWANCE = 20.0    # wall cap without a deadline: the budget × this


def set_limits(solver, budget_s: float, wall_limit_s: float | None = None) -> None:
    """Give ``solver`` (a ``CpSolver``) a budget of ``budget_s`` seconds of solver work and a
    wall-clock cap (module docstring)."""
    solver.parameters.max_deterministic_time = max(0.01, budget_s * DET_PER_SECOND)
    cap = budget_s * LOAD_ALLOWANCE if wall_limit_s is None else wall_limit_s
    solver.parameters.max_time_in_seconds = max(0.05, cap)
