"""The optimizer step and autocast's casts: per-step work on the parameters, not on the rows.

Memory-bound element-wise passes over the parameters this GPU updates (ZeRO divides them over
dp); kept apart from the row-time model in ``compute``.
"""
from __future__ import annotations

from costmodels.profiles.hardware import HardwareProfile

OPTIMIZER_BYTES_PER_PARAM = 40.0


def optimizer_shards(dp: int, zero: int) -> int:
    """Into how many parts the Adam step of a model-parallel shard is split: ZeRO ≥ 1 gives each
    of the ``dp`` replicas the optimizer state, and so the update, of 1/dp of the parameters."""
    return dp if zero >= 1 else 1


def optimizer_step_s(params_per_gpu: float, profile: HardwareProfile) -> float:
    """Mixed-precision Adam step, memory-bound (Megatron-LM's optimizer): gradient-norm pass
    (read the grad, 4 B), Adam (read fp32 master, m, v, grad: 16 B; write master, m, v: 12 B),
    copy master to the bf16 weight (read 4, write 2), zero the grad (2): OPTIMIZER_BYTES_PER_PARAM
    = 40 bytes per parameter this GPU updates, at HBM bandwidth — or at the profile's measured
    ``optimizer_bandwidth_bytes_per_s`` (``autopar profile`` times torch.optim.AdamW itself and
    counts the same 40 bytes per parameter, so per-tensor overheads are folded in)."""
    return OPTIMIZER_BYTES_PER_PARAM * params_per_gpu / profile.optimizer_bw


def autocast_step_s(params_per_gpu: float, micro_batches: int, precision: str,
                    profile: HardwareProfile) -> float:
    """The casts ``torch.autocast`` adds to a step of autopar's runtime (``precision="amp"``:
    fp32 parameters, bf16 matmuls), element-wise traffic at the profile's element-wise bandwidth:
    each weight cast to bf16 once per step (autocast caches it: read 4 + write 2 bytes), each
    micro-batch's bf16 weight gradient cast back to fp32 (read 2 + write 4) and, from the second
    micro-batch on, added into ``.grad`` (read 4 + 4, write 4). Megatron's bf16-mixed recipe keeps
    bf16 weights and accumulates into fp32 main grads inside the weight-gradient GEMM: 0."""
    if precision != "amp":
        return 0.0
    m = max(1, int(micro_batches))
    return params_per_gpu * (6.0 + 6.0 * m + 12.0 * (m - 1)) / profile.elementwise_bw
