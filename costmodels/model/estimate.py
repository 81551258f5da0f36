"""Totals: score one plan — step time, throughput, MFU, memory, communication, breakdown.

``estimate(table, profile, plan, gpus, global_batch) -> Estimate`` composes the pure per-term
functions of the other modules: the per-row coefficients of the plan's configuration
(``coefficients.row_coefficients``: row times, p2p at each cut, ZeRO-3 gathers, activation
bytes, the dp sync's line), memory.stage_memory, pipeline.pipeline_time. The search's integer
program reads the same coefficients, so its objective is this step time up to its rounding.

For virtual stage ``c`` (rows [s, e)) and one micro-batch, with ``k = b/b0``::

    F_c = Σ fwd_i + Σ tp_fwd_i + p2p(out)        B_c = Σ bwd_i + Σ tp_bwd_i + p2p(grad in)
    R_c = Σ recompute_i + Σ tp_recompute_i       Z_c = ZeRO-3 gathers exposed (comm docstring)
    t_c = F_c + B_c + R_c + Z_c,   T_r = Σ_{c on rank r} t_c   (chunk c runs on rank c mod pp)

    pipeline time, bubble = pipeline.pipeline_time([[t_c for c on r] for r], m, vpp)
        (v = 1: m·T_max + Σ_r T_r − T_max; interleaved: m·Σ_j C_j + (pp − 1)·max_j C_j with
         C_j the slowest j-th chunk over ranks — pipeline's docstring)
    dp_exposed = max_r max(0, t_dp,r − overlap_r) (+ autopar's ZeRO-1 broadcasts, never hidden,
                 ``zero1_broadcast``),  overlap_r = ov · (backward (+recompute) of one micro-batch
                 on rank r + the backward of ranks 0..r−1 that still follows it; ov times
                 pp − (pp−1)/vpp under interleaving where each chunk syncs after its own last
                 backward: costmodels/profiles/interleaved_dp_window.py)
    step_time  = pipeline time + dp_exposed + optimizer step (Adam, memory-bound, compute.py)

    tokens_per_s   = global_batch · seq / step_time
    model FLOPs    = Σ_rows (fwd_flops + bwd_flops) · global_batch / b0   (no recompute: MFU)
    tflops_per_gpu = model FLOPs / (gpus · step_time) / 1e12
    mfu            = model FLOPs / (gpus · peak · step_time)

Breakdown (of the slowest rank r*, sums to step_time): compute = m·Σ(fwd + bwd) + optimizer,
recompute = m·Σ recompute, tp_exposed / pp_exposed / zero_exposed = m·(their exposed time),
bubble = pipeline time − m·T_r*, dp_exposed as above. Memory is that of the most loaded GPU, in
the ``precision`` recipe (memory.py). The recipe also sets the time of what it changes: the
bytes per gradient and weight that dp / ZeRO communication moves (``STATE_BYTES``: 2 in
bf16-mixed, 4 in autopar's fp32-parameter runtime), and for "amp" autocast's casts
(``compute.autocast_step_s``, added to the optimizer step), and ZeRO-1 as autopar's runtime
runs it (DDP all-reduce + the owners' broadcasts). The search plans in bf16-mixed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from costmodels.contracts.breakdown import BREAKDOWN_KEYS, MEMORY_KEYS  # noqa: F401  (re-exported)
from costmodels.contracts.errors import PlanError
from costmodels.contracts.layer_table import LayerTable
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES, V_SCHEDULES, Plan
from costmodels.model import torch_tp_memory
from costmodels.model.allocator import as_allocated
from costmodels.model.checks import check_plan
from costmodels.model.cluster_estimate import cross_pool_sends, pool_detail, rank_hardware
from costmodels.model.coefficients import (
    dp_exposed,
    dp_sync,
    grad_bytes,
    row_coefficients,
    zero_exposed,
    zero_row_collectives,
)
from costmodels.model.comm import collective_time, plan_tiers
from costmodels.model.compute import RUNTIME_PRECISIONS
from costmodels.model.context_parallel import zero_group
from costmodels.model.estimate_result import Estimate
from costmodels.model.experts import ep_comm, fix_stage_memory
from costmodels.model.long_sequence_memory import fixed_buffer_bytes
from costmodels.model.memory import (
    STATE_BYTES,
    check_precision,
    in_flight,
    split_in_flight,
    stage_memory,
    w_input_bytes,
)
from costmodels.model.optimizer import autocast_step_s, optimizer_shards, optimizer_step_s
from costmodels.model.pipeline import pipeline_time
from costmodels.model.pipeline_fsdp_memory import stage_states, with_held_outputs
from costmodels.model.pipeline_split import split_pipeline_time
from costmodels.model.precision import check_plan_precision, stack_key
from costmodels.model.step_tail import step_tail_per_param_s
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.cluster import Cluster
from costmodels.profiles.error_bands import band_for
from costmodels.profiles.fp8_shapes import check_fp8_shapes
from costmodels.profiles.hardware import HardwareProfile  # noqa: F401  (re-exported)
from costmodels.profiles.kernel_stacks import stack_profile
from costmodels.profiles.runtime import load_runtime
from costmodels.profiles.runtime_rules import check_runtime


@dataclass(frozen=True)
class ChunkCost:
    """One virtual stage (chunk) for one micro-batch; seconds and bytes per GPU."""

    fwd_s: float          # compute + memory traffic
    bwd_s: float
    recompute_s: float
    tp_s: float           # TP collectives fwd + bwd + recompute (exposed)
    pp_s: float           # p2p sends fwd + bwd (exposed)
    zero_s: float         # ZeRO-3 gathers, exposed part
    tp_bytes: float
    pp_bytes: float
    zero_bytes: float
    params: float         # parameters of the chunk on this GPU (after tp)
    zero_total_s: float = 0.0   # ZeRO-3 gathers, all of it (hidden or not)
    bwd_w_s: float = 0.0        # of bwd_s: the weight-gradient (W) matmuls

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s + self.tp_s + self.pp_s + self.zero_s


def chunk_cost(table: LayerTable, profile: HardwareProfile, plan: Plan, start: int, end: int,
               virtual_stage: int, precision: str = "bf16-mixed") -> ChunkCost:
    """Cost of rows [start, end) as virtual stage ``virtual_stage`` of ``plan`` (pure function):
    range sums of the configuration's ``RowCoefficients``, the p2p at the stage's two cuts and
    the part of its ZeRO-3 gathers compute does not hide."""
    arr = table_arrays(table)
    co = row_coefficients(table, profile, plan, precision)
    rt = co.times
    f = rt.range_sum("fwd_s", start, end)
    bw = rt.range_sum("bwd_s", start, end)
    bw_w = rt.range_sum("bwd_w_s", start, end)
    rec = rt.range_sum("recompute_s", start, end)
    tp_s = (rt.range_sum("tp_fwd_s", start, end) + rt.range_sum("tp_bwd_s", start, end)
            + rt.range_sum("tp_recompute_s", start, end))
    tp_b = (rt.range_sum("tp_bytes_fwd", start, end) + rt.range_sum("tp_bytes_bwd", start, end)
            + rt.range_sum("tp_bytes_recompute", start, end))
    pp_s = pp_b = 0.0
    nvs = plan.pp * plan.vpp
    turn = plan.pp - 1 if plan.schedule in V_SCHEDULES else None   # V: stages pp−1, pp on one rank
    if plan.pp > 1:
        if virtual_stage < nvs - 1 and virtual_stage != turn:       # send the output forward
            pp_s += float(co.cut_p2p_s[end])
            pp_b += float(co.cut_p2p_bytes[end])
        if virtual_stage > 0 and start > 0 and (turn is None or virtual_stage != turn + 1):
            # send the input gradient backward
            pp_s += float(co.cut_p2p_s[start])
            pp_b += float(co.cut_p2p_bytes[start])
    params = float(arr.params[start:end].sum()) / plan.tp
    if plan.ep > 1 or plan.etp > 1:   # routed experts sharded over ep·etp (costmodels.model.experts)
        params = float(co.params[start:end].sum())
    z_s = z_b = z_all = 0.0
    if co.zero_collectives:
        # the ZeRO gathers (and per-micro-batch reduce-scatters) of the stage, less what compute
        # hides (coefficients docstring); autopar's runtime: max(0, Σg − ov·F) + max(0, Σg − ov·B)
        gf, gb = float(np.sum(co.zero_fwd_s[start:end])), float(np.sum(co.zero_bwd_s[start:end]))
        ov = co.runtime.zero_window(profile.overlap(plan.zero)) * (1.0 - co.slowdown)
        z_s = (zero_exposed(float(co.zero_first_fwd_s[start]), gf, ov * f, co.slowdown)
               + zero_exposed(float(co.zero_first_bwd_s[start]), gb, ov * (bw + rec), co.slowdown))
        z_b = float(np.sum(co.zero_fwd_bytes[start:end])) + float(np.sum(co.zero_bwd_bytes[start:end]))
        z_all = gf + gb
    return ChunkCost(fwd_s=f, bwd_s=bw, recompute_s=rec, tp_s=tp_s, pp_s=pp_s, zero_s=z_s,
                     tp_bytes=tp_b, pp_bytes=pp_b, zero_bytes=z_b, params=params,
                     zero_total_s=z_all, bwd_w_s=bw_w)


def zero1_broadcast(params_per_gpu: float, plan: Plan, profile: HardwareProfile, tier: str,
                    precision: str) -> tuple[float, float]:
    """(bytes per GPU, seconds) of autopar's ZeRO-1 parameter broadcasts: after the optimizer
    step each of the dp owners broadcasts the 1/dp of the weights it updated
    (runtime/data_parallel.py), ``dp`` collectives, each priced as an all-gather of its buffer
    (the same bytes per GPU); 0 for Megatron's recipe, whose reduce-scatter + all-gather
    ``dp_sync`` already counts."""
    if plan.zero != 1 or plan.dp <= 1 or precision not in RUNTIME_PRECISIONS:
        return 0.0, 0.0
    b, s = collective_time("all_gather", STATE_BYTES[precision][0] * params_per_gpu / plan.dp,
                           plan.dp, profile.group_link(plan, "dp"), line=True)
    return plan.dp * float(b), plan.dp * float(s)


def estimate(table: LayerTable, profile: HardwareProfile | str | Cluster, plan: Plan, gpus: int,
             global_batch: int, *, precision: str = "bf16-mixed") -> Estimate:
    """Score ``plan`` for ``table`` on ``gpus`` GPUs of ``profile`` at ``global_batch`` sequences;
    ``precision`` picks the memory model's recipe (costmodels.model.memory: "bf16-mixed", "amp", "fp32").
    ``profile`` may be a ``costmodels.profiles.cluster.Cluster`` for a plan with ``pools``: every pipeline
    rank is then priced on its pool's profile (``costmodels.model.cluster_estimate``) and ``gpus`` is
    the GPUs the plan uses."""
    check_precision(precision)
    if isinstance(plan, dict):
        plan = Plan.from_dict(plan)
    if plan.attention == "flash" and not table.fused_attention:   # the model runs materialised attention
        plan = replace(plan, attention="math")
    if plan.precision != "bf16":   # the stack's FP8 GEMM shape rule (costmodels.profiles.fp8_shapes)
        check_fp8_shapes(table, plan, load_runtime(plan.runtime))
    if plan.cp > 1:   # context parallelism: the per-rank share, cp folded into dp (context_parallel)
        from costmodels.model.context_parallel_estimate import cp_estimate
        return cp_estimate(estimate, table, profile, plan, gpus, global_batch, precision)
    hw = rank_hardware(profile, plan)
    profs = hw.profiles
    profile = profs[0]
    if not hw.uniform:
        gpus = plan.world_size
    runtime = load_runtime(plan.runtime)
    check_runtime(runtime, plan, table.layers, precision)
    for pr in profs:   # an FP8 plan on a GPU, stack or recipe without FP8 (costmodels.model.precision)
        check_plan_precision(plan, pr, stack_key(runtime), precision)
    stages = check_plan(table, plan, gpus, global_batch)
    gpus, global_batch = int(gpus), int(global_batch)
    m = plan.num_micro_batches(global_batch)
    p, v = plan.pp, plan.vpp
    tiers_r = [plan_tiers(plan, pr.link_domain) for pr in profs]
    arr = table_arrays(table)
    rank_chunks = [list(plan.stages_of_rank(r)) for r in range(p)]
    rank_of = {c: r for r, cs in enumerate(rank_chunks) for c in cs}
    chunks = [chunk_cost(table, profs[rank_of[c]], plan, s, e, c, precision) for c, (s, e) in enumerate(stages)]
    co_r = [row_coefficients(table, pr, plan, precision) for pr in profs]
    chunks = cross_pool_sends(table, chunks, stages, plan, hw, [co_r[rank_of[c]] for c in range(len(stages))])
    T = [sum(chunks[c].total_s for c in cs) for cs in rank_chunks]
    if plan.schedule in SPLIT_BACKWARD_SCHEDULES:
        pipe_s, bubble_s = split_pipeline_time(
            plan.schedule, *([[fn(chunks[c]) for c in cs] for cs in rank_chunks]
                             for fn in (lambda c: _fwd_total(c, plan), lambda c: _bwd_total(c, plan),
                                        lambda c: c.bwd_w_s)), m)
    else:
        pipe_s, bubble_s = pipeline_time([[chunks[c].total_s for c in cs] for cs in rank_chunks], m, v)

    # data-parallel gradient sync, overlapped with the tail of the backward (coefficients docstring)
    co = co_r[0]
    share_r = [(1.0 - c.slowdown) * runtime.dp_window_for(plan, pr.overlap(plan.zero)) for c, pr in zip(co_r, profs)]
    bwd_r = [share_r[r] * sum(chunks[c].bwd_s + chunks[c].recompute_s for c in cs)
             for r, cs in enumerate(rank_chunks)]
    params_r = [sum(chunks[c].params for c in cs) for cs in rank_chunks]
    dp_info = [dp_sync(params_r[r], plan, profs[r], tiers_r[r]["dp"], precision) for r in range(p)]
    after = [dp_sync(params_r[r], plan, profs[r], tiers_r[r]["dp"], precision, "after") for r in range(p)]
    bcast = [zero1_broadcast(params_r[r], plan, profs[r], tiers_r[r]["dp"], precision) for r in range(p)]
    dp_exposed_r = [dp_exposed(dp_info[r][2], bwd_r[r] + sum(bwd_r[:r]), co_r[r]) + after[r][2]
                    + bcast[r][1] for r in range(p)]
    dp_exposed_s = max(dp_exposed_r)
    opt_r = [optimizer_step_s(params_r[r] / optimizer_shards(zero_group(plan), plan.zero),
                              stack_profile(profs[r], runtime.kernel_stack))   # its stack's optimizer
             + autocast_step_s(params_r[r], m, precision, profs[r])
             + params_r[r] * step_tail_per_param_s(   # Megatron-core's once-a-step work (step_tail.py)
                 arr, plan, runtime, stack_profile(profs[r], runtime.kernel_stack), grad_bytes(precision, runtime),
                 optimizer_shards(zero_group(plan), plan.zero)) for r in range(p)]
    opt_s = max(opt_r)
    step = pipe_s + dp_exposed_s + opt_s
    if step <= 0.0:   # a table with no FLOPs and no bytes (nothing to run): avoid dividing by 0
        raise PlanError(f"the layer table of '{table.model}' has no FLOPs or activation bytes to "
                        "cost; check the model (autopar inspect MODEL)")

    rs = int(np.argmax(T))
    cs = [chunks[c] for c in rank_chunks[rs]]
    breakdown = {
        "compute": m * sum(c.fwd_s + c.bwd_s for c in cs) + opt_s,
        "recompute": m * sum(c.recompute_s for c in cs),
        "bubble": bubble_s,
        "dp_exposed": dp_exposed_s,
        "tp_exposed": m * sum(c.tp_s for c in cs),
        "pp_exposed": m * sum(c.pp_s for c in cs),
        "zero_exposed": m * sum(c.zero_s for c in cs),
    }

    # memory per pipeline rank
    mems = []
    w_rows = w_input_bytes(arr, plan.tp, plan.micro_batch_size)
    for r in range(p):
        w_held = 0.0
        if plan.schedule in SPLIT_BACKWARD_SCHEDULES:   # read off the simulated order
            act_rows = co_r[r].act_bytes
            infl, w_held = split_in_flight(plan.schedule, p, v, m, r,
                                           [float(act_rows[s:e].sum()) for s, e in (stages[c] for c in rank_chunks[r])],
                                           [float(w_rows[s:e].sum()) for s, e in (stages[c] for c in rank_chunks[r])])
            later = None
        else:
            infl = in_flight(plan.schedule, p, v, m, r)
            later = in_flight(plan.schedule, p, v, m - 1, r) if m > 1 else None
        mems.append(stage_memory(arr, [stages[c] for c in rank_chunks[r]], tp=plan.tp,
                                              dp=zero_group(plan),
                                 zero=plan.zero, sp=plan.sequence_parallel, b=plan.micro_batch_size,
                                 recompute=plan.recompute, attention=plan.attention, inflight=infl,
                                 reserve=profs[r].memory_reserve_bytes + fixed_buffer_bytes(table, plan, runtime),
                                 act_rows=co_r[r].act_bytes,   # (+ userbuffers etc.: long_sequence_memory.py)
                                 precision=precision, m=m, pp=p, vpp=v, inflight_later=later,
                                 w_inputs=w_held, ep=plan.ep))   # experts kept whole (memory._runtime_peak)
        mems[-1] = as_allocated(fix_stage_memory(mems[-1], arr, [stages[c] for c in rank_chunks[r]], plan,
                                                 precision, co_r[r].act_none_bytes),
                                runtime, precision)   # experts.py, allocator.py
        mems[-1] = stage_states(mems[-1], arr, [stages[c] for c in rank_chunks[r]], plan, runtime,
                                precision, zero_group(plan))   # FSDP2 under torch pipelining
        mems[-1] = torch_tp_memory.with_working_set(mems[-1], arr, [stages[c] for c in rank_chunks[r]], plan,
                                                    runtime, precision, co_r[r].act_none_bytes)
        mems[-1] = with_held_outputs(mems[-1], arr, [stages[c] for c in rank_chunks[r]], plan, runtime,
                                     precision, m)   # the last stage's outputs (pipeline_fsdp_memory.py)
    if hw.uniform:
        rm = int(np.argmax([mm["total"] for mm in mems]))
    else:   # the most loaded GPU against its own pool's HBM
        rm = int(np.argmax([mm["total"] / pr.hbm_bytes for mm, pr in zip(mems, profs)]))
    memory = mems[rm]
    tiers = tiers_r[rs]

    model_flops = float(arr.fwd_flops.sum() + arr.bwd_flops.sum()) * global_batch / table.micro_batch
    gpus_peak = (gpus * profile.peak_flops_per_s(table.act_dtype_bytes) if hw.uniform
                 else hw.peak_total(plan, table.act_dtype_bytes))
    tokens = global_batch * table.seq

    comm_bytes = {"dp": dp_info[rs][1] + after[rs][1] + bcast[rs][0], "tp": m * sum(c.tp_bytes for c in cs),
                  "pp": m * sum(c.pp_bytes for c in cs), "zero": m * sum(c.zero_bytes for c in cs)}
    comm = []
    if plan.tp > 1:
        comm.append({"kind": "tp", "collective": "all_gather+reduce_scatter" if plan.sequence_parallel
                     else "all_reduce", "group_size": plan.tp, "tier": tiers["tp"],
                     "bytes_per_gpu": comm_bytes["tp"], "time_s": breakdown["tp_exposed"],
                     "exposed_s": breakdown["tp_exposed"]})
    if plan.pp > 1:
        comm.append({"kind": "pp", "collective": "p2p", "group_size": 2, "tier": tiers["pp"],
                     "bytes_per_gpu": comm_bytes["pp"], "time_s": breakdown["pp_exposed"],
                     "exposed_s": breakdown["pp_exposed"]})
    if plan.dp > 1:
        names = [n for n in (dp_info[rs][0], after[rs][0]) if n != "none"]
        comm.append({"kind": "dp", "collective": "+".join(names or ["none"])
                     + ("+broadcast" if bcast[rs][1] else ""),
                     "group_size": plan.dp, "tier": tiers["dp"], "bytes_per_gpu": comm_bytes["dp"],
                     "time_s": dp_info[rs][2] + after[rs][2] + bcast[rs][1], "exposed_s": dp_exposed_s})
        if co.zero_collectives:
            zt = m * sum(c.zero_total_s for c in cs)
            comm.append({"kind": "zero", "collective": _zero_collectives(plan), "group_size": plan.dp,
                         "tier": tiers["dp"], "bytes_per_gpu": comm_bytes["zero"], "time_s": zt,
                         "exposed_s": breakdown["zero_exposed"]})

    comm.extend(ep_comm(table, profs[rs], plan, [stages[c] for c in rank_chunks[rs]], m))

    stages_detail = []
    for r in range(p):
        detail = {"stage": r, "rows": [list(stages[c]) for c in rank_chunks[r]],
                  "fwd_s": [_fwd_total(chunks[c], plan) for c in rank_chunks[r]],
                  "bwd_s": [_bwd_total(chunks[c], plan) for c in rank_chunks[r]],
                  "memory_bytes": mems[r]}
        if plan.schedule in SPLIT_BACKWARD_SCHEDULES:   # B and W apart (bwd_s = their sum)
            detail["virtual_stages"] = list(rank_chunks[r])
            detail["bwd_w_s"] = [chunks[c].bwd_w_s for c in rank_chunks[r]]
            detail["bwd_b_s"] = [b - w for b, w in zip(detail["bwd_s"], detail["bwd_w_s"])]
        if not hw.uniform:
            detail.update(pool=plan.stage_pools[r], hardware=profs[r].name, hbm_bytes=profs[r].hbm_bytes)
        stages_detail.append(detail)
    return Estimate(
        plan=plan, model=table.model, hardware=hw.name, gpus=int(gpus), global_batch=int(global_batch),
        seq=table.seq, num_micro_batches=m, step_time_s=step, tokens_per_s=tokens / step,
        tflops_per_gpu=model_flops / (gpus * step) / 1e12, mfu=model_flops / (gpus_peak * step),
        bubble_fraction=bubble_s / step, memory_bytes=memory, hbm_bytes=profs[rm].hbm_bytes,
        fits=all(mm["total"] <= pr.hbm_bytes for mm, pr in zip(mems, profs)), comm_bytes=comm_bytes,
        breakdown_s=breakdown, stages_detail=stages_detail, comm=comm, stages=tuple(stages),
        error_band=band_for(profs[rs].name, runtime.name, plan, borrow=profs[rs].nics_per_node is not None),
        cluster=None if hw.uniform else pool_detail(plan, hw))


def _zero_collectives(plan: Plan) -> str:
    """The name of the per-micro-batch ZeRO collectives the plan's runtime issues."""
    kinds = zero_row_collectives(plan, load_runtime(plan.runtime))
    gathers = "all_gather" if kinds & {"fwd", "bwd"} else ""
    return "+".join(k for k in (gathers, "reduce_scatter" if "reduce" in kinds else "") if k)


def _fwd_total(c: ChunkCost, plan: Plan) -> float:
    """Forward of one micro-batch through a chunk: compute + its share of TP / PP / ZeRO time."""
    return c.fwd_s + c.tp_s * _fwd_share(plan) + c.pp_s / 2 + c.zero_s / 2


def _bwd_total(c: ChunkCost, plan: Plan) -> float:
    return c.total_s - _fwd_total(c, plan)


def _fwd_share(plan: Plan) -> float:
    # forward : backward : recompute TP collectives are 1 : 1 : (1 with full recompute)
    return 1 / 3 if plan.recompute == "full" else 1 / 2

