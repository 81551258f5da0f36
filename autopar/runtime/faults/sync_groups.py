"""The gradient-sync groups of a plan with context parallelism and HSDP.

Context parallel ranks (``cp``) hold the same weights and different chunks of the same samples,
so their gradients are averaged exactly as the dp ones are: the *sync group* of a rank is every
rank that differs from it only along dp and cp (``dp·cp`` ranks). ZeRO shards over that group too
— torchtitan's ``dp_shard·cp`` flattened mesh dimension, Megatron's distributed optimizer over
``dp·cp`` — so a cp plan holds no more optimizer state per rank than the dp plan of the same
world.

HSDP (``plan.dp_shard``): the dp coordinate ``d`` splits into a replica index ``d // dp_shard``
(outer) and a shard index ``d % dp_shard`` (inner). The *shard group* is the ranks of one replica
along (shard index, cp): ``dp_shard·cp`` ranks; the *replicate group* the ``dp / dp_shard`` ranks
with the same shard index and cp coordinate. FSDP2 gets the 2-D mesh (replicate, shard)
(``sync_mesh``): reduce-scatter inside the shard group, all-reduce across replicas.

Everything here is a pure function of the plan and the rank list, so every rank creates the
same groups in the same order (``dist.create_groups`` calls ``dist.sync_rank_sets``).
"""
from __future__ import annotations

import torch

from autopar.runtime.faults import dist as adist
from autopar.runtime.faults.dist import coord_to_sync as _coord_to_sync

_MESHES: dict[tuple, object] = {}


def sync_peers(layout) -> list[int]:
    """The ranks this rank's gradients are averaged over (dp·cp), dp slowest."""
    return layout.peers_along(("dp", "cp"))


def sync_size(plan) -> int:
    return plan.dp * plan.cp


def sync_group(layout):
    return adist.group(sync_peers(layout))


def shard_peers(layout, plan) -> list[int]:
    """The ranks of this rank's ZeRO shard group in shard-index order (HSDP: its replica's
    ``dp_shard·cp`` ranks; else the whole dp·cp sync group)."""
    if not plan.dp_shard:
        return sync_peers(layout)
    rep, _ = _coord_to_sync(plan, layout.coord)
    base = rep * plan.shard_size
    return [layout.rank_at(dp=base + s, cp=c) for s in range(plan.shard_size) for c in range(plan.cp)]


def replicate_peers(layout, plan) -> list[int]:
    """The ranks holding the same shard as this one in the other HSDP replicas."""
    _, s_idx = _coord_to_sync(plan, layout.coord)
    s, c = divmod(s_idx, plan.cp)
    return [layout.rank_at(dp=r * plan.shard_size + s, cp=c) for r in range(plan.replicas)]


def sync_mesh(layout, plan, device_type: str):
    """The DeviceMesh FSDP2 shards over: 1-D over the dp·cp sync group, or (HSDP) 2-D
    (replicate, shard) — FSDP2's HSDP form."""
    from torch.distributed.device_mesh import DeviceMesh
    if not plan.dp_shard:
        peers = sync_peers(layout)
        key = (tuple(peers), device_type)
        if key not in _MESHES:
            _MESHES[key] = DeviceMesh.from_group(adist.group(peers), device_type,
                                                 mesh_dim_names=("dp_cp",))
        return _MESHES[key]
    rows = []
    for r in range(plan.replicas):
        rows.append([layout.rank_at(dp=r * plan.shard_size + s, cp=c)
                     for s in range(plan.shard_size) for c in range(plan.cp)])
    key = (tuple(map(tuple, rows)), device_type)
    if key not in _MESHES:
        mesh = torch.tensor(rows, dtype=torch.int)
        groups = [adist.group(replicate_peers(layout, plan)), adist.group(shard_peers(layout, plan))]
        _MESHES[key] = DeviceMesh.from_group(groups, device_type, mesh=mesh,
                                             mesh_dim_names=("replicate", "shard"))
    return _MESHES[key]
