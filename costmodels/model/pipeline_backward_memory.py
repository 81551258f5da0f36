"""What autopar's runtime holds inside a backward under pp > 1 beyond ``memory._runtime_peak``'s
once-per-step terms (issue 31): the amp / fp32 recipes only (``autopar validate``'s).

Measured on 4 gloo ranks (``python benchmarks/memory_peak_breakdown.py`` on gpt 8 × 384,
pp2·dp2, m = 4, 1F1B, amp: the live blocks at each rank's peak by allocating op), two things the
model did not hold:

* **Autocast's bf16 weight casts, one set per micro-batch in flight.** The runtime casts the
  weights anew for every micro-batch's forward (autopar/runtime/step/schedules.py
  ``fresh_autocast_casts``: a pre-hook on every pipeline stage clears autocast's cache), and each
  linear's backward needs its bf16 weight for the input gradient, so autograd saves that
  micro-batch's casts until its backward has passed the row. A chunk with ``n`` micro-batches in
  flight holds ``n`` copies (``2`` bytes per block / head parameter), not the one the cache term
  charges: on stage 0 of the plan above (2 in flight) 24.9 MB of casts at the peak against one
  copy's 14.2 MB (the micro-batch being backwarded has freed part of its own). At pp = 1 one
  micro-batch is in flight at a time: nothing changes. ZeRO 0–3 alike.
* **FSDP2's reduce window, ZeRO-2/3.** autopar's stage (autopar/runtime/step/pipeline_stage.py
  ``ShardedGradStage``) reduce-scatters every micro-batch's gradients inside its backward, row
  by row (FSDP2's post-backward hook). While row i's backward runs, its whole fp32 weight
  gradient (the cast of the bf16 one, ``ToCopyBackward0``) is live, and so is row i+1's
  reduce-scatter input: FSDP2 keeps the last reduce-scatter's input until the next row's
  post-backward (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py ``post_backward``:
  ``reduce_scatter_states`` with ``reduce_scatter_max_input_buffers = 1``). Two rows' whole
  gradients (``grad`` bytes, fp32 here) beside the 1/dp shards: the two largest rows of the
  rank's chunks, as ZeRO-3's gather buffer counts two rows' weights. Measured: 7.49 + 7.10 MB on
  stage 1 (a block is 7.10 MB in fp32). At pp = 1 the runtime reduces once a step, on the last
  micro-batch, over whole accumulated gradients (``memory._runtime_peak``'s ``GΨ``): not here.

Both enter one moment of ``_runtime_peak``: **a later backward's reduce** (``moment``): the
in-flight micro-batches' casts, the 1/dp gradients of the earlier micro-batches plus the reduce
window, ZeRO-3's two gathered rows (re-gathered by that backward's pre-backward hooks) and the
activations and held logits of the other micro-batches in flight (the one being backwarded has
freed the rows after the reducing one; its own rows before it are not charged: at the reduce of
the stage's last-backwarded rows they are few). The first / later backward's start also charge
the in-flight casts (``cast_copies_bytes``).

Found and NOT priced: gloo's reduce-scatter stages its input. On a CPU (``autopar validate``'s
gloo ranks) ``ProcessGroupGloo::reduce_scatter_tensor_coalesced`` clones the whole input and
all-reduces the clone, which its work object holds until it is dropped (often on gloo's worker
thread, which the profiler does not watch: ``autopar/validate/live_bytes.py``'s ghosts). At the
ZeRO-2 peak of stage 1 above that was 14.2 MB (two rows' clones, ``c10d::_reduce_scatter_base_``),
the 9 % left between the stage's prediction and its measurement; on the uneven plan's stage 1
(pp2·dp2 ZeRO-3, stages (0, 4), (4, 10)) 14.2 MB again, its −7…−12 % (gloo's all-gather stages
a row too: ``c10d::_allgather_base_``, 7.1 MB on its stage 0). NCCL reduce-scatters from the
input buffer: a figure of the collective backend (the CPU hardware profile), not of autopar's
runtime, so it is left out of this runtime's model.
"""
from __future__ import annotations

AUTOCAST_BYTES = 2.0   # a bf16 cast of each matmul weight (memory.AUTOCAST_CACHE_BYTES)


def cast_rows_params(arr, chunk: tuple[int, int], tp: int) -> float:
    """Parameters whose matmul weights autocast casts in ``chunk`` (its block and head rows),
    per tp rank (memory._runtime_peak's ``cached``, one chunk's share)."""
    s, e = chunk
    return sum(float(arr.params[i]) for i in range(s, e)
               if arr.table.rows[i].kind in ("block", "head")) / tp


def cast_copies_bytes(arr, chunks, counts, tp: int, precision: str, pp: int) -> float:
    """Bytes of the casts beyond the cache's one set that ``counts[c]`` micro-batches in flight on
    chunk c hold (module docstring): 0 at pp = 1 and outside amp."""
    if precision != "amp" or pp <= 1 or not counts:
        return 0.0
    return AUTOCAST_BYTES * sum(max(n - 1, 0) * cast_rows_params(arr, ch, tp)
                                for ch, n in zip(chunks, counts))


def reduce_window_bytes(arr, chunks, tp: int, dp: int, zero: int, pp: int, grad_bytes: float) -> float:
    """The whole gradients of the two largest rows of the rank's chunks (module docstring) where
    the runtime reduce-scatters inside each backward (ZeRO-2/3, dp > 1, pp > 1); else 0."""
    if not (dp > 1 and zero >= 2 and pp > 1):
        return 0.0
    sizes = sorted((float(arr.params[i]) for s, e in chunks for i in range(s, e)), reverse=True)
    return grad_bytes * sum(sizes[:2]) / tp


def moment(arr, chunks, counts, act_rows, *, tp: int, dp: int, zero: int, pp: int, precision: str,
           grad_bytes: float, held_per_micro_batch: float, head_in_flight: int):
    """(extra params, extra grads, other micro-batches' activations and logits) of a later
    backward's reduce (module docstring), or None where the runtime reduces nothing there."""
    window = reduce_window_bytes(arr, chunks, tp, dp, zero, pp, grad_bytes)
    if not window:
        return None
    casts = cast_copies_bytes(arr, chunks, counts, tp, precision, pp)
    others = sum(max(n - 1, 0) * float(act_rows[s:e].sum()) for (s, e), n in zip(chunks, counts))
    others += max(head_in_flight - 1, 0) * held_per_micro_batch
    return casts, window, others
