"""The search's view of the cost model: per-configuration coefficients, bounds, and the evaluator.

Nothing here prices anything itself: the coefficients of a configuration's split program are
``costmodels.model.coefficients.row_coefficients`` (the per-row arrays ``estimate`` reads too), the
schedule's in-flight counts ``memory.in_flight``, the cheap bound ``compute.row_times`` and
``optimizer_step_s``. So the integer model's objective is ``estimate``'s step time up to integer
rounding, and ``evaluate`` *is* ``estimate``.
"""
from __future__ import annotations

from autopar.search.space import Config
from autopar.search.terms import Terms
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES, stages_of_rank
from costmodels.model.coefficients import plan_experts, plan_row_times, row_coefficients, zero_hbm_param_s
from costmodels.model.context_parallel import local_table, merged, zero_group
from costmodels.model.estimate import estimate
from costmodels.model.long_sequence_memory import fixed_buffer_bytes
from costmodels.model.memory import in_flight, w_input_bytes
from costmodels.model.optimizer import optimizer_shards, optimizer_step_s
from costmodels.model.schedule_program import in_flight_states, period
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.kernel_stacks import stack_profile
from costmodels.profiles.runtime import load_runtime


class Costs:
    """Cost-model coefficients for one (table, profile, global batch)."""

    def __init__(self, table, profile, global_batch: int):
        self.table = table
        self.profile = profile
        self.global_batch = global_batch
        self.arr = table_arrays(table)
        self._quick: dict = {}
        self._quick_parts: dict = {}
        self._memory_coef: dict = {}

    def m(self, c: Config) -> int:
        return self.global_batch // (c.dp * c.micro_batch_size)

    # ---- level 0: cheap bound -------------------------------------------------------------
    def quick_bound(self, c: Config) -> float:
        """Lower bound on the step time of any split of ``c``: compute only, perfectly balanced,
        no communication exposed except the tensor-parallel collectives (always on the path).
        Its parts but the schedule's are kept per configuration less (schedule, vpp): listing and
        bounding every configuration was most of a throughput_per_gpu search (556k of them)."""
        k0 = (c.dp, c.tp, c.pp, c.micro_batch_size, c.zero, c.recompute, c.sequence_parallel, c.attention,
              c.placement, c.runtime, c.precision, c.cp, c.dp_shard, c.ep, c.etp)
        parts = self._quick_parts.get(k0)
        if parts is None:
            parts = self._quick_parts[k0] = self._quick_bound_parts(c)
        m, tmax, total, opt = parts
        v = c.vpp
        if c.schedule in SPLIT_BACKWARD_SCHEDULES and c.pp > 1:   # W passes may fill the whole bubble
            from autopar.search.zb_chain import quick_chain_s, quick_w_total  # issue 30 (zbdef)
            return max(m * tmax, quick_chain_s(m, c.pp, c.schedule, tmax, total, quick_w_total(self, c))) + opt
        return (m - 1.0 / v) * tmax + total / v + opt

    def _quick_bound_parts(self, c: Config) -> tuple[float, float, float, float]:
        """(m, max(Στ/pp, max τ), Στ, optimizer step) of ``quick_bound``."""
        m = self.m(c)   # micro-batches per step: the same before and after cp is folded into dp
        table, arr, c = self.priced(c)   # cp: the rank's share, cp folded into dp (context_parallel)
        tp_tier = self.profile.group_link(c, "tp")   # the tier estimate prices TP on
        rtp = load_runtime(c.runtime)
        zp = zero_hbm_param_s(c, self.profile, rtp)
        key = (c.tp, c.sequence_parallel, c.micro_batch_size, c.recompute, c.attention, tp_tier, c.runtime, zp,
               id(table), c.ep, c.etp, c.dp, c.placement)
        if c.precision != "bf16":   # FP8 rows (precision.fp8_row_times) depend on the shard too
            key += (c.precision, c.zero)
        q = self._quick.get(key)
        if q is None and table is self.table:   # moesearch: distinct rows priced once (row_classes)
            q = self._quick[key] = self._quick_by_class(c, rtp)
        if q is None:
            moe = plan_experts(arr, self.profile, c, "bf16-mixed", rtp)   # None: a dense model
            tau = plan_row_times(arr, self.profile, c, "bf16-mixed", rtp, moe).row_total_s
            params = float(arr.params.sum()) / c.tp if moe is None else float(moe.params.sum())
            q = (float(tau.sum()), float(tau.max()), params)
            self._quick[key] = q
        total, mx, params = q
        tmax = max(total / c.pp, mx)
        opt = optimizer_step_s(params / c.pp / optimizer_shards(zero_group(c), c.zero),
                               stack_profile(self.profile, rtp.kernel_stack))
        return m, tmax, total, opt

    def _quick_by_class(self, c: Config, rtp):
        """(Σ τ, max τ, Σ params) of ``c`` from the table's distinct rows (``row_classes``),
        or None when its rows are all distinct (moesearch)."""
        if not hasattr(self, "_classes"):
            from autopar.search.row_classes import row_classes
            rc = row_classes(self.table)
            self._classes = (rc, table_arrays(rc.table)) if rc is not None else None
        if self._classes is None:
            return None
        rc, arr = self._classes
        moe = plan_experts(arr, self.profile, c, "bf16-mixed", rtp)
        tau = plan_row_times(arr, self.profile, c, "bf16-mixed", rtp, moe).row_total_s
        params = arr.params / c.tp if moe is None else moe.params
        return (rc.total(tau), float(tau.max()), rc.total(params))

    # ---- level 1: the split program's data ----------------------------------------------------
    def memory_lower_bound(self, c: Config) -> float:
        """``terms(c).memory_lower_bound()``, reading the bytes per row (model state σ, saved
        activations α) of any configuration that differs from ``c`` only in (pp, vpp, schedule):
        they do not depend on those (``coefficients._row_coefficients``), and most configurations
        the search bounds are dropped on memory alone (throughput_per_gpu on 1024 GPUs: 65k of
        67k), which then costs no coefficients of their own."""
        key = (c.dp, c.tp, c.micro_batch_size, c.zero, c.recompute, c.sequence_parallel, c.attention,
               c.placement, c.runtime, c.precision, c.cp, c.dp_shard, c.ep, c.etp)
        coef = self._memory_coef.get(key)
        if coef is None:
            table, _, pc = self.priced(c)
            coef = self._memory_coef[key] = row_coefficients(table, self.profile, pc)
        return self.terms(c, coef=coef).memory_lower_bound()

    def terms(self, c: Config, coef=None) -> Terms:
        """The cost model's coefficients of ``c`` (``row_coefficients``, in the search's recipe
        "bf16-mixed") with the schedule's in-flight count φ_v of every virtual stage v = j·pp + r
        (chunk j of pipeline rank r) and the GPU's memory limits. ``coef``: coefficients already
        known (``memory_lower_bound``'s, for its bytes only)."""
        m = self.m(c)
        table, arr, c = self.priced(c)   # cp: the rank's share, cp folded into dp (context_parallel)
        inflight = [0] * (c.pp * c.vpp)
        states = w_bytes = None
        if c.schedule in SPLIT_BACKWARD_SCHEDULES and c.pp > 1:
            # every moment that may be the peak (memory.split_in_flight picks the largest for a
            # given split); φ_v from the one holding most micro-batches (the memory bound's)
            states = list(in_flight_states(c.schedule, c.pp, c.vpp, min(m, 3 * period(c.schedule, c.pp, m))))
            w_bytes = w_input_bytes(arr, c.tp, c.micro_batch_size)
        for r in range(c.pp):
            stages = stages_of_rank(c.schedule, c.pp, c.vpp, r)
            counts = (in_flight(c.schedule, c.pp, c.vpp, m, r) if states is None
                      else [n for n, _ in max(states[r], key=lambda st: sum(n for n, _ in st))])
            for j, count in enumerate(counts):
                inflight[stages[j]] = count
        coef = with_held_state(coef or row_coefficients(table, self.profile, c), arr, c, m)   # needs m
        return Terms(config=c, coef=coef, m=m,
                     inflight=inflight, reserve=self.profile.memory_reserve_bytes
                     + fixed_buffer_bytes(table, c, load_runtime(c.runtime)),   # long_sequence_memory.py
                     hbm=self.profile.hbm_bytes, states=states, w_input_bytes=w_bytes)

    def priced(self, c: Config):
        """(table, its arrays, configuration) the cost model prices ``c`` on: the table and ``c``
        itself, or under cp the rank's share of the table and ``c`` with cp folded into dp
        (``costmodels.model.context_parallel``: what ``estimate`` prices a cp plan as)."""
        if getattr(c, "cp", 1) <= 1:
            return self.table, self.arr, c
        table = local_table(self.table, c.cp)
        return table, table_arrays(table), merged(c)

    # ---- the evaluator -----------------------------------------------------------------------
    def evaluate(self, plan) -> dict:
        """``costmodels.model.estimate`` on ``plan`` (the solver-free scorer of any plan)."""
        return estimate(self.table, self.profile, plan, plan.world_size, self.global_batch).to_dict()


def with_held_state(coef, arr, c, m: int):
    """``coef`` with the last pipeline stage's held outputs, ``m`` micro-batches' logits, in the
    head row's state bytes (``costmodels.model.pipeline_fsdp_memory.held_output_bytes``; zero
    except for torch's pipelining), as ``estimate`` charges them; ``coef`` itself where none."""
    import dataclasses

    from costmodels.model.pipeline_fsdp_memory import held_output_bytes
    held = held_output_bytes(arr, c, load_runtime(c.runtime), "bf16-mixed", m)
    if not held.any():
        return coef
    return dataclasses.replace(coef, state_bytes=coef.state_bytes + held)
