"""Each collective torch's micro-pipeline TP (torchtitan's async TP) fuses hides behind the GEMMs
it is fused with, and only those: a block's TP collectives priced one by one.

``tp_overlap.exposed`` prices a pipeline that hides a row's TP collectives behind the row's whole
compute in that pass (attention, norms and every GEMM). torch's fused ops do not: each is one
operator (``symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``, the
``micro_pipeline_tp_pass`` rewrite in ``torch/_inductor/fx_passes/micro_pipeline_tp.py``, torch
2.13.0 git cf30153c) whose copies run beside *its own* decomposed GEMMs
(``torch/distributed/_symmetric_memory/__init__.py``); the attention core, the norms and the
unfused GEMMs run before or after it on the same stream and hide nothing. So, per TP pair of a
block row (``LayerRow.tp_pairs``: column linears, then one row linear) and per pass:

=========================  ======================================  ==============================
collective                 fused with (the window)                 source
=========================  ======================================  ==============================
forward all-gather         the pair's column GEMMs (Q/K/V; w1/w3)  ``_find_consumer_matmuls``
forward reduce-scatter     the row GEMM (wo; w2)                   ``_find_producer_matmul``
backward all-gather        the row linear's input-gradient GEMM    ``_find_consumer_matmuls``
                           (the output gradient is its left
                           operand; the weight-gradient GEMM reads
                           it transposed, through a permute, and
                           is not fused)
backward reduce-scatter    one column linear's input-gradient      ``_find_producer_matmul``
                           GEMM where the pair has one column
                           linear; with several (wq, wk, wv) the
                           producer is their ``add``: not fused,
                           exposed whole (``async_tp_fusion``)
=========================  ======================================  ==============================

A full recompute re-runs the forward's fused ops. The pipelines, read from the code: the
all-gather consumes the rank's own shard first while the peers' shards are copied one after the
other ("cp from different streams cannot overlap"), each consumed as it lands; the
reduce-scatter produces each destination's chunk, then the peers pull it. Either ends no sooner
than all its GEMMs (``g``, the decomposed GEMMs' time) and no sooner than all the copies (``c``,
the collective's time on the TP link) plus one shard's GEMM (``g/t``, the first produced or the
last consumed), so what the collective adds beyond its GEMMs is::

    exposed = max(0, c − g · (1 − 1/t))

The shard copy into symmetric memory before the pipeline and the partial-sum reduction after it
are ``async_tp_fusion``'s copies; the decomposed GEMMs' lost efficiency is charged there too
(forward, and here named: the backward's fused input-gradient GEMMs). Rows whose GEMMs cannot be
matched to their pairs (``linear_roles``) keep the row-wide window of ``tp_overlap``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from costmodels.model.comm import collective_time
from costmodels.model.precision import PEAK_KEY, STACKS, linear_dims, stack_key, stack_scale


@dataclass(frozen=True, eq=False)
class LinearRoles:
    """Which TP pair each block linear of ``precision.linear_dims`` belongs to, and its role."""

    pair: np.ndarray            # per linear: index into the pair arrays, -1 where unmatched
    is_row: np.ndarray          # per linear: the pair's row-parallel linear
    pair_row: np.ndarray        # per pair: its table row
    pair_single: np.ndarray     # per pair: one column linear (its backward reduce-scatter fuses)
    matched: np.ndarray         # per table row: every linear of it matched to a pair


@lru_cache(maxsize=256)
def linear_roles(arr) -> LinearRoles:
    """Map a block row's linears (trace order) onto its ``tp_pairs``: each pair's column
    linears, then its row linear. A table lists either every column linear (wq, wk, wv) or the
    pair's columns merged into one GEMM (the synthetic tables' qkv); any other count, or a row
    linear whose output width is not its columns' input width, leaves the row unmatched."""
    t = arr.table
    tokens = t.micro_batch * t.seq
    pair, is_row, pair_row, pair_single = [], [], [], []
    matched = np.zeros(arr.n, dtype=bool)
    for i, r in enumerate(t.rows):
        if r.kind != "block":
            continue
        dims = [(n, k) for m, n, k in r.matmul_dims if m == tokens]
        roles = _pair_roles(dims, tuple(r.tp_pairs or ()))
        if roles is None:
            pair += [-1] * len(dims)
            is_row += [False] * len(dims)
            continue
        matched[i] = True
        for nc, single in roles:
            pair += [len(pair_row)] * (nc + 1)
            is_row += [False] * nc + [True]
            pair_row.append(i)
            pair_single.append(single)
    return LinearRoles(np.array(pair, dtype=int), np.array(is_row, dtype=bool),
                       np.array(pair_row, dtype=int), np.array(pair_single, dtype=bool), matched)


def _pair_roles(dims: list[tuple[int, int]], pairs: tuple) -> list[tuple[int, bool]] | None:
    """Per pair (column GEMMs listed, one column linear), or None where the row's linears
    (``(out, in)`` widths, trace order) do not line up with its pairs."""
    if not pairs:
        return None
    if len(dims) == sum(len(p.column) + 1 for p in pairs):
        cols = [len(p.column) for p in pairs]
    elif len(dims) == 2 * len(pairs):
        cols = [1] * len(pairs)
    else:
        return None
    roles, at = [], 0
    for p, nc in zip(pairs, cols):
        col, row = dims[at:at + nc], dims[at + nc]
        if any(k != col[0][1] for _, k in col) or row[0] != col[0][1]:
            return None   # the row linear must map back to its columns' input width
        roles.append((nc, len(p.column) == 1))
        at += nc + 1
    return roles


def runs_micro_pipeline_tp(runtime, plan, tp: int) -> bool:
    """True where torch's micro-pipeline TP rewrites the plan's TP collectives: a runtime that
    runs it (``[overlap] tp_comm_overlap`` and ``tp_bwd_reduce_scatter_exposed``, ``fsdp:async_tp``),
    tp > 1, sequence parallelism (the all-gathers and reduce-scatters it fuses)."""
    return bool(getattr(runtime, "tp_comm_overlap", 0) and getattr(runtime, "tp_bwd_reduce_scatter_exposed", 0)
                and tp > 1 and plan.sequence_parallel)


def gemm_rate(arr, kernels, plan, runtime) -> tuple[float, float]:
    """``(size, rate)``: a block GEMM of ``f`` FLOPs runs ``f / (rate · eff(f · size))`` under the
    plan's precision (FP8 at the stack's fitted rate, as ``precision.fp8_row_times`` prices it)."""
    p = getattr(plan, "precision", "bf16") or "bf16"
    peak = kernels.peak_flops_per_s(arr.table.act_dtype_bytes)
    if p == "bf16":
        return 1.0, peak
    p8 = kernels.peak_flops[PEAK_KEY[p]]
    return peak / p8, p8 * stack_scale(kernels, stack_key(runtime), p)


def decomposed_gemm_s(f: np.ndarray, kernels, size: float, rate: float, tp: int) -> np.ndarray:
    """Seconds of GEMMs of ``f`` FLOPs each run as ``tp`` shards' GEMMs, two at a time on two
    streams (``async_tp_fusion``): at the curve's efficiency for ``min(1, 2/tp)`` of the size."""
    chunk = f * min(1.0, 2.0 / tp)
    return f / rate / kernels.matmul_efficiency(np.maximum(chunk * size, 1.0))


def whole_gemm_s(f: np.ndarray, kernels, size: float, rate: float) -> np.ndarray:
    """Seconds of the same GEMMs run whole."""
    return f / rate / kernels.matmul_efficiency(np.maximum(f * size, 1.0))


def fused_backward_gemms(arr) -> np.ndarray:
    """Per linear of ``linear_dims``: True where torch fuses a backward collective with its
    input-gradient GEMM (a pair's row linear: the output gradient's all-gather; the one column
    linear of a pair that has one: its input gradient's reduce-scatter)."""
    roles = linear_roles(arr)
    single = np.append(roles.pair_single, False)[roles.pair]   # pair -1 reads the appended False
    return (roles.pair >= 0) & (roles.is_row | single)


def fused_bwd_reduce_scatters(arr) -> np.ndarray:
    """Per table row, how many of its backward input-gradient reduce-scatters torch fuses (its
    matched pairs with one column linear); the rest of ``tp_collectives`` stay exposed."""
    roles = linear_roles(arr)
    return np.bincount(roles.pair_row, weights=roles.pair_single.astype(float), minlength=arr.n)


def fused_collective_windows(rt, arr, kernels, plan, runtime, tier, tp: int, b: int):
    """``rt`` with the TP collectives of every matched block row priced one by one behind the
    GEMMs torch fuses each with (module docstring); ``rt`` unchanged unless the runtime runs
    micro-pipeline TP. Rows ``linear_roles`` leaves unmatched keep ``tp_overlap``'s pricing."""
    roles = linear_roles(arr)
    if not runs_micro_pipeline_tp(runtime, plan, tp) or not roles.pair_row.size:
        return rt
    k = b / arr.table.micro_batch
    size, rate = gemm_rate(arr, kernels, plan, runtime)
    g = decomposed_gemm_s(linear_dims(arr).mm_flops * k / tp, kernels, size, rate, tp)
    npair = roles.pair_row.size
    col, row = (roles.pair >= 0) & ~roles.is_row, roles.is_row
    g_col = np.bincount(roles.pair[col], weights=g[col], minlength=npair)
    g_row = np.bincount(roles.pair[row], weights=g[row], minlength=npair)   # = its dgrad's FLOPs too
    nbytes = arr.tp_comm_bytes[roles.pair_row] * k
    p = getattr(plan, "precision", "bf16") or "bf16"
    ag = 0.5 if p in STACKS[stack_key(runtime)].fp8_tp_all_gather else 1.0   # fp8_tensor_parallel
    _, c_ag = collective_time("all_gather", nbytes * ag, tp, tier)
    _, c_rs = collective_time("reduce_scatter", nbytes, tp, tier)
    hide = 1.0 - 1.0 / tp

    def exposed(c, window):
        return np.maximum(0.0, c - window * hide)

    fwd = exposed(c_ag, g_col) + exposed(c_rs, g_row)
    bwd = exposed(c_ag, g_row) + np.where(roles.pair_single, exposed(c_rs, g_col), c_rs)
    on = roles.matched & (arr.tp_comm_bytes > 0)
    tp_fwd = np.where(on, np.bincount(roles.pair_row, weights=fwd, minlength=arr.n), rt.tp_fwd_s)
    tp_bwd = np.where(on, np.bincount(roles.pair_row, weights=bwd, minlength=arr.n), rt.tp_bwd_s)
    tp_rec = np.where(on, tp_fwd, rt.tp_recompute_s) if plan.recompute == "full" else rt.tp_recompute_s
    return replace(rt, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, tp_recompute_s=tp_rec)
