"""Which tensor-parallel collectives torch's micro-pipeline TP (torchtitan's async TP) fuses
with a matmul, and so which ``tp_overlap`` may pipeline.

torchtitan's ``enable_async_tensor_parallel`` turns on ``torch._inductor.config._micro_pipeline_tp``:
a post-grad pass (``torch/_inductor/fx_passes/micro_pipeline_tp.py``, ``micro_pipeline_tp_pass``)
that rewrites, in the compiled forward and backward graphs,

* an all-gather whose result feeds matmuls as their left operand
  (``_find_consumer_matmuls``: ``mm`` / ``_scaled_mm``, through a reshape) into
  ``symm_mem.fused_all_gather_matmul`` (FP8: ``_scaled_mm`` consumers too, when the gather
  dimension is not the last one — the sequence dimension here);
* a reduce-scatter whose input is *produced by one matmul* (``_find_producer_matmul``: the node
  feeding it must be an ``mm`` / ``_scaled_mm``, or ``reshape(mm(reshape(·)))``) into
  ``symm_mem.fused_matmul_reduce_scatter``. Anything else is left as it was (a plain NCCL
  collective on the critical path).

In a transformer block under sequence parallelism that fuses:

* forward: the all-gathers before Q/K/V and before the MLP's gate/up projections (their consumer
  matmuls), and the reduce-scatters after the attention output and the MLP down projection (each
  the output of one matmul) — all four;
* backward: the all-gathers of the output gradients before the attention-output and down
  projections' input-gradient matmuls (consumers) — but NOT the reduce-scatters of the input
  gradients of Q/K/V and of gate/up: the input of each is used by several linears (torchtitan's
  Llama has separate ``wq``, ``wk``, ``wv`` and ``w1``, ``w3``), so autograd sums their
  input-gradient matmuls and the reduce-scatter's producer is an ``add``, not a matmul.

So under this runtime, of a block row's backward TP collectives (``compute.row_times``: per TP
pair one all-gather + one reduce-scatter) only the all-gather half is pipelined; the
reduce-scatter stays exposed at its BF16 time (partial sums are never cast to FP8,
``fp8_tensor_parallel``). The forward and a full recompute's forward are pipelined whole. The LM
head's input-gradient reduce-scatter has one producer matmul and is fused (non-block rows keep
the whole overlap). A runtime profile says so with ``[overlap] tp_bwd_reduce_scatter_exposed = 1``
(``fsdp:async_tp``); Transformer Engine's userbuffers (``megatron:tp_comm_overlap``) pipeline the
backward's reduce-scatters too and keep 0.

What the fused ops cost that the chunk pipeline (``tp_overlap.exposed``) does not see, read from
torch's implementation (``torch/distributed/_symmetric_memory/__init__.py``, torch 2.13.0, git
cf30153c4c131c8164ee7798e5022d810682e2cb; ``micro_pipeline_tp_cost``):

* the matmul is decomposed: ``_fused_all_gather_matmul_impl`` runs the consumer matmul once per
  source rank on that rank's shard (``shard_consumer`` in ``_pipelined_multi_all_gather_and_consume``)
  and ``_fused_matmul_reduce_scatter_impl`` once per destination rank (``chunk_producer`` in
  ``_pipelined_produce_and_all2all``), so each of a block's forward GEMMs runs as ``tp`` GEMMs of
  ``1/tp`` the rows, at the matmul curve's efficiency for that size;
* copies it cannot hide: before the pipeline every rank copies its shard into its symmetric-memory
  buffer and barriers ("we are giving up the chance to overlap 'mv' and 'b' with the first
  shard_consumer", the source says), ``2·V/tp`` bytes of HBM for a gathered tensor of ``V``
  bytes; after a fused reduce-scatter the ``tp`` stacked partials are summed by a separate
  reduction (``reduce_fn(stacked_partials_view)``), ``V + V/tp`` bytes;
* the two streams: the shards' GEMMs alternate between the current and a backend stream, so two
  of them run at once ("computation/computation overlapping, greatly reducing quantization
  inefficiency", the source's comment): a decomposed GEMM is priced at the curve's efficiency
  for ``min(1, 2/tp)`` of its size, not ``1/tp``.

The peer copies themselves are charged nothing beyond the chunk pipeline: they are
``Tensor.copy_`` of a peer-mapped buffer, which the copy engines run (DMA, no SMs), so the GEMMs
they overlap keep the whole GPU; the design states it ("finer-grained async P2P ops executed by
copy engines ... This prevents any SM contention", D. Vega-Myhre, "An illustrated deep-dive
into async TP", 2025; the PyTorch dev-discuss post "Introducing Async Tensor Parallelism in
PyTorch", 2024). So the GPU's ``collective_slowdown`` (NCCL kernels holding SMs) is not charged.

The backward's two fused all-gathers (into the input-gradient GEMMs of the attention-output and
down projections) are charged their copies and their decomposed input-gradient GEMMs, which
``async_tp_windows.linear_roles`` finds among a row's matmuls (each pair's row linear; a pair's
lone column linear too, whose reduce-scatter then fuses and pays its partial-sum reduction);
rows it cannot match pay the forward's decomposition only. How much of each collective the
fused GEMMs hide is ``async_tp_windows.fused_collective_windows``. Megatron's userbuffers are
left as they were: their ring exchange is Transformer Engine's own kernels, calibrated with the
NeMo rows.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from costmodels.model.async_tp_windows import (
    decomposed_gemm_s,
    fused_backward_gemms,
    fused_bwd_reduce_scatters,
    gemm_rate,
    whole_gemm_s,
)
from costmodels.model.comm import collective_time
from costmodels.model.precision import STACKS, linear_dims, stack_key


def unfused_bwd_reduce_scatter_s(arr, runtime, tier, tp: int, b: int, sp: bool) -> np.ndarray:
    """Per row, the seconds of backward reduce-scatter the runtime's TP overlap cannot pipeline
    (module docstring); zeros where it pipelines every collective."""
    if not getattr(runtime, "tp_bwd_reduce_scatter_exposed", 0) or tp <= 1 or not sp:
        return np.zeros(arr.n)
    nbytes = arr.tp_comm_bytes * (b / arr.table.micro_batch)
    _, t_rs = collective_time("reduce_scatter", nbytes, tp, tier)
    unfused = arr.tp_collectives - fused_bwd_reduce_scatters(arr)   # a lone column linear's fuses
    return np.where(arr.is_block & (nbytes > 0), unfused * t_rs, 0.0)


def micro_pipeline_tp_cost(rt, arr, kernels, plan, runtime, tp: int, b: int):
    """``rt`` (the RowTimes ``tp_overlap.overlapped`` left) with what torch's fused
    all-gather-matmul / matmul-reduce-scatter add to each block row (module docstring): the
    decomposed forward GEMMs of the block linears (in FP8 where the plan runs them so:
    ``precision.fp8_row_times``' time) and the unhidden shard copies and partial-sum
    reductions. ``rt`` unchanged unless the runtime runs micro-pipeline TP
    (``tp_bwd_reduce_scatter_exposed``) with tp > 1 under sequence parallelism."""
    sp = bool(plan.sequence_parallel)
    if not getattr(runtime, "tp_bwd_reduce_scatter_exposed", 0) or tp <= 1 or not sp:
        return rt
    k = b / arr.table.micro_batch
    ld = linear_dims(arr)   # the block linears (one row per token), not the attention core
    p = getattr(plan, "precision", "bf16") or "bf16"
    size, rate = gemm_rate(arr, kernels, plan, runtime)   # FP8 GEMMs at their own rate
    f = ld.mm_flops * k / tp
    split = decomposed_gemm_s(f, kernels, size, rate, tp) - whole_gemm_s(f, kernels, size, rate)
    split_row = np.bincount(ld.mm_row, weights=split, minlength=arr.n)
    # the backward's fused input-gradient GEMMs (async_tp_windows.fused_backward_gemms): the
    # row linears' (their output gradient's all-gather) and a lone column linear's (its
    # reduce-scatter); an input-gradient GEMM has its forward's FLOPs
    fb = fused_backward_gemms(arr)
    split_bwd = np.bincount(ld.mm_row[fb], weights=split[fb], minlength=arr.n)
    # the copies the pipeline leaves on the critical path, per TP pair (one all-gather + one
    # reduce-scatter per direction: compute.row_times' tp_collectives); an FP8 all-gather's
    # shard is 1 byte per element (fp8_tensor_parallel), the partial sums stay BF16
    v = arr.tp_comm_bytes * k
    ag = 0.5 if p in STACKS[stack_key(runtime)].fp8_tp_all_gather else 1.0
    ew = kernels.elementwise_bw
    copies_fwd = arr.tp_collectives * (ag * 2.0 * v / tp + (v + v / tp)) / ew
    # backward: the gradient shards' copies, and the partial-sum reduction of each fused
    # input-gradient reduce-scatter (pairs with one column linear)
    copies_bwd = (arr.tp_collectives * (ag * 2.0 * v / tp) + fused_bwd_reduce_scatters(arr) * (v + v / tp)) / ew
    blk = arr.is_block & (arr.tp_comm_bytes > 0)
    add_f = np.where(blk, split_row + copies_fwd, 0.0)
    add_b = np.where(blk, split_bwd + copies_bwd, 0.0)
    add_r = np.where(rt.recompute_s > 0, add_f, 0.0)   # a recomputed forward runs the fused ops again
    return replace(rt, fwd_s=rt.fwd_s + add_f, bwd_s=rt.bwd_s + add_b, recompute_s=rt.recompute_s + add_r)
