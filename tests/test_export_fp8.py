"""FP8 plans exported and imported back (issue 28): Megatron --fp8-format/--fp8-recipe, torchtitan's
float8 / mx converters, torchrun (the plan itself); DeepSpeed and Megatron's missing rowwise recipe
refused in one line."""
from __future__ import annotations

import pytest

from autopar.export import RUNTIMES, export_plan, import_config, with_runtime
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from tests.export_plans import ctx_for, split

PLANS = [Plan(dp=8, zero=3, precision="fp8", stages=split(8)),
         Plan(dp=2, tp=2, zero=2, sequence_parallel=True, precision="fp8-rowwise", stages=split(8)),
         Plan(dp=4, tp=2, zero=1, sequence_parallel=True, precision="fp8", stages=split(8)),
         Plan(dp=2, pp=2, tp=2, zero=1, sequence_parallel=True, precision="mxfp8", stages=split(4, 4))]


def round_trip(plan, target):
    ctx = ctx_for(plan)
    exported = export_plan(plan, target, ctx)
    return exported, import_config(target, exported.text, ctx).plan


@pytest.mark.parametrize("target,plan", [("megatron", PLANS[2]), ("megatron", PLANS[3]),
                                         ("torchtitan", PLANS[0]), ("torchtitan", PLANS[1]),
                                         ("torchrun", PLANS[0]), ("torchrun", PLANS[3])])
def test_fp8_export_then_import_is_the_identity(target, plan):
    exported, back = round_trip(plan, target)
    assert back == with_runtime(plan, RUNTIMES[target])
    if target == "megatron":
        assert "--fp8-recipe" in exported.text
    if target == "torchtitan" and plan.precision == "fp8":
        assert "enable_fsdp_float8_all_gather = true" in exported.text and '"output"' in exported.text


@pytest.mark.parametrize("target,plan", [("deepspeed", Plan(dp=8, precision="fp8", stages=split(8))),
                                         ("megatron", PLANS[1].with_(zero=1))])
def test_fp8_a_target_cannot_state_is_refused_in_one_line(target, plan):
    with pytest.raises(PlanError) as e:
        export_plan(plan, target, ctx_for(plan))
    msg = str(e.value)
    assert "\n" not in msg and "plan field 'precision'" in msg and "nearest exportable plan" in msg


def test_megatron_import_refuses_an_unplanned_recipe():
    plan = PLANS[2]
    text = export_plan(plan, "megatron", ctx_for(plan)).text.replace("delayed", "blockwise")
    with pytest.raises(PlanError, match="blockwise"):
        import_config("megatron", text, ctx_for(plan))
