"""row_coefficients: the per-row and per-parameter terms of a configuration are the formulas of
the comm / compute / memory docstrings, and exactly what estimate's chunks add up."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from synthetic_tables import gpt3_175b, gpt_table, no_torch_pipelining_runtime

from costmodels.contracts.plan import Plan
from costmodels.model.checks import check_plan
from costmodels.model.coefficients import dp_sync, dp_sync_line, row_coefficients
from costmodels.model.comm import collective_steps, collective_time, plan_tiers
from costmodels.model.compute import row_times
from costmodels.model.estimate import chunk_cost
from costmodels.model.memory import activation_bytes
from costmodels.model.optimizer import optimizer_step_s
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile

A100 = load_profile("a100-80g-sxm")


@pytest.mark.parametrize("plan,gpus,batch", [
    (Plan(dp=4, tp=2, pp=4, vpp=2, zero=3, micro_batch_size=2, schedule="interleaved-1f1b",
          recompute="selective", sequence_parallel=True), 32, 64),
    (Plan(dp=2, tp=8, pp=4, zero=1, recompute="full", placement="tp,pp,dp"), 64, 32),
])
def test_chunks_are_range_sums_of_the_coefficients(plan, gpus, batch):
    """Each chunk's p2p is the coefficient at its two cuts (none before the first chunk's input
    nor after the last chunk's output), its ZeRO-3 gathers the sum over its rows, its compute the
    range sums of the row times: bit for bit."""
    t = gpt3_175b()
    co = row_coefficients(t, A100, plan)
    stages = check_plan(t, plan, gpus, batch)
    last = len(stages) - 1
    for v, (s, e) in enumerate(stages):
        c = chunk_cost(t, A100, plan, s, e, v)
        p2p = (float(co.cut_p2p_s[e]) if v < last else 0.0) + (float(co.cut_p2p_s[s]) if v else 0.0)
        assert c.pp_s == p2p and c.pp_s > 0
        assert c.fwd_s == co.times.range_sum("fwd_s", s, e)
        # ZeRO-3: two gathers a row; under pp autopar also reduce-scatters every micro-batch
        assert c.zero_total_s == float(np.sum(co.zero_fwd_s[s:e])) + float(np.sum(co.zero_bwd_s[s:e]))
        assert float(np.sum(co.zero_fwd_s[s:e])) == float(np.sum(co.zero3_gather_s[s:e])) * (plan.zero == 3)
        assert (float(np.sum(co.zero_bwd_s[s:e])) > float(np.sum(co.zero3_gather_s[s:e]))) == (plan.zero == 3)
        assert (c.zero_total_s > 0) == (plan.zero == 3)


def test_coefficients_follow_the_docstring_formulas():
    t = gpt_table(layers=4, hidden=512, heads=8, vocab=8000, seq=256)
    prof = load_profile("cpu-2core")
    # ZeRO Table 1 (16Ψ/d at ZeRO-3): a runtime without torch pipelining's whole stage states
    plan = Plan(dp=2, tp=2, pp=2, zero=3, micro_batch_size=4, runtime=no_torch_pipelining_runtime())
    co = row_coefficients(t, prof, plan)
    arr = table_arrays(t)
    tiers = plan_tiers(plan, prof.gpus_per_node)
    k = plan.micro_batch_size / t.micro_batch
    # P[x]: the activation of row x−1 (scaled to the micro-batch, 1/tp per rank), one p2p
    assert co.cut_p2p_s[0] == 0.0 and co.cut_p2p_bytes[0] == 0.0
    for x in range(1, arr.n + 1):
        b, s = collective_time("p2p", float(arr.boundary[x - 1]) * k / plan.tp, 2, prof.tier(tiers["pp"]))
        assert (co.cut_p2p_bytes[x], co.cut_p2p_s[x]) == (b, s)
    # g_i: each row's bf16 weights all-gathered over dp
    g = collective_time("all_gather_into_tensor", 2.0 * arr.params / plan.tp, plan.dp, prof.tier(tiers["dp"]))
    assert np.array_equal(co.zero3_gather_s, g[1]) and np.array_equal(co.zero3_gather_bytes, g[0])
    rt = row_times(t, prof, plan.tp, False, plan.micro_batch_size, "none", "flash", tiers["tp"])
    assert np.array_equal(co.row_s, rt.fwd_s + rt.bwd_s + rt.recompute_s + rt.tp_fwd_s + rt.tp_bwd_s
                          + rt.tp_recompute_s)
    ov = prof.overlap(plan.zero)
    assert np.array_equal(co.bwd_window_s, ov * (rt.bwd_s + rt.recompute_s))
    # ZeRO-3 shards all three model states over dp: 16 bytes per parameter / dp
    assert np.allclose(co.state_bytes, arr.params / plan.tp * 16.0 / plan.dp)
    assert np.array_equal(co.act_bytes, activation_bytes(arr, plan.tp, False, 4, "none", "flash"))
    assert co.optimizer_per_param_s == optimizer_step_s(1.0, prof) / plan.dp


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_dp_sync_line_is_the_sync_split_into_latency_and_per_parameter_time(zero):
    prof = dataclasses.replace(A100, name="t")
    plan = Plan(dp=8, zero=zero)
    tier = prof.tier("intra_node")
    lat, per_param = dp_sync_line(plan, prof, "intra_node")
    kinds = dp_sync(1.0, plan, prof, "intra_node")[0].split("+")
    assert lat == pytest.approx(sum(collective_steps(k, 8) * tier.alpha_beta(k)[0] for k in kinds))
    for params in (1e6, 3e9):   # γ_d is one parameter's time less λ_d: λ_d's rounding, ~1e-10
        assert lat + per_param * params == pytest.approx(dp_sync(params, plan, prof, "intra_node")[2],
                                                          rel=1e-8)
    assert dp_sync_line(Plan(), prof, "intra_node") == (0.0, 0.0)


def test_no_pipeline_no_p2p_and_no_zero3_no_gathers():
    co = row_coefficients(gpt3_175b(), A100, Plan(dp=8, tp=8))
    assert not co.cut_p2p_s.any() and not co.zero3_gather_s.any()
    assert co.dp_per_param_s > 0 and co.dp_latency_s > 0
