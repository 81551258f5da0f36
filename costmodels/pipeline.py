"""Pipeline model: step time of a pipeline whose ranks take different times (bubble + imbalance).

Let ``T_r`` be the time pipeline rank r needs for one micro-batch through all of its chunks
(forward + backward + recompute + exposed TP / PP / ZeRO-3 communication), ``T_max = max_r T_r``
the slowest rank, ``m`` micro-batches, ``v`` virtual stages per rank (vpp)::

    pipeline time = m·T_max + (Σ_r T_r − T_max) / v

The first term is the steady state, paced by the slowest stage (imbalance costs
``m·(T_max − T_r)`` idle time on the other ranks). The second is fill and drain: a micro-batch
has to traverse every other stage once before the slowest one is busy, and interleaving cuts
each traversal into v chunks. For uniform stages (T_r = T) it is the textbook bubble

    GPipe, 1F1B:        (m + p − 1)·T        bubble fraction (p − 1)/(m + p − 1)
    interleaved 1F1B:   (m + (p − 1)/v)·T    bubble (p−1)/(v·m) of the ideal time

(Huang et al. 2019; Narayanan et al. 2021, §2.2). GPipe and 1F1B take the same time and differ
only in memory (memory.in_flight). ``bubble = pipeline time − m·T_max``.
"""
from __future__ import annotations

from collections.abc import Sequence


def pipeline_time(rank_times: Sequence[float], m: int, vpp: int = 1) -> tuple[float, float]:
    """(pipeline time, bubble) in seconds for per-rank micro-batch times ``rank_times``."""
    t_max = max(rank_times)
    total = m * t_max + (sum(rank_times) - t_max) / vpp
    return total, total - m * t_max


def bubble_fraction_uniform(pp: int, m: int, vpp: int = 1) -> float:
    """Bubble time / ideal time for uniform stages: (p − 1)/(v·m) (Narayanan et al. 2021)."""
    return (pp - 1) / (vpp * m)
