"""Transformer Engine's backward tensor-parallel communication without userbuffers: what its
``Linear`` / ``LayerNormLinear`` / ``LayerNormMLP`` backward overlaps on its own.

Without ``--tp-comm-overlap`` (NeMo ``ub_tp_comm_overlap false``) Transformer Engine still runs
two of a column-parallel linear's backward collectives asynchronously
(``transformer_engine/pytorch/module/linear.py``, ``_Linear.backward``, the non-userbuffers path):

* the re-gather of the sequence-parallel input the weight gradient needs
  (``gather_along_first_dim(..., async_op=True)``) runs during the dgrad GEMM;
* the input gradient's reduce-scatter (sequence parallel) or all-reduce (without it)
  (``reduce_scatter_along_first_dim`` / ``allreduce`` with ``async_op=True``) runs during the
  wgrad GEMM and is waited for at the end of the backward.

A row-parallel linear's backward first gathers its sequence-parallel output gradient
(``grad_output_preprocess``), before any GEMM can start: that one stays exposed.

``compute.row_times`` charges per TP pair and backward one all-gather + one reduce-scatter (with
sequence parallel) or one all-reduce (without); the input re-gather is not counted there (it is
hidden, as here). So, per row, with ``c`` its backward TP seconds and ``w`` its weight-gradient
GEMM seconds (``RowTimes.bwd_w_s``, the window the async collective hides in)::

    sequence parallel:   exposed = c/2 + max(0, c/2 − w)     (the all-gather stays; the RS hides)
    without:             exposed = max(0, c − w)             (the all-reduce hides)

Only for runtimes whose kernel stack is Transformer Engine (``ASYNC_BACKWARD_STACKS``) and only
where userbuffers do not already pipeline the collectives (``tp_overlap``, which then prices
all of them). The forward's collectives stay exposed: each feeds the GEMM that follows it.
"""
from __future__ import annotations

import dataclasses

import numpy as np

ASYNC_BACKWARD_STACKS = ("transformer-engine",)


def te_async_backward(rt, runtime, tp: int, sp: bool):
    """``rt`` (compute.RowTimes) with the backward TP time cut to what TE's async collectives
    leave exposed (module docstring); ``rt`` itself elsewhere."""
    if (tp <= 1 or getattr(runtime, "tp_comm_overlap", 0)
            or getattr(runtime, "kernel_stack", "") not in ASYNC_BACKWARD_STACKS or not rt.tp_bwd_s.any()):
        return rt
    c, w = np.asarray(rt.tp_bwd_s, dtype=float), np.asarray(rt.bwd_w_s, dtype=float)
    exposed = c / 2 + np.maximum(0.0, c / 2 - w) if sp else np.maximum(0.0, c - w)
    return dataclasses.replace(rt, tp_bwd_s=exposed)
