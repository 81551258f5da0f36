"""The once-per-step work of a Megatron-core / NeMo step that is neither the pipeline, the dp
gradient sync nor the Adam update (``optimizer.optimizer_step_s``), read from the code.

Why its own module: these terms are per step, not per micro-batch, so a step of few
micro-batches (the weak-scaling NeMo rows, 8 micro-batches) carries a larger share of them than
its strong-scaling twin (32-128); unpriced, a fit on the short steps takes them into the matmul
scale. Each term is linear in the parameters a GPU holds (or a constant per step), so the
search's integer program reads it through the coefficients that already carry the optimizer step
(``coefficients.RowCoefficients.optimizer_per_param_s``) and the dp sync's "after" line
(``dp_sync.dp_sync_line``), and its objective stays ``estimate``'s step time.

What a Megatron-core step does once (NVIDIA/Megatron-LM d98e8a64 unless said otherwise):

* **the gradient buffer is zeroed** at the start of every step: ``train_step`` calls each model
  chunk's ``DistributedDataParallel.zero_grad_buffer`` (megatron/core/distributed/
  distributed_data_parallel.py), which runs ``_ParamAndGradBuffer.reset`` -> ``grad_data.zero_()``
  over the contiguous buffer of EVERY parameter the GPU holds (param_and_grad_buffer.py), not the
  optimizer's shard: ``grad_reduce_bytes`` (4 in fp32, 2 with bf16 gradient reduce) written per
  parameter at HBM bandwidth. The optimizer step's own 40 bytes count a 2-byte gradient zeroing
  of the shard (optimizer.py: autopar's runtime and torch's ``zero_grad``); Megatron's
  DistributedOptimizer sets its fp32 main grads to None instead, so that shard's 2 bytes are
  taken off here (runtime figure ``[kernels] grad_buffer_zero_passes``, 0 elsewhere);
* **FP8 primary weights** (the Transformer Engine stack keeping FP8 weights, NeMo
  ``fp8_params``; ``precision.STACKS[...].fp8_weights``): after the update the distributed
  optimizer casts its fp32 master shard into the FP8 weights through TE's
  ``cast_master_weights_to_fp8`` (NVIDIA/TransformerEngine 002a3e57
  transformer_engine/pytorch/tensor/utils.py, ``_cast_master_weights_to_fp8_delayed_scaling``:
  ``master_weight.to(model_weight.dtype)`` -- read 4, write 2 -- then ``update_quantized`` --
  read 2, write 1): 9 bytes per linear weight of the shard at element-wise bandwidth. On a GPU
  whose FP8 GEMM takes only the TN layout (Hopper: TE's ``is_non_tn_fp8_gemm_supported`` is false
  below sm_100), the transposed FP8 copy the backward's GEMMs read is stale after the update and
  re-made once per step: read 1 + write 1 per linear weight the GPU holds. A GPU profile with an
  MXFP8 peak is a Blackwell part (sm_100), which reads FP8 in any layout. MXFP8 weights are not
  FP8 primary weights in TE (``cast_master_weights_to_fp8`` raises for MXFP8): the BF16 weight is
  quantized in both block directions on the first micro-batch of the step and cached
  (``is_first_microbatch``): read 2 + write 1 + write 1 per linear weight held. The per-micro-
  batch casts ``precision.fp8_row_times`` charges are the activations' (the weights' term there is
  0 for a stack that keeps them across the micro-batches);
* **the first parameter all-gather is exposed** with ``overlap_param_gather``: the forward
  pre-hook of the step's first module finds its bucket's all-gather not dispatched, dispatches it
  and waits (param_and_grad_buffer.py ``finish_param_sync``: "first AG bucket in first model chunk
  if ddp_config.align_param_gather is False"; with ``align_param_gather`` the interleaved
  schedule dispatches chunk 0's gathers at the step's start, schedules.py, and the first forward
  still waits for its first bucket): one all-gather of one bucket over dp, every later bucket
  hidden behind the forward (runtime figure ``[overlap] param_gather_exposed_buckets``).

Looked for and NOT priced (each well under a millisecond a step on the open rows, or no figure):
the grad-norm (``clip_grads.get_grad_norm_fp32``: ``multi_tensor_l2norm`` over the shard, which
the optimizer's 40 bytes count, and one all-reduce of a scalar over the model-parallel group),
the sequence-parallel norm-gradient all-reduce (``finalize_model_grads._allreduce_layernorm_grads``,
kilobytes per layer), the loss / num-tokens all-reduce (one scalar per micro-batch), and the host
time the grad-norm's ``.item()`` leaves exposed before the optimizer's kernels are issued
(megatron/core/optimizer/clip_grads.py ``get_grad_norm_fp32``: ``total_norm.item()``, a host-device
sync inside every step), for which no measured figure exists here. What the published step is:
NeMo's ``train_step_timing`` is host wall time from Lightning's ``on_train_batch_start`` to
``on_train_batch_end`` with no CUDA sync of its own (NVIDIA/NeMo 00780235 nemo/utils/exp_manager.py
``StepTimingParams(sync_cuda=False)``, ``TimingCallback``): it spans the data fetch inside the
schedule, the forward-backward, the optimizer step and the logging call, and measures the GPU's
step because that ``.item()`` keeps the host within one step of the GPU.
"""
from __future__ import annotations

from costmodels.model.comm import collective_time
from costmodels.model.precision import LOW_PRECISIONS, STACKS, linear_dims, stack_key

OPTIMIZER_GRAD_ZERO_BYTES = 2.0   # the shard's gradient zeroing inside optimizer.OPTIMIZER_BYTES_PER_PARAM
FP8_MASTER_CAST_BYTES = 9.0       # fp32 master -> bf16 (4 + 2) -> FP8 (2 + 1), per shard weight
FP8_TRANSPOSE_BYTES = 2.0         # the transposed FP8 copy: read 1 + write 1, per held weight
MXFP8_WEIGHT_CAST_BYTES = 4.0     # bf16 read 2, rowwise + columnwise MXFP8 writes 1 + 1


def grad_buffer_zero_per_param_s(runtime, profile, grad_bytes: float, shards: int) -> float:
    """Seconds per held parameter of zeroing the contiguous gradient buffer once a step (module
    docstring), less the shard's 2 bytes the optimizer step already counts."""
    passes = float(getattr(runtime, "grad_buffer_zero_passes", 0.0))
    if passes <= 0.0:
        return 0.0
    return max(0.0, passes * grad_bytes - OPTIMIZER_GRAD_ZERO_BYTES / shards) / profile.hbm_bandwidth_bytes_per_s


def non_tn_fp8_gemm(profile) -> bool:
    """Whether the GPU's FP8 GEMM reads any operand layout (Blackwell, sm_100: TE's
    ``is_non_tn_fp8_gemm_supported``); a profile with an MXFP8 peak is such a part."""
    return "mxfp8" in profile.peak_flops


def fp8_weight_step_per_param_s(arr, plan, runtime, profile, shards: int) -> float:
    """Seconds per held parameter of the once-per-step FP8 weight work (module docstring), over
    the linear weights' share of the model's parameters (the search keeps one figure per
    parameter; the embedding and head, which stay BF16, are spread over the stages with it)."""
    p = getattr(plan, "precision", "bf16")
    if p not in LOW_PRECISIONS:
        return 0.0
    stack = STACKS.get(stack_key(runtime))
    if stack is None or stack.weight_cast_per_micro_batch:   # casts per micro-batch: fp8_row_times
        return 0.0
    total = float(arr.params.sum())
    if total <= 0.0:
        return 0.0
    share = float(linear_dims(arr).weights.sum()) / total
    if p == "mxfp8":
        per_weight = MXFP8_WEIGHT_CAST_BYTES
    elif stack.fp8_weights:
        per_weight = FP8_MASTER_CAST_BYTES / shards + (0.0 if non_tn_fp8_gemm(profile) else FP8_TRANSPOSE_BYTES)
    else:
        return 0.0
    return share * per_weight / profile.elementwise_bw


def step_tail_per_param_s(arr, plan, runtime, profile, grad_bytes: float, shards: int) -> float:
    """The per-held-parameter seconds of this module's work, ``profile`` the runtime's kernel
    stack profile (as the optimizer step reads it): what ``estimate`` adds to the optimizer step
    and ``coefficients`` to ``optimizer_per_param_s``."""
    if not getattr(runtime, "grad_buffer_zero_passes", 0.0):   # not a Megatron-core step
        return 0.0
    return (grad_buffer_zero_per_param_s(runtime, profile, grad_bytes, shards)
            + fp8_weight_step_per_param_s(arr, plan, runtime, profile, shards))


def bucket_params(dp: int) -> float:
    """Parameters in one Megatron-core DDP bucket: ``max(40,000,000, 1,000,000 * dp)``
    (DistributedDataParallelConfig.bucket_size docstring; megatron/training/arguments.py default),
    whatever the gradient dtype."""
    return max(4.0e7, 1.0e6 * dp)


def first_param_gather(plan, runtime, link, param_bytes: float) -> tuple[float, float]:
    """(bytes per GPU, seconds) of the exposed first bucket's parameter all-gather a step (module
    docstring): the runtime's ``param_gather_exposed_buckets`` buckets of ``bucket_params(dp)``
    parameters, ``param_bytes`` each, gathered over dp on ``link``; (0, 0) without the
    distributed optimizer's overlapped gather."""
    n = float(getattr(runtime, "param_gather_exposed_buckets", 0.0))
    if n <= 0.0 or plan.dp <= 1 or plan.zero != 1 or (runtime.param_gather_overlap or 0.0) <= 0.0:
        return 0.0, 0.0
    b, s = collective_time("all_gather", param_bytes * bucket_params(plan.dp), plan.dp, link, line=True)
    return n * float(b), n * float(s)
