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


TORCH_RING, ALL_GATHER, SHAPE_PROBE = "torch-ring", "all-gather", "shape-probe"


def _torch_cp():
    """torch's context-parallel attention module, or None where this torch lacks it."""
    try:
        from torch.distributed.tensor.experimental import _attention
    except ImportError:
        return None
    needed = ("_enable_context_parallel_dispatcher", "_cp_options")
    return _attention if all(hasattr(_attention, n) for n in needed) else None


def choose_kernel(*, real_group: bool, device_type: str, backend: str | None, sdpa: bool,
                  api: bool, switch: str | None) -> str:
    """Which attention ``ContextParallelAttention`` runs, from plain facts (no tensor, no group,
    so it is unit-tested on CPU): ``SHAPE_PROBE`` for the rewrite's probe (a FakeGroup, or meta
    tensors: only the gathered shape), ``TORCH_RING`` — torch's own — where the model called SDPA
    and q is on CUDA over an NCCL group with the API present and ``AUTOPAR_CP_TORCH_RING``
    (``switch``) not "0", else ``ALL_GATHER`` (``cp_attention``: gloo, CPU, a written-out core).
    ``cp = 1`` never reaches here from the Runner: it rewrites rows only for ``plan.cp > 1``
    (``assemble.stages``), so one GPU runs the model's own attention."""
    if not real_group or device_type == "meta":
        return SHAPE_PROBE
    if sdpa and device_type == "cuda" and backend == "nccl" and api and switch != "0":
        return TORCH_RING
    return ALL_GATHER


def kernel_for(q: torch.Tensor, group, sdpa: bool) -> str:
    """``choose_kernel`` for the query tensor ``q`` and the cp ``group`` of a forward."""
    real = isinstance(group, dist.ProcessGroup)
    return choose_kernel(real_group=real, device_type=q.device.type,
                         backend=dist.get_backend(group) if real else None, sdpa=sdpa,
                         api=_torch_cp() is not None, switch=os.environ.get("AUTOPAR_CP_TORCH_RING"))


def torch_ring_usable(q: torch.Tensor, group) -> bool:
    """Whether the cp attention of an SDPA call on ``q`` runs as torch's (``choose_kernel``)."""
    return kernel_for(q, group, sdpa=True) == TORCH_RING


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
