"""torchrun launch lines shared by the targets: how many nodes, how many ranks on each."""
from __future__ import annotations

from costmodels.contracts.plan_pools import gpu_of_rank, pool_usage, pools_label, short_name

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


def pool_nodes(plan, nproc: int) -> list[tuple[int, int, int]] | None:
    """A pooled plan's torchrun node ranks as runs ``(first, last, pool)``: node rank ``k`` starts
    torch ranks ``k·nproc …``, whose GPUs ``costmodels.contracts.plan_pools.gpu_of_rank`` puts in one pool
    (a node is one GPU type). None where a node would hold ranks of two pools (a stage's tp·dp
    group smaller than a node, next to a stage on another pool): no launch can place that."""
    runs: list[list[int]] = []
    for k in range(plan.world_size // nproc):
        pools = {gpu_of_rank(plan, r)[0] for r in range(k * nproc, (k + 1) * nproc)}
        if len(pools) != 1:
            return None
        q = pools.pop()
        if runs and runs[-1][2] == q:
            runs[-1][1] = k
        else:
            runs.append([k, k, q])
    return [(a, b, q) for a, b, q in runs]


def pool_lines(plan, nproc: int, prefix: str = "# ") -> list[str]:
    """Comment lines telling which nodes start which node ranks (empty for a uniform plan): the
    launcher must give node ranks in the pools' order for each stage to run where it was priced."""
    if plan.pools is None:
        return []
    runs = pool_nodes(plan, nproc) or []
    out = [f"{prefix}heterogeneous plan ({pools_label(plan)}): start each torchrun node rank on a node of "
           "its pool (--node-rank), or the stages run on GPUs they were not priced for:"]
    for a, b, q in runs:
        ranks = f"node rank {a}" if a == b else f"node ranks {a}-{b}"
        out.append(f"{prefix}  {ranks}: {short_name(plan.pools[q][0])} nodes")
    idle = [f"{u['idle']} GPUs of {short_name(u['profile'])}" for u in pool_usage(plan) if u["idle"]]
    if idle:
        out.append(f"{prefix}  idle, not launched: {', '.join(idle)}")
    return out
