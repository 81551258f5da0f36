"""The split program's memory constraints (family 6 of ``autopar.search.split_model``'s
docstring), kept apart from the time families: per rank, reserve + model states + in-flight
activations (+ one rebuilt block under full recompute, + the ZeRO-3 buffer of its two largest
rows) ≤ HBM, with the same coefficients ``estimate`` uses (``costmodels.model.coefficients``)."""
from __future__ import annotations

import math

import numpy as np


def up(x) -> list[int]:
    """Byte counts rounded up to integers (the program is integral; rounding up never accepts a
    split that does not fit; a hair below an integer stays it)."""
    return [int(math.ceil(float(v) - 1e-9)) for v in x]


def add_memory(sm) -> None:
    """Constraint family 6 of the split program (``autopar.search.split_model``): every rank's memory
    fits its HBM, or, for the memory objective, is at most ``M``; sets ``sm.exprs`` (and ``sm.M``)."""
    md, t, co = sm.model, sm.t, sm.co
    reserve = int(math.ceil(t.reserve))
    # full recompute: one block's activations are rebuilt at a time (the largest one)
    w = (int(math.ceil(float(co.act_none_bytes[co.is_block].max())))
         if (t.full_recompute and co.is_block.any()) else 0)
    sm.exprs = []   # every rank's memory must be ≤ HBM (one expression per rank and peak moment)
    X = sm._sums("pX", up(t.w_input_bytes)) if t.states is not None else None
    for r in range(sm.pp):
        vs = list(sm.rank_stages[r])
        # the moments that may be the rank's peak, per stage (micro-batches held, of which
        # waiting for their W): one for the other schedules, several for the split-backward ones
        # (memory.split_in_flight picks the largest for a given split)
        moments = [[(int(t.inflight[v]), 0) for v in vs]] if t.states is None else t.states[r]
        anyb = top2 = None
        if w:
            hb = [sm._has(sm.K[v], f"hb{v}") for v in vs]
            anyb = md.NewBoolVar(f"anyb{r}")
            md.AddMaxEquality(anyb, hb)
        if t.zero3_buffer:
            top2 = top2_rows(sm, vs, r)
        for moment in moments:
            base = reserve + sum(sm.Sig[v] + n * sm.U[v] + (nw * X[v] if nw else 0)
                                 for (n, nw), v in zip(moment, vs))
            if w:
                base = base + w * anyb
            if top2 is not None:
                base = base + top2
            sm.exprs.append(base)
    if sm.objective == "memory":
        most = max([max(t.inflight)] + [n for st in (t.states or []) for moment in st for n, _ in moment])
        hi = (reserve + sum(up(co.state_bytes)) + most * sum(up(co.act_bytes)) + w
              + (most * sum(up(t.w_input_bytes)) if t.states is not None else 0)
              + 2 * int(math.ceil(float(co.weight_bytes.max()) + 1)))
        sm.M = md.NewIntVar(0, hi, "M")
        for e in sm.exprs:
            md.Add(e <= sm.M)
    else:
        hbm = int(math.floor(t.hbm))
        for e in sm.exprs:
            md.Add(e <= hbm)

def top2_rows(sm, vs, r):
    """ZeRO-3 buffer of rank r: bf16 weights of its two largest rows, ``2·(π_(1) + π_(2))``.

    With the distinct row sizes ``u_1 > … > u_K`` (``u_{K+1} = 0``) and ``c_j`` the rank's rows
    of size ≥ ``u_j`` (prefix counts, linear in the cuts), the sum of the two largest is
    ``Σ_j (u_j − u_{j+1})·min(2, c_j)`` — exact. Beyond 8 distinct sizes the smaller ones are
    rounded up to the 8th (conservative: never accepts a split that does not fit)."""
    md = sm.model
    if not hasattr(sm, "_levels"):
        size = np.array(up(sm.co.weight_bytes), dtype=np.int64)   # buffer bytes per row
        u = sorted(set(size.tolist()), reverse=True)
        if len(u) > 8:
            u = u[:8]
            size = np.where(size < u[-1], u[-1], size)
        sm._levels = []
        for j, uj in enumerate(u):
            nxt = u[j + 1] if j + 1 < len(u) else 0
            if uj - nxt <= 0:
                continue
            counts = sm._sums(f"lv{j}_", [int(x >= uj) for x in size])
            sm._levels.append((uj - nxt, counts))
    expr = 0
    for k, (delta, counts) in enumerate(sm._levels):
        c = sum(counts[v] for v in vs)
        mn = md.NewIntVar(0, 2, f"top{r}_{k}")
        md.AddMinEquality(mn, [2, c])
        expr = expr + delta * mn
    return expr
