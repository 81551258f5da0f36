"""GPU counts no plan can use whole: the nearest counts that work, below and above.

A cluster of 1000 GPUs (125 nodes) runs no plan of gpt3-175b at batch 1536 on all of them
(``dp·tp·pp = 1000 = 2³·5³`` leaves a factor 125 that no degree can take), but 992 and 1008
work. Rather than only "no plan can exist", the search plans on the largest count below the
request that has a configuration — the plan that leaves the fewest GPUs idle on the cluster the
user has — and names both neighbours, so the user can also ask for the one above.
"""
from __future__ import annotations

from autopar.search.space import Shape, configurations


def has_configuration(shape: Shape, gpus: int, global_batch: int, gpus_per_node: int, fix: dict,
                      allow_cross_node_tp: bool, max_micro_batch: int | None, zero_bubble: bool) -> bool:
    """Whether any configuration exists on exactly ``gpus`` GPUs (stops at the first)."""
    return next(iter(configurations(shape, gpus, global_batch, gpus_per_node, fix, allow_cross_node_tp,
                                    max_micro_batch, zero_bubble)), None) is not None


def nearest_gpu_counts(shape: Shape, gpus: int, global_batch: int, gpus_per_node: int, fix: dict,
                       allow_cross_node_tp: bool, max_micro_batch: int | None = None,
                       zero_bubble: bool = False) -> tuple[int | None, int | None]:
    """(largest count below ``gpus``, smallest above, up to twice it) with a configuration; None
    where there is none. A request of whole nodes is answered in whole nodes (a job takes nodes,
    not loose GPUs); counts are tried outward from ``gpus``, so the first found is the nearest."""
    step = gpus_per_node if gpus % gpus_per_node == 0 else 1

    def ok(g: int) -> bool:
        return has_configuration(shape, g, global_batch, gpus_per_node, fix, allow_cross_node_tp,
                                 max_micro_batch, zero_bubble)
    below = next((g for g in range(gpus - step, 0, -step) if ok(g)), None)
    above = next((g for g in range(gpus + step, 2 * gpus + 1, step) if ok(g)), None)
    return below, above
