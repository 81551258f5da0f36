"""Tensor-parallel communication overlapped with the GEMMs: Megatron's userbuffers
(``--tp-comm-overlap``, NeMo ``ub_tp_comm_overlap``) and torchtitan's async TP
(``enable_async_tensor_parallel``).

Both cut a sequence-parallel all-gather (or reduce-scatter) over ``t`` ranks into ``t`` chunks and
pipeline them with the GEMM that consumes (or produces) the tensor: while the GEMM runs on chunk
``j`` the ring moves chunk ``j + 1`` (Transformer Engine ``userbuffers`` ring-exchange, torch's
``fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter`` micro-pipeline). What stays on the
critical path of a row, per pass, is the first chunk (nothing runs before it) and whatever of
the rest the row's compute is too short to cover::

    exposed_i = c_i / t + max(0, c_i · (1 − 1/t) − g_i)

``c_i`` the row's TP collective time in that pass (``compute.RowTimes``: forward, backward,
recompute), ``g_i`` the row's compute in that pass (the GEMMs and the kernels around them, the
window the chunks hide behind). With ``t = 1`` nothing moves. The runtime profile switches it on
with ``[overlap] tp_comm_overlap = 1`` (the ``megatron:tp_comm_overlap`` and ``fsdp:async_tp``
options); without it the collectives stay exposed, as before.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from costmodels.model.compute import RowTimes


def exposed(comm: np.ndarray, window: np.ndarray, tp: int) -> np.ndarray:
    """The part of ``comm`` seconds per row a ``tp``-chunk pipeline behind ``window`` leaves exposed."""
    comm = np.asarray(comm, dtype=float)
    if tp <= 1:
        return comm
    first = comm / tp
    return first + np.maximum(0.0, comm - first - np.asarray(window, dtype=float))


def overlapped(rt: RowTimes, runtime, tp: int, bwd_unfused_s=None) -> RowTimes:
    """``rt`` with its TP collective times cut to what the runtime's overlap leaves exposed
    (module docstring); ``rt`` itself when the runtime does not overlap them.
    ``bwd_unfused_s``: per row, backward collective seconds the overlap cannot pipeline (torch's
    micro-pipeline TP, ``async_tp_fusion``): they stay exposed whole."""
    if not getattr(runtime, "tp_comm_overlap", 0) or tp <= 1 or not rt.tp_fwd_s.any():
        return rt
    keep = np.zeros_like(rt.tp_bwd_s) if bwd_unfused_s is None else np.minimum(bwd_unfused_s, rt.tp_bwd_s)
    return dataclasses.replace(rt, tp_fwd_s=exposed(rt.tp_fwd_s, rt.fwd_s, tp),
                               tp_bwd_s=keep + exposed(rt.tp_bwd_s - keep, rt.bwd_s, tp),
                               tp_recompute_s=exposed(rt.tp_recompute_s, rt.recompute_s, tp))
