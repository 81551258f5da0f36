"""What a plan's zero-bubble schedule bought: its bubble next to interleaved 1F1B's on the same
split, for ``autopar search``'s table, the plans file and ``autopar explain``.

Why a counterfactual and not the runners-up: the runner-up with interleaved 1F1B usually differs
in more than the schedule (another vpp, micro-batch size or ZeRO stage, because the zero-bubble
schedules hold more in flight), so its gap mixes several causes. Re-scoring the *same* plan — the
same degrees and the same virtual stages, placed as interleaved 1F1B places them (virtual stage v
on rank v mod pp) — isolates the schedule: one ``estimate`` per returned plan, cheap beside the
search. Written to each plan's prediction as ``schedule_gain``::

    {"schedule": "interleaved-1f1b", "vpp": 2, "bubble_s": …, "step_time_s": …, "fits": …}

None where interleaved 1F1B cannot run the plan (micro-batches not a multiple of pp) or the
plan's schedule does not split the backward.
"""
from __future__ import annotations

from costmodels.errors import PlanError
from costmodels.plan import SPLIT_BACKWARD_SCHEDULES

BASELINE = "interleaved-1f1b"


def schedule_gain(costs, plan) -> dict | None:
    """The same plan under interleaved 1F1B, scored (module docstring), or None."""
    if plan.schedule not in SPLIT_BACKWARD_SCHEDULES or plan.pp < 2:
        return None
    try:
        other = costs.evaluate(plan.with_(schedule=BASELINE))
    except PlanError:        # e.g. micro-batches not a multiple of pp: Megatron's groups
        return None
    return {"schedule": BASELINE, "vpp": plan.vpp, "bubble_s": other["breakdown_s"]["bubble"],
            "step_time_s": other["step_time_s"], "fits": other["fits"]}


def gain_text(pred: dict) -> str | None:
    """One line: the plan's bubble, and interleaved 1F1B's on the same split."""
    g = pred.get("schedule_gain")
    bd = pred.get("breakdown_s") or {}
    if not g or "bubble" not in bd:
        return None
    step = float(pred["step_time_s"])
    own, base = float(bd["bubble"]), float(g["bubble_s"])
    return (f"{pred['schedule']}: bubble {own:.3g} s ({own / step:.1%} of the step); the same split under "
            f"{g['schedule']} would idle {base:.3g} s ({base / float(g['step_time_s']):.1%}), "
            f"step {float(g['step_time_s']):.4g} s ({float(g['step_time_s']) - step:+.3g} s)"
            + ("" if g.get("fits", True) else ", and it would not fit"))
