"""Dominance between configurations whose split programs differ only in memory (issue 30).

Why: two configurations that differ only in ZeRO stage (1 and 2, or 0 and 1) often have the very
same split program but for their bytes: the same row times, communication, data-parallel and
optimizer terms, micro-batches and schedule, so the same objective for every split, while one holds
no more bytes per row than the other. Every split the larger one fits, the smaller one fits too, at
the same step time; so where CP-SAT proves that no split of the smaller one beats the k-th plan's
cut, none of the larger one does either. gpt3-175b on 1024 A100 solved both of two such pairs
(dp32·tp4·pp8 vpp12 b2, dp16·tp8·pp8 vpp12 b6: ZeRO 1 then 2, each infeasible under the cut),
four CP-SAT proofs where two decide.

``proved_out`` keeps the proofs (the objective's signature, the bytes, the cut) and answers for a
configuration about to be solved under a cut: True when a twin with no more bytes was proved out
under a cut at least as loose; else, where such a twin exists and is unknown, it is solved first
(once) under this cut, and its infeasibility proves both. The result stays exact: a configuration
is dropped only on a CP-SAT proof of infeasibility of a program whose feasible splits include all of
its own, at the same objective.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

MEMORY_FIELDS = ("state_bytes", "act_bytes", "act_none_bytes", "weight_bytes")
DERIVED_FIELDS = ("times", "runtime")   # row_s etc. and the config's runtime are compared instead


def signature(terms) -> tuple:
    """Everything the split program's objective and cuts read, as a hashable value: two terms of
    one signature price every split the same (memory aside)."""
    from autopar.search.terms import time_unit
    co = terms.coef
    parts = []
    for f in dataclasses.fields(co):
        if f.name in MEMORY_FIELDS or f.name in DERIVED_FIELDS:
            continue
        v = getattr(co, f.name)
        parts.append((f.name, v.tobytes() + str(v.dtype).encode() if isinstance(v, np.ndarray) else v))
    c = terms.config
    return (tuple(parts), terms.m, terms.pp, terms.vpp, c.schedule, c.runtime, tuple(terms.inflight),
            terms.zero3_gathers, terms.dp_sync, terms.full_recompute, terms.split_backward,
            time_unit(terms.time_lower_bound()))


def no_more_memory(a, b) -> bool:
    """Whether every split ``b`` fits, ``a`` fits too: per row no more bytes, no more reserve,
    no less HBM, the same in-flight counts, and ``a``'s ZeRO-3 buffer only where ``b`` has one."""
    ca, cb = a.coef, b.coef
    if a.states is not None or b.states is not None or list(a.inflight) != list(b.inflight):
        return False
    if a.reserve > b.reserve or a.hbm < b.hbm or (a.zero3_buffer and not b.zero3_buffer):
        return False
    if a.full_recompute != b.full_recompute:
        return False
    fields = ["state_bytes", "act_bytes"] + (["act_none_bytes"] if a.full_recompute else []) \
        + (["weight_bytes"] if a.zero3_buffer else [])
    return all(np.all(np.asarray(getattr(ca, f)) <= np.asarray(getattr(cb, f))) for f in fields)


class Twins:
    """The proofs of one search (module docstring)."""

    def __init__(self, costs):
        self.costs = costs
        self.out: dict = {}        # signature -> [(terms, cut)] proved to have no split under cut
        self.tried: set = set()    # twins already solved ahead of their turn

    def record(self, terms, cut: float) -> None:
        """CP-SAT proved no split of ``terms`` under the k-th plan's cut ``cut``."""
        if terms.states is None:
            self.out.setdefault(signature(terms), []).append((terms, cut))

    def proved_out(self, frontier, c, terms, cut: float) -> bool:
        """Whether ``c`` (terms ``terms``) has no split under ``cut`` by a twin's proof (module
        docstring), solving the twin with the fewest bytes first where it is unknown."""
        if terms.states is not None or frontier.fixed_stages is not None:
            return False
        sig = signature(terms)
        if any(cut <= cut_a and no_more_memory(a, terms) for a, cut_a in self.out.get(sig, ())):
            return True
        best = None
        for z in range(3):   # ZeRO 0-2: the same objective is possible; 3 gathers weights
            if z == c.zero:
                continue
            twin = dataclasses.replace(c, zero=z)
            # only a twin of the searched space: a ZeRO stage the runtime lacks, or one --fix
            # excludes, is no plan (the solve below may hand its split on as a real plan)
            if twin in self.tried or twin not in frontier.offered:
                continue
            try:
                tt = self.costs.terms(twin)
            except Exception:   # noqa: BLE001  (not a valid configuration: no twin)
                continue
            if no_more_memory(tt, terms) and signature(tt) == sig and (best is None or no_more_memory(tt, best[1])):
                best = (twin, tt)
        if best is None:
            return False
        twin, tt = best
        self.tried.add(twin)
        from autopar.search.split_model import SplitModel
        res = frontier._solve(twin, SplitModel(tt, time_limit_s=frontier.solve_limit_s, upper_bound_s=cut,
                                               wall_limit_s=max(0.05, frontier.deadline - time.perf_counter())))
        if res.status == "infeasible":
            self.record(tt, cut)
            return True
        frontier._incumbent(twin, res)   # a split it found is a real plan: a cut for what follows
        return False
