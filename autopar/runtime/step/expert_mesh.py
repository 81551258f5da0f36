"""The expert mesh of autopar's runtime: which ranks form an ep group and which an expert-dp group.

Every rank of a pipeline stage holds tokens of its own at the routed experts: each dp and cp rank
its part of the batch and sequence, each tp rank its ``1/tp`` of them (``autopar.rewrite.experts``:
the sequence-parallel shard, or without sequence parallelism its ``tensor_split`` of the
replicated tokens, the experts' outputs all-gathered over tp afterwards). So for the experts the
stage's ``dp·cp·tp`` ranks are alike, and an ep group may take any ``ep`` of them (the plan
contract: ``ep·etp`` divides ``dp·cp·tp``; this runtime runs ``etp = 1``).

The stage's ranks are flattened innermost first in the plan's rank order (``Layout.order``:
``mesh_order``, tp then cp then dp) and cut into ``dp·cp·tp/ep`` groups of ``ep`` consecutive
ranks, except that where ``ep`` divides ``dp·cp`` tp is put outermost, so that an ep group stays
at one tp coordinate, ``tp`` ranks apart (what ``costmodels.model.experts.ep_span`` prices for this
runtime there). Where ``ep`` does not divide ``dp·cp`` the group takes the tp ranks first, ``ep``
consecutive ranks: Megatron-core's expert ``RankGenerator`` at etp 1 (``megatron/core/
parallel_state.py``: order tp-ep-dp over the same ranks, so an ep group is ``ep`` consecutive
ranks), which ``ep_span`` prices as the folding runtimes'.

A rank's position in its ep group is its index in the group's *sorted* ranks, which is its
process-group rank (``torch.distributed.new_group`` sorts), so position ``j`` owns experts
``[j·E/ep, (j+1)·E/ep)`` and the all-to-all's split ``j`` goes to it. The expert-dp group of a
rank is the ranks at its position in every ep group of the stage: ``dp·cp·tp/ep`` ranks holding
the same experts, over which their gradients are summed (``experts.reduce_expert_grads``).
"""
from __future__ import annotations

import itertools

MESH_DIMS = ("tp", "cp", "dp")


def ep_takes_tp(plan) -> bool:
    """Whether the plan's ep groups take tp ranks (ep does not divide dp·cp)."""
    return plan.ep > 1 and (plan.dp * getattr(plan, "cp", 1)) % plan.ep != 0


def stage_ep_groups(plan, layout, pp: int) -> list[list[int]]:
    """The ep groups (sorted global ranks) of pipeline rank ``pp`` (module docstring)."""
    order = [d for d in layout.order if d in MESH_DIMS]
    if not ep_takes_tp(plan):
        order = [d for d in order if d != "tp"] + ["tp"]
    sizes = [layout.sizes.get(d, 1) for d in order]
    flat = []
    for coord in itertools.product(*(range(n) for n in reversed(sizes))):   # outermost varies slowest
        flat.append(layout.rank_at(pp=pp, **dict(zip(reversed(order), coord))))
    return [sorted(flat[i:i + plan.ep]) for i in range(0, len(flat), plan.ep)]


def expert_groups(plan, layout, pp: int | None = None) -> tuple[list[int], list[int], int]:
    """(this rank's ep group, its expert-dp group, its position in the ep group) on its own
    pipeline rank (``pp`` None) — all as sorted global ranks."""
    groups = stage_ep_groups(plan, layout, layout.pp_rank if pp is None else pp)
    mine = next(g for g in groups if layout.rank in g)
    j = mine.index(layout.rank)
    return mine, sorted(g[j] for g in groups), j


def all_rank_sets(plan, layout) -> tuple[list[list[int]], list[list[int]]]:
    """(ep groups, expert-dp groups) of every pipeline rank, for ``create_groups`` (every rank
    builds the same lists); groups of one rank left out."""
    eps, edps = [], []
    for pp in range(plan.pp):
        groups = stage_ep_groups(plan, layout, pp)
        if plan.ep > 1:
            eps += groups
        edps += [sorted(g[j] for g in groups) for j in range(plan.ep)]
    return eps, [g for g in edps if len(g) > 1]


def counts_in_norm(plan, layout) -> bool:
    """Whether this rank adds its expert shards to the serial gradient norm: the ranks of its
    stage's first ep group hold every expert once (``step/clipping.py``)."""
    return layout.rank in stage_ep_groups(plan, layout, layout.pp_rank)[0]
