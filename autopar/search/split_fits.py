"""A split that fits, found without CP-SAT: the certificate ``split_stop.some_split_fits`` asks for.

Why: when the search's stop cut makes a split solve infeasible, ``some_split_fits`` must tell
"every split sorts after the next entry" from "no split fits the GPU", and it solved the memory
program (``SplitModel.fit_check``) for that. On ZeRO-3 layouts that program costs CP-SAT far more
than the time solve it follows (llama3-405b on 16384 H100, dp256·tp8·pp8 vpp8 ZeRO-3: 0.45 s of
CPU against 0.07 s; five such checks were 1.7 of the search's 3.2 CPU seconds). One split under
HBM answers the question exactly, so a few candidate splits are priced here first, in NumPy, with
the program's own integer memory (``split_memory.add_memory``: bytes rounded up per row, the
ZeRO-3 buffer's sizes rounded as ``top2_rows`` rounds them, the recompute working set on every
rank holding a block); only when none fits does CP-SAT run. A candidate accepted here is accepted
by the program, so the answer is the program's; a candidate rejected proves nothing, and CP-SAT
decides as before.

Candidates: the min-max split of the row times (``incumbents.incumbent_split``, the solver's hint)
and, for each cheap-to-build row weight, the min-max split of the rows' bytes at each stage's
in-flight count (a greedy balanced split of the memory). Not for the split-backward schedules,
whose peaks are several moments (``Terms.states``).
"""
from __future__ import annotations

import math

import numpy as np

from autopar.search.split_memory import up


def rank_memory(terms, stages) -> list[int] | None:
    """Each rank's memory in the split program's integers for the split ``stages`` (a tuple of
    (first row, end row) per virtual stage), or None where this pricing does not apply."""
    if terms.states is not None:
        return None
    co = terms.coef
    n = terms.n
    if len(stages) != terms.n_virtual or stages[0][0] != 0 or stages[-1][1] != n:
        return None
    sig = np.concatenate([[0], np.cumsum(np.array(up(co.state_bytes), dtype=object))])
    act = np.concatenate([[0], np.cumsum(np.array(up(co.act_bytes), dtype=object))])
    block = np.asarray(co.is_block, bool)
    w = (int(math.ceil(float(co.act_none_bytes[block].max())))
         if (terms.full_recompute and block.any()) else 0)
    size = None
    if terms.zero3_buffer:
        size = np.array(up(co.weight_bytes), dtype=np.int64)
        u = sorted(set(size.tolist()), reverse=True)
        if len(u) > 8:
            size = np.where(size < u[7], u[7], size)
    out = []
    for r in range(terms.pp):
        total = int(math.ceil(terms.reserve))
        rows, holds_block = [], False
        for v in terms.stages_of(r):
            a, b = stages[v]
            if not a < b:
                return None
            total += int(sig[b] - sig[a]) + int(terms.inflight[v]) * int(act[b] - act[a])
            holds_block = holds_block or bool(block[a:b].any())
            rows.append((a, b))
        if w and holds_block:
            total += w
        if size is not None:
            top = np.sort(np.concatenate([size[a:b] for a, b in rows]))[::-1][:2]
            total += int(top.sum())
        out.append(total)
    return out


def fits(terms, stages) -> bool:
    """Whether the split program accepts ``stages`` (every rank under ``floor(hbm)``)."""
    mem = rank_memory(terms, stages)
    return mem is not None and max(mem) <= int(math.floor(terms.hbm))


def _filled_from_the_end(terms, level: float) -> tuple[tuple[int, int], ...] | None:
    """A split whose every rank stays under ``level`` bytes (approximately: the ZeRO-3 buffer is
    charged at the two largest rows, the recompute working set on every rank), or None: the
    stages are filled from the last one back, each taking as many rows as its rank's room allows
    while leaving one row for every earlier stage (the last chunks hold the fewest micro-batches
    in flight, so rows are cheapest there)."""
    co, S, n = terms.coef, terms.n_virtual, terms.n
    phi = np.asarray(terms.inflight, float)[:S, None]
    cost = np.asarray(co.state_bytes, float)[None, :] + phi * np.asarray(co.act_bytes, float)[None, :]
    pref = np.concatenate([np.zeros((S, 1)), np.cumsum(cost, axis=1)], axis=1)
    base = float(math.ceil(terms.reserve))
    if terms.zero3_buffer:
        # the two largest rows but the first and last (an embedding or a head rarely shares a
        # rank's top two with another such row; the exact check decides)
        base += float(np.sort(np.asarray(co.weight_bytes, float)[1:-1])[-2:].sum())
    block = np.asarray(co.is_block, bool)
    if terms.full_recompute and block.any():
        base += float(co.act_none_bytes[block].max())
    room = {r: level - base for r in range(terms.pp)}
    rank_of = {v: r for r in range(terms.pp) for v in terms.stages_of(r)}
    # each earlier stage of a rank needs room for one row at least: its cheapest possible one
    least = [float(cost[v, v:n - S + v + 1].min()) for v in range(S)]
    held = {r: sum(least[v] for v in terms.stages_of(r)) for r in range(terms.pp)}
    cuts, e = [], n
    for v in range(S - 1, -1, -1):
        r = rank_of[v]
        held[r] -= least[v]
        free = room[r] - held[r]
        a = 0 if v == 0 else v + int(np.searchsorted(pref[v, v:e], pref[v, e] - free, side="left"))
        if a >= e or pref[v, e] - pref[v, a] > free:
            return None
        room[r] -= pref[v, e] - pref[v, a]
        cuts.append((a, e))
        e = a
    return tuple(reversed(cuts))


def _memory_balanced(terms) -> tuple[tuple[int, int], ...] | None:
    """``_filled_from_the_end`` at the least level it meets (bisection)."""
    lo, hi = 0.0, float(terms.hbm)
    best = _filled_from_the_end(terms, hi)
    if best is None:
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        got = _filled_from_the_end(terms, mid)
        if got is None:
            lo = mid
        else:
            hi, best = mid, got
    return best


def candidates(terms) -> list:
    """The candidate splits of ``certified_fit``, the min-max split of the row times first."""
    if terms.states is not None or terms.n_virtual > terms.n or terms.n_virtual < 1:
        return []
    from autopar.search.incumbents import incumbent_split
    out = [incumbent_split(terms), _filled_from_the_end(terms, float(terms.hbm)), _memory_balanced(terms)]
    return [c for c in out if c is not None]


def certified_fit(terms) -> bool:
    """Whether a candidate split (module docstring) fits: True proves some split fits; False
    proves nothing."""
    return any(fits(terms, c) for c in candidates(terms))
