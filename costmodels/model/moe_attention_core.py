"""The fused attention core of a Mixture-of-Experts row, priced from the efficiency it was charged at.

``compute.row_times`` charges a row's matmuls at their own efficiencies (the flops-weighted
harmonic mean ``eff`` of the row), then moves the fused attention core's forward FLOPs ``F_a``
to the GPU's measured attention efficiency ``e_att``: ``+ F_a/peak·(1/e_att − 1/eff)``,
which assumes the core was charged at the row's mean. In a dense block the core's GEMMs and
the row's mean are within a few per cent of each other (and ``e_att`` was measured with this
formula on dense rows). In a MoE row they are not: the mean is dragged down by the ``E`` small
expert GEMMs at ep = 1 (``tokens·k/E`` rows each; DeepSeek-V3: 0.23 efficiency on H100 at 128
rows, the row's mean 0.34, its attention core's GEMMs 0.61), which ``experts.expert_terms``
re-prices at their ep size. So a MoE row's core ended up below the attention efficiency
it is meant to run at; with MLA's core (2.9× a hidden-wide one, ``attention_core``) the
difference is 0.9 ms of a 14 ms forward per DeepSeek-V3 block. The correction, per MoE row with
fused attention::

    forward   + F_a/peak·(1/eff − 1/eff_core)       (eff_core: the core GEMMs' own efficiency,
    backward  + ATTN_BWD_RATIO·(the same)            the two matmuls with m = b·heads·s)
    recompute (full) + the forward's

so that the core costs ``F_a/(peak·e_att)`` forward as the formula intends. Dense rows and rows
without identifiable core GEMMs are left alone. Applied in ``coefficients.plan_row_times`` with
the runtime's kernel-stack profile, the one ``row_times`` charged the row with (so ``estimate``
and the search's coefficients price it alike).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from costmodels.model.compute import ATTN_BWD_RATIO, RowTimes, row_matmul_efficiency


def moe_core_fix_s(arr, profile, plan, k: float, moe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds to add per row, one GPU and micro-batch (``k = b/b0``)."""
    zero = np.zeros(arr.n)
    t = arr.table
    if (getattr(plan, "attention", "flash") != "flash" or profile.attention_efficiency is None
            or not t.heads or not moe.any()):
        return zero, zero
    tp = plan.tp
    peak = profile.peak_flops_per_s(t.act_dtype_bytes)
    f_mm = arr.mm_flops * k / tp
    e_mm = profile.matmul_efficiency(f_mm)
    eff = row_matmul_efficiency(arr, profile, k, tp)
    per_head = t.micro_batch * t.heads * t.seq
    out = np.zeros(arr.n)
    for i, r in enumerate(t.rows):
        if not moe[i] or arr.attn_core_flops[i] <= 0:
            continue
        core = [j for j, (m, _, _) in enumerate(r.matmul_dims) if m == per_head]
        if len(core) != 2:
            continue
        at = np.flatnonzero(arr.mm_row == i)[core]
        eff_core = f_mm[at].sum() / (f_mm[at] / e_mm[at]).sum()
        out[i] = k * arr.attn_core_flops[i] / tp / peak * (1.0 / eff[i] - 1.0 / eff_core)
    return out, ATTN_BWD_RATIO * out


def with_moe_core_fix(rt: RowTimes, arr, kernels, plan) -> RowTimes:
    """``rt`` with the correction on its MoE rows (``kernels``: the kernel-stack profile
    ``row_times`` used); a full recompute re-runs the forward's."""
    moe = np.array([bool(getattr(r, "experts", 0)) for r in arr.table.rows])
    f, b = moe_core_fix_s(arr, kernels, plan, plan.micro_batch_size / arr.table.micro_batch, moe)
    if not f.any():
        return rt
    rec = rt.recompute_s + f if plan.recompute == "full" else rt.recompute_s
    return replace(rt, fwd_s=rt.fwd_s + f, bwd_s=rt.bwd_s + b, recompute_s=rec)
