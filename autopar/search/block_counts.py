"""A dense interleaved configuration's split from block counts, before its split program (issue 30).

Why: with the whole-block floors (``busiest_rank``) the level-1 bound of many interleaved
configurations equals their optimum, and ``reached_bound`` ends a CP-SAT solve at the first split
that reaches it, but CP-SAT must first find that split among the ``C(n−1, S−1)`` placements of the
split points. GPT 1T on 3072 A100 (``benchmarks/bench_search_scale.py --case 1``) after the ppzero
merge: 2.78 of its 3.00 CP-SAT units went to dp32·tp8·pp12 vpp 4, whose first solve (1.25 units)
stopped at a 71.40 s split and whose retry found the 70.7077 s optimum after 1.53 more. Its
min-max seed (``incumbents``) does not fit memory's shape (76.9 s): memory forbids even columns.

Where every row but the first and last is one repeated block, a split is a block count ``k_v``
per virtual stage, and the interleaved step the program prices is, up to its edges,
``m·Σ_c C_c + (pp − 1)·max_c C_c + D + O`` with ``C_c ≥ k_v·b + pinned rows + sends`` over the
stages ``v`` of column ``c``, ``D`` and ``O`` growing with the busiest rank's blocks. This module
solves that program in block counts (``S`` small integers, no element constraints; memory per rank
as ``memory_blocks`` writes it, block bytes rounded up so its splits tend to fit) and hands each
split it finds to the evaluator: the first whose estimate is at the configuration's level-1 bound
is its optimum and no split program is built (GPT 1T: vpp 3 / 4 / 6 all reach it).

Exact: the level-1 bound (``Terms.time_lower_bound``) holds for the estimate of every split, so a
split whose estimate (``costmodels.model.estimate``, the search's evaluator) is at or under it, to
the search's tie tolerance (``reached_bound.TIE``), is optimal, as in ``reached_bound``; a split
that does not reach it is only a real plan of the configuration (an incumbent, a valid cut), and
CP-SAT's split program runs as before. Ties stay ties: equal-time splits may differ.
"""
from __future__ import annotations

import math

import numpy as np

COUNT_BUDGET_S = 0.3   # CP-SAT budget (solver_limits seconds) of the count program
# the count program runs only where the min-max seed does not fit or lies this far above the
# level-1 bound: memory's shape (GPT 1T dp32·pp12 vpp 4: seed 8.8 % above, vpp 3: none fits); where
# the bound is merely loose the seed is already the optimum, 0.2–0.8 % above (gpt3-175b's top 5:
# the count program found the seed's step each time, 0.18 units for nothing)
SEED_GAP = 0.02


def applies(terms) -> bool:
    """Dense interleaved programs (not split-backward, not V placement, no per-state memory)."""
    return (terms.pp > 1 and terms.vpp > 1 and not terms.split_backward and not terms.v_placement
            and terms.states is None and terms.n_virtual <= terms.n)


def _block(terms):
    """(L, b): every middle row the same block of time ``b``, else None."""
    co, n = terms.coef, terms.n
    if n < 3:
        return None
    mid = np.round(co.row_s[1:-1], 15)
    vals = np.unique(mid)
    if len(vals) != 1 or vals[0] <= 0:
        return None
    return n - 2, float(vals[0])


def count_program(terms):
    """(model, k) of the block-count program of ``terms`` (module docstring), or None."""
    blk = _block(terms)
    if blk is None:
        return None
    L, b = blk
    from ortools.sat.python import cp_model
    t, co = terms, terms.coef
    pp, v, S = t.pp, t.vpp, t.n_virtual
    last = S - 1
    u = b / 1000.0   # integer unit: a thousandth of a block
    sig, alpha = float(co.state_bytes[1:-1].max()), float(co.act_bytes[1:-1].max())
    send = float(co.cut_p2p_s[1:t.n].max())
    rank_of = {s: r for r in range(pp) for s in t.stages_of(r)}
    room = np.full(pp, float(t.hbm) - float(t.reserve))
    room[rank_of[0]] -= float(co.state_bytes[0]) + t.inflight[0] * float(co.act_bytes[0])
    room[rank_of[last]] -= float(co.state_bytes[-1]) + t.inflight[last] * float(co.act_bytes[-1])
    if np.any(room < 0):
        return None
    md = cp_model.CpModel()
    k = [md.NewIntVar(0 if s in (0, last) else 1, L, f"k{s}") for s in range(S)]
    bi = max(1, int(round(b / u)))
    ub = (L + 2) * bi * 4 + 10 ** 6
    C = [md.NewIntVar(0, ub, f"C{c}") for c in range(v)]
    for s in range(S):
        edge = (float(co.row_s[0]) if s == 0 else 0.0) + (float(co.row_s[-1]) if s == last else 0.0)
        edge += send * ((s > 0) + (s < last))
        md.Add(C[s // pp] >= k[s] * bi + int(round(edge / u)))
    cmax = md.NewIntVar(0, ub, "Cmax")
    for cc in C:
        md.Add(cmax >= cc)
    busiest = md.NewIntVar(0, L, "R")
    for r in range(pp):
        st = t.stages_of(r)
        md.Add(sum(k[s] * int(math.ceil(sig + t.inflight[s] * alpha)) for s in st) <= int(math.floor(room[r])))
        md.Add(sum(k[s] for s in st) <= busiest)
    md.Add(sum(k) == L)
    per_block = (co.dp_per_param_s + co.dp_after_per_param_s + co.optimizer_per_param_s) * float(co.params[1:-1].max())
    md.Minimize(t.m * sum(C) + (pp - 1) * cmax + int(round(per_block / u)) * busiest)
    return md, k


def stages_of_counts(counts) -> tuple[tuple[int, int], ...]:
    """Split of the rows for block counts per stage (the first / last stage also hold row 0 / n−1)."""
    cnt = list(counts)
    cnt[0] += 1
    cnt[-1] += 1
    bd = np.cumsum([0] + cnt)
    return tuple((int(bd[i]), int(bd[i + 1])) for i in range(len(cnt)))


def count_split(terms, score, bound: float):
    """Solve the count program, scoring each split it finds with ``score(stages) -> (fits,
    step_time)``; stop at one at ``bound`` (to ``reached_bound.TIE``). Returns ``(reached,
    best fitting (step, stages) or None, CP-SAT deterministic units)``."""
    built = count_program(terms)
    if built is None:
        return False, None, 0.0
    md, k = built
    from ortools.sat.python import cp_model

    from autopar.search.reached_bound import TIE
    from autopar.search.solver_limits import set_limits
    found: dict = {"best": None, "reached": False}

    class Scorer(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            stages = stages_of_counts([int(self.Value(x)) for x in k])
            fits, step = score(stages)
            if not fits:
                return
            if found["best"] is None or step < found["best"][0]:
                found["best"] = (step, stages)
            if step <= bound * (1 + TIE):
                found["reached"] = True
                self.StopSearch()
    solver = cp_model.CpSolver()
    set_limits(solver, COUNT_BUDGET_S)
    solver.parameters.num_workers = 1
    solver.parameters.catch_sigint_signal = False
    solver.Solve(md, Scorer())
    return found["reached"], found["best"], float(solver.response_proto.deterministic_time)


def reach_by_counts(frontier, c, terms) -> bool:
    """Before ``c``'s first split program: where its min-max seed (``incumbents``) or, when that
    seed does not fit or lies more than ``SEED_GAP`` above the bound, the count program's split
    reaches ``c``'s level-1 bound, push it as ``c``'s exact plan and return True (no CP-SAT split
    program); otherwise a fitting split is known as an incumbent and False."""
    if (c in frontier.counted or c in frontier.retried or frontier.fixed_stages is not None
            or terms.split_backward or terms.pp < 2):   # (a re-solve has had its first try)
        return False
    frontier.counted.add(c)
    from costmodels.contracts.errors import AutoparError

    def score(stages):
        try:
            pred = frontier._evaluate(c.plan(stages))
        except AutoparError:
            return False, math.inf
        return bool(pred.get("fits", True)), pred["step_time_s"]
    from autopar.search.incumbents import incumbent_split
    from autopar.search.own_cut import push_own_split
    from autopar.search.reached_bound import TIE
    bound = terms.time_lower_bound()
    seed = incumbent_split(terms)   # the frontier's seed: scored already, the evaluator caches it
    fits, step = score(seed) if seed is not None else (False, math.inf)
    if fits and step <= bound * (1 + TIE):
        frontier.stats.count_splits += 1
        push_own_split(frontier, c, seed)
        return True
    if (fits and step <= bound * (1 + SEED_GAP)) or not applies(terms):
        return False
    reached, best, det = count_split(terms, score, bound)
    frontier.stats.solver_det += det
    if best is None:
        return False
    step, stages = best
    if not reached:
        frontier._seed_split(c, stages)   # a real plan: its key bounds the k-th plan
        return False
    frontier.stats.count_splits += 1
    push_own_split(frontier, c, stages)
    return True
