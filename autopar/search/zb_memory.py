"""The estimate's memory of one pipeline rank of a zero-bubble plan, for ``zb_exact``'s prune.

Why not the split program's memory (``split_memory``): it is conservative against the estimate
(bytes rounded up per row, the full-recompute working set on every rank holding a block), by
up to 0.3 % on small random tables — a prune on it dropped splits the estimate says fit. This
is ``costmodels.model.estimate``'s own per-rank computation (its loop over ranks: the in-flight
counts read off the simulated order, ``stage_memory``, ``fix_stage_memory``, ``as_allocated``)
for one rank's stages, so a rank over HBM here is over HBM in the estimate of every split that
gives the rank those stages.
"""
from __future__ import annotations

from dataclasses import replace

from costmodels.model.allocator import as_allocated
from costmodels.model.coefficients import row_coefficients
from costmodels.model.context_parallel import zero_group
from costmodels.model.experts import fix_stage_memory
from costmodels.model.long_sequence_memory import fixed_buffer_bytes
from costmodels.model.memory import split_in_flight, stage_memory, w_input_bytes
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.runtime import load_runtime

PRECISION = "bf16-mixed"   # the recipe the search's evaluator prices (Costs.evaluate: the default)


class RankMemory:
    """``total(r, ranges)``: bytes on rank r's GPU with its stages on rows ``ranges``."""

    def __init__(self, table, profile, plan, m: int):
        if plan.attention == "flash" and not table.fused_attention:   # as estimate
            plan = replace(plan, attention="math")
        self.plan, self.m = plan, m
        self.runtime = load_runtime(plan.runtime)
        self.arr = table_arrays(table)
        self.act = row_coefficients(table, profile, plan, PRECISION).act_bytes
        self.w_rows = w_input_bytes(self.arr, plan.tp, plan.micro_batch_size)
        self.reserve = profile.memory_reserve_bytes + fixed_buffer_bytes(table, plan, self.runtime)
        self.hbm = profile.hbm_bytes

    def total(self, r: int, ranges: list[tuple[int, int]]) -> float:
        p = self.plan
        infl, w_held = split_in_flight(p.schedule, p.pp, p.vpp, self.m, r,
                                       [float(self.act[a:b].sum()) for a, b in ranges],
                                       [float(self.w_rows[a:b].sum()) for a, b in ranges])
        mem = stage_memory(self.arr, ranges, tp=p.tp, dp=zero_group(p), zero=p.zero,
                           sp=p.sequence_parallel, b=p.micro_batch_size, recompute=p.recompute,
                           attention=p.attention, inflight=infl, reserve=self.reserve,
                           act_rows=self.act, precision=PRECISION, m=self.m, pp=p.pp, vpp=p.vpp,
                           inflight_later=None, w_inputs=w_held)
        return float(as_allocated(fix_stage_memory(mem, self.arr, ranges, p, PRECISION),
                                  self.runtime, PRECISION)["total"])
