"""Pipeline split points: the one balanced split that the cost model and the runtime share.

When a plan gives no ``stages``, both sides call ``balanced_stages`` on the same layer table, so
the split the cost model scored is the split the runtime cuts. Weight of a row = forward +
backward FLOPs (embedding and head rows count with their real cost).

The split minimises the heaviest stage (the classic linear partition problem), exactly:

1. the optimal bottleneck ``B*`` is one of the O(n²) contiguous range sums; binary search over
   them (sorted) with a greedy feasibility test (fill each stage as far as it stays ≤ B; feasible
   when that needs ≤ k stages) finds the smallest feasible one — O(n² log n) numpy work once,
   then O(k log n) per test;
2. among the splits whose heaviest stage is ``B*``, take the one that fills stages from the
   *back* (the last stage takes as many rows as fit, then the one before, ...; each earlier
   stage keeps at least one row). Early pipeline ranks hold the most in-flight activations
   under 1F1B, so they get the lighter loads. Deterministic for a given weight list.

Results are cached per (weights, k).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from costmodels.contracts.errors import PlanError
from costmodels.contracts.layer_table import LayerTable


def check_stage_rows(plan, n_rows: int) -> None:
    """The checks the cost model and the runtime share: no more virtual stages than rows, and
    pinned ``stages`` that end at the last row (Plan itself checks they are contiguous)."""
    v = plan.pp * plan.vpp
    if v > n_rows:
        raise PlanError(f"plan fields 'pp'·'vpp' = {plan.pp}·{plan.vpp} = {v} pipeline stages but "
                        f"the model has only {n_rows} layer rows (embedding, {n_rows - 2} blocks, "
                        "head); lower pp or vpp")
    if plan.stages is not None and plan.stages[-1][1] != n_rows:
        raise PlanError(f"plan field 'stages' ends at row {plan.stages[-1][1]} but the model has "
                        f"{n_rows} rows (embedding, {n_rows - 2} blocks, head); the last range "
                        f"must end at {n_rows}")


def balanced_stages(table: LayerTable, n_stages: int) -> tuple[tuple[int, int], ...]:
    weights = tuple(float(r.fwd_flops + r.bwd_flops) for r in table.rows)
    return _partition(weights, int(n_stages))


def partition(weights, n_stages: int) -> tuple[tuple[int, int], ...]:
    """Contiguous split of ``weights`` into ``n_stages`` non-empty ranges minimising the max sum."""
    return _partition(tuple(float(w) for w in weights), int(n_stages))


@lru_cache(maxsize=1024)
def _partition(weights: tuple[float, ...], k: int) -> tuple[tuple[int, int], ...]:
    n = len(weights)
    if k < 1:
        raise PlanError(f"{k} pipeline stages: need at least 1")
    if k > n:
        raise PlanError(f"{k} pipeline stages but the model has only {n} layer rows; lower pp·vpp")
    w = np.maximum(np.asarray(weights, dtype=float), 0.0)
    prefix = np.concatenate(([0.0], np.cumsum(w)))
    if k == 1:
        return ((0, n),)
    tol = 1e-12 * max(prefix[-1], 1.0)

    def stages_needed(bound: float) -> int:
        start, count = 0, 0
        while start < n:
            end = int(np.searchsorted(prefix, prefix[start] + bound + tol, side="right")) - 1
            if end <= start:          # a single row heavier than bound
                return n + 1
            start, count = end, count + 1
            if count > k:
                return count
        return count

    i, j = np.triu_indices(n + 1, 1)
    cands = np.unique(prefix[j] - prefix[i])
    cands = cands[cands >= w.max() - tol]
    lo, hi = 0, len(cands) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if stages_needed(float(cands[mid])) <= k:
            hi = mid
        else:
            lo = mid + 1
    best = float(cands[lo])

    bounds = []
    end = n
    for s in range(k, 0, -1):          # stage s-1 (0-based) takes rows [start, end)
        if s == 1:
            start = 0
        else:
            # as many rows as fit in `best`, leaving at least one row per earlier stage
            start = int(np.searchsorted(prefix, prefix[end] - best - tol, side="left"))
            start = max(start, s - 1)
            start = min(start, end - 1)
        bounds.append((start, end))
        end = start
    return tuple(reversed(bounds))
