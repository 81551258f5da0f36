"""Pipeline split points: the one balanced split that the cost model and the runtime share.

When a plan gives no ``stages``, both sides call ``balanced_stages`` on the same layer table, so
the split the cost model scored is the split the runtime cuts. Weight of a row = forward +
backward FLOPs (embedding and head rows count with their real cost). The split minimises the
heaviest stage (classic linear partition, solved exactly by dynamic programming; ties broken
toward earlier cuts so the result is deterministic).
"""
from __future__ import annotations

from costmodels.errors import PlanError
from costmodels.layer_table import LayerTable


def balanced_stages(table: LayerTable, n_stages: int) -> tuple[tuple[int, int], ...]:
    weights = [r.fwd_flops + r.bwd_flops for r in table.rows]
    return partition(weights, n_stages)


def partition(weights: list[float], n_stages: int) -> tuple[tuple[int, int], ...]:
    """Contiguous split of ``weights`` into ``n_stages`` non-empty ranges minimising the max sum."""
    n = len(weights)
    if n_stages > n:
        raise PlanError(f"{n_stages} pipeline stages but the model has only {n} layer rows; "
                        "lower pp·vpp")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[k][i]: min over splits of rows[:i] into k stages of the heaviest stage
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for i in range(k, n - (n_stages - k) + 1):
            for j in range(k - 1, i):
                cost = max(best[k - 1][j], prefix[i] - prefix[j])
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    bounds, i = [], n
    for k in range(n_stages, 0, -1):
        j = cut[k][i]
        bounds.append((j, i))
        i = j
    return tuple(reversed(bounds))
