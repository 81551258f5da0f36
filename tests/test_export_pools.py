"""Pooled (heterogeneous) plans in every export: the launch must start each torchrun node rank on
a node of the pool its stages were priced on, so every target's file says which node ranks go
where (as ``costmodels.contracts.plan_pools.gpu_of_rank`` places the ranks) and which GPUs stay idle; a
plan whose nodes would each need two GPU types is refused in one line."""
import re

import pytest

from autopar.export import context_for, export_plan
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.plan_pools import gpu_of_rank, short_name

POOLS = (("h100-80g-sxm", 16), ("a100-80g-sxm", 32))
# what each target can state: torchtitan has no ZeRO-1, DeepSpeed wants even stages of its own
PLANS = {"megatron": Plan(dp=2, tp=4, pp=4, zero=1, sequence_parallel=True, pools=POOLS, stage_pools=(0, 1, 1, 0)),
         "torchrun": Plan(dp=2, tp=4, pp=4, zero=1, sequence_parallel=True, pools=POOLS, stage_pools=(1, 0, 0, 1)),
         "torchtitan": Plan(dp=2, tp=4, pp=4, zero=2, sequence_parallel=True, pools=POOLS, stage_pools=(0, 1, 1, 0)),
         "deepspeed": Plan(dp=2, tp=4, pp=4, zero=1, sequence_parallel=True, pools=POOLS, stage_pools=(0, 0, 1, 1),
                           stages=((0, 9), (9, 17), (17, 25), (25, 34)))}


@pytest.mark.parametrize("target", sorted(PLANS))
def test_every_target_says_which_node_ranks_run_on_which_pool(target):
    plan = PLANS[target]
    ctx = context_for("llama3-8b", gpus=plan.world_size, global_batch=64, hardware="h100-80g-sxm")
    files = export_plan(plan, target, ctx).files
    text = "\n".join(files.values())
    said = {}
    for first, last, name in re.findall(r"node ranks? (\d+)(?:-(\d+))?: (\S+) nodes", text):
        for k in range(int(first), int(last or first) + 1):
            said[k] = name
    nproc = 8
    want = {k: short_name(plan.pools[gpu_of_rank(plan, k * nproc)[0]][0]) for k in range(plan.world_size // nproc)}
    assert said == want
    assert "idle, not launched: 16 GPUs of a100-80g-sxm" in text


@pytest.mark.parametrize("target", sorted(PLANS))
def test_a_node_that_would_need_two_gpu_types_is_refused_in_one_line(target):
    plan = Plan(dp=2, tp=2, pp=4, zero=2 if target == "torchtitan" else 1, sequence_parallel=True,
                pools=(("h100-80g-sxm", 8), ("a100-80g-sxm", 8)), stage_pools=(0, 1, 0, 1),
                stages=((0, 9), (9, 17), (17, 25), (25, 34)) if target == "deepspeed" else None)
    ctx = context_for("llama3-8b", gpus=16, global_batch=64, hardware="h100-80g-sxm")
    with pytest.raises(PlanError) as e:
        export_plan(plan, target, ctx)
    msg = str(e.value)
    assert "\n" not in msg and "'stage_pools'" in msg and "two pools" in msg and "one GPU type" in msg, msg


def test_a_uniform_plan_says_nothing_of_pools():
    plan = Plan(dp=2, tp=4, pp=4, zero=1, sequence_parallel=True)
    ctx = context_for("llama3-8b", gpus=32, global_batch=64, hardware="h100-80g-sxm")
    assert "node rank" not in export_plan(plan, "megatron", ctx).text
