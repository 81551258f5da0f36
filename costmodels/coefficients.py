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

The dp line is ``dp_sync``'s, which ``estimate`` prices per rank; autopar's runtime terms of
the "amp" / "fp32" recipes that are not linear per row (ZeRO-1's broadcasts, autocast's casts,
the runtime's memory peaks) stay in ``estimate``: the search plans in "bf16-mixed".
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodels.comm import collective_latency, collective_time, plan_tiers
from costmodels.compute import (
    RUNTIME_PRECISIONS,
    RowTimes,
    TableArrays,
    activation_bytes_none,
    optimizer_shards,
    optimizer_step_s,
    row_times,
    table_arrays,
)
from costmodels.hardware import HardwareProfile
from costmodels.layer_table import LayerTable
from costmodels.memory import STATE_BYTES, activation_bytes, model_state_bytes


@dataclass(frozen=True, eq=False)
class RowCoefficients:
    """The per-row arrays and per-parameter scalars of one configuration (module docstring);
    seconds and bytes for one micro-batch on one GPU unless said otherwise."""

    times: RowTimes                 # compute.row_times: per-row compute and TP, O(1) range sums
    row_s: np.ndarray               # τ_i
    fwd_window_s: np.ndarray        # f_i  where ZeRO-3's forward gathers hide
    bwd_window_s: np.ndarray        # β_i  where the dp sync and ZeRO-3's backward gathers hide
    cut_p2p_bytes: np.ndarray       # [x], x = 0..n: bytes each way across a cut at x
    cut_p2p_s: np.ndarray           # P[x]
    zero3_gather_bytes: np.ndarray  # per row and pass
    zero3_gather_s: np.ndarray      # g_i
    params: np.ndarray              # π_i  parameters on one GPU
    weight_bytes: np.ndarray        # w·π_i  a row's weights gathered whole (ZeRO-3's buffer)
    state_bytes: np.ndarray         # σ_i  weights + grads + optimizer state after ZeRO
    act_bytes: np.ndarray           # α_i  saved per micro-batch in flight
    act_none_bytes: np.ndarray      # saved without recompute: full recompute's working set
    is_block: np.ndarray            # bool
    dp_latency_s: float             # λ_d  (0 when dp = 1)
    dp_per_param_s: float           # γ_d
    optimizer_per_param_s: float    # γ_o

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
    key = (arr, profile, plan.dp, plan.tp, plan.pp, plan.micro_batch_size, plan.zero,
           plan.recompute, plan.sequence_parallel, plan.attention, plan.placement, precision)
    co = _CACHE.get(key)
    if co is None:
        if len(_CACHE) >= 1024:
            _CACHE.clear()
        co = _CACHE[key] = _row_coefficients(arr, profile, plan, precision)
    return co


def _row_coefficients(arr: TableArrays, profile: HardwareProfile, plan,
                      precision: str) -> RowCoefficients:
    tp, dp, b = plan.tp, plan.dp, plan.micro_batch_size
    tiers = plan_tiers(plan, profile.gpus_per_node)
    rt = row_times(arr.table, profile, tp, plan.sequence_parallel, b, plan.recompute,
                   plan.attention, tiers["tp"], precision)
    ov = profile.overlap(plan.zero)
    p2p_b, p2p_s = cut_p2p(arr, b, tp, profile.tier(tiers["pp"]) if plan.pp > 1 else None)
    weights = STATE_BYTES[precision][0] * arr.params / tp
    gather_b, gather_s = np.zeros(arr.n), np.zeros(arr.n)
    if plan.zero == 3 and dp > 1:   # one all-gather per row and pass (comm docstring)
        gather_b, gather_s = collective_time("all_gather_into_tensor", weights, dp,
                                             profile.tier(tiers["dp"]))
    params = arr.params / tp
    p_b, g_b, o_b = model_state_bytes(1.0, dp, plan.zero, precision)
    dp_lat, dp_per_param = dp_sync_line(plan, profile, tiers["dp"], precision)
    return RowCoefficients(
        times=rt, row_s=rt.row_total_s, fwd_window_s=ov * np.asarray(rt.fwd_s),
        bwd_window_s=ov * (rt.bwd_s + rt.recompute_s), cut_p2p_bytes=p2p_b, cut_p2p_s=p2p_s,
        zero3_gather_bytes=np.asarray(gather_b, dtype=float),
        zero3_gather_s=np.asarray(gather_s, dtype=float), params=params,
        weight_bytes=STATE_BYTES[precision][0] * params, state_bytes=params * (p_b + g_b + o_b),
        act_bytes=activation_bytes(arr, tp, plan.sequence_parallel, b, plan.recompute,
                                   plan.attention, precision),
        act_none_bytes=activation_bytes_none(arr, tp, plan.sequence_parallel, b, plan.attention),
        is_block=arr.is_block, dp_latency_s=dp_lat, dp_per_param_s=dp_per_param,
        optimizer_per_param_s=optimizer_step_s(1.0, profile) / optimizer_shards(dp, plan.zero))


def cut_p2p(arr: TableArrays, b: int, tp: int, tier) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, seconds) per GPU of the pipeline send across a cut before row x, x = 0..n: the
    activation ``boundary_{x−1}`` scaled to micro-batch ``b`` and sent 1/tp per rank (Megatron's
    scatter/gather), one way; 0 at x = 0 and without a pipeline (``tier`` None)."""
    nbytes, seconds = np.zeros(arr.n + 1), np.zeros(arr.n + 1)
    if tier is not None:
        nbytes[1:], seconds[1:] = collective_time("p2p", arr.boundary * (b / arr.table.micro_batch)
                                                  / tp, 2, tier)
    return nbytes, seconds


def dp_sync_collectives(plan, precision: str = "bf16-mixed") -> list[tuple[str, float]]:
    """The gradient sync over dp as ``[(collective kind, bytes per parameter)]``: what
    ``dp_sync`` prices and ``dp_sync_line`` splits into latency and cost per parameter."""
    if plan.dp <= 1:
        return []
    bytes_param, bytes_grad, _ = STATE_BYTES[precision]
    if plan.zero == 0 or (plan.zero == 1 and precision in RUNTIME_PRECISIONS):
        # autopar's runtime runs ZeRO-1 as DDP's all-reduce + the owners' broadcasts after the
        # optimizer step (estimate.zero1_broadcast, never hidden)
        return [("all_reduce", bytes_grad)]
    # ZeRO-1 (Megatron's distributed optimizer): reduce-scatter + all-gather; ZeRO-2/3: FSDP2's
    # flat-tensor collectives (ZeRO-3 gathers its parameters per micro-batch, not here)
    rs, ag = ("reduce_scatter", "all_gather") if plan.zero == 1 else \
        ("reduce_scatter_tensor", "all_gather_into_tensor")
    return [(rs, bytes_grad)] if plan.zero == 3 else [(rs, bytes_grad), (ag, bytes_param)]


def dp_sync(params_per_gpu: float, plan, profile: HardwareProfile, tier: str,
            precision: str = "bf16-mixed") -> tuple[str, float, float]:
    """(collective name, bytes per GPU, seconds) of the once-per-step gradient sync over dp: on
    the α-β line, not a measured curve (``comm.collective_time``), so the search can keep it
    linear in the parameters of a stage."""
    colls = dp_sync_collectives(plan, precision)
    if not colls:
        return "none", 0.0, 0.0
    t = profile.tier(tier)
    nbytes = seconds = 0.0
    for kind, per_param in colls:
        b, s = collective_time(kind, per_param * params_per_gpu, plan.dp, t, line=True)
        nbytes, seconds = nbytes + b, seconds + s
    return "+".join(k for k, _ in colls), nbytes, seconds


def dp_sync_line(plan, profile: HardwareProfile, tier: str,
                 precision: str = "bf16-mixed") -> tuple[float, float]:
    """``dp_sync``'s seconds as ``(λ_d, γ_d)``: its fixed latency (every collective's
    ``steps·α``) and the rest of one parameter's time, the cost per parameter; (0, 0) without dp.
    ``λ_d + γ_d·Π`` is ``dp_sync(Π)`` up to λ_d's rounding (about 1e-10 relative), far below the
    integer program's unit."""
    colls = dp_sync_collectives(plan, precision)
    if not colls:
        return 0.0, 0.0
    t = profile.tier(tier)
    latency = sum(collective_latency(kind, plan.dp, t) for kind, _ in colls)
    return latency, dp_sync(1.0, plan, profile, tier, precision)[2] - latency
