"""The split-backward schedules compiled once into a flat program of ops, then timed cheaply.

Why: the estimate prices tens of thousands of plans, and a zero-bubble schedule's step time is
read off its simulation (``costmodels.model.pipeline_split``). Walking torch's action lists with
dictionaries of released outputs for every plan would cost milliseconds; the dependency
structure depends only on (schedule, pp, vpp, m), so it is resolved once (cached) into a list of
ops in an order where everything an op waits for comes earlier, and timing a plan is one pass
of ``max`` and ``+`` over that list (``makespan``). The same program gives the simulator's
timeline (``costmodels.model.schedule_sim.simulate``) and the micro-batches each stage holds in flight
(``peak_in_flight``), so the three can never disagree about what waits for what.

Rules (module docstring of ``schedule_sim``): a forward of virtual stage ``v`` waits for the
forward of ``v − 1`` (same micro-batch), an input-gradient backward ``B`` (or a full backward,
``B`` then ``W`` in one pass) for the input gradient of ``v + 1``; a rank runs its ops in order;
the outputs of an action (one op, or DualPipeV's overlapped F + full backward) are released when
the whole action ends (torch posts the sends after it).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from costmodels.contracts.plan import stages_of_rank
from costmodels.model.schedule_orders import rank_actions, rounds_of

KINDS = ("F", "B", "W")


@dataclass(frozen=True)
class ProgramOp:
    rank: int
    kind: str                  # "F" | "B" | "W"
    chunk: int                 # the rank's local chunk (stages_of_rank order)
    micro_batch: int
    waits: tuple[int, ...]     # ops (indices) whose end releases what this op needs
    slot: int                  # index of its duration: (rank·vpp + chunk)·3 + KINDS.index(kind)


@lru_cache(maxsize=512)
def program(schedule: str, pp: int, vpp: int, m: int) -> tuple[ProgramOp, ...]:
    """The ops of all ranks in a dependency-respecting order (see the module docstring)."""
    acts = [rank_actions(schedule, pp, vpp, m, r) for r in range(pp)]
    chunk_of = {s: c for r in range(pp) for c, s in enumerate(stages_of_rank(schedule, pp, vpp, r))}
    nv = pp * vpp
    released: dict[tuple[str, int, int], int] = {}    # (F|B, stage, mb) -> op ending its action
    out: list[ProgramOp] = []
    pos = [0] * pp
    remaining = sum(len(a) for a in acts)
    while remaining:
        progressed = False
        for r in range(pp):
            while pos[r] < len(acts[r]):
                action = acts[r][pos[r]]
                needs = [_needs(k, s, mb, nv) for k, s, mb in action]
                if any(d not in released for ds in needs for d in ds):
                    break
                for (kind, s, mb), ds in zip(action, needs):
                    c = chunk_of[s]
                    waits = tuple(released[d] for d in ds)
                    for part in (("B", "W") if kind == "BW" else (kind,)):
                        out.append(ProgramOp(r, part, c, mb, waits, (r * vpp + c) * 3 + KINDS.index(part)))
                        waits = ()
                for kind, s, mb in action:
                    if kind != "W":
                        released[("F" if kind == "F" else "B", s, mb)] = len(out) - 1
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:   # torch's orders never deadlock (tests); this would be a transcription bug
            raise RuntimeError(f"schedule {schedule} pp={pp} vpp={vpp} m={m} deadlocks")
    return tuple(out)


def _needs(kind: str, stage: int, mb: int, nv: int) -> list[tuple[str, int, int]]:
    if kind == "F":
        return [("F", stage - 1, mb)] if stage > 0 else []
    if kind == "W":
        return []
    return [("F", stage, mb)] + ([("B", stage + 1, mb)] if stage < nv - 1 else [])


def period(schedule: str, pp: int, m: int) -> int:
    """Micro-batches per period of the schedule's steady state: a round (``mpr``) for
    interleaved-zb, ``pp`` for the V schedules; ``m`` itself when the rounds at 2 and 3 periods
    would differ in size from the step's (then nothing repeats that can be extrapolated)."""
    if schedule != "interleaved-zb":
        return pp
    mpr = rounds_of(pp, m)[1]
    for k in (2, 3):
        if max(1, k * mpr // pp) * mpr != k * mpr or (k * mpr) // max(1, k * mpr // pp) != mpr:
            return m
    return mpr


@lru_cache(maxsize=512)
def _compiled(schedule: str, pp: int, vpp: int, m: int) -> tuple[tuple, ...]:
    return tuple((o.rank, o.slot, o.waits) for o in program(schedule, pp, vpp, m))


def durations(fwd, bwd, wgt) -> list[float]:
    """The duration slots of ``ProgramOp.slot``: per rank and chunk, F, B (= bwd − wgt), W."""
    out = []
    for fr, br, wr in zip(fwd, bwd, wgt):
        for f, b, w in zip(fr, br, wr):
            out += [float(f), float(b) - float(w), float(w)]
    return out


def op_ends(schedule: str, pp: int, vpp: int, m: int, dur: list[float],
            starts: list[float] | None = None) -> list[float]:
    """When each op of ``program(...)`` ends, given the duration slots ``dur`` (and, into
    ``starts`` when given, when each starts)."""
    free = [0.0] * pp
    ends: list[float] = []
    for r, slot, waits in _compiled(schedule, pp, vpp, m):
        t = free[r]
        for i in waits:
            if ends[i] > t:
                t = ends[i]
        if starts is not None:
            starts.append(t)
        t += dur[slot]
        ends.append(t)
        free[r] = t
    return ends


def makespan(schedule: str, pp: int, vpp: int, m: int, fwd, bwd, wgt) -> float:
    """The time from the first op to the last, ``fwd[rank][chunk]`` etc. in seconds."""
    return max(op_ends(schedule, pp, vpp, m, durations(fwd, bwd, wgt)))


@lru_cache(maxsize=256)
def in_flight_states(schedule: str, pp: int, vpp: int, m: int) -> tuple[tuple[tuple[tuple[int, int], ...], ...], ...]:
    """Per rank, the moments at which it may hold most: per chunk, (micro-batches whose
    activations are held, of which waiting for their W only), right after each forward (the only
    op that adds to what is held); repeated and dominated moments dropped.

    A micro-batch's activations for a chunk are held from its forward to the end of its W: torch's
    input-gradient pass (``stage_backward_input``) keeps the autograd graph (``retain_graph``)
    for the weight-gradient pass, which frees it; between its B and its W a micro-batch also holds
    the output gradients the weight gradients need (``costmodels.model.memory``)."""
    n = vpp
    held = [[0] * n for _ in range(pp)]
    wait_w = [[0] * n for _ in range(pp)]
    states: list[set] = [set() for _ in range(pp)]
    for o in program(schedule, pp, vpp, m):
        h, w = held[o.rank], wait_w[o.rank]
        if o.kind == "F":
            h[o.chunk] += 1
            states[o.rank].add(tuple(zip(h, w)))
        elif o.kind == "B":
            w[o.chunk] += 1
        else:
            h[o.chunk] -= 1
            w[o.chunk] -= 1
    return tuple(tuple(sorted(s for s in st if not any(_dominates(t, s) for t in st))) for st in states)


def _dominates(t, s) -> bool:
    return t != s and all(a >= c and b >= d for (a, b), (c, d) in zip(t, s))
