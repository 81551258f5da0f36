"""A configuration's first plan before CP-SAT: the min-max split of its row times.

Why: the search cuts every CP-SAT solve by the k-th best plan known (``frontier._step_bound``)
and never solves a configuration whose bound is above it; before this, the k-th plan came only
from finished solves, so the first hundred solves of a large search ran with no cut at all
(gpt3-175b on 1024 GPUs: 116 solves, the first 100 uncut). The evaluator scores this split in
milliseconds; its step time is a real plan's, so it is an upper bound on the configuration's
optimum and a valid cut. It changes which configurations are solved, never the answer.
"""
from __future__ import annotations


def incumbent_split(terms) -> tuple[tuple[int, int], ...] | None:
    """The split of ``terms``' rows into ``pp·vpp`` stages minimising the largest stage's row
    time (``costmodels.contracts.split.partition``), or None where it has none."""
    from costmodels.contracts.split import partition
    S = terms.pp * terms.vpp
    if S > terms.n:
        return None
    try:
        st = partition([float(x) for x in terms.coef.row_s], S)
    except Exception:   # noqa: BLE001  (a heuristic only; the solver still runs)
        return None
    return tuple((int(a), int(b)) for a, b in st)
