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

``skip_load_probing`` (later, engineer "hint"): the probing itself is skipped
(``cp_model_probing_level`` 0) on the programs of the dense schedules. On one program it had made
a solve slower (above), and program by program it goes either way (DeepSeek-V3-like, the search's
own terms and cuts, ``SplitModel`` alone, units default -> level 0: dp512·pp2 ZeRO-3 mb4 vpp6
3.48 -> 2.61, vpp16 2.10 -> 1.46, vpp7 1.78 -> 1.60, vpp5 1.03 -> 0.01, vpp11 2.81 -> 4.58, vpp8
1.93 -> 2.65; dp256·pp4 ZeRO-2 mb2 vpp8 at its own cut 1.87 -> 1.80), but over the whole search
the first solves no longer spend their budget probing, and the configurations whose proofs
stalled (dp256·pp4 vpp6 ZeRO-2: uncut 7.34 -> 0.57 units, own cut 11.25 -> 0.78) prove:
DeepSeek-V3-like on 1024 H100 (batch 4096) proved, the same top 5, 25 -> 23 CP-SAT solves,
56.6 -> 24.6 units, 43.9 s CPU at load 1.8 (main: 115.5 s at load 3; level 1 gave the same
units as level 0). The dense cases' units are unchanged (gpt3-175b 0.22, GPT 1T 1.56;
llama3-405b 0.10 -> 0.13). The zero-bubble op-graph programs keep CP-SAT's default: skipping it
there changed nothing (pinned zb-v, gpt3-175b on 1024 A100: 7.19 units either way, 47.4 / 49.0 s
CPU at load 0.8).

Tried and left out (same measurements): a solution hint of the split a re-solve's configuration
already holds changed nothing (vpp6 ZeRO-2, 6 units: same bound, same split; CP-SAT finds that
split at once, the bound is what stalls); CP-SAT's lower-bound tree search
(``optimize_with_lb_tree_search``) proved vpp6 in 2.04 units where the default probing took 7.34,
but with the probing skipped the default is faster (0.57), and on dp512·pp2 ZeRO-3 it is slower
either way (vpp11 uncut unproved at 5 units vs 2.93): with it on the odd further chances the
whole search took 26.6 units, without 24.6.
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


def skip_load_probing(model, solver) -> None:
    """No load-time probing for the dense schedules' time programs (module docstring)."""
    if model.sched is None:
        solver.parameters.cp_model_probing_level = 0
