"""ZeRO's HBM traffic: what FSDP-style sharding costs the GPU's memory per micro-batch, beside
the link time ``comm`` prices.

A ZeRO-2/3 collective that runs hidden behind compute still moves its bytes through the GPU's
HBM, and so do the copies the runtime makes around it; the matmuls and element-wise kernels of
the same micro-batch share that bandwidth. Per parameter on the GPU (``params / tp``) and per
micro-batch, with ``w`` the weight bytes (``memory.STATE_BYTES``), ``g`` the gradient-reduce
bytes (``coefficients.grad_bytes``) and ``f = (dp − 1) / dp``::

    forward   (a gather before it)      (2·f + c_g) · w
    backward  (a gather before it)      (2·f + c_g) · w
              (a reduce-scatter in it)  (3·f + c_r) · g

added, divided by the HBM bandwidth, to the forward and backward time of each row
(``compute.row_times``: the row's compute and this traffic are serialised on HBM, a 1:1 share,
no fitted factor). The other cost of a hidden collective, the SMs its kernels hold, stays the
GPU's fitted ``collective_slowdown`` (``coefficients``).

* ``NCCL_HBM_PASSES`` — bytes a ring collective moves through each GPU's HBM per byte of its
  result: an all-gather reads the chunk it forwards and writes the one it receives (2 · f); a
  reduce-scatter reads its own input and the partial sum it receives and writes the sum it
  forwards (3 · f). The least any ring or tree moves; NCCL's FIFO staging buffers add more.
* ``c_g``, ``c_r`` — the runtime's copies around them (``[kernels] gather_copy_passes`` and
  ``reduce_copy_passes``, in passes over ``w`` and ``g``): FSDP2 copies every gathered weight
  out of the all-gather buffer (``split_with_sizes_copy``: read + write, ``c_g = 2``) and
  the gradients into the reduce-scatter input (``_chunk_cat``: ``c_r = 2``); FSDP1 gathers into
  the flat parameter itself (``c_g = 0``) and joins the views' gradients into the flat gradient
  (autograd's split backward, 2) then pre-divides it in place (2): ``c_r = 4``.

On a CPU profile this is 0: gloo's copies are inside the in-step collective times
``autopar profile`` measures. Fitted nothing; derived from the collectives' and runtimes' code
(docs/validation.md says what it moved on the open runs).
"""
from __future__ import annotations

NCCL_HBM_PASSES = {"all_gather_into_tensor": 2.0, "reduce_scatter_tensor": 3.0}


def zero_param_s(collectives: frozenset[str], dp: int, weight_bytes: float, grad_bytes: float,
                 gather_copy_passes: float, reduce_copy_passes: float,
                 hbm_bytes_per_s: float) -> tuple[float, float]:
    """Seconds per parameter on the GPU, (forward, backward), per micro-batch (module
    docstring); ``collectives`` as ``coefficients.zero_row_collectives`` names them."""
    if not collectives or dp <= 1 or hbm_bytes_per_s <= 0:
        return 0.0, 0.0
    f = (dp - 1) / dp
    gather = (NCCL_HBM_PASSES["all_gather_into_tensor"] * f + gather_copy_passes) * weight_bytes
    reduce = (NCCL_HBM_PASSES["reduce_scatter_tensor"] * f + reduce_copy_passes) * grad_bytes
    fwd = gather * ("fwd" in collectives)
    bwd = gather * ("bwd" in collectives) + reduce * ("reduce" in collectives)
    return fwd / hbm_bytes_per_s, bwd / hbm_bytes_per_s


def grad_accumulate_s(bytes_per_param: float, precision: str, elementwise_bytes_per_s: float) -> float:
    """Seconds per parameter on the GPU and micro-batch (backward) that a runtime keeping fp32
    parameters under ``torch.autocast`` spends on its weight gradients when it is priced in the
    bf16-mixed recipe (the search's): each bf16 weight gradient cast to fp32 and added into
    ``.grad`` — the runtime profile's ``[kernels] grad_accumulate_bytes_per_param`` (autopar's:
    read 2 + write 4, then read 4 + 4 + write 4, 18 bytes), at the element-wise bandwidth. In the
    "amp" recipe ``optimizer.autocast_step_s`` prices the same bytes per step, so this is 0
    there (and in "fp32", which has no cast); 0 for runtimes without the figure (Megatron
    accumulates into fp32 main grads inside the weight-gradient GEMM)."""
    if precision != "bf16-mixed" or bytes_per_param <= 0 or elementwise_bytes_per_s <= 0:
        return 0.0
    return bytes_per_param / elementwise_bytes_per_s
