"""FP8 routed experts: a plan's ``precision`` applied to the experts' GEMMs of a MoE row.

``costmodels.model.precision`` moves a block's linear layers to FP8 — the matmuls with one row
per token (``m = b·s``). A routed expert's GEMMs have ``m`` = the tokens it receives, so they
were left in BF16 there, while the stacks that run FP8 MoE training run them in FP8 too:

* Transformer Engine under Megatron-core: ``TEGroupedMLP`` (``--moe-grouped-gemm``: TE's
  ``GroupedLinear``) and ``SequentialMLP`` (one TE ``Linear`` per expert, as NeMo's Grok-1 recipe
  runs them) are TE modules, so ``fp8_autocast`` puts their GEMMs in FP8 as it does the dense
  linears (megatron/core/transformer/moe/experts.py; transformer_engine/pytorch/module/
  grouped_linear.py);
* torchao under torchtitan: its float8 / MXFP8 MoE training converts the routed experts'
  grouped GEMMs (``torchao.prototype.moe_training``; torchtitan's ``float8`` converter with
  ``moe_fqns``), which is what the torchtitan MoE rows of the open data state.

Per MoE row and micro-batch, with ``X`` the routed experts' forward FLOPs on one GPU at the plan's
ep (``X_i·k/tp``, as ``costmodels.model.experts`` prices them), ``ι`` the load imbalance, ``g·ep``
the GEMM one local expert runs, ``P`` / ``P8`` the BF16 / FP8 peak and ``σ`` the fitted FP8
matmul scale of (GPU, stack) (``precision.stack_scale``; nothing new is fitted here)::

    forward   ι·X / (P8·eff(g·ep·P/P8)·σ)  −  ι·X / (P·eff(g·ep))      (the BF16 time experts.py
                                                                       charged, replaced)
    backward  2 × that (dgrad and wgrad), its W pass once
    casts     the experts' inputs ι·(h + f_e) per routed token (fc1 reads h, fc2 f_e; the backward
              casts the output gradients, about as many) and, where the stack re-casts
              weights every micro-batch, their weights, at ``precision.cast_bytes`` per element

A BF16 plan, a dense table or a runtime without an FP8 stack returns zeros (nothing changes).
"""
from __future__ import annotations

import numpy as np

from costmodels.model.precision import PEAK_KEY, STACKS, cast_bytes, stack_scale


def fp8_expert_s(x, g_ep, expert_weights, expert_inputs, imbalance: float, profile, plan,
                 runtime_name: str | None):
    """(forward, backward, W-pass) seconds the FP8 experts add per row (module docstring);
    ``x`` the experts' forward FLOPs on one GPU, ``g_ep`` one local expert's GEMM FLOPs,
    ``expert_weights`` / ``expert_inputs`` the elements of the GPU's expert weights and of the
    inputs its expert GEMMs read in one forward (before the imbalance)."""
    p = getattr(plan, "precision", "bf16")
    zero = np.zeros_like(np.asarray(x, dtype=float))
    stack = STACKS.get(runtime_name or "")
    if p == "bf16" or stack is None or p not in stack.precisions or PEAK_KEY[p] not in profile.peak_flops:
        return zero, zero, zero
    peak = profile.peak_flops_per_s(2)
    raw8 = profile.peak_flops[PEAK_KEY[p]]
    peak8 = raw8 * stack_scale(profile, runtime_name)
    g = np.maximum(np.asarray(g_ep, dtype=float), 1.0)
    t16 = imbalance * x / (peak * profile.matmul_efficiency(g))
    t8 = imbalance * x / (peak8 * profile.matmul_efficiency(g * peak / raw8))
    d = np.where(x > 0, t8 - t16, 0.0)
    cb, ew = cast_bytes(stack), profile.elementwise_bw
    w_cast = expert_weights * cb * (1.0 if stack.weight_cast_per_micro_batch else 0.0)
    fwd_cast = np.where(x > 0, (imbalance * expert_inputs * cb + w_cast) / ew, 0.0)
    return d + fwd_cast, 2.0 * d + fwd_cast, d
