"""The per-rank operation order of torch 2.13's split-backward schedules, transcribed.

Why a separate module: ``costmodels`` imports no torch, yet the simulator must run the very
order torch runs (``tests/test_costmodels_schedule_orders.py`` builds torch's ``pipeline_order``
and checks these functions against it op for op). Each function here mirrors one
``_calculate_single_rank_operations`` of ``torch/distributed/pipelining/schedules.py``:

* ``interleaved-zb``: ``ScheduleInterleavedZeroBubble`` (ZB1P, Qi et al. 2024): micro-batches
  in rounds of ``mpr = m // max(1, m // pp)``; rank ``r`` warms up with ``(vpp − 1)·mpr +
  pp − 1 − r`` forwards, then pairs one forward with one input-gradient backward, and from its
  ``r``-th such pair on, adds the oldest pending weight-gradient pass; the rest drain at the end.
* ``zb-v``: ``ScheduleZBVZeroBubble`` (ZB-V, Qi et al. 2024 §6): V placement, warm-up
  ``2(pp − r) − 1`` forwards of chunk 0, then ``r`` pairs F1 F0, ``pp − r`` triples F1 B1 W1, a
  steady state F0 B0 W0 F1 B1 W1, and a cool-down; built for ``max(2pp − 1, m)`` micro-batches
  and the ones past ``m`` dropped (torch does the same).
* ``dualpipe-v``: ``ScheduleDualPipeV`` (DeepSeek-V3's DualPipe, V variant): eight steps; its
  main step issues a forward of one chunk and a *full* backward of the other as one action
  (torch's ``OVERLAP_F_B``). torch 2.13 runs the two back to back (the sub-actions in turn, with
  no custom overlap callback) and posts both sends after the second, which is what is modelled:
  there is no compute / compute overlap in torch's runtime.

An *op* is ``(kind, stage, micro_batch)`` with ``stage`` the global virtual stage and ``kind``
``"F"`` (forward), ``"B"`` (input-gradient backward), ``"W"`` (weight-gradient backward) or
``"BW"`` (a full backward: B and W in one pass); an *action* is a tuple of one op, or two for an
overlapped F + BW.
"""
from __future__ import annotations

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import stages_of_rank

Op = tuple[str, int, int]
Action = tuple[Op, ...]


def rounds_of(pp: int, m: int) -> tuple[int, int]:
    """(rounds, micro-batches per round) of torch's interleaved schedules; PlanError when the
    rounds do not divide ``m`` (torch's constructor refuses it)."""
    rounds = max(1, m // pp)
    if m % rounds:
        raise PlanError(f"schedule 'interleaved-zb' with pp={pp} runs {m} micro-batches in {rounds} "
                        f"rounds, which must divide them; use a multiple of pp micro-batches")
    return rounds, m // rounds


def interleaved_zb_actions(pp: int, vpp: int, m: int, rank: int) -> list[Action]:
    """``ScheduleInterleavedZeroBubble`` (``_get_1f1b_rank_ops`` with ``enable_zero_bubble``)."""
    _, mpr = rounds_of(pp, m)
    warmup = min((vpp - 1) * mpr + (pp - 1 - rank), m * vpp)
    fwd_bwd = m * vpp - warmup

    def f_stage(step):
        return ((step // mpr) % vpp) * pp + rank

    def b_stage(step):
        return (vpp - 1 - ((step - warmup) // mpr) % vpp) * pp + rank

    count: dict[tuple[str, int], int] = {}

    def op(kind, stage):
        mb = count.get((kind, stage), 0)
        count[(kind, stage)] = mb + 1
        return ((kind, stage, mb),)

    out: list[Action] = []
    b_steps: list[int] = []
    n_w = 0
    for step in range(warmup + fwd_bwd + warmup):
        if step < warmup + fwd_bwd:
            out.append(op("F", f_stage(step)))
        if step >= warmup:
            out.append(op("B", b_stage(step)))
            b_steps.append(step)
            if step - warmup >= rank:
                out.append(op("W", b_stage(b_steps[n_w])))
                n_w += 1
    while n_w < len(b_steps):
        out.append(op("W", b_stage(b_steps[n_w])))
        n_w += 1
    return out


def zbv_actions(pp: int, m: int, rank: int) -> list[Action]:
    """``ScheduleZBVZeroBubble._calculate_single_rank_operations``."""
    n = max(2 * pp - 1, m)
    s0, s1 = stages_of_rank("zb-v", pp, 2, rank)
    cnt = {"F0": 0, "F1": 0, "B0": 0, "B1": 0}
    out: list[Op] = []

    def add(kind, chunk, counter=None, mb=None):
        key = counter or f"{kind}{chunk}"
        if mb is None:
            mb = cnt[key]
            cnt[key] += 1
        out.append((kind, s0 if chunk == 0 else s1, mb))

    for _ in range(2 * (pp - rank) - 1):
        add("F", 0)
    for _ in range(rank):
        add("F", 1)
        add("F", 0)
    for _ in range(pp - rank):
        add("F", 1)
        add("B", 1, mb=cnt["B1"])
        add("W", 1, counter="B1")
    while cnt["F1"] < cnt["F0"] or cnt["F0"] < n:
        if cnt["F0"] < n:
            add("F", 0)
        add("B", 0, mb=cnt["B0"])
        add("W", 0, counter="B0")
        add("F", 1)
        add("B", 1, mb=cnt["B1"])
        add("W", 1, counter="B1")
    w0, w1 = cnt["B0"], cnt["B1"]
    for _ in range(rank):
        add("B", 0)
        add("B", 1)
    for _ in range(pp - rank):
        add("B", 0)
        add("W", 0, mb=w0)
        w0 += 1
    for mb in range(w1, cnt["B1"]):
        add("W", 1, mb=mb)
    for mb in range(w0, cnt["B0"]):
        add("W", 0, mb=mb)
    return [(o,) for o in out if o[2] < m]


def dualpipe_v_actions(pp: int, m: int, rank: int) -> list[Action]:
    """``ScheduleDualPipeV._calculate_single_rank_operations``; needs ``m >= 2·pp``."""
    if m < 2 * pp:
        raise PlanError(f"schedule 'dualpipe-v' with pp={pp} needs at least 2·pp = {2 * pp} "
                        f"micro-batches per step, got {m}")
    s0, s1 = stages_of_rank("dualpipe-v", pp, 2, rank)
    count: dict[tuple[int, str], int] = {}
    weights: list[tuple[int, int]] = []      # pending W after an input-gradient B
    out: list[Action] = []

    def one(stage, kind) -> Op:
        key = (stage, "B" if kind == "BW" else kind)
        mb = count.get(key, 0)
        count[key] = mb + 1
        if kind == "B":
            weights.append((stage, mb))
        return (kind, stage, mb)

    def add(stage, kind):
        out.append((one(stage, kind),))

    def overlap(f_stage, b_stage):
        out.append((one(f_stage, "F"), one(b_stage, "BW")))

    def pending_w():
        if weights:
            stage, mb = weights.pop(0)
            out.append((("W", stage, mb),))

    for _ in range((pp - rank - 1) * 2):                 # 1: F0
        add(s0, "F")
    for _ in range(rank + 1):                            # 2: F0 F1
        add(s0, "F")
        add(s1, "F")
    for _ in range(pp - rank - 1):                       # 3: B1 W F1 (zero bubble)
        add(s1, "B")
        pending_w()
        add(s1, "F")
    for i in range(m - 2 * pp + rank + 1):               # 4: F0·BW1, F1·BW0 (overlapped)
        if i == 0 and rank == pp - 1:
            add(s0, "F")
            add(s1, "BW")
        else:
            overlap(s0, s1)
        overlap(s1, s0)
    for _ in range(pp - rank - 1):                       # 5: BW1, F1·BW0
        add(s1, "BW")
        overlap(s1, s0)
    zb = False
    n6 = rank + 1
    for i in range(n6):                                  # 6: B1 B0, second half zero bubble
        if i == n6 // 2 and rank % 2 == 1:
            zb = True
        add(s1, "B" if zb else "BW")
        if i == n6 // 2 and rank % 2 == 0:
            zb = True
        add(s0, "B" if zb else "BW")
    for _ in range(pp - rank - 1):                       # 7: W B0
        pending_w()
        add(s0, "B" if zb else "BW")
    for _ in range(rank + 1):                            # 8: W
        pending_w()
    return out


def rank_actions(schedule: str, pp: int, vpp: int, m: int, rank: int) -> list[Action]:
    """Rank ``rank``'s actions, in order, for ``m`` micro-batches of a split-backward schedule."""
    if schedule == "interleaved-zb":
        return interleaved_zb_actions(pp, vpp, m, rank)
    if vpp != 2:
        raise PlanError(f"schedule '{schedule}' places exactly two stages per rank; got vpp={vpp}")
    if schedule == "zb-v":
        return zbv_actions(pp, m, rank)
    if schedule == "dualpipe-v":
        return dualpipe_v_actions(pp, m, rank)
    raise PlanError(f"no split-backward order for schedule '{schedule}'; known: interleaved-zb, "
                    "zb-v, dualpipe-v")
