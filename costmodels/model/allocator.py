"""Memory as the allocator and the optimizer hold it: two runtime-profile figures.

* ``[memory] fragmentation``: bytes PyTorch's caching allocator keeps reserved but unallocated,
  per byte of saved activations (the memory that churns every micro-batch; weights, gradients and
  optimizer state are allocated once). The hardware profile's ``memory_reserve_bytes`` (CUDA
  context, NCCL buffers) holds what does not scale with the activations; a runtime whose
  allocator fragments more says so here. autopar's runtime sets ``expandable_segments:True``
  (``autopar/runtime/step/gpu_defaults.py``): its figure is the one measured with it, and the
  ``autopar:default_allocator`` option the one measured without.
* ``[memory] optimizer_state_bytes``: the optimizer's bytes per parameter before ZeRO sharding,
  where the runtime's differ from the recipe's (``memory.STATE_BYTES``: fp32 master weights and
  Adam's two moments, 12 for "bf16-mixed"). NeMo's distributed Adam keeps only the 16-bit
  remainders of the fp32 master weights (``store_param_remainders``): 2 + 4 + 4 = 10.

Both enter ``coefficients.row_coefficients`` (``act_bytes``, ``state_bytes``: what the search's
memory bound reads) and ``estimate``'s per-rank breakdown (``as_allocated``), so the search's
memory is ``estimate``'s.
"""
from __future__ import annotations

from costmodels.model.memory import STATE_BYTES


def fragmentation(runtime) -> float:
    """Reserved-but-unallocated bytes per saved activation byte (0: the hardware reserve covers it)."""
    return float(getattr(runtime, "fragmentation", 0.0) or 0.0)


def optimizer_share(runtime, precision: str) -> float:
    """The runtime's optimizer bytes per parameter over the recipe's (1: the recipe's)."""
    own = getattr(runtime, "optimizer_state_bytes", None)
    base = STATE_BYTES[precision][2]
    return 1.0 if own is None or not base else float(own) / base


def as_allocated(mem: dict[str, float], runtime, precision: str) -> dict[str, float]:
    """``memory.stage_memory``'s breakdown with the runtime's optimizer bytes (activations already
    carry the fragmentation: ``row_coefficients.act_bytes``)."""
    share = optimizer_share(runtime, precision)
    if share == 1.0:
        return mem
    out = dict(mem)
    out["optimizer"] = mem["optimizer"] * share
    out["total"] = mem["total"] + out["optimizer"] - mem["optimizer"]
    return out
