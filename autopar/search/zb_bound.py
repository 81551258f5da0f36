"""A lower bound on a zero-bubble configuration's step time that holds for every split: the op
graph of its schedule as a linear program over fluid rows.

Why: the split-independent bound of the split-backward schedules (``Terms.time_lower_bound``,
``m·T* + D + O``) counts the busiest rank's work but none of the warm-up and cool-down the
schedule cannot avoid; it sits about 6 % under the optimum on gpt3-175b, so best-first had to
solve (with CP-SAT, seconds each) nearly every zero-bubble configuration near the best. The
warm-up/cool-down is a property of the schedule's op graph (``costmodels.model.schedule_program``)
and of how the rows can be spread over its stages, so the bound is that graph's longest path,
minimised over a relaxation of the split:

* rows of identical coefficients form a type; ``x[k][v] ≥ 0`` rows of type ``k`` sit in virtual
  stage ``v`` (fractions allowed, contiguity dropped), every row placed once, row 0 in stage 0
  and row ``n−1`` in the last stage, every stage at least one row's worth;
* each stage's forward ``F_v``, input-gradient ``B_v`` and weight-gradient ``W_v`` durations are
  those of ``split_schedules.SplitScheduleTime._durations`` (linear in ``x``), its p2p at the
  cheapest cut, its exposed ZeRO collectives at their lower envelope (``split_comm``);
* each op ends ``e ≥ e_prev(rank) + d`` and ``e ≥ e_wait + d`` for every op of another rank it
  waits on; ``M ≥`` every op's end (``split_schedules._graph``), with ``M ≥ m_sim·T``;
* the pipeline time is bounded below by ``M(m1) + (m − m1)·T`` past the schedule's period
  (``costmodels.model.pipeline_split``: ``max(Δ, p·T) ≥ p·T``), ``T ≥`` every rank's work and
  ``≥ Terms.rank_time_bound`` (whole blocks); plus the dp sync's exposure and the optimizer step
  at their lower envelopes (``split_comm.add_data_parallel``).

Every split is a point of this LP with the estimate's own durations, so the LP's optimum is at
most the estimate of the best split (``tests/test_search_zb_bound.py`` checks it against the
exact split optimum over random row costs). It costs GLOP 0.1–0.3 s with only the first and last
micro-batches' waits, seconds with the whole graph at pp 32 (load 10), so the search takes it
only for a configuration about to be solved, cheapest tier first (``defer_by_graph_bound``).

What it does not close: the LP's rows are fluid, so where a stage holds one or two blocks
(interleaved-zb at pp·vpp ≈ n) it sits 1–5 % under the optimum, and CP-SAT still has to prove
the configurations near the best (docs/guide-schedules.md has the figures).
"""
from __future__ import annotations

import numpy as np

from autopar.search.split_schedules import periods, rank_stages
from costmodels.contracts.plan import V_SCHEDULES

SCALE = 1e3          # the LP counts milliseconds (coefficients near 1)
SAFETY = 1 - 1e-6    # GLOP's tolerances: the bound gives up a millionth
# GLOP from a triangular initial basis: the whole graph's LP (gpt3-175b, zb-v, pp 32, m 64:
# 8k rows) in 6 s where the default basis took 19 s and HiGHS / CLP 60-75 s (load 10)
LP_PARAMS = "initial_basis: TRIANGULAR"


def _types(co, share: float):
    """Per-row columns of the LP and the row types (middle rows grouped by identical columns)."""
    rt = co.times
    tp = rt.tp_fwd_s + rt.tp_bwd_s + rt.tp_recompute_s
    params = np.asarray(co.params, dtype=float)
    cols = {"A": co.row_s, "Fr": rt.fwd_s + share * tp, "Wr": rt.bwd_w_s, "Bk": co.bwd_window_s,
            "Dt": (co.dp_per_param_s + co.dp_after_per_param_s) * params,
            "Ot": co.optimizer_per_param_s * params}
    if co.zero_collectives:
        cols.update(Zf=co.zero_fwd_s, Fw=co.fwd_window_s, Zb=co.zero_bwd_s, Bz=co.zero_bwd_window_s)
    names = list(cols)
    mat = SCALE * np.stack([np.asarray(cols[k], dtype=float) for k in names], axis=1)
    n = len(co.row_s)
    groups: dict = {}
    for i in range(1, n - 1):
        groups.setdefault(tuple(np.round(mat[i], 15)), []).append(i)
    types = [(mat[idx[0]], len(idx), idx) for idx in groups.values()]
    return names, mat, types


def graph_bound(terms, keep_mb: int = 10 ** 9) -> float:
    """Seconds: a lower bound on the step time of every split of ``terms``' configuration (a
    split-backward schedule, pp ≥ 2), the module docstring's LP; ``keep_mb``: the micro-batches
    at each end whose waits on other ranks it keeps (fewer: a cheaper, looser bound)."""
    return _solve(terms, keep_mb=keep_mb)


def _solve(terms, keep_mb: int = 2) -> float:
    """The module docstring's LP, solved by GLOP. An op gets a variable only where the LP keeps
    one of its waits on another rank (micro-batches ``< keep_mb`` from either end); every other
    op ends the sum of its rank's durations after the last such variable (a linear expression),
    which drops its waits: a relaxation, so still a bound, and the LP stays small."""
    built = build_lp(terms, keep_mb)
    if built is None:
        return terms.time_lower_bound()
    best = solve_lp(built[0])
    if best <= 0:
        return terms.time_lower_bound()
    return best / SCALE * SAFETY


def solve_lp(lp) -> float:
    """The LP's optimum in its units (0 where GLOP gives none)."""
    from ortools.linear_solver import pywraplp
    return lp.Objective().Value() if lp.Solve() == pywraplp.Solver.OPTIMAL else 0.0


def build_lp(terms, keep_mb: int = 2):
    """``(lp, variables, row types)`` of ``_solve``'s LP, the placement ``x[k][v]`` (rows of type
    ``k`` in stage ``v``) at ``variables[k·S + v]``, each type ``(columns, count, its rows)``;
    None where the table is too small for it."""
    from ortools.linear_solver import pywraplp

    from costmodels.model.schedule_program import program
    c, co = terms.config, terms.coef
    pp, vpp, m, n = terms.pp, terms.vpp, terms.m, terms.n
    S = pp * vpp
    if n < S or n < 3:
        return None
    share = 1 / 3 if terms.full_recompute else 1 / 2
    names, mat, types = _types(co, share)
    col = {k: j for j, k in enumerate(names)}
    K = len(types)
    zero = co.zero_collectives
    # variable indices: x[k][v] = k·S + v, then zf_v, zb_v (ZeRO), T, D, O, M
    nx = K * S
    izf, izb = nx, nx + S
    iT = nx + (2 * S if zero else 0)
    iD, iO, iM = iT + 1, iT + 2, iT + 3
    nvar = iM + 1
    lp = pywraplp.Solver.CreateSolver("GLOP")
    lp.SetSolverSpecificParametersAsString(LP_PARAMS)
    inf = lp.infinity()
    var = [lp.NumVar(0, float(types[j // S][1]), "") for j in range(nx)]
    var += [lp.NumVar(0, inf, "") for _ in range(nvar - nx)]
    var[iT].SetLb(SCALE * terms.rank_time_bound() * (1 - 1e-9))

    def add(vec, lo: float):
        """Σ vec·var ≥ lo."""
        ct = lp.Constraint(lo, inf)
        for j in np.nonzero(vec)[0]:
            ct.SetCoefficient(var[int(j)], float(vec[j]))

    def stage(name, v):
        j = col[name]
        vec = np.zeros(nvar)
        vec[[k * S + v for k in range(K)]] = [types[k][0][j] for k in range(K)]
        const = (float(mat[0, j]) if v == 0 else 0.0) + (float(mat[n - 1, j]) if v == S - 1 else 0.0)
        return vec, const
    for k in range(K):   # every row placed once
        vec = np.zeros(nvar)
        vec[k * S:(k + 1) * S] = 1
        ct = lp.Constraint(float(types[k][1]), float(types[k][1]))
        for j in range(k * S, (k + 1) * S):
            ct.SetCoefficient(var[j], 1.0)
    for v in range(S):   # every stage holds at least one row
        vec = np.zeros(nvar)
        vec[[k * S + v for k in range(K)]] = 1
        add(vec, 1.0 - (v == 0) - (v == S - 1))
    # p2p: each send at the cheapest cut (split_comm.add_communication; none at the V's turn)
    qmin = SCALE * float(co.cut_p2p_s[1:n].min())
    turn = pp - 1 if c.schedule in V_SCHEDULES else None
    q = [qmin * ((v < S - 1 and v != turn) + (v > 0 and (turn is None or v != turn + 1))) for v in range(S)]
    qz = []   # (vec, const) of each stage's q + Z
    for v in range(S):
        vec = np.zeros(nvar)
        if zero:   # max(EF + s·Σgf, Σgf − Σf) + the same backward, at its lower envelope
            vec[izf + v] = vec[izb + v] = 1
            for iz, g, w, first in ((izf + v, "Zf", "Fw", co.zero_first_fwd_s),
                                    (izb + v, "Zb", "Bz", co.zero_first_bwd_s)):
                gv, gc = stage(g, v)
                wv, wc = stage(w, v)
                e = np.zeros(nvar)
                e[iz] = 1
                add(e - gv + wv, gc - wc)
                if not co.legacy:
                    lo = SCALE * float(first[0] if v == 0 else np.min(first[1:n]))
                    add(e - co.slowdown * gv, lo + co.slowdown * gc)
        qz.append((vec, q[v]))
    # per stage (split_schedules._durations): F = Fr + ½(q+Z), B = A − Fr − W + ½(q+Z), W = Wr
    stages = rank_stages(c)
    slot_forms = np.zeros((S * 3, nvar))   # rows: duration slots of schedule_program
    slot_const = np.zeros(S * 3)
    for r in range(pp):
        for ch, v in enumerate(stages[r]):
            (a, ac), (fr, fc), (wr, wc), (zv, zc) = stage("A", v), stage("Fr", v), stage("Wr", v), qz[v]
            base = (r * vpp + ch) * 3
            slot_forms[base] = fr + 0.5 * zv
            slot_const[base] = fc + 0.5 * zc
            slot_forms[base + 1] = a - fr - wr + 0.5 * zv
            slot_const[base + 1] = ac - fc - wc + 0.5 * zc
            slot_forms[base + 2] = wr
            slot_const[base + 2] = wc
    for r in range(pp):   # T ≥ every rank's work
        vec = -sum(slot_forms[(r * vpp + ch) * 3 + i] for ch in range(vpp) for i in range(3))
        vec[iT] += 1
        add(vec, float(sum(slot_const[(r * vpp + ch) * 3:(r * vpp + ch) * 3 + 3].sum() for ch in range(vpp))))
    per = periods(c.schedule, pp, m)
    m_sim = per[1] if per else m
    vec = np.zeros(nvar)
    vec[iM], vec[iT] = 1, -m_sim
    add(vec, 0.0)
    if terms.dp_sync:   # split_comm.add_data_parallel: each rank's exposure ≥ its legacy tail
        before_v, before_c = np.zeros(nvar), 0.0
        for r in range(pp):
            for v in stages[r]:
                bv, bc = stage("Bk", v)
                before_v, before_c = before_v + bv, before_c + bc
            dv = sum(stage("Dt", v)[0] for v in stages[r])
            dc = sum(stage("Dt", v)[1] for v in stages[r])
            e = before_v - dv
            e[iD] += 1
            add(e, SCALE * co.dp_latency_s + dc - before_c)
    for r in range(pp):   # the optimizer step
        ov = sum(stage("Ot", v)[0] for v in stages[r])
        oc = sum(stage("Ot", v)[1] for v in stages[r])
        e = -ov
        e[iO] += 1
        add(e, oc)
    # duration slots as variables (d_s = its form), so the graph's rows stay sparse
    i0 = len(var)
    for j in range(S * 3):
        var.append(lp.NumVar(-inf, inf, ""))
        e = -slot_forms[j].copy()
        e = np.concatenate([e, np.zeros(len(var) - nvar)])
        e[i0 + j] += 1
        ct = lp.Constraint(float(slot_const[j]), float(slot_const[j]))
        for jj in np.nonzero(e)[0]:
            ct.SetCoefficient(var[int(jj)], float(e[jj]))
    ops = program(c.schedule, pp, vpp, m_sim)
    # an op's end as (anchor variable or None, counts of duration slots since it)
    exprs: list = []
    chain = [(None, np.zeros(S * 3)) for _ in range(pp)]

    def bound_by(ct, expr, sign=-1.0):
        anchor, counts = expr
        if anchor is not None:
            ct.SetCoefficient(var[anchor], ct.GetCoefficient(var[anchor]) + sign)
        for jj in np.nonzero(counts)[0]:
            v_ = var[i0 + int(jj)]
            ct.SetCoefficient(v_, ct.GetCoefficient(v_) + sign * float(counts[jj]))
    for o in ops:
        far = [w for w in o.waits if ops[w].rank != o.rank]
        keep = far and (o.micro_batch < keep_mb or o.micro_batch >= m_sim - keep_mb)
        anchor, counts = chain[o.rank]
        counts = counts.copy()
        counts[o.slot] += 1
        if keep:
            var.append(lp.NumVar(0, inf, ""))
            ie = len(var) - 1
            for expr in [(anchor, counts)] + [(exprs[w][0], exprs[w][1] + np.eye(1, S * 3, o.slot)[0])
                                              for w in far]:
                ct = lp.Constraint(0, inf)
                ct.SetCoefficient(var[ie], 1.0)
                bound_by(ct, expr)
            anchor, counts = ie, np.zeros(S * 3)
        exprs.append((anchor, counts))
        chain[o.rank] = (anchor, counts)
    for expr in chain:
        ct = lp.Constraint(0, inf)
        ct.SetCoefficient(var[iM], 1.0)
        bound_by(ct, expr)
    obj = lp.Objective()
    for j, a in ((iM, 1.0), (iT, float(m - m_sim)), (iD, 1.0), (iO, 1.0)):
        obj.SetCoefficient(var[j], a)
    obj.SetMinimization()
    return lp, var, types


def defer_by_graph_bound(frontier, c, terms) -> bool:
    """Before a zero-bubble configuration's first CP-SAT solve, its graph bounds, cheapest first:
    the LP with the other ranks' waits of the first and last two micro-batches only (a
    relaxation: the steady state's waits dropped), then the whole graph. Each is kept as the
    configuration's split-independent bound from then on (``Terms.time_lower_bound``); True (and
    ``c`` back on the heap at that key) where one is above the key it was popped at, so that
    better entries go first and ``c`` is never solved if the top plans come out before it."""
    if not terms.split_backward:
        return False
    b = terms._bounds
    # the V schedules go to zb_exact next, whose cut at the next entry defers as the whole
    # graph's LP would (1–3 s a solve at pp 16–32): only the cheap tier for them
    tiers = TIERS[:1] if terms.v_placement else TIERS   # those zb_exact.takes
    while b.get("zb_tier", 0) < len(tiers):
        tier = b.get("zb_tier", 0)
        b["zb_tier"] = tier + 1
        old = terms.time_lower_bound()
        lb = _solve(terms, keep_mb=TIERS[tier])
        if lb > old:
            b["time"] = lb
            frontier.push(c, lb, 1, terms)
            return True
    return False


TIERS = (2, 10 ** 9)   # micro-batches at each end whose cross-rank waits the LP keeps
