"""Pipeline model: the step time of a pipeline schedule in closed form (bubble + imbalance).

Let ``t_{r,c}`` be the time pipeline rank r needs for one micro-batch through its c-th chunk
(virtual stage ``c·p + r``: forward + backward + recompute + exposed TP / PP / ZeRO-3
communication), ``T_r = Σ_c t_{r,c}`` the rank's time, ``T_max = max_r T_r``, ``m``
micro-batches, ``p`` ranks, ``v`` chunks per rank (vpp)::

    GPipe, 1F1B (v = 1):   pipeline time = m·T_max + (Σ_r T_r − T_max)
    interleaved 1F1B:      pipeline time = m·Σ_c C_c + (p − 1)·max_c C_c,   C_c = max_r t_{r,c}

Why per-chunk maxima for interleaving: Megatron's interleaved schedule runs micro-batches in
groups of p and every rank works on the same chunk index c for a group at a time, so the ranks
advance in lock-step per chunk column and each column is paced by its slowest chunk ``C_c``
(steady state ``m·Σ_c C_c``); fill and drain are ``p − 1`` traversals of one chunk, the slowest.
A formula in rank totals (``m·T_max + (Σ T_r − T_max)/v``, used before) misses that: a rank whose
chunks are 1 row, 10 blocks, 1 block, 1 block has the same total as one with 3, 3, 3, 4 blocks,
but its 10-block chunk stalls every other rank once per group (gpt3-175b, 256 GPUs: 62.9 s
predicted, 94 s simulated). For v = 1 the steady state is paced by the slowest rank and fill and
drain traverse every other rank once (Huang et al. 2019; Narayanan et al. 2021, §2.2).

Both equal the schedule simulator (``costmodels.model.schedule_sim``) for uniform chunks
(``t_{r,c} = t``): ``(m + p − 1)·T`` and ``(m + (p − 1)/v)·T``. For non-uniform chunks,
formula / simulator measured over random per-chunk times (hypothesis,
``tests/test_costmodels_pipeline.py``; "jitter": forward times within 10 %, backward 2–2.2×
forward; "uneven": chunks 4× apart, backward 2–3× forward):

    schedule           jitter           uneven
    1F1B               1.00 … 1.07      1.00 … 1.30     (never below: an upper bound here)
    GPipe              0.98 … 1.00      0.92 … 1.00     (forward / backward maxima on different ranks)
    interleaved 1F1B   0.995 … 1.12     0.86 … 1.65

On real plans: gpt3-175b splits whose columns are even up to the embedding and head rows are
0.1–0.4 % above the simulator; splits the HBM forces into uneven columns (early ranks hold
more micro-batches in flight, e.g. columns of 1, 4, 4, 3 blocks) stall at every change of
column, which per-column maxima do not see: up to ~10–20 % below (the report's schedule check
flags those). Chunks far apart (1 and 48 blocks on one rank) are worse still.

The split-backward schedules (interleaved-zb, zb-v, dualpipe-v) are priced by
``costmodels.model.pipeline_split``: the simulator's makespan, extrapolated past three periods (no
formula in rank totals or column maxima holds 2 % once W fills part of the bubble on uneven
stages). Its / the full simulation's ratio, "uneven" as pipeline_split's docstring defines it
(tests/test_costmodels_pipeline_split.py; 300 draws each, pp 2–8, m up to 12·pp):

    schedule           uneven
    interleaved-zb     1.000 … 1.002
    zb-v               1.000 … 1.008    (exact up to 3 periods; never below)
    dualpipe-v         1.000 … 1.007

GPipe and 1F1B take the same time and differ only in memory (memory.in_flight).
``bubble = pipeline time − m·T_max`` (the slowest rank's idle time).
"""
from __future__ import annotations

from collections.abc import Sequence


def _per_chunk(times: Sequence, vpp: int) -> list[list[float]]:
    """``times[r]`` is rank r's micro-batch time (split evenly over its vpp chunks) or the list
    of its per-chunk times."""
    out = []
    for t in times:
        if isinstance(t, (list, tuple)):
            out.append([float(x) for x in t])
        else:
            out.append([float(t) / vpp] * vpp)
    return out


def pipeline_time(times: Sequence, m: int, vpp: int = 1) -> tuple[float, float]:
    """(pipeline time, bubble) in seconds; ``times[r]`` = rank r's per-chunk times ``[t_{r,c}]``
    (or one number per rank, read as vpp equal chunks). See the module docstring."""
    t = _per_chunk(times, vpp)
    p = len(t)
    T = [sum(row) for row in t]
    t_max = max(T)
    if vpp == 1 or p == 1:
        total = m * t_max + (sum(T) - t_max)
    else:
        cols = column_maxima(t)
        total = m * sum(cols) + (p - 1) * max(cols)
    return total, total - m * t_max


def column_maxima(chunk_times: Sequence[Sequence[float]]) -> list[float]:
    """``C_c = max_r t_{r,c}``: the slowest chunk of every chunk column."""
    v = len(chunk_times[0])
    return [max(row[c] for row in chunk_times) for c in range(v)]


def bubble_fraction_uniform(pp: int, m: int, vpp: int = 1) -> float:
    """Bubble time / ideal time for uniform stages: (p − 1)/(v·m) (Narayanan et al. 2021)."""
    return (pp - 1) / (vpp * m)
