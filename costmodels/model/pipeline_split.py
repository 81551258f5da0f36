"""Step time of the split-backward schedules (interleaved-zb, zb-v, dualpipe-v) for the estimate.

Why not a formula like ``pipeline``'s: with the backward split into B and W and stages of
uneven size, where the W passes land (and so how much of the fill / drain they cover) depends
on the per-stage times in ways no short expression follows — closed forms in rank totals or
column maxima, tried like those of ``pipeline``, missed the simulator by 5–20 % on uneven
stages. What does hold is that these schedules are periodic: past their warm-up, adding one
period of micro-batches (a round of ``mpr`` for interleaved-zb, ``pp`` micro-batches for the V
schedules) adds the same time, ``Δ``, and that time is at least the busiest rank's work for
those micro-batches, ``P·T_max`` (and for the V schedules settles at exactly that). So::

    m ≤ m1:   pipeline time = simulated makespan(m)                    (exact)
    m > m1:   pipeline time = makespan(m1) + (m − m1)/P · max(Δ, P·T_max),
              Δ = makespan(m1) − makespan(m0),  m0 = 2P, m1 = 3P  (interleaved-zb: P = mpr;
              V schedules: P = pp)

with ``makespan`` the simulator's (``costmodels.model.schedule_program``: torch's order, one pass of
max / + over a cached op list, ~0.1 ms at pp = 8). ``T_r = Σ_c (F + B + W)`` of rank r's
chunks, ``bubble = pipeline time − m·T_max`` as for the other schedules.

Measured against the full simulation (``tests/test_costmodels_pipeline_split.py``, hypothesis)
for UNEVEN stages as real plans have them: each virtual stage holds n or n + 1 blocks (the
split's remainder) or, one time in three, n − 2 … n + 3 (a split the memory forced), the first
stage carries the embedding (up to half a block more) and the last the head and loss (half a
block to three blocks more), backward 2–3× forward, W 30–50 % of the backward, pp 2–8,
m = pp … 12·pp: within 2 % (interleaved-zb and dualpipe-v: exact to rounding; zb-v: its slope
reaches ``T_max`` a few periods late on some splits, up to ~1 % above).
"""
from __future__ import annotations

from collections.abc import Sequence

from costmodels.model.schedule_program import makespan, period


def rank_work(fwd, bwd) -> list[float]:
    """``T_r``: rank r's work for one micro-batch through all its chunks (B and W in ``bwd``)."""
    return [sum(f) + sum(b) for f, b in zip(fwd, bwd)]


def split_pipeline_time(schedule: str, fwd: Sequence[Sequence[float]], bwd: Sequence[Sequence[float]],
                        wgt: Sequence[Sequence[float]], m: int) -> tuple[float, float]:
    """(pipeline time, bubble) in seconds; ``fwd[r][c]`` / ``bwd[r][c]`` / ``wgt[r][c]`` are rank
    r's chunk c (``stages_of_rank`` order) forward, whole backward and its W part, per micro-batch.
    See the module docstring."""
    pp, vpp = len(fwd), len(fwd[0])
    t_max = max(rank_work(fwd, bwd))
    per = period(schedule, pp, m)
    m1 = 3 * per
    if m <= m1:
        total = makespan(schedule, pp, vpp, m, fwd, bwd, wgt)
    else:
        t1 = makespan(schedule, pp, vpp, m1, fwd, bwd, wgt)
        delta = t1 - makespan(schedule, pp, vpp, 2 * per, fwd, bwd, wgt)
        total = t1 + (m - m1) / per * max(delta, per * t_max)
    return total, total - m * t_max
