"""A configuration's model states against HBM, before any of its row times are priced.

Two bounds, and a configuration above HBM on either is dropped: one under the split program's
memory (so CP-SAT could not fit it either), one under ``estimate``'s (so no plan of it fits, and
neither the search nor enumeration could return one).

DeepSeek-V3-like on 1024 H100 lists 139,584 configurations; most hold far more weights,
gradients and optimizer state per GPU than 80 GB (671 B parameters: tp 1, pp 1 and ep 8 keep 84 B
of them on each GPU). The frontier used to find that out at level 1, after the configuration's
quick bound (``Costs.quick_bound``) and its full coefficients (``Costs.terms``), and the lowest
quick bounds are exactly those of the least sharded layouts, so thousands of them were priced
twice before the first split. ``static_memory_bound`` is ``Terms.memory_lower_bound`` with the
activations left out and the ranks weighted evenly (λ_r = 1/pp, one of the weights its LP
argument allows): ``R + Σ_i σ_i / pp`` ≤ the most loaded GPU's memory under any split, where
``σ_i`` is the row's states after tp, ep and ZeRO exactly as ``coefficients.row_coefficients``
computes them (``state_bytes``). It reads only per-row parameter counts, no matmuls, so it is
cached per (tp, pp, dp, zero, ep, etp, HSDP shard, cp) and costs nothing next to a quick bound.
"""
from __future__ import annotations

import numpy as np

from costmodels.model.allocator import as_allocated, optimizer_share
from costmodels.model.context_parallel import zero_group
from costmodels.model.experts import expert_state_bytes, fix_stage_memory
from costmodels.model.memory import model_state_bytes, stage_memory
from costmodels.profiles.runtime import load_runtime

PRECISION = "bf16-mixed"   # the search's memory recipe (Costs.terms)


class StaticMemory:
    """``static_memory_bound`` of the configurations of one ``Costs``, cached by what it reads."""

    def __init__(self, costs):
        self.costs = costs
        self._cache: dict = {}

    def bound(self, c) -> float:
        """``R + Σ σ_i / pp`` of ``c`` in bytes (module docstring)."""
        key = (c.tp, c.pp, c.dp, c.zero, c.ep, c.etp, c.dp_shard, c.cp, c.runtime, c.precision)
        b = self._cache.get(key)
        if b is None:
            b = self._cache[key] = self._bound(c)
        return b

    def _bound(self, c) -> float:
        return max(self.program_bound(c), self.estimate_bound(c))

    def program_bound(self, c) -> float:
        """``R + Σ σ_i / pp``: under the split program's memory for every split."""
        _table, arr, c = self.costs.priced(c)
        state = expert_state_bytes(arr, c, PRECISION)
        if state is None:   # a dense model: coefficients.row_coefficients' σ_i
            p_b, g_b, o_b = model_state_bytes(1.0, zero_group(c), c.zero, PRECISION)
            o_b *= optimizer_share(load_runtime(c.runtime), PRECISION)
            state = arr.params / c.tp * (p_b + g_b + o_b)
        return self.costs.profile.memory_reserve_bytes + float(state.sum()) / c.pp

    def estimate_bound(self, c) -> float:
        """``R + states / pp`` with the states as ``estimate`` charges them: under its memory
        of the most loaded GPU for every split (``_estimate_states``)."""
        _table, arr, c = self.costs.priced(c)
        return self.costs.profile.memory_reserve_bytes + self._estimate_states(arr, c) / c.pp

    @staticmethod
    def _estimate_states(arr, c) -> float:
        """Weights, gradients and optimizer state of the whole table as ``estimate`` charges them
        (``memory.stage_memory``, ``experts.fix_stage_memory``, ``allocator.as_allocated``), no
        activations: each is linear in a rank's parameters or clipped at 0 above, so the ranks'
        sum is at least the whole table's. It equals Σσ but where a row's value is clipped at 0
        (``fix_stage_memory``'s ``max(0, …)``), and only the estimate decides what fits."""
        chunks = [(0, arr.n)]
        mem = stage_memory(arr, chunks, tp=c.tp, dp=zero_group(c), zero=c.zero, sp=c.sequence_parallel,
                           b=c.micro_batch_size, recompute=c.recompute, attention=c.attention, inflight=[0],
                           reserve=0.0, act_rows=np.zeros(arr.n), precision=PRECISION)
        mem = as_allocated(fix_stage_memory(mem, arr, chunks, c, PRECISION), load_runtime(c.runtime), PRECISION)
        return float(mem["params"] + mem["grads"] + mem["optimizer"])

    def over_hbm(self, c) -> bool:
        """No split of ``c`` fits: its states alone exceed the GPU's memory."""
        return self.bound(c) > self.costs.profile.hbm_bytes
