"""Per-row linear coefficients of one configuration: the pieces ``estimate`` adds up, row by row.

``row_coefficients(table, profile, plan) -> RowCoefficients`` is the one place where the
per-row and per-parameter terms of a configuration (a plan without its split points) are
written: ``estimate.chunk_cost`` reads its p2p and ZeRO-3 arrays at a stage's rows, and
``estimate`` its activation bytes; the search's integer program (``autopar.search.split_model``)
takes every coefficient from it. So a formula changed here changes both, and the search's
objective stays ``estimate``'s step time (up to the program's integer rounding).

Per micro-batch and GPU, for rows ``i = 0 … n−1`` and cuts ``x = 0 … n`` (``k = b / b0``)::

    τ_i  = fwd_i + bwd_i + recompute_i + TP collectives       (compute.RowTimes.row_total_s)
    f_i  = ov · fwd_i        β_i = ov · (bwd_i + recompute_i)  (ov = profile.overlap(zero): the
                                       share of dp / ZeRO communication compute hides)
    P[x] = p2p(boundary_{x−1} · k / tp) over the pp tier       (x ≥ 1, pp > 1; else 0): the
           activation a stage ending at x sends and the gradient a stage starting at x sends
           back, the same size (comm docstring, "PP")
    g_i  = all_gather_into_tensor(w · params_i / tp) over dp   (ZeRO-3 with dp > 1; else 0):
           one per row and pass, w the weight bytes per parameter (memory.STATE_BYTES)
    π_i  = params_i / tp      σ_i = π_i · (weights + grads + optimizer bytes per parameter after
           ZeRO, memory.model_state_bytes)      α_i = memory.activation_bytes

and per step, per parameter on the GPU (linear in a stage's ``Π = Σ π_i``)::

    dp sync = λ_d + γ_d · Π     λ_d = Σ_collectives comm.collective_latency (dp_sync_collectives)
                                γ_d = dp_sync(1 parameter) − λ_d   (the α-β line, never a curve)
    Adam    = γ_o · Π           γ_o = compute.optimizer_step_s(1) / compute.optimizer_shards

**The runtime** (``plan.runtime``, ``costmodels.profiles.runtime``) decides what hides where. With
``s`` the compute slowdown (the share of a hidden collective's time compute loses to it: the
GPU's fitted figure, else the runtime's, ``collective_slowdown``),
``ov_d`` / ``ov_z`` the shares of compute the dp sync / ZeRO collectives hide in (the hardware
profile's ``overlap(zero)`` for autopar's runtime; ``ov_d`` times pp − (pp−1)/vpp under
interleaving where the runtime syncs each chunk after its own last backward,
``costmodels/profiles/interleaved_dp_window.py``)::

    β_i  = (1 − s)·ov_d·(bwd_i + recompute_i)     f_i = (1 − s)·ov_z·fwd_i
    βz_i = (1 − s)·ov_z·(bwd_i + recompute_i)     the windows, already net of the slowdown
    gf_i, gb_i, r_i   ZeRO collectives per row and micro-batch: the forward gather (ZeRO-3;
                      ZeRO-2 when the runtime re-gathers every micro-batch, FSDP), the backward
                      gather (ZeRO-3) and the gradient reduce-scatter when the runtime reduces in
                      every backward (``zero_reduce_per_micro_batch``)
    EF[x] = (1 − s)·gf_x, EB[x] = (1 − s)·r_x     at a stage's first row when the runtime leaves
                      that gather / the last reduce-scatter exposed (``zero_edges_exposed``), else 0

    ZeRO, per virtual stage and micro-batch:  max(EF[x_v] + s·Σgf, Σgf − Σf)
                                            + max(EB[x_v] + s·Σ(gb + r), Σ(gb + r) − Σβz)
    dp sync of rank r (t_r = λ_d + γ_d·Π_r its time, W_r = Σ β over its backward and those after
    it, t_b the last bucket's time ``dp_bucket_s``):
                     D_r = max((1 − s)·min(t_r, t_b) + s·t_r,  t_r − W_r,  0) + λ_a + γ_a·Π_r
    (λ_a + γ_a·Π the weights' all-gather after the optimizer step, ZeRO-1/2, that the runtime
    leaves exposed). autopar's runtime on a CPU profile has s = 0, no bucket and no after-part
    (its exposed first gather hides nothing there: FSDP2 overlaps nothing without device
    streams, fsdp_overlap 0): exactly the formulas above this paragraph.

The dp line is ``dp_sync``'s, which ``estimate`` prices per rank; autopar's runtime terms of
the "amp" / "fp32" recipes that are not linear per row (ZeRO-1's broadcasts, autocast's casts,
the runtime's memory peaks) stay in ``estimate``: the search plans in "bf16-mixed".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodels.contracts.layer_table import LayerTable
from costmodels.model import torch_tp_memory
from costmodels.model.allocator import fragmentation, optimizer_share
from costmodels.model.amax_reduction import with_amax_reductions
from costmodels.model.async_tp_fusion import micro_pipeline_tp_cost, unfused_bwd_reduce_scatter_s
from costmodels.model.async_tp_windows import fused_collective_windows
from costmodels.model.collectives_at_scale import extra_collectives_s
from costmodels.model.comm import collective_latency, collective_time, plan_tiers
from costmodels.model.compute import RowTimes, host_block_floor, row_times, runs_on_cpu
from costmodels.model.context_parallel import cp_row_link, cp_row_times, zero_group, zero_link
from costmodels.model.dp_sync import (  # noqa: F401  (re-exported: estimate, the search and tests import them here)
    dp_link,
    dp_sync,
    dp_sync_collectives,
    dp_sync_line,
    grad_bytes,
    zero_row_collectives,
)
from costmodels.model.eager_norm import unfused_norm_times
from costmodels.model.expert_token_gather import with_token_gather
from costmodels.model.experts import expert_state_bytes, expert_terms, with_expert_times, zero_gathered_params
from costmodels.model.fp8_tensor_parallel import fp8_ub_reduce_scatter
from costmodels.model.interleaved_p2p_overlap import p2p_exposed_share
from costmodels.model.long_sequence_memory import loss_logits_held_bytes
from costmodels.model.loss_backward_memory import loss_backward_bytes
from costmodels.model.memory import STATE_BYTES, activation_bytes, model_state_bytes
from costmodels.model.moe_attention_core import with_moe_core_fix
from costmodels.model.optimizer import optimizer_shards, optimizer_step_s
from costmodels.model.pipeline_fsdp_memory import state_bytes_per_param
from costmodels.model.precision import fp8_row_times, fp8_saved_bytes, fp8_weight_share, stack_key
from costmodels.model.recompute_early_stop import early_stop_recompute
from costmodels.model.step_tail import step_tail_per_param_s
from costmodels.model.table_arrays import TableArrays, activation_bytes_none, table_arrays
from costmodels.model.te_activations import te_saved_less
from costmodels.model.te_backward_overlap import te_async_backward
from costmodels.model.tp_overlap import overlapped
from costmodels.model.zero_traffic import grad_accumulate_s, zero_param_s
from costmodels.profiles.hardware import HardwareProfile
from costmodels.profiles.kernel_stacks import stack_elementwise, stack_profile
from costmodels.profiles.runtime import RuntimeProfile, load_runtime


@dataclass(frozen=True, eq=False)
class RowCoefficients:
    """The per-row arrays and per-parameter scalars of one configuration (module docstring);
    seconds and bytes for one micro-batch on one GPU unless said otherwise."""

    times: RowTimes                 # compute.row_times: per-row compute and TP, O(1) range sums
    row_s: np.ndarray               # τ_i
    fwd_window_s: np.ndarray        # f_i  where the ZeRO forward gathers hide
    bwd_window_s: np.ndarray        # β_i  where the dp sync hides
    cut_p2p_bytes: np.ndarray       # [x], x = 0..n: bytes each way across a cut at x
    cut_p2p_s: np.ndarray           # P[x]
    zero3_gather_bytes: np.ndarray  # per row and pass
    zero3_gather_s: np.ndarray      # g_i  one gather of row i's weights
    params: np.ndarray              # π_i  parameters on one GPU
    weight_bytes: np.ndarray        # w·π_i  a row's weights gathered whole (ZeRO-3's buffer)
    state_bytes: np.ndarray         # σ_i  weights + grads + optimizer state after ZeRO
    act_bytes: np.ndarray           # α_i  saved per micro-batch in flight
    act_none_bytes: np.ndarray      # saved without recompute: full recompute's working set
    is_block: np.ndarray            # bool
    dp_latency_s: float             # λ_d  (0 when dp = 1)
    dp_per_param_s: float           # γ_d
    optimizer_per_param_s: float    # γ_o
    zero_bwd_window_s: np.ndarray | None = None   # βz_i  where the ZeRO backward collectives hide
    zero_fwd_s: np.ndarray | None = None          # gf_i
    zero_bwd_s: np.ndarray | None = None          # gb_i + r_i
    zero_fwd_bytes: np.ndarray | None = None
    zero_bwd_bytes: np.ndarray | None = None
    zero_first_fwd_s: np.ndarray | None = None    # EF[x], x = 0..n
    zero_first_bwd_s: np.ndarray | None = None    # EB[x]
    slowdown: float = 0.0                         # s
    dp_bucket_s: float = 0.0                      # t_b  (0: no bucket left for after the backward)
    dp_after_latency_s: float = 0.0               # λ_a
    dp_after_per_param_s: float = 0.0             # γ_a
    runtime: RuntimeProfile | None = None

    @property
    def zero_collectives(self) -> bool:
        """Any ZeRO collective per row and micro-batch (gathers or reduce-scatters)."""
        return bool(self.zero_fwd_s.any() or self.zero_bwd_s.any())

    @property
    def legacy(self) -> bool:
        """autopar's runtime terms: no slowdown, edges, bucket or after-part (module docstring)."""
        return (self.slowdown == 0.0 and self.dp_bucket_s == 0.0 and self.dp_after_per_param_s == 0.0
                and self.dp_after_latency_s == 0.0 and not self.zero_first_fwd_s.any()
                and not self.zero_first_bwd_s.any())

    @property
    def n(self) -> int:
        return len(self.row_s)


_CACHE: dict = {}


def row_coefficients(table: LayerTable, profile: HardwareProfile, plan,
                     precision: str = "bf16-mixed") -> RowCoefficients:
    """The coefficients of ``plan``'s configuration (its split points are ignored); ``plan`` is
    a ``Plan`` or anything with its degree fields (the search's ``Config``). Cached per table,
    profile object, configuration and precision, as ``compute.row_times`` is."""
    arr = table_arrays(table)
    runtime = load_runtime(getattr(plan, "runtime", None))
    key = (arr, profile, plan.dp, plan.tp, plan.pp, plan.micro_batch_size, plan.zero,
           plan.recompute, plan.sequence_parallel, plan.attention, plan.placement, precision, runtime,
           plan.schedule,   # the schedule: split-backward ones may move the dp window (dp_window_for)
           getattr(plan, "vpp", 1),   # interleaving widens the dp window (profiles.interleaved_dp_window)
           getattr(plan, "precision", "bf16"),
           getattr(plan, "dp_shard", None),   # HSDP's shard group (context_parallel)
           getattr(plan, "ep", 1), getattr(plan, "etp", 1))   # expert parallelism (experts.py)
    co = _CACHE.get(key)
    if co is None:
        if len(_CACHE) >= 1024:
            _CACHE.clear()
        co = _CACHE[key] = _row_coefficients(arr, profile, plan, precision, runtime)
    return co


def _row_coefficients(arr: TableArrays, profile: HardwareProfile, plan,
                      precision: str, runtime: RuntimeProfile) -> RowCoefficients:
    tp, dp, b = plan.tp, plan.dp, plan.micro_batch_size
    tiers = plan_tiers(plan, profile.link_domain)
    kernels = stack_profile(profile, runtime.kernel_stack)   # the runtime's kernel stack (kernel_stacks.py)
    moe = plan_experts(arr, profile, plan, precision, runtime)   # None: no Mixture of Experts
    rt = plan_row_times(arr, profile, plan, precision, runtime, moe)
    rt = with_amax_reductions(rt, arr, profile, plan, runtime)   # TE delayed scaling (amax_reduction.py)
    zdp = zero_group(plan)   # ZeRO's shard group: dp, or HSDP's dp_shard (context_parallel)
    hw = profile.overlap(plan.zero)
    s = collective_slowdown(profile, runtime)
    dov, zov = (1.0 - s) * runtime.dp_window_for(plan, hw), (1.0 - s) * runtime.zero_window(hw)
    p2p_b, p2p_s = cut_p2p(arr, b, tp, profile.group_link(plan, "pp") if plan.pp > 1 else None)
    p2p_s = p2p_s * p2p_exposed_share(plan, runtime, s)   # Megatron's overlap_p2p_comm (interleaved_p2p_overlap.py)
    on_gpu = arr.params / tp if moe is None else moe.params   # parameters on one GPU
    weights = STATE_BYTES[precision][0] * on_gpu * fp8_weight_share(arr, plan, stack_key(runtime), plan.zero)
    gather_b, gather_s = np.zeros(arr.n), np.zeros(arr.n)
    zero = zero_row_collectives(plan, runtime)
    if zero and dp > 1:   # one all-gather per row and pass (comm docstring)
        gather_b, gather_s = collective_time("all_gather_into_tensor", weights, zdp,
                                             zero_link(profile, plan))
    gather_b, gather_s = np.asarray(gather_b, dtype=float), np.asarray(gather_s, dtype=float)
    red_b, red_s = np.zeros(arr.n), np.zeros(arr.n)
    if "reduce" in zero and dp > 1:
        red_b, red_s = collective_time("reduce_scatter_tensor", grad_bytes(precision, runtime)
                                       * on_gpu, zdp, zero_link(profile, plan))
    if zero and dp > 1 and runtime.zero_collectives_per_row != 1:   # per module (collectives_at_scale.py)
        lat = collective_latency("all_gather_into_tensor", zdp, zero_link(profile, plan))
        gather_s = gather_s + extra_collectives_s(lat, runtime.zero_collectives_per_row, arr.is_block, arr.params > 0)
        red_s = np.asarray(red_s, dtype=float) + ("reduce" in zero) * extra_collectives_s(
            lat, runtime.zero_collectives_per_row, arr.is_block, arr.params > 0)
    f_on = "fwd" in zero
    zf_s, zf_b = gather_s * f_on, gather_b * f_on
    zb_s = gather_s * ("bwd" in zero) + red_s
    zb_b = gather_b * ("bwd" in zero) + red_b
    edge = (1.0 - s) * runtime.zero_edges_exposed
    first_f, first_b = np.zeros(arr.n + 1), np.zeros(arr.n + 1)
    first_f[:-1], first_b[:-1] = edge * zf_s, edge * red_s
    params = on_gpu
    p_b, g_b, o_b = model_state_bytes(1.0, zdp, plan.zero, precision)
    o_b *= optimizer_share(runtime, precision)   # the runtime's optimizer state (allocator.py)
    p_b, g_b = state_bytes_per_param(arr, plan, runtime, precision, zdp, p_b, g_b)   # pipeline_fsdp_memory.py
    state = params * (p_b + g_b + o_b) if moe is None else expert_state_bytes(arr, plan, precision, runtime)
    act = (activation_bytes(arr, tp, plan.sequence_parallel, b, plan.recompute,
                            plan.attention, precision, runtime.loss_saved_bytes)
           - (fp8_saved_bytes(arr, plan, stack_key(runtime), tp, b) if plan.recompute != "full" else 0.0)
           - te_saved_less(arr, plan, runtime, tp, b)    # TE's fused SwiGLU keeps one tensor fewer (te_activations.py)
           + loss_logits_held_bytes(arr, plan, runtime, tp, b)   # Megatron's loss (long_sequence_memory.py)
           + loss_backward_bytes(arr, plan, runtime, precision)   # unfused loss backward (loss_backward_memory.py)
           + torch_tp_memory.saved_bytes(arr, plan, runtime, precision))   # torch TP's gathered inputs
    if moe is not None:   # the dispatch buffers (experts.py)
        act = act + moe.buffer_bytes
    act = act * (1.0 + fragmentation(runtime))   # what the caching allocator holds for them (allocator.py)
    dp_lat, dp_per_param = dp_sync_line(plan, profile, tiers["dp"], precision, "reduce")
    a_lat, a_per_param = dp_sync_line(plan, profile, tiers["dp"], precision, "after")
    bucket = 0.0
    if runtime.dp_bucket_bytes and dp_per_param > 0:
        bucket = dp_lat + dp_per_param * runtime.dp_bucket_bytes / grad_bytes(precision, runtime)
    fwd_s = np.asarray(rt.fwd_s)
    return RowCoefficients(
        times=rt, row_s=rt.row_total_s, fwd_window_s=zov * fwd_s,
        bwd_window_s=dov * (rt.bwd_s + rt.recompute_s), cut_p2p_bytes=p2p_b, cut_p2p_s=p2p_s,
        zero3_gather_bytes=gather_b, zero3_gather_s=gather_s, params=params,
        weight_bytes=STATE_BYTES[precision][0] * (params if moe is None else zero_gathered_params(
            arr, plan, runtime)),   # experts the runtime keeps whole are not gathered (experts.py)
        state_bytes=state, act_bytes=act,
        act_none_bytes=activation_bytes_none(arr, tp, plan.sequence_parallel, b, plan.attention)
        + torch_tp_memory.working_bytes(arr, plan, runtime, precision)   # torch TP's gathered inputs
        + (0.0 if moe is None else moe.work_buffer_bytes),   # + a MoE block's dispatch buffers (experts.py)
        is_block=arr.is_block, dp_latency_s=dp_lat, dp_per_param_s=dp_per_param,
        optimizer_per_param_s=optimizer_step_s(1.0, kernels) / optimizer_shards(zdp, plan.zero)
        + step_tail_per_param_s(arr, plan, runtime, kernels, grad_bytes(precision, runtime),
                                optimizer_shards(zdp, plan.zero)),   # Megatron-core's once-a-step work (step_tail.py)
        zero_bwd_window_s=zov * (rt.bwd_s + rt.recompute_s), zero_fwd_s=zf_s, zero_bwd_s=zb_s,
        zero_fwd_bytes=zf_b, zero_bwd_bytes=zb_b, zero_first_fwd_s=first_f, zero_first_bwd_s=first_b,
        slowdown=s, dp_bucket_s=bucket, dp_after_latency_s=a_lat, dp_after_per_param_s=a_per_param,
        runtime=runtime)


def collective_slowdown(profile: HardwareProfile, runtime: RuntimeProfile) -> float:
    """``s``: the step time lost per second of a dp / ZeRO collective run hidden beside compute.
    The GPU's fitted figure (``HardwareProfile.collective_slowdown``, costmodels.calibration.fit:
    NCCL's kernels take SMs and HBM bandwidth from the matmuls whatever runtime issues them)
    where its profile has one, else the runtime profile's assumed ``compute_slowdown`` (0 for
    autopar's runtime: CPU profiles keep their measured overlap alone)."""
    if profile.collective_slowdown is not None:
        return profile.collective_slowdown
    return runtime.compute_slowdown


def plan_experts(arr: TableArrays, profile: HardwareProfile, plan, precision: str, runtime: RuntimeProfile):
    """The Mixture-of-Experts terms of ``plan`` (``costmodels.model.experts``), None for a dense model."""
    return expert_terms(arr, profile, plan, plan.recompute, runtime.moe_load_imbalance,
                        zero_hbm_param_s(plan, profile, runtime, precision), bool(runtime.moe_dispatch_once_per_node),
                        stack_key(runtime),   # FP8 plans: the experts' GEMMs in FP8 (expert_precision.py)
                        consecutive=bool(runtime.moe_route_consecutive),   # AutoModel's fake balanced gate
                        saved_copies=runtime.moe_saved_token_copies)   # kept token copies (dispatch_buffers.py)


def plan_row_times(arr: TableArrays, profile: HardwareProfile, plan, precision: str,
                   runtime: RuntimeProfile, moe=False) -> RowTimes:
    """Every row's times under ``plan`` as its runtime runs them: the runtime's kernel stack
    (``kernel_stacks``), its FP8 recipe (``precision``), then the TP collectives its overlap
    leaves exposed (``tp_overlap``). The one pipeline the coefficients and the search's quick
    bound both read, so the bound stays under ``estimate``. ``moe``: ``plan_experts``' terms when
    the caller has them (False: computed here)."""
    tp, b = plan.tp, plan.micro_batch_size
    kernels = stack_profile(profile, runtime.kernel_stack)
    rt = row_times(arr.table, kernels, tp, plan.sequence_parallel, b, plan.recompute,
                   plan.attention, profile.group_link(plan, "tp"), precision, stack_elementwise(profile, runtime),
                   host_block_floor(profile, runtime), zero_hbm_param_s(plan, profile, runtime, precision))
    rt = unfused_norm_times(rt, arr, kernels, plan, runtime)   # an eager RMSNorm's kernels (eager_norm.py)
    # FP8 on the same kernel stack whose BF16 matmul times it replaces (precision.py)
    rt = fp8_row_times(rt, arr, kernels, plan, stack_key(runtime), tp, b, plan.dp, plan.zero,
                       zero_param_s=zero_hbm_param_s(plan, profile, runtime, precision))   # FP8 gathers' HBM bytes
    if getattr(plan, "precision", "bf16") != "bf16":   # userbuffers' FP8 reduce-scatters (fp8_tensor_parallel.py)
        rt = fp8_ub_reduce_scatter(rt, arr, profile.group_link(plan, "tp"), tp, b, plan.sequence_parallel,
                                   runtime.tp_fwd_reduce_scatter_fp8, plan.recompute == "full")
    rt = cp_row_times(rt, arr, profile, tp, b, runtime, cp_row_link(profile, plan, arr))   # cp's K/V traffic
    moe = plan_experts(arr, profile, plan, precision, runtime) if moe is False else moe
    if moe is not None:   # a Mixture of Experts: ep's all-to-alls, grouped GEMMs, expert shards
        rt = with_expert_times(rt, moe)
        rt = with_moe_core_fix(rt, arr, kernels, plan)   # its attention core at e_att (moe_attention_core.py)
        rt = with_token_gather(rt, arr, profile.group_link(plan, "tp"), plan, runtime)   # expert_token_gather.py
    rt = te_async_backward(rt, runtime, tp, plan.sequence_parallel)   # TE's async backward TP (te_backward_overlap.py)
    unfused = unfused_bwd_reduce_scatter_s(arr, runtime, profile.group_link(plan, "tp"), tp, b,
                                           plan.sequence_parallel)   # what async TP leaves (async_tp_fusion.py)
    rt = overlapped(rt, runtime, tp, unfused)   # TP collectives pipelined with the GEMMs (tp_overlap.py)
    rt = fused_collective_windows(rt, arr, kernels, plan, runtime, profile.group_link(plan, "tp"), tp,
                                  b)   # async TP: each collective behind its own GEMMs (async_tp_windows.py)
    rt = micro_pipeline_tp_cost(rt, arr, kernels, plan, runtime, tp, b)   # torch's fused ops (async_tp_fusion.py)
    return early_stop_recompute(rt, arr, kernels, plan, runtime, profile.group_link(plan, "tp"), tp, b,
                                host_block_floor(profile, runtime))   # checkpoint early stop (recompute_early_stop.py)


def zero_hbm_param_s(plan, profile: HardwareProfile, runtime: RuntimeProfile,
                     precision: str = "bf16-mixed") -> tuple[float, float]:
    """ZeRO's HBM seconds per parameter on the GPU and micro-batch, (forward, backward): its
    collectives' and the runtime's copies' memory traffic (``costmodels.model.zero_traffic``); 0 on a
    CPU profile (``compute.runs_on_cpu``)."""
    if runs_on_cpu(profile):
        return 0.0, 0.0
    fwd, bwd = zero_param_s(zero_row_collectives(plan, runtime), plan.dp, STATE_BYTES[precision][0],
                            grad_bytes(precision, runtime), runtime.gather_copy_passes,
                            runtime.reduce_copy_passes, profile.hbm_bandwidth_bytes_per_s)
    # a runtime that keeps fp32 parameters under autocast, priced in the search's bf16-mixed
    # recipe: its per-micro-batch gradient cast and accumulation (zero_traffic.grad_accumulate_s)
    return fwd, bwd + grad_accumulate_s(runtime.grad_accumulate_bytes, precision, profile.elementwise_bw)


def dp_exposed(t: float, window: float, co: RowCoefficients) -> float:
    """The dp sync's cost to a step for a rank whose sync takes ``t`` seconds and hides in
    ``window`` seconds (already net of the slowdown; module docstring)."""
    if co.slowdown == 0.0 and co.dp_bucket_s == 0.0:
        return max(0.0, t - window)
    s = co.slowdown
    return max((1.0 - s) * min(t, co.dp_bucket_s) + s * t, t - window, 0.0)


def zero_exposed(first: float, total: float, window: float, slowdown: float) -> float:
    """One pass of a stage's ZeRO collectives: ``total`` seconds of them, ``window`` seconds of
    compute to hide in, ``first`` the part at the stage's edge that nothing hides."""
    if first == 0.0 and slowdown == 0.0:
        return max(0.0, total - window)
    return max(first + slowdown * total, total - window)


def cut_p2p(arr: TableArrays, b: int, tp: int, tier) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, seconds) per GPU of the pipeline send across a cut before row x, x = 0..n: the
    activation ``boundary_{x−1}`` scaled to micro-batch ``b`` and sent 1/tp per rank (Megatron's
    scatter/gather), one way; 0 at x = 0 and without a pipeline (``tier`` None)."""
    nbytes, seconds = np.zeros(arr.n + 1), np.zeros(arr.n + 1)
    if tier is not None:
        nbytes[1:], seconds[1:] = collective_time("p2p", arr.boundary * (b / arr.table.micro_batch)
                                                  / tp, 2, tier)
    return nbytes, seconds
