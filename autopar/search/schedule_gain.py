"""What a plan's zero-bubble schedule bought: its bubble next to interleaved 1F1B's for the same
configuration, for ``autopar search``'s table, the plans file and ``autopar explain``.

Why a counterfactual and not the runners-up: the runner-up with interleaved 1F1B usually differs
in more than the schedule (another vpp, micro-batch size or ZeRO stage, because the zero-bubble
schedules hold more in flight), so its gap mixes several causes. Re-planning the *same*
configuration — degrees, vpp, micro-batch, ZeRO, recompute — under interleaved 1F1B isolates the
schedule. Its split points are re-optimised (one CP-SAT solve of the split program, a fraction
of a second): the V schedules' stages are cut for their placement (rank r holds stages r and
2·pp − 1 − r), and the same cuts placed as interleaved 1F1B places them (stage v on rank
v mod pp) would charge 1F1B for a mismatch, not for its schedule. Written to each plan's
prediction as ``schedule_gain``::

    {"schedule": "interleaved-1f1b", "vpp": 2, "bubble_s": …, "step_time_s": …, "stages": […]}

None where interleaved 1F1B cannot run the configuration (micro-batches not a multiple of pp,
or no split fits the memory) or the plan's schedule does not split the backward.
"""
from __future__ import annotations

import dataclasses

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES

BASELINE = "interleaved-1f1b"


def schedule_gain(costs, config, time_limit_s: float = 2.0) -> dict | None:
    """``config`` (a search ``Config``) under interleaved 1F1B with its best split, scored
    (module docstring), or None."""
    if config.schedule not in SPLIT_BACKWARD_SCHEDULES or config.pp < 2:
        return None
    from autopar.search.split_model import SplitModel
    base = dataclasses.replace(config, schedule=BASELINE)
    if costs.m(base) % base.pp:        # Megatron's groups of pp micro-batches
        return None
    try:
        res = SplitModel(costs.terms(base), time_limit_s=time_limit_s).solve()
        if res.stages is None:
            return None
        other = costs.evaluate(base.plan(res.stages))
    except PlanError:
        return None
    return {"schedule": BASELINE, "vpp": base.vpp, "bubble_s": other["breakdown_s"]["bubble"],
            "step_time_s": other["step_time_s"], "stages": [list(x) for x in res.stages]}


def gain_text(pred: dict) -> str | None:
    """One line: the plan's bubble, and interleaved 1F1B's on the same split."""
    g = pred.get("schedule_gain")
    bd = pred.get("breakdown_s") or {}
    if not g or "bubble" not in bd:
        return None
    step = float(pred["step_time_s"])
    own, base = float(bd["bubble"]), float(g["bubble_s"])
    return (f"{pred['schedule']}: bubble {own:.3g} s ({own / step:.1%} of the step); the same configuration "
            f"under {g['schedule']} (its own best split) would idle {base:.3g} s "
            f"({base / float(g['step_time_s']):.1%}), step {float(g['step_time_s']):.4g} s "
            f"({float(g['step_time_s']) - step:+.3g} s)")
