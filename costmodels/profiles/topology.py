"""Topology: which link tier a parallel group crosses, and the two-tier ring's α and β.

Owned by the profiles (a hardware profile answers "which link does this group use"); the
communication model (``costmodels.model.comm``) prices collectives on the tier this returns.
Placement convention and formulas: ``costmodels.model.comm``'s docstring.
"""
from __future__ import annotations

from costmodels.contracts.errors import PlanError

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")
# torch's flat-tensor collectives, as FSDP2 (ZeRO-2/3) issues them; the same algorithm as their
# base kind (bytes, steps), but a profile may measure them apart: gloo runs its native
# reduce_scatter_tensor several times slower per byte than the all-reduce + chunk autopar's TP
# rewrite uses. Without their own fit they take the base kind's.
TENSOR_KINDS = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}
MEASURED_KINDS = COLLECTIVES + tuple(TENSOR_KINDS)


def group_tier(placement: str, sizes: dict[str, int], dim: str, gpus_per_node: int) -> str:
    """'intra_node' or 'inter_node' for the group of parallel dimension ``dim`` ('tp', 'dp',
    'pp') under ``placement`` (innermost first, e.g. 'tp,dp,pp') and degrees ``sizes``."""
    order = placement.split(",")
    if dim not in order:
        raise PlanError(f"placement '{placement}' does not name '{dim}'")
    stride = 1
    for d in order:
        if d == dim:
            break
        stride *= sizes[d]
    return "intra_node" if stride * sizes[dim] <= gpus_per_node else "inter_node"


def group_span(placement: str, sizes: dict[str, int], dim: str, gpus_per_node: int) -> tuple[int, int]:
    """(ranks of the ``dim`` group on one node, nodes the group spans) under ``placement``: a
    dimension of stride ``s`` (the product of the sizes inside it) puts ``gpus_per_node / s`` of
    its ranks on each node while ``s`` is below a node, one per node above."""
    stride = 1
    for d in placement.split(","):
        if d == dim:
            break
        stride *= sizes[d]
    n = sizes[dim]
    per_node = max(1, min(n, gpus_per_node // stride)) if stride < gpus_per_node else 1
    return per_node, max(1, -(-n // per_node))


def two_level(n: int, per_node: int, intra, inter, contention: int) -> tuple[float, float]:
    """(α per ring step, bus bandwidth) of a collective over ``n`` ranks, ``per_node`` of them on
    each node, as NCCL runs it across the two tiers (nccl-tests PERFORMANCE.md; the ring's
    chunks travel every hop, so)::

        latency of a pass = nodes·α_inter + (n − nodes)·α_intra   (spread over the n − 1 steps)
        bandwidth         = min(β_intra, per_node·β_inter / contention)

    The slowest link bounds the whole: inside a node NVLink, between nodes the group's share of
    the node's NICs (each of the node's ``per_node`` ranks drives its own NIC, one rail each, so
    a group with all 8 GPUs of a node on it has the node's whole network; ``β_inter`` is the
    per-GPU share). ``contention``: how many groups of different dimensions use those NICs at the
    same time (``HardwareProfile.group_link``)."""
    nodes = max(1, -(-n // per_node))
    alpha = (nodes * inter.latency_s + (n - nodes) * intra.latency_s) / max(1, n - 1)
    beta = min(intra.bandwidth_bytes_per_s, per_node * inter.bandwidth_bytes_per_s / contention)
    return alpha, beta


def plan_tiers(plan, gpus_per_node: int) -> dict[str, str]:
    """Tier of the tp, dp and pp groups of a plan (and of its cp group when cp > 1: the ranks
    laid out by ``Plan.mesh_order``, cp right outside tp)."""
    if getattr(plan, "cp", 1) > 1 and hasattr(plan, "mesh_order"):
        order, sizes = ",".join(plan.mesh_order()), plan.mesh_sizes()
        return {d: group_tier(order, sizes, d, gpus_per_node) for d in ("tp", "cp", "dp", "pp")}
    sizes = {"tp": plan.tp, "dp": plan.dp, "pp": plan.pp}
    return {d: group_tier(plan.placement, sizes, d, gpus_per_node) for d in ("tp", "dp", "pp")}
