"""The attention core's forward FLOPs per row when its heads are not ``hidden/heads`` wide.

``table_arrays`` prices the fused attention core (Q·Kᵀ and scores·V) of a block row at the
GPU's attention efficiency, and counts it as ``4·b·s²·h``: two matmuls whose width over all
heads is the hidden size. Multi-head Latent Attention (``costmodels.calibration.mla``) has a
query-key width ``a·(d_n + d_r)`` and a value width ``a·d_v`` of their own (DeepSeek-V3: 24,576
and 16,384 against a hidden size of 7,168), so its core is 2.9× that count. A row's core GEMMs
are the matmuls with one row per (sequence, head, query), ``m = b·heads·s``: where a block row
holds exactly two of them and their FLOPs differ from ``4·b·s²·h``, theirs are taken. Tables
whose heads are ``h/heads`` wide (every dense table, the traced ones included, where the two
agree) keep the original figure bit for bit; so does context parallelism (its own accounting
in ``table_arrays``).
"""
from __future__ import annotations

import numpy as np


def core_flops_from_matmuls(table, core_flops: np.ndarray, is_block: np.ndarray) -> np.ndarray:
    """``core_flops`` (per row, ``4·b·s²·h`` where the row has an attention core) with the
    rows whose two core GEMMs say otherwise replaced by theirs (module docstring)."""
    if getattr(table, "cp", 1) != 1 or not table.heads:
        return core_flops
    per_head = table.micro_batch * table.heads * table.seq
    out = core_flops
    for i, r in enumerate(table.rows):
        if not is_block[i] or core_flops[i] <= 0:
            continue
        core = [2.0 * m * n * k for m, n, k in r.matmul_dims if m == per_head]
        if len(core) == 2 and abs(sum(core) - core_flops[i]) > 1e-9 * core_flops[i]:
            if out is core_flops:
                out = core_flops.copy()
            out[i] = sum(core)
    return out
