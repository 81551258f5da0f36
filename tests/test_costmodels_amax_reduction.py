"""Delayed scaling's amax all-reduces (costmodels.model.amax_reduction): two blocking all-reduces
per model chunk and micro-batch over the tp·dp group of a TE (megatron) FP8 plan, none for its
BF16 pair or a recipe without delayed scaling; in ``estimate`` and in the coefficients the
search reads alike."""
from __future__ import annotations

import math

import pytest
from synthetic_tables import llama_table

from costmodels.contracts.plan import Plan
from costmodels.model import amax_reduction, coefficients
from costmodels.model.amax_reduction import amax_group_link, amax_reduction_s, latency_steps
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

TABLE = llama_table(8, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")
H100 = load_profile("h100-80g-sxm")
NEMO = "megatron:overlap_grad_reduce,overlap_param_gather"


def _plan(precision="fp8", dp=8, tp=2, pp=1, vpp=1, runtime=NEMO):
    return Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, zero=1, micro_batch_size=1, sequence_parallel=tp > 1,
                schedule="interleaved-1f1b" if vpp > 1 else "1f1b", runtime=runtime, precision=precision)


def _s(plan):
    return amax_reduction_s(H100, plan, load_runtime(plan.runtime))


def test_only_delayed_scaling_fp8_reduces_and_the_group_is_tp_times_dp():
    assert _s(_plan()) > 0 and load_runtime(NEMO).amax_reductions_per_chunk == 2
    for plan in (_plan("bf16"), _plan("fp8-rowwise"), _plan(runtime="fsdp"), _plan(dp=1, tp=1)):
        assert _s(plan) == 0.0
    # 8 ranks stay on one node's NVSwitch: a tree's 6 steps there, not the ring's 14; 256 ranks
    # cross 32 nodes on the two-level tier, 16 steps
    small, big = _plan(dp=4, tp=2), _plan(dp=64, tp=4)
    assert _s(small) == pytest.approx(6 * H100.intra_node.latency_s)
    link = amax_group_link(H100, big, 256)
    assert link.name == "inter_node" and latency_steps(256) == 16 and latency_steps(2) == 2
    assert _s(big) == pytest.approx(16 * link.latency_s) and _s(big) > _s(_plan(dp=4, tp=4))
    # NeMo 2's tp_only_amax_red: the 4 tp ranks of one node only, whatever dp
    tp_only = _plan(dp=64, tp=4, runtime=NEMO + ",tp_only_amax_red")
    assert _s(tp_only) == pytest.approx(4 * H100.intra_node.latency_s)


@pytest.mark.parametrize("pp,vpp", [(1, 1), (2, 2)])
def test_estimate_pays_two_per_chunk_and_micro_batch(monkeypatch, pp, vpp):
    plan, bf, gpus, batch = _plan(pp=pp, vpp=vpp), _plan("bf16", pp=pp, vpp=vpp), 16 * pp, 64
    t = _s(plan)
    est, est_bf = estimate(TABLE, H100, plan, gpus, batch), estimate(TABLE, H100, bf, gpus, batch)
    m = est.num_micro_batches
    monkeypatch.setattr(amax_reduction, "amax_reduction_s", lambda *a: 0.0)
    monkeypatch.setattr(coefficients, "_CACHE", {})
    without, without_bf = estimate(TABLE, H100, plan, gpus, batch), estimate(TABLE, H100, bf, gpus, batch)
    # every rank's micro-batch grows by two reductions per chunk it holds
    for d, d0 in zip(est.stages_detail, without.stages_detail):
        grown = sum(d["fwd_s"]) + sum(d["bwd_s"]) - sum(d0["fwd_s"]) - sum(d0["bwd_s"])
        assert math.isclose(grown, 2 * vpp * t, rel_tol=1e-9)
    if pp == 1:   # one chunk a micro-batch: the step pays exactly 2·m of them
        assert math.isclose(est.step_time_s - without.step_time_s, 2 * m * t, rel_tol=1e-9)
    assert est.step_time_s - without.step_time_s >= 2 * vpp * m * t * (1 - 1e-9)
    assert est.breakdown_s["tp_exposed"] > without.breakdown_s["tp_exposed"]
    assert est_bf.step_time_s == without_bf.step_time_s   # the BF16 pair pays none of it


def test_nemo2_gpt3_rows_reduce_over_tp_only():
    from costmodels.calibration.fp8_run_runtimes import nemo_fp8_runtime
    row = {"framework": "NeMo 2 (Megatron-core + TE)", "precision": "fp8", "gpu": "B200", "model": "gpt3-175b"}
    rt = "megatron:overlap_grad_reduce,tp_comm_overlap"
    assert "tp_only_amax_red" in nemo_fp8_runtime(row, rt).split(",")
    assert load_runtime(nemo_fp8_runtime(row, rt)).amax_reduce_over_dp == 0
    assert "tp_only_amax_red" not in nemo_fp8_runtime({**row, "model": "llama3.1-405b"}, rt)
    assert "tp_only_amax_red" not in nemo_fp8_runtime({**row, "framework": "NeMo 1 (Megatron-core + TE)"}, rt)
