"""Expert parallelism that takes ranks from tp (issue 27, Megatron-core's rule): the plan contract
lets ``ep·etp`` divide ``dp·cp·tp`` (DeepSeek-V3 at tp 2, etp 1, ep 64 over dp 32), the cost model
places that ep group innermost over the freed tp ranks and shards the expert states over the
expert-dp group ``dp·cp·(tp/etp)/ep``, the search offers such ep to the runtimes whose expert
mesh spans tp (megatron, fsdp, autopar) and prices them as ``estimate`` does, Megatron and
torchtitan round-trip them, and deepspeed's runtime refuses them in one line."""
from __future__ import annotations

import pytest

from autopar.export import RUNTIMES, context_for, export_plan, import_config, with_runtime
from autopar.export.stages import stages_from_counts
from autopar.search.costs import Costs
from autopar.search.engine import run_search
from autopar.search.space import Shape, configurations
from costmodels.calibration.moe_tables import moe_table
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.runnable import ModelDims, check_runnable
from costmodels.model.estimate import estimate
from costmodels.model.experts import ep_span, expert_state_bytes, expert_zero_group
from costmodels.model.memory import model_state_bytes
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime
from costmodels.profiles.runtime_rules import expert_mesh_rule

H100 = load_profile("h100-80g-sxm")
MODEL = ("moe:layers=8,hidden=64,heads=4,kv_heads=2,ffn=128,vocab=256,seq=64,experts=8,top_k=2,"
         "expert_ffn=32,shared_experts=1,dense_layers=1")


def table(layers=4):
    return moe_table(layers, 1024, 16, 4, 2816, 32000, 2048, experts=16, top_k=2, expert_ffn=512,
                     shared=1, dense_layers=1)


def test_contract_takes_ep_times_etp_from_dp_cp_tp():
    p = Plan(dp=32, tp=2, pp=8, ep=64, etp=1, sequence_parallel=True, runtime="megatron")
    assert Plan.from_dict(p.to_dict()) == p and p.to_dict()["ep"] == 64 and "etp" not in p.to_dict()
    assert Plan(dp=2, cp=2, tp=2, ep=8).ep == 8                       # cp ranks count too
    # a plan without experts serialises exactly as before the axes existed
    assert set(Plan(dp=4, tp=2).to_dict()) == {"dp", "tp", "pp", "vpp", "micro_batch_size", "zero",
                                               "recompute", "sequence_parallel", "schedule",
                                               "attention", "stages", "placement", "runtime", "version"}
    for kw, words in ((dict(dp=32, tp=2, ep=64, etp=2), ["'ep'=64 times 'etp'=2", "dp·cp·tp = 32·1·2 = 64",
                                                         "choose ep dividing dp·cp·tp/etp = 32"]),
                      (dict(dp=4, tp=2, ep=16), ["dp·cp·tp = 4·1·2 = 8", "= 8"]),
                      (dict(dp=4, tp=4, etp=3), ["'etp'=3 must divide tp=4"])):
        with pytest.raises(PlanError) as e:
            Plan(**kw)
        assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_only_runtimes_whose_expert_mesh_spans_tp_run_it():
    p = Plan(dp=4, tp=2, ep=8, sequence_parallel=True, zero=1)
    assert expert_mesh_rule(load_runtime("megatron"), p) is None
    assert expert_mesh_rule(load_runtime("fsdp"), p) is None
    assert expert_mesh_rule(load_runtime("megatron"), Plan(dp=4, ep=4)) is None   # within dp: unchanged
    assert expert_mesh_rule(load_runtime("autopar"), p) is None   # its expert mesh spans tp too
    why = expert_mesh_rule(load_runtime("deepspeed"), p)
    assert why and "ep=8 does not divide dp·cp = 4" in why and "runtime megatron or fsdp" in why
    with pytest.raises(PlanError) as e:                                  # estimate: one line
        estimate(table(), H100, p.with_(runtime="deepspeed"), 8, 16)
    assert "\n" not in str(e.value) and "takes the ep ranks from dp·cp only" in str(e.value)
    # autopar's own runtime runs it (tests/test_runtime_experts_over_tp.py), but not etp > 1
    check_runnable(p, ModelDims(rows=6, heads=16, kv_heads=4, seq=2048, experts=16), 4)
    with pytest.raises(PlanError) as e:
        check_runnable(p.with_(ep=4, etp=2), ModelDims(rows=6, heads=16, kv_heads=4, seq=2048, experts=16), 4)
    assert "\n" not in str(e.value) and "'etp'=2" in str(e.value)


def test_ep_group_and_expert_states_over_the_freed_tp_ranks():
    """Megatron's expert mesh at etp 1: ep consecutive ranks (the tp pairs first), the expert-dp
    group dp·cp·(tp/etp)/ep; the expert states on a GPU are those of the dp-only plan with the
    same ep shard, the dense ones tp-sharded."""
    one_node = Plan(dp=4, tp=2, ep=8, sequence_parallel=True, zero=1, runtime="megatron")
    two_nodes = Plan(dp=8, tp=2, ep=16, sequence_parallel=True, zero=1, runtime="megatron")
    assert ep_span(one_node, 8) == (8, 1) and ep_span(two_nodes, 8) == (8, 2)
    assert expert_zero_group(one_node) == 1 and expert_zero_group(one_node.with_(dp=8)) == 2
    t = table()
    arr = table_arrays(t)
    got = expert_state_bytes(arr, one_node, "bf16-mixed")
    rt = load_runtime("megatron")
    from costmodels.model.allocator import optimizer_share
    share = optimizer_share(rt, "bf16-mixed")
    ex = arr.params * 0
    for i, r in enumerate(t.rows):
        ex[i] = getattr(r, "expert_params", 0) or 0
    p, g, o = model_state_bytes(1.0, 4, 1, "bf16-mixed")       # dense: ZeRO-1 over dp 4
    pe, ge, oe = model_state_bytes(1.0, 1, 1, "bf16-mixed")    # experts: expert-dp 1, unsharded
    want = (arr.params - ex) / 2 * (p + g + o * share) + ex / 8 * (pe + ge + oe * share)
    assert got == pytest.approx(want, rel=1e-12)
    for plan, gpus, tier in ((one_node, 8, "intra_node"), (two_nodes, 16, "inter_node")):
        ep = [c for c in estimate(t, H100, plan, gpus, 2 * plan.dp).comm if c["kind"] == "ep"]
        assert len(ep) == 1 and ep[0]["group_size"] == plan.ep and ep[0]["tier"] == tier


def test_search_offers_ep_over_tp_and_prices_it_as_estimate():
    t = table()
    fix = {"tp": 2, "precision": "bf16", "micro_batch_size": 1, "sequence_parallel": True}
    meg = list(configurations(Shape.of(t), 4, 8, 8, {**fix, "runtime": "megatron"}))
    own = list(configurations(Shape.of(t), 4, 8, 8, fix))
    assert any(c.ep > c.dp * c.cp for c in meg) and {c.ep for c in meg} == {1, 2, 4}
    assert any(c.ep > c.dp * c.cp for c in own) and {c.ep for c in own} == {1, 2, 4}   # autopar's too
    costs = Costs(t, H100, 8)
    res = run_search(costs, gpus=4, global_batch=8, top=1, time_limit_s=60,
                     fix={**fix, "runtime": "megatron", "ep": 4, "etp": 1, "pp": 1, "zero": 1})
    best = res.plans[0]
    plan = best.plan
    assert plan.ep == 4 and plan.dp == 2 and plan.tp == 2 and res.optimal
    step = estimate(t, H100, plan, 4, 8).step_time_s
    print(best.solver_objective_s, step, best.prediction["step_time_s"])
    assert best.solver_objective_s == pytest.approx(step, rel=1e-6)
    assert best.prediction["step_time_s"] == pytest.approx(step, rel=1e-12)


def split(*counts):
    return stages_from_counts(list(counts), 10, "test")


@pytest.mark.parametrize("target, plan", [
    ("megatron", Plan(dp=2, tp=2, ep=4, etp=1, sequence_parallel=True, zero=1, stages=split(8))),
    ("megatron", Plan(dp=2, tp=2, pp=2, ep=4, etp=1, sequence_parallel=True, stages=split(4, 4))),
    ("torchtitan", Plan(dp=2, tp=2, ep=4, etp=1, sequence_parallel=True, zero=2, stages=split(8))),
], ids=lambda x: x if isinstance(x, str) else x.label())
def test_export_import_round_trip(target, plan):
    ctx = context_for(MODEL, gpus=plan.world_size, global_batch=64, gpus_per_node=8)
    text = export_plan(plan, target, ctx).text
    if target == "megatron":
        assert "--expert-model-parallel-size 4" in text and "--expert-tensor-parallel-size 1" in text
    else:
        assert "expert_parallel_degree = 4" in text and "expert_tensor_parallel_degree = 1" in text
    assert import_config(target, text, ctx).plan == with_runtime(plan, RUNTIMES[target])


def test_torchtitan_refuses_an_expert_mesh_wider_than_its_shard_group():
    """torchtitan's efsdp = dp_shard·cp·tp/(etp·ep): under HSDP ep·etp must divide dp_shard·cp·tp."""
    plan = Plan(dp=4, tp=2, ep=8, etp=1, sequence_parallel=True, zero=3, dp_shard=2, stages=split(8))
    ctx = context_for(MODEL, gpus=plan.world_size, global_batch=64, gpus_per_node=8)
    with pytest.raises(PlanError) as e:
        export_plan(plan, "torchtitan", ctx)
    assert "\n" not in str(e.value) and "plan field 'ep'" in str(e.value) and "dp_shard·cp·tp = 4" in str(e.value)
