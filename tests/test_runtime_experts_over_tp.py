"""Expert parallelism over the tp ranks in autopar's own runtime (issue 27: ``ep·etp`` dividing
``dp·cp·tp`` at etp 1, as Megatron-core runs it; ``autopar/runtime/step/expert_mesh.py``).

In the 4-process world of tests/test_runtime_experts.py (``moe_over_tp.CASES``): ep 4 over dp 2 ·
tp 2 (clipped by the serial gradient norm) and ep 2 over tp 2 · pp 2 equal the serial model
(losses of 5 SGD steps within 1e-5 relative, parameters within 1e-4); 3 AdamW steps under
dp2·tp2·ep4 with sequence parallel, ZeRO-1 and selective recompute equal serial training, and
their checkpoint resumes under dp4·ep2 equal to it.
Without processes: the groups (ep consecutive ranks, tp first, where ep does not divide dp·cp; at
one tp coordinate where it does), the runtime rules, the sweep's grid and the cost model's terms
for what the runtime does (the ep group's span; the tp all-gather of the experts' tokens without
sequence parallel)."""
from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest
import test_runtime_experts
from world_prefetch import result

from autopar.runtime.faults.dist import Layout
from autopar.runtime.step import expert_mesh
from autopar.runtime.verify import sweep
from costmodels.calibration.moe_tables import moe_table
from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import plan_row_times
from costmodels.model.comm import collective_time
from costmodels.model.experts import ep_span
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
from moe_over_tp import CASES  # noqa: E402
from train_loop import assert_resumed_equal_serial  # noqa: E402

H100 = load_profile("h100-80g-sxm")


@pytest.fixture(scope="module")
def world():
    return result("test_runtime_experts", test_runtime_experts.PREFETCH_WORLD)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_ep_over_tp_equals_serial(world, case):
    res = world.results[case.name]
    assert res["status"] == "pass", res
    assert res["rel"] <= 1e-5 and res["param_rel"] <= 1e-4, res


@pytest.mark.slow
@pytest.mark.parametrize("resumed", ["dp4ep2"])
def test_an_ep_over_tp_checkpoint_resumes_under_another_plan_equal_to_serial(world, resumed):
    out = world.then
    assert out is not None, world.results
    assert_resumed_equal_serial(out, resumed)


def _layout(plan, rank):
    order, sizes = plan.mesh_order(), plan.mesh_sizes()
    i, coord = rank, {}
    for d in order:
        coord[d], i = i % sizes[d], i // sizes[d]
    return Layout(ranks=tuple(range(plan.world_size)), sizes=sizes, order=order, rank=rank, coord=coord)


@pytest.mark.parametrize("plan, eps, edps", [
    (Plan(dp=2, tp=2, ep=4), [[0, 1, 2, 3]], []),                          # all of dp·tp
    (Plan(dp=2, tp=4, ep=4), [[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (Plan(dp=1, tp=2, pp=2, ep=2), [[0, 1], [2, 3]], []),                  # one group per stage
    (Plan(dp=4, tp=2, ep=2), [[0, 2], [4, 6], [1, 3], [5, 7]],             # ep | dp: at one tp coord
     [[0, 1, 4, 5], [2, 3, 6, 7]]),
], ids=lambda x: x.label() if isinstance(x, Plan) else "")
def test_ep_groups_take_the_tp_ranks_first_only_where_ep_does_not_divide_dp_cp(plan, eps, edps):
    layouts = [_layout(plan, r) for r in range(plan.world_size)]
    got_eps, got_edps = expert_mesh.all_rank_sets(plan, layouts[0])
    assert sorted(got_eps) == sorted(eps) and sorted(got_edps) == sorted(edps)
    for lay in layouts:   # every rank: its group holds every position once, its edp group its own
        mine, edp, j = expert_mesh.expert_groups(plan, lay)
        assert mine[j] == lay.rank and lay.rank in edp and len(edp) * plan.ep == plan.dp * plan.tp
    first = [lay.rank for lay in layouts if expert_mesh.counts_in_norm(plan, lay)]
    assert len(first) == plan.ep * plan.pp    # each expert counted once per stage by clipping


def test_the_sweep_draws_ep_over_tp_plans_the_rules_accept():
    over = [c for c in sweep.expert_grid() if dict(c.plan)["ep"] > dict(c.plan)["dp"]]
    assert {(dict(c.plan)["dp"], dict(c.plan)["tp"], dict(c.plan)["ep"]) for c in over} == {(2, 2, 4), (1, 2, 2)}
    assert all(sweep.rules_accept(c) for c in over)


def test_the_ep_group_is_priced_where_the_runtime_puts_it():
    """ep 8 over dp 4 · tp 2 takes 8 consecutive ranks (one node); ep 8 within dp 8 at tp 2 keeps
    each tp coordinate's group, 2 ranks apart (two nodes), as before."""
    assert ep_span(Plan(dp=4, tp=2, ep=8, sequence_parallel=True), 8) == (8, 1)
    assert ep_span(Plan(dp=8, tp=2, ep=8, sequence_parallel=True), 8) == (4, 2)


def test_tp_without_sp_prices_one_all_gather_of_the_tokens_per_moe_row_and_direction():
    t = moe_table(4, 1024, 16, 4, 2816, 32000, 2048, experts=16, top_k=2, expert_ffn=512, shared=1,
                  dense_layers=1)
    arr = table_arrays(t)
    rt = load_runtime("autopar")
    without = dataclasses.replace(rt, moe_tp_token_gather=0)
    plan = Plan(dp=2, tp=2, ep=4)
    a, b = plan_row_times(arr, H100, plan, "bf16-mixed", rt), plan_row_times(arr, H100, plan, "bf16-mixed", without)
    moe = np.array([r.experts > 0 for r in t.rows])
    _, ag = collective_time("all_gather", arr.tp_comm_bytes.astype(float), 2, H100.group_link(plan, "tp"))
    assert moe.any() and np.allclose((a.tp_fwd_s - b.tp_fwd_s)[moe], ag[moe], rtol=1e-9)
    assert np.allclose((a.tp_bwd_s - b.tp_bwd_s)[moe], ag[moe], rtol=1e-9)
    assert np.all((a.tp_fwd_s - b.tp_fwd_s)[~moe] == 0)
    sp = plan.with_(sequence_parallel=True)   # the sequence shard is dispatched as it is
    assert np.array_equal(plan_row_times(arr, H100, sp, "bf16-mixed", rt).tp_fwd_s,
                          plan_row_times(arr, H100, sp, "bf16-mixed", without).tp_fwd_s)


def test_the_search_offers_ep_over_tp_to_autopar_and_prices_it_as_estimate():
    from autopar.search.costs import Costs
    from autopar.search.engine import run_search
    from costmodels.model.estimate import estimate
    t = moe_table(4, 1024, 16, 4, 2816, 32000, 2048, experts=16, top_k=2, expert_ffn=512, shared=1,
                  dense_layers=1)
    fix = {"tp": 2, "precision": "bf16", "micro_batch_size": 1, "sequence_parallel": False,
           "ep": 4, "etp": 1, "pp": 1, "zero": 1}   # runtime: autopar's own (the default)
    res = run_search(Costs(t, H100, 8), gpus=4, global_batch=8, top=1, time_limit_s=60, fix=fix)
    best = res.plans[0]
    assert best.plan.ep == 4 and best.plan.dp == 2 and best.plan.runtime in (None, "autopar") and res.optimal
    step = estimate(t, H100, best.plan, 4, 8).step_time_s
    assert best.solver_objective_s == pytest.approx(step, rel=1e-6)
    assert best.prediction["step_time_s"] == pytest.approx(step, rel=1e-12)
