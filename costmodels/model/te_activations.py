"""Activations Transformer Engine's fused gated MLP does not keep, that the traced eager block does.

A layer table is traced from the eager model (``autopar.trace``): a gated MLP (SwiGLU:
``down(silu(gate(x)) * up(x))``) keeps for its backward ``gate(x)``, ``silu(gate(x))``, ``up(x)``
and their product, the down projection's input — four tensors of the MLP's width ``f`` per token.
Megatron-core with Transformer Engine runs the gate and up projections as one fc1 GEMM of width
``2f`` and the activation as one fused kernel (``bias_swiglu_impl`` /
``megatron/core/fusions/fused_bias_swiglu.py``; TE ``LayerNormMLP`` with ``activation="swiglu"``):
it keeps fc1's output (``2f``, what the fused backward recomputes ``silu`` from) and the
activation's output (``f``, fc2's input) — three. So per gated block and token, ``f`` elements
of the activation dtype fewer, split over tp like the MLP's other activations::

    saved_less_i = k · tokens · f_i · dtype / tp          (block rows with a gated MLP)

A row's MLP is gated when its traced matmuls (``LayerRow.matmul_dims``) hold two token GEMMs
``h → f`` and one ``f → h`` (``gated_width``); a two-matmul MLP (GELU, squared ReLU) keeps the
same tensors eager or fused and is left alone, and so is a table that records one fused
``h → 2f`` GEMM (an analytic table such as ``tests/synthetic_tables.llama_table``, which already
counts fc1's ``2f`` output and fc2's ``f`` input, the fused kernel's three). Only for runtimes
whose kernel stack is Transformer Engine (``TE_STACKS``), and not under full recompute (nothing
of the block is kept).

The same stack's fused norm keeps two tensors where the traced eager RMSNorm keeps three
(``eager_norm_extra``): in BF16 a pre-norm block keeps ``2·h`` elements per token fewer, outside
the TP regions (divided by tp only under sequence parallelism). It is what lets the Llama 3.1 405B
cp2 run on 512 GPUs (dgxc v25.04.02) fit once Transformer Engine's userbuffers are counted
(``long_sequence_memory``): 79.4 -> 75.1 GiB of 79.1.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

TE_STACKS = ("transformer-engine",)


@lru_cache(maxsize=64)
def gated_width(arr) -> np.ndarray:
    """Per row: the width ``f`` of its gated MLP (0 where the row has none)."""
    t = arr.table
    tokens = t.micro_batch * t.seq
    h = t.hidden or 0
    out = np.zeros(arr.n)
    for i, r in enumerate(t.rows):
        if r.kind != "block" or not h:
            continue
        ups = [n for m, n, k in r.matmul_dims if m == tokens and k == h and n != h]
        downs = [k for m, n, k in r.matmul_dims if m == tokens and n == h and k != h]
        for f in set(downs):
            if ups.count(f) == 2:   # gate and up apart, as the eager module traces them
                out[i] = f
    return out


def eager_norm_extra(arr) -> np.ndarray:
    """Per row and traced micro-batch, the bytes of the eager RMSNorms' normalized intermediates.

    The traced eager RMSNorm (``x * rsqrt(mean(x²) + eps) * w``, autopar.models.llama, and
    transformers' Llama alike) keeps three tensors of the hidden width per token: its input ``x``
    (for ``pow`` and the first product), ``x · rsqrt`` (for the weight's product) and its output
    (the next linear's input). Transformer Engine's fused norm (``LayerNormLinear``, Megatron-core's
    TE spec for the QKV and fc1 inputs) keeps the input and the output (and fp32 ``rsigma``), not
    the intermediate. A block row whose tensors outside the TP regions hold at least three
    hidden-wide tensors per norm (two pre-norms per block) has the eager form; a LayerNorm row
    (``F.layer_norm``: input and output only) has not and is left alone."""
    t = arr.table
    tokens = t.micro_batch * t.seq
    h = float(t.hidden or 0)
    out = np.zeros(arr.n)
    if not h or not tokens:
        return out
    per_norm = h * t.act_dtype_bytes * tokens
    replicated = arr.saved - arr.act_tp - arr.mask
    eager = arr.is_block & (replicated >= 2 * 3 * per_norm)
    out[eager] = 2 * per_norm
    return out


def te_saved_less(arr, plan, runtime, tp: int, b: int) -> np.ndarray:
    """Per row, the activation bytes a TE stack keeps fewer than the traced table (docstring):
    the fused SwiGLU's tensor, and in BF16 the eager norms' intermediates (``eager_norm_extra``;
    under FP8, ``precision.fp8_saved_bytes`` already takes a byte off each linear's input per
    matmul — three for the one QKV input, two for the one fc1 input — which stands in for them)."""
    if getattr(runtime, "kernel_stack", "") not in TE_STACKS or plan.recompute == "full":
        return np.zeros(arr.n)
    t = arr.table
    k = b / t.micro_batch
    less = k * t.micro_batch * t.seq * gated_width(arr) * t.act_dtype_bytes / tp
    if getattr(plan, "precision", "bf16") == "bf16":
        less = less + k * eager_norm_extra(arr) / (tp if plan.sequence_parallel else 1)
    return less
