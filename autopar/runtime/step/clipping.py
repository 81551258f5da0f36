"""Gradient clipping by the serial model's global norm, under any plan (``Runner.clip_grad_norm_``).

``torch.nn.utils.clip_grad_norm_(runner.parameters())`` is wrong under a plan: each rank would
clip by the norm of the gradients it happens to hold — a tensor-parallel shard, one pipeline
stage, ZeRO-1's owned share, an FSDP2 shard — so the ranks scale by different factors and the
run drifts from serial training. The serial norm is a sum of squares over every parameter of the
serial model exactly once, so each rank adds what only it holds:

* tensor-parallel shards (the rewrite's ``ShardSpec`` with a dim): every tp rank its shard;
  parameters the rewrite leaves whole (same gradient on every tp rank): tp rank 0 only;
* pipeline stages: every pipeline rank its stages; a parameter tied across pipeline ranks (an
  embedding and LM head, its gradients already all-reduced between them): the lowest of them;
* dp: gradients DDP has all-reduced (ZeRO 0 / 1): dp rank 0 only; FSDP2's sharded gradients
  (ZeRO 2 / 3, DTensors): every dp rank its shard; expert shards under ep (``autopar_ep`` on the
  parameter, ``autopar.runtime.step.experts``): the ranks of the stage's first ep group, each its
  slice (``autopar_in_norm``; the group may span tp ranks: ``autopar.runtime.step.expert_mesh``).

One all-reduce over the plan's ranks sums them; every rank then scales *all* its local
gradients by ``max_norm / (norm + 1e-6)`` when that is below 1, as torch's own
``clip_grad_norm_`` does on the serial model.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from autopar.runtime.faults import dist as adist
from costmodels.contracts.errors import PlanError


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def local_square_sum(stages, names, shards, tied, layout, norm_type: float) -> torch.Tensor:
    """This rank's share of Σ |g|^p over the serial model's parameters (see the module docstring)."""
    tied_lowest = {(s, n): min(dist.get_process_group_ranks(g)) == layout.rank for s, n, g in tied}
    total = torch.zeros((), dtype=torch.float64, device=adist.device_for_backend())   # no host sync
    seen: set[int] = set()
    for s, stage in enumerate(stages):
        for n, p in stage.named_parameters(remove_duplicate=False):
            if id(p) in seen or p.grad is None or not names[s].get(n):
                continue
            seen.add(id(p))
            sharded_dp = hasattr(p.grad, "to_local")
            ep = getattr(p, "autopar_ep", 0)   # an expert shard: the first ep group holds each once
            if ep and not p.autopar_in_norm:     # (step/expert_mesh.py: its ranks may differ in tp)
                continue
            if not ep and not sharded_dp and (layout.dp_rank != 0 or layout.cp_rank != 0):
                continue
            if not ep and n not in shards[s] and layout.tp_rank != 0:
                continue
            if not tied_lowest.get((s, n), True):
                continue
            g = _local(p.grad).detach().double()
            total += (g.abs().pow(norm_type).sum() if norm_type != 2.0 else g.pow(2).sum()).to(total.device)
    return total


def clip_grad_norm_(stages, names, shards, tied, layout, max_norm: float,
                    norm_type: float = 2.0) -> torch.Tensor:
    """Clip every local gradient by the serial model's global ``norm_type`` norm; returns that
    norm (a float64 tensor, the same on every rank). Every rank of the plan must call it, after
    ``train_step`` and before the optimizer's ``step``."""
    if norm_type == float("inf"):
        raise PlanError("clip_grad_norm_(norm_type=inf) is not supported; use norm_type=2.0")
    if not max_norm > 0:
        raise PlanError(f"clip_grad_norm_(max_norm={max_norm}): max_norm must be positive")
    total = local_square_sum(stages, names, shards, tied, layout, float(norm_type))
    if len(layout.ranks) > 1:
        dist.all_reduce(total, group=adist.group(layout.ranks))
    norm = total ** (1.0 / norm_type)
    # the factor stays on the device, clamped at 1 (torch's clip_grad_norm_: no host sync)
    coef = (float(max_norm) / (norm + 1e-6)).clamp(max=1.0)
    seen: set[int] = set()
    for stage in stages:
        for p in stage.parameters():
            if id(p) not in seen and p.grad is not None:
                seen.add(id(p))
                g = _local(p.grad).detach()
                g.mul_(coef.to(device=g.device, dtype=g.dtype))
    return norm
