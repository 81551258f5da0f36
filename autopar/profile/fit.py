"""Alpha-beta fit of collective timings and the nccl-tests bandwidth conventions (no torch).

For a collective ``kind`` over ``n`` ranks and a buffer of ``S`` bytes (the whole tensor, as
nccl-tests and ``costmodels.model.comm`` define it), the model ``costmodels.model.comm.collective_time`` uses
is::

    t(S) = steps(kind, n) · α + bytes_per_gpu(kind, S, n) / β

with ``steps`` = 2(n−1) ring steps for all-reduce, n−1 for all-gather / reduce-scatter, 1 for
p2p, and ``bytes_per_gpu`` = 2(n−1)/n·S, (n−1)/n·S, (n−1)/n·S, S. It is linear in the two
unknowns ``a = α`` and ``c = 1/β``; ``fit_alpha_beta`` solves the least-squares problem in
*relative* error, ``min Σ_i ((steps·a + x_i·c − t_i) / t_i)²`` with a ≥ 0, c > 0, so that small
(latency-bound) and large (bandwidth-bound) messages weigh alike — absolute least squares would
let the largest message decide everything and leave α meaningless.

Bus bandwidth (nccl-tests' ``busbw``): ``algbw = S / t`` and ``busbw = algbw · 2(n−1)/n`` for
all-reduce, ``· (n−1)/n`` for all-gather and reduce-scatter, ``· 1`` for p2p — i.e. exactly
``bytes_per_gpu / t``, which is what β is (``LinkTier.bandwidth_bytes_per_s``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodels.model.comm import COLLECTIVES, base_kind, collective_bytes, collective_steps


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor."""
    kind = base_kind(kind)
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if kind == "p2p":
        return 1.0
    raise ValueError(f"unknown collective {kind!r}; one of {COLLECTIVES}")


def bus_bandwidth(kind: str, nbytes, n: int, seconds):
    """busbw = (S / t) · bus_factor (bytes/s); arrays welcome."""
    return np.asarray(nbytes, dtype=float) / np.asarray(seconds, dtype=float) * bus_factor(kind, n)


@dataclass(frozen=True)
class AlphaBeta:
    kind: str
    n: int
    alpha_s: float                  # per ring step
    beta_bytes_per_s: float         # bus bandwidth
    max_rel_error: float            # over the points it was fitted from
    median_rel_error: float

    def predict(self, nbytes):
        """Seconds for buffers of ``nbytes`` (same formula as costmodels.model.comm.collective_time)."""
        s = np.asarray(nbytes, dtype=float)
        return (collective_steps(self.kind, self.n) * self.alpha_s
                + collective_bytes(self.kind, s, self.n) / self.beta_bytes_per_s)


def _wls(X: np.ndarray, t: np.ndarray) -> np.ndarray:
    w = 1.0 / t
    A = X * w[:, None]
    y = t * w
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return coef


def fit_alpha_beta(kind: str, n: int, nbytes, seconds) -> AlphaBeta:
    """Least-squares (relative error) α and β for one collective from (size, time) points."""
    return fit_joint([(kind, n, nbytes, seconds)], kind=kind)


def fit_joint(series, kind: str = "joint") -> AlphaBeta:
    """One α and one β over several collectives' measurements ``[(kind, n, nbytes, seconds)]``:
    the single link tier the cost model uses for every collective. The returned ``AlphaBeta``
    has ``n`` of the first series (its ``predict`` is meaningful only for a single kind)."""
    rows, ts = [], []
    for k, n, nb, sec in series:
        nb = np.asarray(nb, dtype=float)
        sec = np.asarray(sec, dtype=float)
        if nb.shape != sec.shape or nb.size == 0:
            raise ValueError("sizes and times must be non-empty arrays of the same shape")
        steps = collective_steps(k, n)
        rows.append(np.column_stack([np.full(nb.size, float(steps)), collective_bytes(k, nb, n)]))
        ts.append(sec)
    X = np.vstack(rows)
    t = np.concatenate(ts)
    if np.any(t <= 0):
        raise ValueError("times must be positive")
    a, c = _wls(X, t)
    if c <= 0:  # no bandwidth term visible (all latency-bound): fall back to the largest point
        c = float(np.max(X[:, 1] / t)) ** -1 if np.any(X[:, 1] > 0) else 1e-30
        a = max(0.0, float(np.median((t - X[:, 1] * c) / np.maximum(X[:, 0], 1))))
    if a < 0:   # constrained: α = 0, refit 1/β alone
        a = 0.0
        (c,) = _wls(X[:, 1:], t)
    pred = X[:, 0] * a + X[:, 1] * c
    rel = np.abs(pred - t) / t
    first = series[0]
    return AlphaBeta(kind=kind, n=int(first[1]), alpha_s=float(a), beta_bytes_per_s=float(1.0 / c),
                     max_rel_error=float(rel.max()), median_rel_error=float(np.median(rel)))
