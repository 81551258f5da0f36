"""Split-independent floors of the dense pipelines that come from whole blocks (issue 30).

Why: GPT 1T on 3072 A100 (``benchmarks/bench_search_scale.py --case 1``) spent 9.04 of its 9.13
CP-SAT units proving three ZeRO-1 configurations of its top 5 (dp32·tp8·pp12, vpp 3 / 4 / 6,
uneven splits of 128 blocks over 36 / 48 / 72 stages). Their level-1 bounds were 69.58 and
69.02 s where the optima are 70.71 and 70.24 s (vpp 4 / 6), and CP-SAT's LP bound lay as low, so
it had to close a 1.1 s gap by search. Of that gap (vpp 4):

* 0.95 s was the data-parallel sync. ``Terms._t_and_dp_bound`` bounds it through rank 0 alone,
  whose backward can hide most of it; but every rank pays its own sync, and the part of it that
  no backward hides — ``(1 − s)·min(t, t_b) + s·t`` of ``coefficients.dp_exposed`` (the last
  bucket, the compute slowdown) and the weights' all-gather after the optimizer step
  ``λ_a + γ_a·Π`` — grows with the rank's parameters ``Π``. Some rank holds at least
  ``⌈L/pp⌉`` of the ``L`` blocks (more where a pinned first / last row leaves room for fewer), so
  ``D ≥ h(Π*)`` with ``Π*`` the least "most parameters on one rank" of any split
  (``dp_floor_s``). The optimizer step ``O = max_r γ_o·Π_r`` is bounded the same way.
* 0.17 s was the fill ``(pp − 1)·max_c C_c``, bounded by ``Σ_c C_c / vpp``. The columns' block
  counts are integers: ``Σ_c y_c ≥ Y`` (``⌈L/pp⌉``, or ``memory_blocks``' floor) puts at least
  ``⌈Y/vpp⌉`` blocks in the busiest column's slowest chunk, which also sends the cheapest p2p both
  ways, or one way and runs the first / last row (``column_max_floor_s``). Memory may put more
  there (``memory_column_floor``: gpt3-175b's ZeRO-2 dp32·tp4·pp8 vpp 6, 3 blocks, not 2).

With these the level-1 bounds of those configurations equal their optima (to 1e-9), so they wait
on the heap at their true keys; the same floors as redundant cuts (``add_floor_cuts``; the
column's with one send: with both, CP-SAT's proofs took longer) raise CP-SAT's LP bound, and
``reached_bound`` ends a solve at a split that reaches the level-1 bound.

Exact: each floor holds for every split of the program (``autopar.search.split_model``), whose
objective is ``costmodels.model.estimate``'s step up to the rounding its slack covers; the cuts
are rounded down by ``4·n + 8`` units (more than the per-row rounding of the sums they bound), so
no split is lost.
"""
from __future__ import annotations

import math

import numpy as np

# each floor is given this much under its exact value, as ``Terms._time_lower_bound``'s column
# bound: the estimate sums the same parameters in another order (a few 1e-15 s apart at the
# optimum), and a bound a hair above a plan's step time would order it after that plan
FLOAT_MARGIN = 1e-9


def _blocks(terms):
    """(L, block time b, least block parameters π_b) of the repeated blocks (rows 1..n−2 of the
    most common time, as ``Terms.rank_time_bound``), or None."""
    co, n = terms.coef, terms.n
    if n < 3:
        return None
    mid = np.round(co.row_s[1:-1], 15)
    vals, counts = np.unique(mid, return_counts=True)
    b, L = float(vals[np.argmax(counts)]), int(counts.max())
    if b <= 0 or L < 2:
        return None
    is_b = mid == vals[np.argmax(counts)]
    return L, b, float(co.params[1:-1][is_b].min())


def most_params_floor(terms) -> float:
    """``Π*``: no split puts fewer parameters on its busiest rank (module docstring). The ``L``
    blocks of ``π_b`` parameters each are indivisible; row 0 sits on rank 0 and row n−1 on rank
    pp − 1 (rank 0 under V placement); other rows only add. The least ``P`` with
    ``Σ_r ⌊(P − pinned_r)/π_b⌋ ≥ L`` among the candidates ``k·π_b + pinned_r``, and at least the
    mean ``Σπ/pp``."""
    memo = getattr(terms, "_bounds", {})   # srch7: asked by both floors of a configuration
    if "most_params" in memo:
        return memo["most_params"]
    co, pp = terms.coef, terms.pp
    params = co.params
    mean = float(params.sum()) / pp
    blocks = _blocks(terms)
    if pp < 2 or blocks is None or blocks[2] <= 0:
        return mean
    L, _b, pb = blocks
    pinned = np.zeros(pp)
    pinned[0] += float(params[0])
    pinned[0 if terms.v_placement else pp - 1] += float(params[-1])
    best = None
    # every candidate at once (the same float operations as one at a time; srch7: this loop was
    # 11 % of gpt3-175b's search), the first in ascending order that holds the blocks
    cands = np.array(sorted({k * pb + p for p in set(pinned.tolist()) for k in range(L + 1)}))
    room = np.floor((cands[:, None] - pinned[None, :]) / pb + 1e-9)
    ok = np.all(room >= 0, axis=1) & (room.sum(axis=1) >= L)
    if ok.any():
        best = float(cands[int(np.argmax(ok))])
    memo["most_params"] = out = max(mean, best if best is not None else 0.0, float(pinned.max()))
    return out


def dp_floor_s(terms) -> float:
    """A floor on the exposed data-parallel sync ``D = max_r D_r`` of every split: the part of
    ``coefficients.dp_exposed`` that no window hides, plus the after-part, at ``Π*`` (both are
    non-decreasing in a rank's parameters). 0 without dp or where the runtime hides it all
    (no slowdown, no bucket, no after-part)."""
    co = terms.coef
    if not terms.dp_sync:
        return 0.0
    p = most_params_floor(terms)
    if p <= 0:
        return 0.0
    t = co.dp_latency_s + co.dp_per_param_s * p
    s = co.slowdown
    hidden_never = 0.0 if (s == 0.0 and co.dp_bucket_s == 0.0) else (1.0 - s) * min(t, co.dp_bucket_s) + s * t
    return (hidden_never + co.dp_after_latency_s + co.dp_after_per_param_s * p) * (1 - FLOAT_MARGIN)


def optimizer_floor_s(terms) -> float:
    """``O = max_r γ_o·Π_r ≥ γ_o·Π*``."""
    return terms.coef.optimizer_per_param_s * most_params_floor(terms) * (1 - FLOAT_MARGIN)


def memory_column_floor(terms) -> int:
    """The fewest blocks the busiest column's slowest chunk can hold under memory: the least
    ``Y`` with ``Σ_r cap_r(Y) ≥ L``, where ``cap_r(Y)`` is the most blocks rank ``r`` holds with at
    most ``Y`` in each of its chunks (``memory_blocks``' bytes: a block's model state plus its
    saved activations times the chunk's micro-batches in flight; lightest chunks first, which is
    exact for a count). Memory may forbid even columns (gpt3-175b, ZeRO-2 dp32·tp4·pp8 vpp 6:
    12 blocks per rank over 6 chunks cannot be 2 in each on rank 0; 3 in the busiest). 0 before
    ``Terms.set_block_floor`` (the search asks it only of the configurations it solves)."""
    t, co = terms, terms.coef
    if not t.blocks or t.pp < 2 or t.vpp < 2 or t.states is not None:
        return 0
    blocks = _blocks(t)
    if blocks is None:
        return 0
    L = blocks[0]
    mid = np.round(co.row_s[1:-1], 15)
    is_b = mid == np.round(blocks[1], 15)
    if not is_b.any():
        return 0
    sig, alpha = float(co.state_bytes[1:-1][is_b].min()), float(co.act_bytes[1:-1][is_b].min())
    last = t.n_virtual - 1
    rank_of = {v: r for r in range(t.pp) for v in t.stages_of(r)}
    room = np.full(t.pp, float(t.hbm) - float(t.reserve))
    room[rank_of[0]] -= float(co.state_bytes[0]) + t.inflight[0] * float(co.act_bytes[0])
    room[rank_of[last]] -= float(co.state_bytes[-1]) + t.inflight[last] * float(co.act_bytes[-1])
    room = np.ceil(room)
    if np.any(room < 0):
        return 0
    w = np.sort(np.array([[math.floor(sig + t.inflight[v] * alpha) for v in t.stages_of(r)]
                          for r in range(t.pp)], dtype=float), axis=1)   # per rank, lightest first

    def cap(y: int) -> int:
        total = 0
        for r in range(t.pp):
            left, held = room[r], 0
            for wc in w[r]:
                k = y if wc <= 0 else min(y, int(left // wc))
                held += k
                left -= k * wc
                if k < y:
                    break
            total += held
        return total
    lo, hi = 1, L
    if cap(hi) < L:
        return 0
    while lo < hi:
        mid_y = (lo + hi) // 2
        if cap(mid_y) >= L:
            hi = mid_y
        else:
            lo = mid_y + 1
    return lo


def column_max_floor_s(terms, edges: bool = True) -> float:
    """A floor on ``max_c C_c`` of an interleaved (dense) split: ``⌈Y/vpp⌉`` blocks and its
    edges (two cheapest sends, or one and the pinned row) in the busiest column's slowest chunk
    (module docstring); 0 where it does not apply."""
    pp, v = terms.pp, terms.vpp
    if pp < 2 or v < 2 or terms.split_backward or terms.v_placement:
        return 0.0
    blocks = _blocks(terms)
    if blocks is None:
        return 0.0
    L, b, _pb = blocks
    y = math.ceil(L / pp)
    if terms.blocks and terms.blocks[0]:
        y = max(y, int(terms.blocks[0]))
    co = terms.coef
    send = float(co.cut_p2p_s[1:terms.n].min())
    # a middle stage sends both ways; the first / last stage one way, but it also runs row 0 / n−1
    sends = min(2 * send, send + float(co.row_s[0]), send + float(co.row_s[-1])) if edges else send
    busiest = max(math.ceil(y / v), memory_column_floor(terms))
    return (busiest * b + sends) * (1 - FLOAT_MARGIN)


def dense(terms) -> bool:
    """The floors apply to the dense schedules' programs (1F1B, GPipe, interleaved 1F1B); the
    split-backward schedules keep their own bounds (``zb_bound``)."""
    return terms.pp > 1 and not terms.split_backward


def add_floor_cuts(sm) -> None:
    """The floors as redundant cuts of the split program ``sm`` (in its integer units, rounded
    down past the per-row rounding): ``D``, ``O`` and, interleaved, ``max_c C_c``."""
    t, md, u = sm.t, sm.model, sm.unit
    if not dense(t) or sm.objective == "memory":
        return

    def units(x: float) -> int:   # (D sums up to three rounded per-row terms and latencies)
        return max(0, int(math.floor(x / u - 4 * sm.n - 8)))
    if t.dp_sync and not isinstance(sm.D, int):
        md.Add(sm.D >= units(dp_floor_s(t)))
    md.Add(sm.O >= units(optimizer_floor_s(t)))
    if sm.vpp > 1 and getattr(sm, "Cmax", None) is not None:
        md.Add(sm.Cmax >= units(column_max_floor_s(t, edges=False)))
