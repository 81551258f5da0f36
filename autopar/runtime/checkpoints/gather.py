"""The serial model's state dict, gathered from a parallel run (``Runner.full_state_dict``).

Kept apart from the Runner because undoing the parallelism is its own job: FSDP2 shards are
gathered with ``full_tensor``, tensor-parallel shards all-gathered over tp (a fused tensor's
segments each on its own), and every pipeline rank's part sent to the plan's first rank under
the serial model's keys.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from autopar.runtime.assemble.stages import LocalStages, tensors
from autopar.runtime.faults import dist as adist
from autopar.runtime.step.experts import gather_expert
from costmodels.contracts.plan import Plan


def full_state_dict(local: LocalStages, keys: list[str], layout: adist.Layout,
                    plan: Plan) -> dict[str, torch.Tensor] | None:
    """The serial model's state dict (its ``keys``, in order) on the plan's first rank; None on
    the others. Every rank of the plan must call it."""
    part: dict[str, torch.Tensor] = {}
    tp_group = layout.group("tp") if plan.tp > 1 else None
    for s, stage in enumerate(local.modules):
        for n, t in tensors(stage):
            serial_keys = local.names[s].get(n)
            if not serial_keys:
                continue
            t = t.detach()
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            t = gather_expert(stage, n, t)   # expert shards of an ep plan, whole
            if n in local.shards[s]:
                t = _tp_full(t, local.shards[s][n], tp_group, plan.tp)
            for k in serial_keys:
                part[k] = t.cpu().clone()
    if layout.dp_rank or layout.tp_rank or layout.cp_rank:  # a replica: dp/cp/tp rank 0 of its pipeline rank sends
        part = {}
    dst = layout.ranks[0]
    gathered = [None] * len(layout.ranks) if layout.rank == dst else None
    if len(layout.ranks) == 1:
        gathered = [part]
    else:
        dist.gather_object(part, gathered, dst=dst, group=adist.group(layout.ranks))
    if layout.rank != dst:
        return None
    merged = {}
    for d in gathered:
        merged.update(d)
    return {k: merged[k] for k in keys if k in merged}


def _tp_full(t: torch.Tensor, shard, group, tp: int) -> torch.Tensor:
    """The full tensor from each tp rank's shard (``shard``: the rewrite's ShardSpec; a fused
    tensor's segments are sharded each on its own)."""
    parts = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(parts, t.contiguous(), group=group)
    dim, segments = shard.dim, getattr(shard, "segments", None)
    if not segments or len(segments) < 2:
        return torch.cat(parts, dim)
    local = [seg // tp for seg in segments]
    split = [p.split(local, dim) for p in parts]
    return torch.cat([torch.cat([sp[k] for sp in split], dim) for k in range(len(local))], dim)
