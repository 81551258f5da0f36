"""The least column sum ``Σ_c C_c`` of an interleaved split, rows kept in order (issue 27, dsk).

Why: DeepSeek-V3-like on 1024 H100 (``search("deepseek-v3-like", "h100-80g-sxm", 1024, 4096)``)
ended unproved in 600 s: its CP-SAT time went to pp2 interleaved configurations whose level-1
bounds sat 1.4–4 % under their optima. Their rows are not one repeated block: an embedding, 3 dense
blocks (half a MoE block's time each), 58 MoE blocks and a head. ``Terms.column_sum_bound`` keeps
only the most common block and drops the other rows, and ``Terms.rank_time_bound`` lets the
columns balance freely; but a column's chunks are whole, consecutive rows, so column 0 (the
embedding and the dense blocks beside whole MoE blocks) and the last column (the head) cannot
balance their pp chunks: dp128·tp4·pp2 vpp5 ZeRO-1 fp8, ``Σ_c C_c`` ≥ 0.5185 s by those bounds,
0.5245 s by this one, × 32 micro-batches: its level-1 bound 16.897 → 17.09 s, optimum 17.1375 s.

What: the exact minimum over ordered splits of ``Σ_c max_{chunk of c} (rows' time + cheapest
sends)``, where column ``c`` is the ``pp`` consecutive stages ``c·pp … c·pp + pp − 1``
(``split_model``'s ``C_c ≥ A_s + Q_s + Z_s``). A min-max product over row boundaries gives each
column's least maximum for every row range (``pp − 1`` products of ``(n+1)³``), and a min-plus
pass over the ``vpp`` columns their least sum.

Exact (a floor): every split of the program is one of the ordered splits this minimises over
(``Plan`` stages are non-empty ranges, ``costmodels.contracts.plan``); each chunk's time is at least its rows' time
(``A_s``, the same ``row_s``) plus its cheapest activation send and gradient receive (the first
chunk only the send, the last only the receive; ``column_sum_bound``'s ``q``), and ``Z_s ≥ 0``.
The callers subtract their rounding margins as for ``column_sum_bound``.
"""
from __future__ import annotations

import numpy as np

# the min-max products cost 3·(pp − 1)·(n+1)³ element operations: computed for every configuration
# bounded up to EARLY_WORK (DeepSeek-V3-like pp2: 0.8 M, ~6 ms), and up to LATE_WORK only once
# ``Terms.set_block_floor`` has run (the configurations the search solves); above, the older bounds
EARLY_WORK = 3e6
LATE_WORK = 6e7


def _minmax(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``out[i, j] = min_t max(left[i, t], right[t, j])`` (a row at a time: (n+1)² memory)."""
    return np.stack([np.min(np.maximum(row[:, None], right), axis=0) for row in left])


def ordered_column_sum(terms) -> float:
    """The least ``Σ_c C_c`` over ordered splits (module docstring); 0 where it does not apply
    (not interleaved, split-backward / V placement's own programs, too much work: ``EARLY_WORK``)."""
    pp, v, n = terms.pp, terms.vpp, terms.n
    if pp < 2 or v < 2 or n < 3 or terms.split_backward or terms.v_placement:
        return 0.0
    work = 3 * (pp - 1) * (n + 1) ** 3
    if work > (EARLY_WORK if getattr(terms, "blocks", None) is None else LATE_WORK):
        return 0.0
    co = terms.coef
    tau = np.asarray(co.row_s, dtype=float)
    send = float(np.min(co.cut_p2p_s[1:n]))
    pre = np.concatenate([[0.0], np.cumsum(tau)])
    rows = pre[None, :] - pre[:, None]            # rows[i, j]: time of rows i..j−1
    i, j = np.indices(rows.shape)
    rows = np.where(i < j, np.maximum(rows, 0.0), np.inf)   # a stage holds at least one row
    S = pp * v

    def column(first: int) -> np.ndarray:
        """Least max chunk time of the column of stages first..first+pp−1 over rows i..j−1."""
        def chunk(s: int) -> np.ndarray:
            return rows + send * ((s > 0) + (s < S - 1))
        g = chunk(first)
        for s in range(first + 1, first + pp):
            g = _minmax(g, chunk(s))
        return g
    f_first, f_last = column(0), column(S - pp)
    f_mid = column(pp) if v > 2 else None
    best = f_first[0, :]                          # best[j]: columns so far over rows 0..j−1
    for c in range(1, v):
        f = f_last if c == v - 1 else f_mid
        best = np.min(best[:, None] + f, axis=0)
    return float(best[n])
