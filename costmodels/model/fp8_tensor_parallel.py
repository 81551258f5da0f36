"""Sequence-parallel all-gathers in FP8: what torchao's float8 tensor parallelism changes in a
row's TP collectives.

torchtitan applies tensor parallelism to float8 (tensorwise) linears with torchao's
``Float8ColwiseParallel`` / ``Float8RowwiseParallel`` / ``PrepareFloat8ModuleInput``
(torchao/float8/float8_tensor_parallel.py; torchtitan's ``apply_tp`` with float8 on, "float8
all-gather for TP by default for Float8Linear", torchtitan docs/float8.md):

* forward: the sequence-sharded input of a column-parallel linear is cast to float8 (e4m3)
  *before* its ``Shard(1) → Replicate`` redistribute, so the sequence-parallel all-gather moves
  1 byte per element instead of 2;
* backward: the row-parallel output's gradient is cast to float8 (e5m2,
  ``_NoopFwToFloat8BwDynamic`` applied after the forward's reduce-scatter, so before its
  backward all-gather), so the backward all-gather moves 1 byte per element too;
* both reduce-scatters (the forward's of the row-parallel output, the backward's of the input
  gradient) stay in BF16: partial sums are not cast.

Transformer Engine does the same (Megatron-core / NeMo): with sequence parallelism a
column-parallel ``te.Linear`` / ``LayerNormLinear`` quantizes its input before the all-gather
(``with_input_all_gather_nccl``), and ``grad_output_preprocess`` casts the row-parallel output
gradient to FP8 before gathering it ("FP8 case with gather: unfused bgrad, cast, transpose for
efficient gather", transformer_engine/pytorch/module/base.py); userbuffers' overlapped
all-gathers use FP8 buffers alike. MXFP8 gathers its quantized data too.

So of each TP pair's one all-gather + one reduce-scatter per direction (``compute.row_times``
with sequence parallelism), the all-gather is priced at half its bytes; a full recompute re-runs
the forward's all-gather in FP8 as well. Of torchao's recipes only tensorwise does this
(torchtitan keeps BF16 TP for rowwise and MXFP8); without sequence parallelism the all-reduce
stays BF16. Which stack does it for which precisions is ``precision.Fp8Stack.fp8_tp_all_gather``.

One reduce-scatter does move FP8: Transformer Engine's userbuffers with ``fp8_buf`` on a
'pipeline' overlap (``initialize_ub``: a uint8 buffer) have the row-parallel GEMM write its
partial sums in FP8 and the reduce-scatter move 1 byte per element, summed in higher precision
on arrival. NeMo 2's FP8 H100 userbuffer configs set it for the forward of the attention-output
and MLP-down projections (``proj_fprop`` / ``fc2_fprop``), so the runtime option ``ub_fp8_rs``
(``[overlap] tp_fwd_reduce_scatter_fp8``: the share of a block's forward reduce-scatters that do,
1 or 0.5) prices them at half their bytes (``fp8_ub_reduce_scatter``); the backward's stay BF16.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from costmodels.model.comm import collective_time


def fp8_tp_all_gather(rt, arr, tier, tp: int, b: int, sp: bool, full_recompute: bool):
    """``rt`` with each TP all-gather of a sequence-parallel row moving FP8 (half its bytes)."""
    if tp <= 1 or not sp:
        return rt
    nbytes = arr.tp_comm_bytes * (b / arr.table.micro_batch)
    b16, t16 = collective_time("all_gather", nbytes, tp, tier)
    b8, t8 = collective_time("all_gather", nbytes / 2.0, tp, tier)
    dt = np.where(nbytes > 0, arr.tp_collectives * (t8 - t16), 0.0)
    db = np.where(nbytes > 0, arr.tp_collectives * (b8 - b16), 0.0)
    rec = np.where(arr.is_block, 1.0, 0.0) if full_recompute else np.zeros(arr.n)
    return replace(rt, tp_fwd_s=rt.tp_fwd_s + dt, tp_bwd_s=rt.tp_bwd_s + dt,
                   tp_recompute_s=rt.tp_recompute_s + rec * dt,
                   tp_bytes_fwd=rt.tp_bytes_fwd + db, tp_bytes_bwd=rt.tp_bytes_bwd + db,
                   tp_bytes_recompute=rt.tp_bytes_recompute + rec * db)


def fp8_ub_reduce_scatter(rt, arr, tier, tp: int, b: int, sp: bool, share: float, full_recompute: bool):
    """``rt`` with ``share`` of each sequence-parallel row's forward reduce-scatters moving FP8
    (half their bytes; userbuffers' ``fp8_buf``, module docstring); a full recompute re-runs them."""
    if tp <= 1 or not sp or share <= 0:
        return rt
    nbytes = arr.tp_comm_bytes * (b / arr.table.micro_batch)
    b16, t16 = collective_time("reduce_scatter", nbytes, tp, tier)
    b8, t8 = collective_time("reduce_scatter", nbytes / 2.0, tp, tier)
    dt = np.where(nbytes > 0, share * arr.tp_collectives * (t8 - t16), 0.0)
    db = np.where(nbytes > 0, share * arr.tp_collectives * (b8 - b16), 0.0)
    rec = np.where(arr.is_block, 1.0, 0.0) if full_recompute else np.zeros(arr.n)
    return replace(rt, tp_fwd_s=rt.tp_fwd_s + dt, tp_recompute_s=rt.tp_recompute_s + rec * dt,
                   tp_bytes_fwd=rt.tp_bytes_fwd + db, tp_bytes_recompute=rt.tp_bytes_recompute + rec * db)
