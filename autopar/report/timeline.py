"""Pipeline timelines for the report: which plan gets one, each stage's per-micro-batch times,
and a check that the simulated bubble agrees with the estimate's.

The schedules themselves (the order of forward / backward passes per rank, and when each runs)
are ``costmodels.model.schedule_sim``'s — see its docstring; ``Op``, ``Timeline``, ``simulate``,
``stage_order`` and ``warmup`` are re-exported from there.
"""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES
from costmodels.model.schedule_sim import Op, Timeline, simulate, stage_order, warmup  # noqa: F401  (re-exported)

MAX_BLOCKS = 4000  # operations drawn at most per timeline (keeps the SVG light)


def drawn_micro_batches(schedule: str, pp: int, vpp: int, m: int) -> int:
    """How many micro-batches to draw: all of them when few, else enough for warm-up, a steady
    state and the drain (2·pp, at least 8), fewer when that would exceed MAX_BLOCKS blocks."""
    cap = max(2 * pp, 8)
    if 2 * pp * vpp * cap > MAX_BLOCKS:
        cap = max(pp, MAX_BLOCKS // (2 * pp * vpp))
    if m <= cap:
        return m
    if schedule in ("interleaved-1f1b", "interleaved-zb"):   # whole groups / rounds of pp
        cap = max(pp, cap // pp * pp)
    return cap


def stage_times(stages_detail: list[dict], pp: int, vpp: int) -> tuple[list[list[float]], list[list[float]]]:
    """Per-rank, per-chunk forward and backward seconds from an estimate's ``stages_detail``
    (``fwd_s`` / ``bwd_s`` are a number, or a list with one entry per virtual chunk)."""
    if len(stages_detail) != pp:
        raise PlanError(f"'stages_detail' has {len(stages_detail)} entries but pp = {pp}")
    fwd, bwd = [], []
    for s in sorted(stages_detail, key=lambda s: s.get("stage", 0)):
        row = []
        for key in ("fwd_s", "bwd_s"):
            v = s.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                vals = [float(v) / vpp] * vpp   # one number for the rank: split over its chunks
            elif isinstance(v, (list, tuple)) and len(v) == vpp and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                vals = [float(x) for x in v]
            else:
                raise PlanError(f"'stages_detail' stage {s.get('stage')}: '{key}'={v!r} must be a "
                                f"number or a list of {vpp} numbers (one per virtual chunk)")
            row.append(vals)
        fwd.append(row[0])
        bwd.append(row[1])
    return fwd, bwd


def weight_times(stages_detail: list[dict], pp: int, vpp: int) -> list[list[float]] | None:
    """Per-rank, per-chunk weight-gradient seconds (``bwd_w_s``, the W part of ``bwd_s``) of a
    split-backward schedule's estimate, or None when the input has none (an older file: the
    timeline then draws each backward whole)."""
    out = []
    for s in sorted(stages_detail, key=lambda s: s.get("stage", 0)):
        v = s.get("bwd_w_s")
        if v is None:
            return None
        if not (isinstance(v, (list, tuple)) and len(v) == vpp and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in v)):
            raise PlanError(f"'stages_detail' stage {s.get('stage')}: 'bwd_w_s'={v!r} must be a list of "
                            f"{vpp} non-negative numbers (one per virtual chunk)")
        out.append([float(x) for x in v])
    return out


def timeline_for(record) -> Timeline | None:
    """The drawn timeline of one report plan, or None when it carries no ``stages_detail``."""
    p = record.plan
    detail = record.get("stages_detail")
    if not detail:
        return None
    fwd, bwd = stage_times(detail, p.pp, p.vpp)
    m_total = int(record.get("num_micro_batches") or p.num_micro_batches(int(record["global_batch"])))
    m = drawn_micro_batches(p.schedule, p.pp, p.vpp, m_total)
    return simulate(p.schedule, p.pp, p.vpp, m, fwd, bwd, total_micro_batches=m_total,
                    wgt=_wgt(p, detail))


def _wgt(plan, detail):
    return weight_times(detail, plan.pp, plan.vpp) if plan.schedule in SPLIT_BACKWARD_SCHEDULES else None


MAX_CHECK_OPS = 400_000  # full-step simulations larger than this are skipped


@dataclass
class ScheduleCheck:
    """The whole step's schedule simulated with the estimate's per-chunk times, against the
    estimate's own bubble term (the cost model's closed form takes the slowest chunk of each chunk
    column; chunks that change size from column to column stall the interleaved schedule in ways
    that form does not see)."""
    micro_batches: int
    simulated_s: float          # makespan of all micro-batches through the schedule
    busiest_rank_s: float       # the busiest rank's own work
    estimated_bubble_s: float
    step_time_s: float

    @property
    def simulated_bubble_s(self) -> float:
        return self.simulated_s - self.busiest_rank_s

    @property
    def extra_s(self) -> float:
        return self.simulated_bubble_s - self.estimated_bubble_s

    @property
    def simulated_step_s(self) -> float:
        return self.step_time_s + max(0.0, self.extra_s)

    @property
    def flagged(self) -> bool:
        """The simulated bubble exceeds the estimate's by more than 1% of the step."""
        return self.extra_s > 0.01 * self.step_time_s


def schedule_check(record) -> ScheduleCheck | None:
    p = record.plan
    detail = record.get("stages_detail")
    bd = record.get("breakdown_s") or {}
    if not detail or p.pp < 2 or "bubble" not in bd:
        return None
    m = int(record.get("num_micro_batches") or p.num_micro_batches(int(record["global_batch"])))
    if 3 * m * p.pp * p.vpp > MAX_CHECK_OPS:
        return None
    fwd, bwd = stage_times(detail, p.pp, p.vpp)
    t = simulate(p.schedule, p.pp, p.vpp, m, fwd, bwd, wgt=_wgt(p, detail))
    busiest = max(m * sum(fwd[r][c] + bwd[r][c] for c in range(p.vpp)) for r in range(p.pp))
    return ScheduleCheck(m, t.makespan, busiest, float(bd["bubble"]), float(record["step_time_s"]))
