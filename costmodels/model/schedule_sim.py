"""Pipeline schedule simulator (the reference the closed form of ``pipeline`` is tested against):
the order of forward / backward passes on every stage, and when they run.

For each schedule the report knows, ``stage_order`` lists, per pipeline rank, the sequence of
``(kind, chunk, micro_batch)`` operations that rank executes (``kind`` is ``"F"`` or ``"B"``,
``chunk`` the virtual chunk, 0 unless interleaved):

* ``gpipe``: every forward, then every backward (Huang et al. 2019).
* ``1f1b``: rank ``r`` runs ``min(pp - r - 1, M)`` warm-up forwards, then alternates one forward
  and one backward, then drains the remaining backwards (PipeDream-Flush / Megatron).
* ``interleaved-1f1b``: micro-batches go in groups of ``pp``; forwards visit chunks 0..vpp-1 per
  group, backwards visit them in reverse; rank ``r`` warms up with ``2 (pp - r - 1) + (vpp - 1) pp``
  forwards (Narayanan et al. 2021, Megatron-LM's ``forward_backward_pipelining_with_interleaving``).

``simulate`` then places every operation in time: virtual stage ``v = chunk·pp + rank``; the
forward of ``(v, m)`` waits for the forward of ``(v - 1, m)``, the backward of ``(v, m)`` for the
backward of ``(v + 1, m)`` and the forward of ``(v, m)``; a rank runs its operations in order, one
at a time. Durations are the estimate's per-micro-batch ``fwd_s`` / ``bwd_s`` of each stage and
chunk (``stages_detail``); point-to-point transfer time is not drawn. The idle time this leaves is
the pipeline bubble.

The split-backward schedules (``interleaved-zb``, ``zb-v``, ``dualpipe-v``) run the orders of
``costmodels.model.schedule_orders`` (torch 2.13's own, op for op), with three kinds of work: ``F``,
``B`` (input gradient: what the previous stage waits for) and ``W`` (weight gradient: nobody
waits for it, so the schedule slips it into what would be bubble). A full backward (``BW``,
DualPipeV's) runs B then W in one pass and releases its input gradient only at the end; an
overlapped pair (DualPipeV's ``OVERLAP_F_B``) runs its two ops back to back, each waiting for its
own input, and releases both outputs at the end (torch posts the sends after the action). For
these, virtual stage ``v`` runs on the rank ``costmodels.contracts.plan.stages_of_rank`` names (V placement
for zb-v / dualpipe-v: the turn from stage pp − 1 to pp stays on rank pp − 1), and a backward of
``(v, m)`` waits for the input gradient of ``(v + 1, m)``. ``wgt[rank][chunk]`` is the W part of
``bwd[rank][chunk]`` (B = bwd − wgt; absent: no W, the whole backward is B).
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES, stages_of_rank
from costmodels.model.schedule_orders import rank_actions
from costmodels.model.schedule_program import durations, op_ends, program


@dataclass(frozen=True)
class Op:
    rank: int
    kind: str        # "F" | "B" | "W" (a full backward is drawn as its B, then its W)
    chunk: int
    micro_batch: int
    start: float
    end: float


@dataclass
class Timeline:
    schedule: str
    pp: int
    vpp: int
    micro_batches: int          # micro-batches simulated (and drawn)
    total_micro_batches: int    # micro-batches in the real step
    ops: list[Op]
    makespan: float

    @property
    def capped(self) -> bool:
        return self.micro_batches < self.total_micro_batches

    @property
    def idle_fraction(self) -> float:
        busy = sum(o.end - o.start for o in self.ops)
        total = self.pp * self.makespan
        return 1.0 - busy / total if total > 0 else 0.0


def warmup(schedule: str, pp: int, vpp: int, rank: int, m: int) -> int:
    if schedule == "gpipe":
        return m * vpp
    if schedule == "1f1b":
        return min(pp - rank - 1, m)
    if schedule == "interleaved-1f1b":
        if m == pp:  # Megatron: with one group, every forward is a warm-up forward
            return m * vpp
        return min(2 * (pp - rank - 1) + (vpp - 1) * pp, m * vpp)
    raise PlanError(f"cannot draw schedule '{schedule}' with this warm-up rule; known: gpipe, 1f1b, "
                    "interleaved-1f1b (the split-backward schedules run schedule_orders' orders)")


def _units(pp: int, vpp: int, m: int, backward: bool) -> list[tuple[int, int]]:
    """(chunk, micro_batch) in the order one rank visits them (interleaved grouping)."""
    out = []
    for g0 in range(0, m, pp):
        group = range(g0, min(g0 + pp, m))
        chunks = range(vpp - 1, -1, -1) if backward else range(vpp)
        for c in chunks:
            out.extend((c, mb) for mb in group)
    return out


def stage_order(schedule: str, pp: int, vpp: int, m: int, rank: int,
                extra_warmup: int = 0) -> list[tuple[str, int, int]]:
    """The operations rank ``rank`` runs, in order, for ``m`` micro-batches: ``(kind, chunk,
    micro_batch)``; for the split-backward schedules ``kind`` is F, B, W or BW (full backward),
    an overlapped pair appearing as its two ops."""
    if schedule in SPLIT_BACKWARD_SCHEDULES:
        chunk = {s: c for c, s in enumerate(stages_of_rank(schedule, pp, vpp, rank))}
        return [(k, chunk[s], mb) for action in rank_actions(schedule, pp, vpp, m, rank)
                for k, s, mb in action]
    if schedule != "interleaved-1f1b" and vpp != 1:
        raise PlanError(f"schedule '{schedule}' runs one chunk per rank, got vpp={vpp}")
    fwd = [("F", c, mb) for c, mb in _units(pp, vpp, m, backward=False)]
    bwd = [("B", c, mb) for c, mb in _units(pp, vpp, m, backward=True)]
    w = min(warmup(schedule, pp, vpp, rank, m) + extra_warmup, m * vpp)
    order = fwd[:w]
    rest_f, rest_b = fwd[w:], list(bwd)
    while rest_f:
        order.append(rest_f.pop(0))
        order.append(rest_b.pop(0))
    order.extend(rest_b)
    return order


def simulate(schedule: str, pp: int, vpp: int, m: int, fwd: list[list[float]],
             bwd: list[list[float]], total_micro_batches: int | None = None,
             wgt: list[list[float]] | None = None) -> Timeline:
    """Place every operation in time; ``fwd[rank][chunk]`` / ``bwd[rank][chunk]`` in seconds,
    ``wgt[rank][chunk]`` the weight-gradient part of ``bwd`` (split-backward schedules only).

    Interleaving with a micro-batch count that is not a multiple of pp (which Megatron refuses)
    deadlocks with the standard warm-up; there every rank gets the fewest extra warm-up forwards
    that let the schedule run."""
    if schedule in SPLIT_BACKWARD_SCHEDULES:
        return _simulate_split(schedule, pp, vpp, m, fwd, bwd, wgt, total_micro_batches)
    for extra in range(m * vpp + 1):
        try:
            return _simulate(schedule, pp, vpp, m, fwd, bwd, total_micro_batches, extra)
        except _Deadlock:
            continue
    raise RuntimeError(f"schedule {schedule} pp={pp} vpp={vpp} m={m} deadlocks")  # a bug


class _Deadlock(Exception):
    pass


def _simulate(schedule, pp, vpp, m, fwd, bwd, total_micro_batches, extra) -> Timeline:
    orders = [stage_order(schedule, pp, vpp, m, r, extra) for r in range(pp)]
    nv = pp * vpp
    done: dict[tuple[str, int, int], float] = {}   # (kind, virtual stage, mb) -> end time
    free = [0.0] * pp
    pos = [0] * pp
    ops: list[Op] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, c, mb = orders[r][pos[r]]
                v = c * pp + r
                start = free[r]    # the latest of the rank's free time and its dependencies' ends
                if kind == "F":
                    if v > 0:
                        dep = done.get(("F", v - 1, mb))
                        if dep is None:
                            break
                        start = max(start, dep)
                else:
                    dep = done.get(("F", v, mb))
                    if dep is None:
                        break
                    start = max(start, dep)
                    if v < nv - 1:
                        dep = done.get(("B", v + 1, mb))
                        if dep is None:
                            break
                        start = max(start, dep)
                end = start + (fwd[r][c] if kind == "F" else bwd[r][c])
                done[(kind, v, mb)] = end
                free[r] = end
                ops.append(Op(r, kind, c, mb, start, end))
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise _Deadlock()
    return Timeline(schedule, pp, vpp, m, total_micro_batches or m, ops, max(free))


def _simulate_split(schedule, pp, vpp, m, fwd, bwd, wgt, total_micro_batches) -> Timeline:
    """The split-backward schedules: torch's orders, compiled (``schedule_program``), in time."""
    w = wgt or [[0.0] * vpp for _ in range(pp)]
    starts: list[float] = []
    ends = op_ends(schedule, pp, vpp, m, durations(fwd, bwd, w), starts)
    ops = [Op(o.rank, o.kind, o.chunk, o.micro_batch, a, e)
           for o, a, e in zip(program(schedule, pp, vpp, m), starts, ends)]
    return Timeline(schedule, pp, vpp, m, total_micro_batches or m, ops, max(ends))
