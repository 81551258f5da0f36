"""Expert parallelism in the cost model (costmodels/model/experts.py): the mechanisms, each
checked against its own arithmetic, and the search's integer program still equal to estimate on
ep plans."""
from __future__ import annotations

import dataclasses
import random

import pytest

from autopar.search.costs import Costs
from autopar.search.space import Shape, configurations
from autopar.search.split_model import SplitModel, time_unit
from costmodels.calibration.moe_tables import moe_table
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.runnable import ModelDims, check_runnable
from costmodels.model.estimate import estimate
from costmodels.model.experts import all_to_all_s, ep_span
from costmodels.profiles.hardware_files import load_profile

H100 = load_profile("h100-80g-sxm")
MEGATRON = "megatron"


def table(dense_layers=0, shared=1):
    return moe_table(8, 1024, 16, 4, 2816, 32000, 2048, experts=16, top_k=2, expert_ffn=512,
                     shared=shared, dense_layers=dense_layers)


def test_ep_on_a_dense_model_is_refused():
    """ep shards experts: a table without any is refused in one line."""
    from synthetic_tables import llama_table
    t = llama_table(4, 512, 8, 8, 1536, 1000, 256)
    with pytest.raises(PlanError, match="has none"):
        check_runnable(Plan(dp=4, ep=2, runtime=MEGATRON), ModelDims.of_table(t))


def test_ep_group_span_and_all_to_all_volume():
    # ep carved from dp right outside tp: tp2·ep4 = 8 ranks fill one node; tp2·ep8 spans two
    assert ep_span(Plan(dp=8, tp=2, ep=4), 8) == (4, 1)
    assert ep_span(Plan(dp=8, tp=2, ep=8), 8) == (4, 2)
    v = 1e9
    sent, secs = all_to_all_s(v, Plan(dp=8, tp=2, ep=4), H100)
    assert float(sent) == pytest.approx(v * 3 / 4)                      # (ep − 1)/ep leaves the GPU
    a, b = H100.tier("intra_node").alpha_beta("all_to_all")
    assert float(secs) == pytest.approx(a + v * 3 / 4 / b)
    sent8, secs8 = all_to_all_s(v, Plan(dp=8, tp=2, ep=8), H100)
    a, bn = H100.tier("inter_node").alpha_beta("all_to_all")
    assert float(secs8) == pytest.approx(a + max(v * 3 / 8 / H100.tier("intra_node").alpha_beta("x")[1],
                                                v * 4 / 8 / bn))
    assert float(all_to_all_s(v, Plan(dp=8), H100)[1]) == 0.0           # no ep, no exchange


def test_expert_states_divided_by_ep_and_zero_over_expert_dp():
    t = table()
    expert = sum(r.expert_params for r in t.rows)
    base = estimate(t, H100, Plan(dp=8, zero=1, runtime=MEGATRON), 8, 64).memory_bytes
    ep4 = estimate(t, H100, Plan(dp=8, zero=1, ep=4, runtime=MEGATRON), 8, 64).memory_bytes
    # bf16 weights and grads (2 B each, memory.STATE_BYTES) of 3/4 of the experts leave the GPU; the optimizer
    # (12 B) was already over dp = 8 and is now over dp/ep = 2 of the ep/… shards: unchanged
    assert base["params"] - ep4["params"] == pytest.approx(2 * expert * 3 / 4, rel=1e-9)
    assert base["grads"] - ep4["grads"] == pytest.approx(2 * expert * 3 / 4, rel=1e-9)
    assert base["optimizer"] == pytest.approx(ep4["optimizer"], rel=1e-9)


def test_all_to_alls_priced_and_listed():
    t = table()
    e1 = estimate(t, H100, Plan(dp=8, ep=1, runtime=MEGATRON), 8, 64)
    e4 = estimate(t, H100, Plan(dp=8, ep=4, runtime=MEGATRON), 8, 64)
    ep = [c for c in e4.comm if c["kind"] == "ep"]
    assert not [c for c in e1.comm if c["kind"] == "ep"] and len(ep) == 1
    moe_rows = [r for r in t.rows if r.experts]
    m = e4.num_micro_batches
    per_gpu = sum(r.dispatch_bytes for r in moe_rows) * 3 / 4      # tp = 1, b = b0
    assert ep[0]["bytes_per_gpu"] == pytest.approx(4 * m * per_gpu)  # dispatch + combine, fwd + bwd
    assert ep[0]["group_size"] == 4 and ep[0]["tier"] == "intra_node"


def test_search_objective_equals_estimate_on_ep_plans():
    t = table(shared=1)
    gpus, batch = 32, 128
    costs = Costs(t, H100, batch)
    configs = [c for c in configurations(Shape.of(t), gpus, batch, H100.gpus_per_node,
                                         fix={"runtime": MEGATRON}) if c.ep > 1]
    assert {c.ep for c in configs} >= {2, 4, 8, 16}
    rng = random.Random(3)
    for c in rng.sample(configs, 12):
        n, S = len(t.rows), c.pp * c.vpp
        cuts = sorted(rng.sample(range(1, n), S - 1))
        stages = tuple(zip([0] + cuts, cuts + [n]))
        est = estimate(t, H100, c.plan(stages), gpus, batch)
        terms = costs.terms(c)
        r = SplitModel(dataclasses.replace(terms, hbm=float(2 ** 60)), fixed_stages=stages, exact=True).solve()
        assert r.status == "optimal" and r.stages == stages
        tol = time_unit(terms.time_lower_bound()) * n * 4 * (terms.m + 2)
        assert abs(r.objective_s - est.step_time_s) <= tol, (c, r.objective_s, est.step_time_s)
        assert costs.quick_bound(c) <= est.step_time_s * (1 + 1e-9)
        mem = SplitModel(terms, objective="memory", fixed_stages=stages).solve()
        total = est.memory_bytes["total"]
        assert total - 1 <= mem.objective_s <= total + 4 * n + 8, (c, mem.objective_s, total)


def test_ep_refused_where_it_cannot_run():
    dims = ModelDims.of_table(table())
    with pytest.raises(PlanError, match="does not divide the 16 routed experts"):
        check_runnable(Plan(dp=24, ep=3, runtime=MEGATRON), dims)
    check_runnable(Plan(dp=8, ep=2, recompute="full"), ModelDims())    # experts unknown
    check_runnable(Plan(dp=8, ep=2, zero=3), dims)
    with pytest.raises(PlanError, match="'etp'=2: autopar's own runtime does not run expert tensor"):
        check_runnable(Plan(dp=8, tp=2, ep=2, etp=2), ModelDims())      # experts unknown
    for runs in (Plan(dp=8, ep=2, zero=1), Plan(dp=8, tp=2), Plan(dp=8, tp=2, ep=2, sequence_parallel=True),
                 Plan(dp=8, ep=2, recompute="selective")):             # what it runs
        check_runnable(runs, dims)
    check_runnable(Plan(dp=8, tp=2, ep=2, etp=2, zero=3, runtime=MEGATRON), dims)
    check_runnable(Plan(dp=2, cp=2, ep=4), dims)                     # ep of dp·cp (runtime/step/expert_mesh.py)
    check_runnable(Plan(dp=2, cp=2, ep=4, runtime=MEGATRON), dims)


def test_dispatch_once_per_node_sends_a_token_once_to_each_remote_node():
    """DeepEP's dispatch (runtime option ``deepep``): with ep 8 over 2 nodes and k = 2, a token's
    experts sit on the other node with probability 1 − (1/2)² = 3/4, so 3/4 of one copy crosses
    the NICs instead of k·4/8 = 1 copy."""
    v = 1e9
    plan = Plan(dp=8, tp=2, ep=8)
    sent, _ = all_to_all_s(v, plan, H100)
    once, secs = all_to_all_s(v, plan, H100, top_k=2)
    assert float(sent) == pytest.approx(v * 7 / 8)
    assert float(once) == pytest.approx(v * 3 / 8 + v / 2 * 0.75)
    t = table()
    base = estimate(t, H100, Plan(dp=16, ep=16, runtime="fsdp"), 16, 64)
    deepep = estimate(t, H100, Plan(dp=16, ep=16, runtime="fsdp:deepep"), 16, 64)
    assert deepep.step_time_s < base.step_time_s
    assert [c["bytes_per_gpu"] for c in deepep.comm if c["kind"] == "ep"][0] < \
        [c["bytes_per_gpu"] for c in base.comm if c["kind"] == "ep"][0]
