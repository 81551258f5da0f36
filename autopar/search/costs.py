"""The search's view of the cost model: per-configuration coefficients, bounds, and the evaluator.

Everything here calls the same pure functions ``costmodels.estimate`` composes
(``compute.row_times``, ``memory.activation_bytes`` / ``in_flight`` / ``model_state_bytes``,
``comm.collective_time`` / ``collective_steps`` / ``plan_tiers``, ``estimate.dp_sync``,
``compute.optimizer_step_s``), so the integer model's
objective is ``estimate``'s step time up to integer rounding, and ``evaluate`` *is* ``estimate``.
"""
from __future__ import annotations


import numpy as np

from costmodels.comm import collective_steps, collective_time, plan_tiers
from costmodels.compute import activation_bytes_none, optimizer_step_s, row_times, table_arrays
from costmodels.estimate import dp_sync, dp_sync_collectives, estimate
from costmodels.memory import BYTES_PARAM, activation_bytes, in_flight, model_state_bytes
from autopar.search.split_model import Terms
from autopar.search.space import Config


class Costs:
    """Cost-model coefficients for one (table, profile, global batch)."""

    def __init__(self, table, profile, global_batch: int):
        self.table = table
        self.profile = profile
        self.global_batch = global_batch
        self.arr = table_arrays(table)
        self._quick: dict = {}

    # ---- helpers -----------------------------------------------------------------------------
    def _tiers(self, c: Config) -> dict[str, str]:
        return plan_tiers(c, self.profile.gpus_per_node)

    def _rows(self, c: Config, tp_tier: str):
        return row_times(self.table, self.profile, c.tp, c.sequence_parallel, c.micro_batch_size,
                         c.recompute, c.attention, tp_tier)

    def m(self, c: Config) -> int:
        return self.global_batch // (c.dp * c.micro_batch_size)

    # ---- level 0: cheap bound -------------------------------------------------------------
    def quick_bound(self, c: Config) -> float:
        """Lower bound on the step time of any split of ``c``: compute only, perfectly balanced,
        no communication exposed except the tensor-parallel collectives (always on the path)."""
        tiers = self._tiers(c)
        key = (c.tp, c.sequence_parallel, c.micro_batch_size, c.recompute, c.attention, tiers["tp"])
        q = self._quick.get(key)
        if q is None:
            rt = self._rows(c, tiers["tp"])
            tau = rt.fwd_s + rt.bwd_s + rt.recompute_s + rt.tp_fwd_s + rt.tp_bwd_s + rt.tp_recompute_s
            q = (float(tau.sum()), float(tau.max()))
            self._quick[key] = q
        total, mx = q
        m, v = self.m(c), c.vpp
        tmax = max(total / c.pp, mx)
        opt = optimizer_step_s(float(self.arr.params.sum()) / c.tp / c.pp
                               / (c.dp if c.zero >= 1 else 1), self.profile)
        return (m - 1.0 / v) * tmax + total / v + opt

    # ---- level 1: the split program's coefficients --------------------------------------------
    def terms(self, c: Config) -> Terms:
        arr, prof = self.arr, self.profile
        tiers = self._tiers(c)
        rt = self._rows(c, tiers["tp"])
        tau = rt.fwd_s + rt.bwd_s + rt.recompute_s + rt.tp_fwd_s + rt.tp_bwd_s + rt.tp_recompute_s
        k = c.micro_batch_size / self.table.micro_batch
        params = arr.params / c.tp
        p_b, g_b, o_b = model_state_bytes(1.0, c.dp, c.zero)
        static = params * (p_b + g_b + o_b)
        act = activation_bytes(arr, c.tp, c.sequence_parallel, c.micro_batch_size, c.recompute, c.attention)
        act_none = activation_bytes_none(arr, c.tp, c.sequence_parallel, c.micro_batch_size, c.attention)
        n = arr.n
        send = np.zeros(n + 1)
        grad = np.zeros(n + 1)
        if c.pp > 1:
            tier = prof.tier(tiers["pp"])
            nb = arr.boundary * k / c.tp
            _, tt = collective_time("p2p", nb, 2, tier)
            send[1:] = tt        # a stage ending at x sends boundary[x-1]
            grad[1:] = tt        # a stage starting at x > 0 sends the gradient of boundary[x-1]
        m = self.m(c)
        inflight = [0] * (c.pp * c.vpp)
        for r in range(c.pp):
            infl = in_flight(c.schedule, c.pp, c.vpp, m, r)
            for j, cnt in enumerate(infl):
                inflight[j * c.pp + r] = cnt
        dtier = prof.tier(tiers["dp"])
        z_on = c.zero == 3 and c.dp > 1
        zgather = np.zeros(n)
        if z_on:   # one all-gather per row and pass (empty rows cost nothing), comm docstring
            zgather = np.asarray(collective_time("all_gather_into_tensor", BYTES_PARAM * arr.params / c.tp, c.dp,
                                                 dtier)[1], dtype=float)
        d_on = c.dp > 1
        d_lat = d_pp = 0.0
        if d_on:   # estimate's dp_sync, split into its fixed latency and its cost per parameter
            _, _, one = dp_sync(1.0, c, prof, tiers["dp"])
            # per collective: its latency steps; the rest of one parameter's time is per parameter
            d_lat = sum(collective_steps(k, c.dp) * dtier.alpha_beta(k)[0]
                        for k, _ in dp_sync_collectives(c))
            d_pp = one - d_lat
        o_pp = optimizer_step_s(1.0, prof) / (c.dp if c.zero >= 1 else 1)
        ov = prof.overlap(c.zero)   # fwd / bwdrec are only the windows dp and ZeRO comm hides in
        return Terms(config=c, m=m, pp=c.pp, vpp=c.vpp, tau=tau, fwd=ov * np.asarray(rt.fwd_s),
                     bwdrec=ov * (rt.bwd_s + rt.recompute_s), params=params, static=static, act=act,
                     is_block=arr.is_block, act_none=act_none, send=send, grad=grad,
                     inflight=inflight, reserve=prof.memory_reserve_bytes, hbm=prof.hbm_bytes,
                     zero3=c.zero == 3, z_on=z_on, zgather=zgather, d_on=d_on,
                     d_lat=d_lat, d_per_param=d_pp, o_per_param=o_pp,
                     full_recompute=c.recompute == "full")

    # ---- the evaluator -----------------------------------------------------------------------
    def evaluate(self, plan) -> dict:
        """``costmodels.estimate`` on ``plan`` (the solver-free scorer of any plan)."""
        return estimate(self.table, self.profile, plan, plan.world_size, self.global_batch).to_dict()
