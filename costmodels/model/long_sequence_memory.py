"""Memory a Megatron-core + Transformer Engine run holds in proportion to the sequence, outside
the saved activations of ``memory.activation_bytes``.

At 8K tokens these buffers are a few hundred MB and hide in the hardware profile's
``memory_reserve_bytes``; at 128K tokens without context parallelism they are GBs, and they decide
which no-CP layout of a long-sequence sweep fits. Each term is read from the code that allocates
it, not fitted:

* **Transformer Engine's userbuffers** (``--tp-comm-overlap`` / NeMo ``ub_tp_comm_overlap``,
  tp > 1). Megatron-LM (``initialize_tp_communicators``, megatron/training/initialize.py) and NeMo
  (``MegatronGPTModel.initialize_ub_func``) call ``transformer_engine.pytorch.module.base.
  initialize_ub(shape=[seq · micro_batch / cp, hidden], ...)``, which allocates one buffer of that
  shape for each of ten GEMMs: the six all-gather overlaps (``qkv_fprop``, ``qkv_dgrad``,
  ``proj_dgrad``, ``fc1_fprop``, ``fc1_dgrad``, ``fc2_dgrad``), in uint8 when the run is FP8
  (``fp8_buf``), else bf16, and the four reduce-scatter ones (``proj_fprop``, ``fc2_fprop``,
  ``qkv_wgrad``, ``fc1_wgrad``) in bf16. The buffers are the full sequence of the cp rank, not
  a tp share, and live for the whole run::

      userbuffers = b · (S / cp) · h · (6 · ag_bytes + 4 · 2),   ag_bytes = 1 (FP8) | 2

* **Megatron's global memory buffer** for the output layer (``ColumnParallelLinear``, not a TE
  module) under sequence parallelism: ``linear_with_grad_accumulation_and_async_allreduce``
  all-gathers the head's input into ``get_global_memory_buffer().get_tensor(..., "mpu")``, a
  buffer of ``b · (S / cp) · h`` elements in the activation dtype kept between steps.
* **The logits beside the loss** (head row, per micro-batch, ``L = b · (S / cp) · vocab``):
  Megatron's ``vocab_parallel_cross_entropy`` starts with ``vocab_parallel_logits.float()``
  (megatron/core/tensor_parallel/cross_entropy.py, ``calculate_logits_max``), so while its fp32
  copy (the ``4·L/t`` the memory model counts as saved) is built and softmaxed, the head's bf16
  output (``2·L/t``) is still referenced by the model's forward; in backward the fp32 gradient is
  cast back to a bf16 ``2·L/t`` while the fp32 one is alive. Either way the moment of the
  micro-batch's loss holds ``2·L/t`` more than ``memory.LOSS_SAVED_BYTES`` says.

Only for runtimes whose base is ``megatron`` (NeMo's stack is Megatron-core): torchtitan and
autopar's own runtime neither allocate userbuffers nor use this loss.
"""
from __future__ import annotations

import numpy as np

FP8_PRECISIONS = ("fp8", "fp8-rowwise", "mxfp8")
UB_ALL_GATHER_BUFFERS = 6      # TE initialize_ub: layers_all_gather_overlap
UB_REDUCE_SCATTER_BUFFERS = 4  # TE initialize_ub: layers_reduce_scatter_overlap (bf16)
LOGIT_BF16_BYTES = 2.0         # the head's output dtype, held beside the loss's fp32 copy


def _is_megatron(runtime) -> bool:
    return str(getattr(runtime, "name", "") or "").split(":")[0] == "megatron"


def userbuffer_bytes(table, plan, runtime) -> float:
    """TE userbuffers of one GPU (module docstring); ``table`` the priced table (under cp the
    rank's share, whose ``seq`` is ``S/cp``)."""
    if not _is_megatron(runtime) or not getattr(runtime, "tp_comm_overlap", 0) or plan.tp <= 1:
        return 0.0
    elems = float(plan.micro_batch_size) * table.seq * float(table.hidden or 0)
    ag = 1.0 if getattr(plan, "precision", "bf16") in FP8_PRECISIONS else float(table.act_dtype_bytes)
    return elems * (UB_ALL_GATHER_BUFFERS * ag + UB_REDUCE_SCATTER_BUFFERS * table.act_dtype_bytes)


def head_gather_buffer_bytes(table, plan, runtime) -> float:
    """Megatron's global "mpu" buffer for the output layer's sequence-parallel all-gather."""
    if not _is_megatron(runtime) or not plan.sequence_parallel or plan.tp <= 1:
        return 0.0
    return float(plan.micro_batch_size) * table.seq * float(table.hidden or 0) * table.act_dtype_bytes


def fixed_buffer_bytes(table, plan, runtime) -> float:
    """Bytes every GPU of the plan holds for the whole run beside its states and activations."""
    return userbuffer_bytes(table, plan, runtime) + head_gather_buffer_bytes(table, plan, runtime)


def loss_logits_held_bytes(arr, plan, runtime, tp: int, b: int) -> np.ndarray:
    """Per row and micro-batch: the bf16 logits held beside the loss's fp32 copy (head row)."""
    if not _is_megatron(runtime) or getattr(plan, "precision", "bf16") not in ("bf16",) + FP8_PRECISIONS:
        return np.zeros(arr.n)
    return LOGIT_BF16_BYTES * arr.loss_logits / arr.table.micro_batch * b / tp
