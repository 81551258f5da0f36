"""A LayerTable's rows as numpy arrays, built once per table, and the saved-activation bytes
per row without recompute that both the compute model (element-wise traffic) and the memory model
read. Kept apart from ``compute`` so the memory model and the search's coefficients use the
same arrays without the row-time model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from costmodels.contracts.layer_table import LayerTable
from costmodels.model.attention_core import core_flops_from_matmuls


@dataclass(frozen=True, eq=False)
class TableArrays:
    """Per-row numpy views of a LayerTable (built once per table)."""

    table: LayerTable
    n: int
    params: np.ndarray
    fwd_flops: np.ndarray
    bwd_flops: np.ndarray
    wgt_flops: np.ndarray          # of bwd_flops: the weight gradients (LayerRow.weight_grad_flops)
    saved: np.ndarray
    act_tp: np.ndarray
    core: np.ndarray
    boundary: np.ndarray
    tp_comm_bytes: np.ndarray
    tp_collectives: np.ndarray     # per direction
    is_block: np.ndarray           # bool
    mm_row: np.ndarray             # row index of each matmul
    mm_flops: np.ndarray           # 2·m·n·k of each matmul at the table's micro-batch, no tp
    attn_core_flops: np.ndarray    # forward FLOPs of Q·Kᵀ and scores·V per row (blocks), table b0
    loss_logits: np.ndarray        # logits the loss reads per row (b0·s·vocab on the head row)
    tp_replicated: np.ndarray      # parameter tensors TP leaves whole per row (blocks)
    mask: np.ndarray               # the causal mask math attention saves (replicated part)


_ARRAYS: dict[int, TableArrays] = {}


def table_arrays(table: LayerTable) -> TableArrays:
    """Numpy arrays of a table's rows, cached by identity."""
    a = _ARRAYS.get(id(table))
    if a is not None and a.table is table:
        return a
    rows = table.rows
    f = lambda name: np.array([float(getattr(r, name)) for r in rows], dtype=float)  # noqa: E731
    mm_row, mm_flops = [], []
    for i, r in enumerate(rows):
        if r.matmul_dims:
            for (m, n_, k) in r.matmul_dims:
                mm_row.append(i)
                mm_flops.append(2.0 * m * n_ * k)
        elif r.fwd_flops > 0:
            mm_row.append(i)
            mm_flops.append(float(r.fwd_flops))
    is_block = np.array([r.kind == "block" for r in rows], dtype=bool)
    core_flops = np.zeros(len(rows))
    if table.hidden and table.heads:
        # Q·Kᵀ and scores·V: 2 matmuls of 2·b·s²·h FLOPs each (attention width = hidden)
        core_flops = np.where(is_block & (f("act_attention_core_bytes") > 0),
                              4.0 * table.micro_batch * table.seq ** 2 * table.hidden
                              * getattr(table, "cp", 1), 0.0)   # cp: S²/cp per rank (context_parallel)
        core_flops = core_flops_from_matmuls(table, core_flops, is_block)   # MLA's widths (attention_core.py)
    ncoll = np.array([len(r.tp_pairs) if r.tp_pairs else (1 if r.tp_comm_bytes else 0) for r in rows],
                     dtype=float)
    logits = np.array([float(table.micro_batch * table.seq * table.vocab)
                       if (r.kind == "head" and table.vocab) else 0.0 for r in rows])
    a = TableArrays(table=table, n=len(rows), params=f("params"), fwd_flops=f("fwd_flops"),
                    bwd_flops=f("bwd_flops"), wgt_flops=f("weight_grad_flops"),
                    saved=f("saved_activation_bytes"), act_tp=f("act_tp_bytes"),
                    core=f("act_attention_core_bytes"), boundary=f("boundary_bytes"),
                    tp_comm_bytes=f("tp_comm_bytes"), tp_collectives=ncoll, is_block=is_block,
                    mm_row=np.array(mm_row, dtype=int), mm_flops=np.array(mm_flops, dtype=float),
                    attn_core_flops=core_flops, loss_logits=logits,
                    tp_replicated=f("tp_replicated_tensors"), mask=f("act_attention_mask_bytes"))
    if len(_ARRAYS) > 64:
        _ARRAYS.clear()
    _ARRAYS[id(table)] = a
    return a


def activation_bytes_none(arr: TableArrays, tp: int, sp: bool, b: int, attention: str, *,
                          drop_core: bool | None = None) -> np.ndarray:
    """Saved-activation bytes per GPU per micro-batch and row, without recompute (see memory).
    ``drop_core`` (default: flash attention) drops the attention core, as selective recompute
    does; flash attention also drops the causal mask the math path saves (``act_attention_mask_bytes``)."""
    k = b / arr.table.micro_batch
    saved, tpb = arr.saved, arr.act_tp
    if attention == "flash" if drop_core is None else drop_core:
        saved, tpb = saved - arr.core, tpb - arr.core
    if attention == "flash" and arr.mask.any():
        saved = saved - arr.mask
    rest = saved - tpb
    return k * (tpb / tp + (rest / tp if sp else rest))
