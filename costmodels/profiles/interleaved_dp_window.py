"""The data-parallel gradient sync's window under an interleaved pipeline: each model chunk's
gradients sync as soon as that chunk's last backward is done, not after the rank's last one.

``estimate`` hides a rank's dp sync behind the backward of its last micro-batch (its window
``ov·B``, ``B`` the rank's backward of one micro-batch over all its chunks): right for 1F1B, where
every parameter's last gradient comes in that backward. Under interleaved 1F1B with ``v`` chunks
per rank the last backwards run chunk by chunk. Both runtimes that interleave order the
backwards in groups of ``pp`` micro-batches per chunk — Megatron-core
``forward_backward_pipelining_with_interleaving`` (``microbatch_group_size_per_vp_stage``
defaults to ``pipeline_model_parallel_size``; megatron/core/pipeline_parallel/schedules.py) and
torch's ``ScheduleInterleaved1F1B`` (``m // pp`` rounds of ``pp`` micro-batches) — so the last
group runs chunk ``v−1`` for ``pp`` micro-batches, then chunk ``v−2``, ..., then chunk 0.

And both launch a chunk's sync after that chunk's own last backward:

* Megatron-core: ``backward_step_helper`` calls ``enable_grad_sync()`` for a chunk's last
  micro-batch (``is_last_microbatch_for_model_chunk``), so with ``--overlap-grad-reduce`` the
  chunk's bucket reduce-scatters start from its backward hooks (or ``grad_sync_func[chunk]`` is
  called then);
* torch.distributed.pipelining: ``backward_one_chunk(..., last_backward=...)`` per stage turns
  on that stage's DDP / FSDP gradient sync at its own last backward
  (``PipelineScheduleMulti._step_microbatches``).

Chunk ``v−1``'s last backward starts ``(pp − 1)`` chunk-backwards into that last group of
``pp·v`` chunk-backwards (each ``B/v``), so the sync's window is what follows that start::

    window = ov · B · (pp − (pp − 1)/v)            (= ov·B at v = 1 or pp = 1)

(interleaving needs ``m`` a multiple of ``pp``: checks.py). A runtime profile says its sync works
so with ``[overlap] dp_sync_per_chunk = 1``. The chunk syncs queue on one stream and a chunk
becomes ready every ``pp`` chunk-backwards; where each chunk's sync is longer than that, the
comm stream is the bottleneck and ``t − window`` prices it; the last chunk's bucket after the
backward and the compute slowdown stay as ``coefficients.dp_exposed`` prices them.
"""
from __future__ import annotations


def interleaved_window_factor(plan, per_chunk: int) -> float:
    """The factor on the dp window of ``plan`` (module docstring); 1 unless ``per_chunk`` and
    the plan runs interleaved 1F1B with vpp > 1 and pp > 1."""
    pp, v = getattr(plan, "pp", 1), getattr(plan, "vpp", 1)
    if not per_chunk or getattr(plan, "schedule", "") != "interleaved-1f1b" or v <= 1 or pp <= 1:
        return 1.0
    return pp - (pp - 1) / v
