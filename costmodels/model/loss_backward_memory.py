"""The loss's backward transient: what an unfused cross-entropy holds at the start of its backward.

``memory.activation_bytes`` keeps ``loss_saved_bytes_per_logit`` per logit on the head row (the
loss's saved tensor). A runtime whose loss is ``F.cross_entropy`` on the upcast logits
(torchtitan's ``loss_fn``: ``cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))``,
pytorch/torchtitan 9dec370 train.py and 0.2.2 torchtitan/components/loss.py) also holds, at the
start of that backward, the fp32 gradient of the log-probabilities (NLL's backward, dense) and
the fp32 gradient of the logits (log-softmax's backward) beside the saved fp32 log-softmax: the
runtime profile's ``[kernels] loss_grad_bytes_per_logit`` (8 for torchtitan; 0 where the loss
writes its gradient into the logits' buffer in the forward, as Megatron's vocab-parallel
cross-entropy and flash-attn's fused one do). With loss parallel (torchtitan at tp > 1) the
logits are vocab shards: ``/tp``, as the saved bytes are, and the backward is DTensor's own
(``torch.distributed.tensor.parallel.loss._nll_loss_and_log_softmax_backward``), which holds three
fp32 shards beside the saved log-softmax, not two: ``[kernels] loss_parallel_grad_bytes_per_logit``
(12 for torchtitan) replaces the figure at tp > 1.

That moment comes before any block's backward, so under full recompute it never meets the
recompute working set (one block's whole activations, ``memory.recompute_working_bytes``): the
head row carries ``max(0, transient − working set)`` per micro-batch in flight (one on the last
pipeline chunk of every standard schedule), which keeps the term linear per row — the search's
memory rows (``row_coefficients.act_bytes``) and ``estimate`` read the same figure.
"""
from __future__ import annotations

import numpy as np

from costmodels.model.memory import logits
from costmodels.model.table_arrays import TableArrays, activation_bytes_none


def loss_backward_bytes(arr: TableArrays, plan, runtime, precision: str) -> np.ndarray:
    """Per row and micro-batch: the loss backward's transient beyond the working set (head row)."""
    per_logit = float(getattr(runtime, "loss_grad_bytes", 0.0) or 0.0)
    if plan.tp > 1 and getattr(runtime, "loss_parallel_grad_bytes", None) is not None:
        per_logit = float(runtime.loss_parallel_grad_bytes)   # torch's loss_parallel() handler (docstring)
    if not per_logit or precision != "bf16-mixed":   # amp / fp32: memory._runtime_peak's own
        return np.zeros(arr.n)
    tp, b = plan.tp, plan.micro_batch_size
    transient = per_logit * logits(arr, b) / tp
    work = 0.0
    if plan.recompute == "full" and arr.is_block.any():
        work = float(activation_bytes_none(arr, tp, plan.sequence_parallel, b, plan.attention)[arr.is_block].max())
    return np.maximum(0.0, transient - work) * (transient > 0)
