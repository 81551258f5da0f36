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
"""
from __future__ import annotations

import numpy as np

from costmodels.model.comm import collective_time


def unfused_bwd_reduce_scatter_s(arr, runtime, tier, tp: int, b: int, sp: bool) -> np.ndarray:
    """Per row, the seconds of backward reduce-scatter the runtime's TP overlap cannot pipeline
    (module docstring); zeros where it pipelines every collective."""
    if not getattr(runtime, "tp_bwd_reduce_scatter_exposed", 0) or tp <= 1 or not sp:
        return np.zeros(arr.n)
    nbytes = arr.tp_comm_bytes * (b / arr.table.micro_batch)
    _, t_rs = collective_time("reduce_scatter", nbytes, tp, tier)
    return np.where(arr.is_block & (nbytes > 0), arr.tp_collectives * t_rs, 0.0)
