"""torchrun launch lines shared by the targets: how many nodes, how many ranks on each."""
from __future__ import annotations

RENDEZVOUS = '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$JOB_ID"'


def nodes_for(world_size: int, gpus_per_node: int) -> tuple[int, int]:
    """(nnodes, nproc-per-node): whole nodes of ``gpus_per_node`` when they divide the world,
    else the largest per-node count that does (torchrun starts the same count on every node)."""
    per_node = max(1, min(world_size, gpus_per_node))
    while world_size % per_node:
        per_node -= 1
    return world_size // per_node, per_node


def launch_line(nnodes: int, nproc: int, command: str) -> str:
    """The torchrun line every node runs (rendezvous values left as shell variables)."""
    return f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} {RENDEZVOUS} \\\n    {command}"
