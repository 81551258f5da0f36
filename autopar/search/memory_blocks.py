"""A bound on a configuration's step time that sees its memory: how evenly its blocks can spread.

Why: the split-independent bounds (``Terms.rank_time_bound``, ``Terms.column_sum_bound``) place
the repeated blocks as evenly as time allows, but a memory-bound configuration cannot: the ranks
that hold the most micro-batches in flight (the first ones, and each rank's first chunks under
interleaving) can take fewer blocks, so the others take more. GPT 1T on 3072 A100 (dp32·tp8·pp12,
vpp 4, micro-batch 2): 66.3 s/step with unlimited memory, 72.0 s within 80 GiB, while its bound
said 65.6 s — so it was solved and deferred a dozen times (the bench's costliest configuration,
up to 10 s of CP-SAT each) before the k-th plan's cut dropped it.

The program (solved once per configuration, only when it reaches CP-SAT: ``Frontier._split``):
``k_{c,r}`` blocks in chunk ``c`` of rank ``r`` (virtual stage ``stages_of(r)[c]``), ``y_c`` the
most in column ``c``, ``k_{c,r} ≥ 1`` where every row but the first and last is a block (a stage
runs at least one row; the first and last stage may run only their pinned row)::

    minimise Σ_c y_c   s.t.  k_{c,r} ≤ y_c,   Σ_{c,r} k_{c,r} = L,
                             Σ_c k_{c,r}·(σ_b + φ_{c,r}·α_b) ≤ HBM − R − pinned_r   (every rank r)

with ``L`` blocks of the most common row time ``b`` (as ``rank_time_bound``), their least model
state ``σ_b`` and saved activations ``α_b`` per micro-batch, ``φ`` the schedule's in-flight counts
(``Terms.inflight``) and ``pinned_r`` the first row's bytes on the first stage's rank and the
last row's on the last stage's. Every split the split program accepts gives such ``k`` (its
memory family is this plus terms ≥ 0: other rows, the ZeRO-3 buffer, the recompute working set,
bytes rounded up), and every chunk of column ``c`` takes at least ``k_{c,r}·b``, so
``Σ_c C_c ≥ b·Σ_c y_c`` (interleaved) and ``T ≥ b·y_0`` (one chunk per rank). CP-SAT's proved
bound on the program is used, so an unfinished solve still gives a valid floor. Byte
coefficients are rounded down and the room up, so the rounding only loosens it.
"""
from __future__ import annotations

import math

import numpy as np

FLOOR_BUDGET_S = 0.2   # CP-SAT budget of this small program (its proved bound is used either way)


def block_floor(terms) -> tuple[int, float] | None:
    """(least ``Σ_c y_c`` of the module docstring, the block time ``b``), or None where the
    program does not apply (split-backward schedules' several peak moments, pp = 1, no repeated
    block, no answer in its budget)."""
    t, co = terms, terms.coef
    if t.states is not None or t.pp < 2 or t.n < 3:
        return None
    tau = co.row_s
    mid = np.round(tau[1:-1], 15)
    vals, counts = np.unique(mid, return_counts=True)
    b, L = float(vals[np.argmax(counts)]), int(counts.max())
    if b <= 0 or L < 2:
        return None
    is_b = np.concatenate([[False], mid == vals[np.argmax(counts)], [False]])
    sig_b, alpha_b = float(co.state_bytes[is_b].min()), float(co.act_bytes[is_b].min())
    pp, v = t.pp, t.vpp
    every = L == t.n - 2   # every row but the first and last is a block
    rank_of = {s: r for r in range(pp) for s in t.stages_of(r)}
    room = np.full(pp, float(t.hbm) - float(t.reserve))
    last = t.n_virtual - 1
    room[rank_of[0]] -= float(co.state_bytes[0]) + t.inflight[0] * float(co.act_bytes[0])
    room[rank_of[last]] -= float(co.state_bytes[-1]) + t.inflight[last] * float(co.act_bytes[-1])
    if np.any(room < 0):
        return None
    from ortools.sat.python import cp_model

    from autopar.search.solver_limits import set_limits
    md = cp_model.CpModel()
    y = [md.NewIntVar(0, L, f"y{c}") for c in range(v)]
    k = {}
    for r in range(pp):
        stages = t.stages_of(r)
        for c in range(v):
            # every stage runs at least one row: with no rows but the blocks and the two pinned
            # ones, one block at least, except where the pinned row may be the stage's only row
            least = 1 if every and stages[c] not in (0, last) else 0
            k[c, r] = md.NewIntVar(least, L, f"k{c}_{r}")
            md.Add(k[c, r] <= y[c])
        md.Add(sum(k[c, r] * int(math.floor(sig_b + t.inflight[stages[c]] * alpha_b)) for c in range(v))
               <= int(math.ceil(room[r])))
    md.Add(sum(k.values()) == L)
    md.Minimize(sum(y))
    solver = cp_model.CpSolver()
    set_limits(solver, FLOOR_BUDGET_S)
    solver.parameters.num_workers = 1
    solver.parameters.catch_sigint_signal = False
    code = solver.Solve(md)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return int(math.ceil(solver.BestObjectiveBound() - 1e-6)), b
