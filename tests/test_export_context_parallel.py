"""Export then import is the identity for context-parallel and HSDP plans (Megatron-LM's
--context-parallel-size / --cp-comm-type / --num-distributed-optimizer-instances, torchtitan's
context_parallel_degree and replicate × shard degrees); DeepSpeed refuses them in one line."""
from __future__ import annotations

import pytest

from autopar.export import export_plan, import_config
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from tests.export_plans import ctx_for, split


def round_trip(plan: Plan, target: str) -> Plan:
    exported = export_plan(plan, target, ctx_for(plan))
    return exported, import_config(target, exported.text, ctx_for(plan)).plan


@pytest.mark.parametrize("plan", [
    Plan(dp=2, cp=4, zero=1, stages=split(8), runtime="megatron"),
    Plan(dp=2, cp=2, tp=2, pp=2, sequence_parallel=True, zero=1, stages=split(4, 4), runtime="megatron"),
    Plan(dp=4, cp=2, zero=1, stages=split(8), runtime="megatron:cp_all_gather"),
    Plan(dp=8, zero=1, dp_shard=4, stages=split(8), runtime="megatron"),
    Plan(dp=4, cp=2, zero=1, dp_shard=2, placement="tp,pp,dp", stages=split(8), runtime="megatron"),
], ids=lambda p: p.label())
def test_megatron_round_trip(plan):
    exported, back = round_trip(plan, "megatron")
    if plan.cp > 1:
        assert f"--context-parallel-size {plan.cp}" in exported.text
    assert back == plan


@pytest.mark.parametrize("plan", [
    Plan(dp=4, cp=2, zero=2, stages=split(8), runtime="fsdp"),
    Plan(dp=2, cp=2, tp=2, sequence_parallel=True, zero=3, stages=split(8), runtime="fsdp:cp_alltoall"),
    Plan(dp=8, zero=3, dp_shard=2, stages=split(8), runtime="fsdp"),
    Plan(dp=4, cp=2, zero=2, dp_shard=2, stages=split(8), runtime="fsdp"),
], ids=lambda p: p.label())
def test_torchtitan_round_trip(plan):
    exported, back = round_trip(plan, "torchtitan")
    if plan.dp_shard:
        assert f"data_parallel_replicate_degree = {plan.replicas}" in exported.text
    assert back == plan


@pytest.mark.parametrize("plan,field", [
    (Plan(dp=4, cp=2, zero=1, stages=split(8)), "cp"),
    (Plan(dp=8, zero=1, dp_shard=4, stages=split(8)), "dp_shard"),
])
def test_deepspeed_refuses_in_one_line(plan, field):
    with pytest.raises(PlanError) as e:
        export_plan(plan, "deepspeed", ctx_for(plan))
    msg = str(e.value)
    assert "\n" not in msg and f"plan field '{field}'" in msg and "nearest exportable plan" in msg


def test_megatron_refuses_ulysses_and_hsdp_beyond_zero1():
    with pytest.raises(PlanError, match="--cp-comm-type a2a"):
        import_config("megatron", "--tensor-model-parallel-size 1 --context-parallel-size 2 "
                      "--cp-comm-type a2a --micro-batch-size 1", ctx_for(Plan(dp=4, cp=2)))
    with pytest.raises(PlanError, match="plan field 'dp_shard'"):
        export_plan(Plan(dp=8, zero=2, dp_shard=4, stages=split(8)), "megatron", ctx_for(Plan(dp=8)))
