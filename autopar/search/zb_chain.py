"""A closed-form floor on a zero-bubble configuration's step time: one micro-batch's forward and
input-gradient chain through every stage (issue 30, zbdef).

Why: the split-independent bound of the split-backward schedules (``Terms.time_lower_bound``,
``m·T* + D + O``) assumes the W passes fill every bubble. Where few micro-batches cross a deep
pipeline that is far off: gpt3-175b on 1024 A100 with ``--zero-bubble`` offers interleaved-zb
dp32·tp2·pp16 vpp 6 at micro-batch 48, ``m = 1``, whose bound sat near 17 s while its op graph's
LP (``zb_bound``) says 217 s. Best-first then popped hundreds of such configurations ahead of the
real candidates, each costing its terms, its memory-block program and an LP. The chain costs
nothing to compute and rules them out at the bound they are first offered with.

The argument, for every split and every schedule of ``SPLIT_BACKWARD_SCHEDULES``: in the op
graph (``costmodels.model.schedule_program``) micro-batch 0's forward runs stage 0, 1, …, S−1,
then its input-gradient pass B runs S−1, …, 0, each op waiting on the one before, so the makespan
of any ``m' ≥ 1`` simulated micro-batches is at least ``Σ_v (F_v + B_v)``. Stage v's
``F_v + B_v`` is ``A_v − W_v + Q_v + Z_v`` (``split_schedules.SplitScheduleTime._durations``:
its rows' whole time less their W passes, plus its p2p and exposed ZeRO collectives, ``Z ≥ 0``),
so the chain is at least ``Σ_rows (τ − w) + 2·q_min·(S − 1 − turn)``, whatever the split (every
row sits in one stage; the V's turn sends nothing). ``pipeline_split.split_pipeline_time``
simulates ``m_sim = min(m, 3·period)`` micro-batches and adds at least ``T`` (the busiest rank's
work) per micro-batch past them, so the pipeline time is at least ``chain + (m − m_sim)·T``, and
with the data-parallel exposure ``D`` and the optimizer step ``O`` the step time is at least
``chain + min over splits of ((m − m_sim)·T + D) + O`` (``Terms._t_and_dp_bound``).

``quick_chain_s`` is the same chain in the level-0 bound's terms (compute only, no p2p): the
``quick_bound`` of every configuration, before its terms are built.

Tested against every split's estimate on random tables (``tests/test_search_zb_chain.py``).
"""
from __future__ import annotations

from autopar.search.split_schedules import periods


def simulated_micro_batches(schedule: str, pp: int, m: int) -> int:
    """``m_sim``: the micro-batches ``split_pipeline_time`` simulates before extrapolating."""
    per = periods(schedule, pp, m)
    return per[1] if per else m


def chain_s(terms) -> float:
    """Seconds: a floor on one micro-batch's F/B chain through every virtual stage, any split."""
    co = terms.coef
    body = float(co.row_s.sum()) - float(co.times.bwd_w_s.sum())
    sends = (terms.n_virtual - 1 - terms.v_placement) * 2 * float(co.cut_p2p_s[1:terms.n].min())
    return body + sends


def chain_floor(terms, tsum: float, total: float, tstar: float) -> float:
    """The module docstring's ``chain + min((m − m_sim)·T + D)`` (no optimizer step), with
    ``tsum``, ``total``, ``tstar`` as ``Terms._time_lower_bound`` computes them."""
    if terms.pp < 2:
        return 0.0
    rest = terms.m - simulated_micro_batches(terms.config.schedule, terms.pp, terms.m)
    return chain_s(terms) + terms._t_and_dp_bound(float(rest), tsum, total, tstar)


def quick_chain_s(m: int, pp: int, schedule: str, tmax: float, total: float, w_total: float) -> float:
    """``Costs.quick_bound``'s floor of a split-backward configuration (no optimizer step):
    ``Σ (τ − w) + (m − m_sim)·tmax``, compute only (``tmax ≤ T``, communication ≥ 0)."""
    return total - w_total + (m - simulated_micro_batches(schedule, pp, m)) * tmax


def quick_w_total(costs, c) -> float:
    """Σ w (the rows' W passes) of ``c`` as ``Costs._quick_bound_parts`` prices its Σ τ (the same
    ``plan_row_times``, on the table's distinct rows where it has them), cached per row pricing."""
    from costmodels.model.coefficients import plan_experts, plan_row_times, zero_hbm_param_s
    from costmodels.profiles.runtime import load_runtime
    table, arr, pc = costs.priced(c)
    rtp = load_runtime(pc.runtime)
    key = (pc.tp, pc.sequence_parallel, pc.micro_batch_size, pc.recompute, pc.attention,
           costs.profile.group_link(pc, "tp"), pc.runtime, zero_hbm_param_s(pc, costs.profile, rtp),
           id(table), pc.ep, pc.etp, pc.dp, pc.placement)
    if pc.precision != "bf16":   # as Costs._quick_bound_parts: FP8 rows depend on the shard too
        key += (pc.precision, pc.zero)
    cache = costs.__dict__.setdefault("_zb_w_total", {})
    if key not in cache:
        classes = getattr(costs, "_classes", None) if table is costs.table else None
        if classes is not None:   # Costs._quick_by_class's distinct rows, when it built them
            rc, carr = classes
            moe = plan_experts(carr, costs.profile, pc, "bf16-mixed", rtp)
            cache[key] = rc.total(plan_row_times(carr, costs.profile, pc, "bf16-mixed", rtp, moe).bwd_w_s)
        else:
            moe = plan_experts(arr, costs.profile, pc, "bf16-mixed", rtp)
            cache[key] = float(plan_row_times(arr, costs.profile, pc, "bf16-mixed", rtp, moe).bwd_w_s.sum())
    return cache[key]
