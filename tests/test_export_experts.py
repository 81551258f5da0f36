"""Expert-parallel plans through the exporters: Megatron writes --num-experts / --moe-router-topk
/ --expert-model-parallel-size / --expert-tensor-parallel-size / --moe-grouped-gemm for a ``moe``
model, torchtitan expert_parallel_degree; both read them back to the same plan (export → import
is the identity); DeepSpeed refuses in one line."""
from __future__ import annotations

import pytest

from autopar.export import RUNTIMES, context_for, export_plan, import_config, with_runtime
from autopar.export.stages import stages_from_counts
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

MODEL = ("moe:layers=8,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=64,experts=8,top_k=2,"
         "expert_ffn=32,shared_experts=1,dense_layers=1")
ROWS = 10


def ctx_for(plan: Plan):
    return context_for(MODEL, gpus=plan.world_size, global_batch=64, gpus_per_node=8)


def split(*counts):
    return stages_from_counts(list(counts), ROWS, "test")


EP_PLANS = {
    "megatron": [Plan(dp=8, ep=8, zero=1, stages=split(8)),
                 Plan(dp=4, tp=2, ep=2, etp=1, sequence_parallel=True, zero=1, stages=split(8)),
                 Plan(dp=4, tp=2, pp=2, ep=4, etp=2, sequence_parallel=True, stages=split(4, 4))],
    "torchtitan": [Plan(dp=8, ep=4, zero=2, stages=split(8)),
                   Plan(dp=4, tp=2, ep=2, etp=2, sequence_parallel=True, zero=3, stages=split(8))],
}


@pytest.mark.parametrize("target, plan", [(t, p) for t, ps in EP_PLANS.items() for p in ps],
                         ids=lambda x: x if isinstance(x, str) else x.label())
def test_ep_plans_round_trip(target, plan):
    exported = export_plan(plan, target, ctx_for(plan))
    if target == "megatron":
        for flag in ("--num-experts 8", "--moe-router-topk 2", f"--expert-model-parallel-size {plan.ep}",
                     f"--expert-tensor-parallel-size {plan.etp}", "--moe-grouped-gemm",
                     "--moe-shared-expert-intermediate-size 32", "--moe-layer-freq"):
            assert flag in exported.text, flag
    else:
        assert f"expert_parallel_degree = {plan.ep}" in exported.text
    back = import_config(target, exported.text, ctx_for(plan)).plan
    assert back == with_runtime(plan, RUNTIMES[target])


def test_megatron_reads_expert_tp_as_tp_when_not_given():
    """Megatron's --expert-tensor-parallel-size defaults to tp (not autopar's 1)."""
    plan = Plan(dp=4, tp=2, ep=2, etp=1, sequence_parallel=True, zero=1, stages=split(8))
    text = export_plan(plan, "megatron", ctx_for(plan)).text.replace("--expert-tensor-parallel-size 1", "")
    assert import_config("megatron", text, ctx_for(plan)).plan.etp == 2


@pytest.mark.parametrize("target, plan, field", [
    ("deepspeed", Plan(dp=8, ep=2, zero=1, stages=split(8)), "ep"),
    # torchtitan runs etp 1 or tp only (its etp 1 takes ep ranks from tp: tests/test_plan_ep_from_tp.py)
    ("torchtitan", Plan(dp=2, tp=4, ep=2, etp=2, sequence_parallel=True, zero=2, stages=split(8)), "etp"),
])
def test_unstatable_ep_plans_refused_in_one_line(target, plan, field):
    with pytest.raises(PlanError) as e:
        export_plan(plan, target, ctx_for(plan))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"cannot export to {target}: plan field '{field}'")
