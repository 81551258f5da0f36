"""Export then import is the identity for every plan a target can state; every other plan is
refused in one line naming the field and the nearest exportable plan (autopar.export)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autopar.export import RUNTIMES, TARGETS, context_for, export_plan, import_config, problems, with_runtime
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from tests.export_plans import ROWS, SPREAD, ctx_for, split


def round_trip(plan: Plan, target: str) -> Plan:
    ctx = ctx_for(plan)
    exported = export_plan(plan, target, ctx)
    extra = exported.files.get("megatron-deepspeed.sh")
    return import_config(target, exported.text, ctx, megatron_args=extra).plan


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("plan", SPREAD, ids=lambda p: p.label())
def test_round_trip_or_one_line_refusal(plan, target):
    if problems(plan, target, ctx_for(plan)):
        with pytest.raises(PlanError) as e:
            export_plan(plan, target, ctx_for(plan))
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"cannot export to {target}: plan field '")
        assert "nearest exportable plan" in msg or "no nearby plan" in msg
        return
    assert round_trip(plan, target) == with_runtime(plan, RUNTIMES[target])


def test_which_plans_of_the_spread_each_target_states():
    stated = {t: [i for i, p in enumerate(SPREAD) if not problems(p, t, ctx_for(p))] for t in TARGETS}
    assert stated["torchrun"] == list(range(len(SPREAD)))
    # megatron: no ZeRO-2/3 (Megatron-FSDP) with pp, no GPipe, no dp-innermost placement
    assert stated["megatron"] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 15]
    # torchtitan: no ZeRO-1, no DDP beside tp/pp, tp always with sp, SDPA only, tp-dp-pp only
    assert stated["torchtitan"] == [0, 2, 3, 10, 11, 12, 16]
    # deepspeed: even splits only, no virtual stages / GPipe, ZeRO <= 1 with pp, tp-dp-pp only
    assert stated["deepspeed"] == [0, 1, 2, 3, 4, 5, 7, 15]


@pytest.mark.parametrize("target,plan,field,nearest", [
    ("megatron", Plan(dp=2, pp=4, zero=3, stages=split(2, 2, 2, 2)), "zero", "ZeRO-1"),
    ("megatron", Plan(dp=4, pp=2, schedule="gpipe", stages=split(4, 4)), "schedule", "1f1b"),
    ("torchtitan", Plan(dp=8, zero=1, stages=split(8)), "zero", "ZeRO-2"),
    ("torchtitan", Plan(dp=2, tp=4, zero=2, stages=split(8)), "sequence_parallel", "ZeRO-2 sp"),
    ("deepspeed", Plan(dp=2, pp=4, stages=split(1, 3, 3, 1)), "stages", "dp2·tp1·pp4"),
    ("deepspeed", Plan(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b", stages=split(2, 2, 2, 2)), "vpp",
     "dp2·tp1·pp2 mb1 1f1b"),
])
def test_refusal_names_field_and_nearest_plan(target, plan, field, nearest):
    with pytest.raises(PlanError) as e:
        export_plan(plan, target, ctx_for(plan))
    msg = str(e.value)
    assert f"plan field '{field}'" in msg
    assert nearest in msg.split("nearest exportable plan:")[1]


def test_the_nearest_plan_of_a_refusal_exports():
    plan = Plan(dp=2, pp=2, vpp=2, schedule="interleaved-1f1b", zero=3, stages=split(1, 3, 3, 1))
    with pytest.raises(PlanError):
        export_plan(plan, "deepspeed", ctx_for(plan))
    nearest = Plan(dp=2, pp=2, zero=1, stages=split(4, 4))
    assert round_trip(nearest, "deepspeed") == with_runtime(nearest, "deepspeed")


@st.composite
def plans(draw):
    tp, pp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    n = pp * vpp
    cuts = sorted(draw(st.lists(st.integers(1, ROWS - 1), min_size=n - 1, max_size=n - 1, unique=True)))
    bounds = [0, *cuts, ROWS]
    schedule = "interleaved-1f1b" if vpp > 1 else draw(st.sampled_from(["1f1b", "gpipe"]))
    return Plan(dp=draw(st.sampled_from([1, 2, 4])), tp=tp, pp=pp, vpp=vpp,
                micro_batch_size=draw(st.sampled_from([1, 2])), zero=draw(st.integers(0, 3)),
                recompute=draw(st.sampled_from(["none", "selective", "full"])),
                sequence_parallel=tp > 1 and draw(st.booleans()), schedule=schedule,
                attention=draw(st.sampled_from(["flash", "math"])),
                placement=draw(st.sampled_from(["tp,dp,pp", "tp,pp,dp", "dp,tp,pp"])),
                stages=tuple(zip(bounds[:-1], bounds[1:])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans(), target=st.sampled_from(list(TARGETS)))
def test_any_statable_plan_round_trips(plan, target):
    if not problems(plan, target, ctx_for(plan)):
        assert round_trip(plan, target) == with_runtime(plan, RUNTIMES[target])


def test_every_plan_the_search_returns_round_trips_where_the_target_states_it():
    from autopar.search import search
    spec = "gpt:layers=8,hidden=512,heads=8,vocab=8192,seq=512"
    found = []
    for fix in (None, "pp=2", "pp=4", "pp=2,vpp=2", "tp=2,pp=2", "zero=0"):
        result = search(spec, "h100-80g-sxm", 16, 64, fix=fix, top=4, time_limit_s=30)
        found += [r.plan for r in result.plans]
    exported = 0
    for plan in found:
        ctx = context_for(spec, gpus=plan.world_size, global_batch=64, hardware="h100-80g-sxm")
        for target in TARGETS:
            if problems(plan, target, ctx):
                continue
            exp = export_plan(plan, target, ctx)
            back = import_config(target, exp.text, ctx, megatron_args=exp.files.get("megatron-deepspeed.sh"))
            assert back.plan == with_runtime(plan, RUNTIMES[target]), (target, plan.label())
            exported += 1
    # the H100 searches return FP8 plans, which DeepSpeed cannot state (autopar.export.precision_flags)
    fp8 = sum(p.precision != "bf16" for p in found)
    assert len(found) >= 20 and exported >= 2 * len(found) - fp8


def test_plan_without_split_points_exports_the_balanced_split():
    plan = Plan(dp=2, pp=4)
    ctx = ctx_for(plan)
    from autopar.export import resolve_stages
    back = import_config("megatron", export_plan(plan, "megatron", ctx).text, ctx).plan
    assert back == with_runtime(plan.with_(stages=resolve_stages(plan, ctx)), RUNTIMES["megatron"])
