"""torch's context-parallel attention as the CUDA path of ``ContextParallelAttention``.

On CUDA over NCCL, where the model's attention is ``F.scaled_dot_product_attention`` (so its
flash / memory-efficient kernels exist), the cp attention is torch's own
(``torch.distributed.tensor.experimental._attention``), wired the way torchtitan wires it
(``torchtitan/distributed/context_parallel.py``, module-wrapper mode): the DTensor dispatcher's
context-parallel handlers are enabled once per process, q, k and v become DTensors sharded on the
sequence (dim 2) over a 1-D mesh of the cp group, and SDPA on them runs
``_templated_ring_attention`` forward and backward (its default rotation, all-gather of K/V,
is what the ``autopar`` runtime profile prices). Its head-tail load balancing is the order our
rows already hold (rank ``i``: chunks ``i`` and ``2·cp − 1 − i``), so nothing is re-sliced.

Never run in this project's CI: there is no GPU, and torch's handlers cover only the CUDA
kernels (``aten._scaled_dot_product_flash_attention_for_cpu`` has no sharding strategy in torch
2.13), so on CPU / gloo — where ``autopar verify`` proves cp equal to serial — the all-gather op
of ``cp_attention`` runs. ``AUTOPAR_CP_TORCH_RING=0`` keeps that op on CUDA too (to compare the two
on a GPU with ``autopar verify``); a torch without the API falls back to it as well.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

_MESHES: dict = {}
_ENABLED = False


def _torch_cp():
    """torch's context-parallel attention module, or None where this torch lacks it."""
    try:
        from torch.distributed.tensor.experimental import _attention
    except ImportError:
        return None
    needed = ("_enable_context_parallel_dispatcher", "_cp_options")
    return _attention if all(hasattr(_attention, n) for n in needed) else None


def torch_ring_usable(q: torch.Tensor, group) -> bool:
    """Whether the cp attention of ``q`` runs as torch's (module docstring): CUDA, NCCL, the
    API present, not switched off by ``AUTOPAR_CP_TORCH_RING=0``."""
    return (q.is_cuda and isinstance(group, dist.ProcessGroup)
            and os.environ.get("AUTOPAR_CP_TORCH_RING", "1") != "0"
            and dist.get_backend(group) == "nccl" and _torch_cp() is not None)


def torch_ring_attention(q, k, v, group, causal: bool, scale: float | None) -> torch.Tensor:
    """SDPA of the local queries against every key of the sequence by torch's ring kernels;
    q, k, v: (B, H, T_local, D), same H (grouped-query heads repeated), load-balanced order."""
    global _ENABLED
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    cp = _torch_cp()
    if not _ENABLED:   # once per process, as torchtitan does (it never turns it off either)
        cp._enable_context_parallel_dispatcher()
        _ENABLED = True
    cp._cp_options.enable_load_balance = causal   # head-tail order: what our rows hold
    key = id(group)
    if key not in _MESHES:
        _MESHES[key] = DeviceMesh.from_group(group, "cuda")
    mesh = _MESHES[key]
    dq, dk, dv = (DTensor.from_local(t.contiguous(), mesh, [Shard(2)], run_check=False)
                  for t in (q, k, v))
    out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=causal, scale=scale)
    return out.to_local()
