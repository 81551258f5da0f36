"""``costmodels.contracts.runnable``: each rule the runtime refuses a plan by, in one line naming the field
and the fix; what it accepts at the boundary runs (tests/test_runtime_parallel.py runs m = pp and
odd counts). Torch-free."""
from __future__ import annotations

import pytest

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.runnable import ModelDims, check_runnable

GPT = ModelDims(rows=6, heads=4, kv_heads=4, ffn=256, seq=16)
GQA = ModelDims(rows=5, heads=6, kv_heads=2, ffn=96, seq=12)
TIED = ModelDims(rows=6, heads=4, kv_heads=4, ffn=256, seq=16, tied_ends=True)

REFUSED = [   # (plan, dims, micro-batches, words the line must hold)
    (dict(pp=2, schedule="1f1b"), GPT, 1, ["'1f1b'", "pp=2", "gets 1", "gpipe"]),
    (dict(pp=4, schedule="1f1b"), GPT, 3, ["'1f1b'", "pp=4", "gets 3"]),
    (dict(pp=2, vpp=2, schedule="interleaved-1f1b"), GPT, 3, ["'interleaved-1f1b'", "multiple of pp"]),
    (dict(pp=2, vpp=2, schedule="interleaved-1f1b"), GPT, 1, ["'interleaved-1f1b'", "gets 1"]),
    (dict(tp=3), GPT, 2, ["'tp'=3", "heads=4", "[1, 2, 4]"]),
    (dict(tp=3), GQA, 2, ["'tp'=3", "kv_heads=2"]),
    (dict(tp=4), ModelDims(heads=4, kv_heads=4, ffn=6), 2, ["'tp'=4", "ffn=6"]),
    (dict(tp=2, sequence_parallel=True), ModelDims(heads=6, kv_heads=2, seq=9), 2,
     ["'sequence_parallel'", "9 tokens"]),
    (dict(pp=4, vpp=2, schedule="interleaved-1f1b"), GPT, 8, ["'pp'·'vpp'", "only 6"]),
    (dict(pp=2, stages=[[0, 2], [2, 5]]), GPT, 2, ["'stages'", "6 rows"]),
    (dict(pp=2, vpp=2, schedule="dualpipe-v"), GPT, 3, ["'dualpipe-v'", "2·pp = 4", "gets 3", "zb-v"]),
    (dict(pp=4, vpp=2, schedule="interleaved-zb"), ModelDims(rows=10), 9, ["'interleaved-zb'", "rounds"]),
    (dict(dp=2, pp=2, vpp=2, schedule="interleaved-zb", zero=3), GPT, 4, ["'interleaved-zb'", "zero=2"]),
    (dict(dp=2, pp=2, vpp=2, schedule="zb-v", zero=2), TIED, 4, ["'zero'=2", "ties", "zero=1"]),
]
ACCEPTED_SPLIT = [   # split-backward schedules at their boundaries (run on gloo in test_runtime_parallel)
    (dict(pp=2, vpp=2, schedule="dualpipe-v"), GPT, 4),
    (dict(pp=2, vpp=2, schedule="zb-v"), GPT, 1),                       # any count
    (dict(pp=2, schedule="interleaved-zb"), GPT, 3),                    # one stage per rank
    (dict(dp=2, pp=2, vpp=2, schedule="zb-v", zero=2), GPT, 4),          # untied
    (dict(dp=2, pp=2, vpp=2, schedule="interleaved-zb", zero=2), TIED, 4),  # loop: ends apart
    (dict(dp=2, pp=2, vpp=2, schedule="zb-v", zero=1), TIED, 4),
    (dict(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b", zero=3), GPT, 4),
]
ACCEPTED = [
    (dict(pp=2, schedule="1f1b"), GPT, 2),          # m = pp: torch's smallest 1F1B
    (dict(pp=4, schedule="gpipe"), GPT, 1),         # GPipe runs any count
    (dict(pp=2, vpp=2, schedule="interleaved-1f1b"), GPT, 4),
    (dict(tp=2, sequence_parallel=True), GQA, 3),
    (dict(tp=3), ModelDims(), 2),                   # sizes unknown: nothing to check
    (dict(pp=2, schedule="1f1b"), GPT, None),       # count unknown (apply without global_batch)
] + ACCEPTED_SPLIT


@pytest.mark.parametrize("plan,dims,m,words", REFUSED, ids=range(len(REFUSED)))
def test_a_refused_plan_gets_one_line_naming_the_field_and_the_fix(plan, dims, m, words):
    with pytest.raises(PlanError) as e:
        check_runnable(Plan.from_dict(plan), dims, m)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("plan,dims,m", ACCEPTED, ids=range(len(ACCEPTED)))
def test_plans_at_the_boundary_are_accepted(plan, dims, m):
    check_runnable(Plan.from_dict(plan), dims, m)


@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("schedule,vpp", [("interleaved-1f1b", 3), ("interleaved-zb", 2),
                                          ("zb-v", 2), ("dualpipe-v", 2)])
def test_each_virtual_stage_runs_on_exactly_one_rank(schedule, vpp, pp):
    """``stages_of_rank`` / ``rank_of_stage``: one the inverse of the other, every stage placed
    once; a V puts stage r and 2·pp−1−r on rank r (so the last rank holds the middle two),
    a loop puts stage v on rank v % pp (torch's generate_stage_to_rank_mapping)."""
    from costmodels.contracts.plan import rank_of_stage
    plan = Plan(pp=pp, vpp=vpp, schedule=schedule)
    placed = sorted(v for r in range(pp) for v in plan.stages_of_rank(r))
    assert placed == list(range(pp * vpp))
    for r in range(pp):
        assert all(rank_of_stage(plan, v) == r for v in plan.stages_of_rank(r))
    if schedule in ("zb-v", "dualpipe-v"):
        assert plan.stages_of_rank(0) == (0, 2 * pp - 1)
        assert plan.stages_of_rank(pp - 1) == (pp - 1, pp)
    else:
        assert plan.stages_of_rank(1) == tuple(range(1, pp * vpp, pp))
