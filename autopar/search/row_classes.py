"""Rows with equal costs, priced once: the search's quick bound on a table of distinct rows.

A Mixture-of-Experts table repeats one row many times (deepseek-v3-like: the embedding, 3 dense
blocks, 58 MoE blocks and the head are 4 distinct rows among 63), and each MoE row carries
hundreds of matmuls (one grouped GEMM per expert: 778 per row there), so the per-row pipeline
the quick bound reads (``costmodels.model.coefficients.plan_row_times`` and ``plan_experts``)
spends its time on arrays of 45,000 matmuls whose results are 58 copies of one number. Every
per-row term of that pipeline is a function of the row alone (elementwise over the table's
arrays: no cumulative sums, no neighbours), so pricing each distinct row once and weighting it
by how often it occurs gives the same Σ τ, max τ and Σ params up to float summation order —
``tests/test_search_row_classes.py`` checks them equal on every quick-bound key of a MoE space.

Only the quick bound (``autopar.search.costs.Costs.quick_bound``) reads this: the split program
still gets every row (its cuts need the positions).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

# the distinct-row sums are the full sums in another order: a bound taken from them is shaded by
# this relative amount so that float rounding can never lift it above the full computation's
ROUNDING_SHADE = 1e-12


@dataclass(frozen=True)
class RowClasses:
    """A table of the distinct rows of another, in first-seen order, and how often each occurs."""
    table: object           # costmodels.contracts.layer_table.LayerTable
    counts: np.ndarray      # occurrences of each distinct row in the full table

    def total(self, per_row: np.ndarray) -> float:
        """Σ over the full table's rows of a per-row array computed on the distinct rows."""
        return float(np.dot(self.counts, per_row)) * (1.0 - ROUNDING_SHADE)


def _signature(row) -> tuple:
    """Everything a row's costs are computed from: all its fields but its name."""
    return tuple(getattr(row, f.name) for f in fields(row) if f.name != "name")


def row_classes(table) -> RowClasses | None:
    """The distinct rows of ``table`` (None when every row is distinct: nothing to gain)."""
    order: dict = {}
    counts: list[int] = []
    keep = []
    for row in table.rows:
        sig = _signature(row)
        i = order.get(sig)
        if i is None:
            order[sig] = len(keep)
            keep.append(row)
            counts.append(1)
        else:
            counts[i] += 1
    if len(keep) == len(table.rows):
        return None
    return RowClasses(table=replace(table, rows=type(table.rows)(keep)),
                      counts=np.asarray(counts, dtype=float))
