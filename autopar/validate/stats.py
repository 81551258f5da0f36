"""Error statistics of predictions against measurements (no torch, no scipy)."""
from __future__ import annotations

import numpy as np


def mape(predicted, measured) -> float:
    """Mean absolute percentage error, as a fraction: mean(|p − m| / m)."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    if p.size == 0:
        return float("nan")
    return float(np.mean(np.abs(p - m) / np.abs(m)))


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get the average of their ranks (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x), dtype=float)
    xs = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        r[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return r


def spearman(a, b) -> float:
    """Spearman rank correlation (Pearson correlation of the tie-averaged ranks); nan when
    either side has fewer than 2 distinct values."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    sa, sb = ra.std(), rb.std()
    if sa == 0 or sb == 0:
        return float("nan")
    return float(np.mean((ra - ra.mean()) * (rb - rb.mean())) / (sa * sb))
