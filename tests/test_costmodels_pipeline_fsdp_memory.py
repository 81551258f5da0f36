"""FSDP2 under torch pipelining (costmodels/model/pipeline_fsdp_memory.py): a pipeline stage of
the fsdp runtime (torchtitan) holds its gradients unsharded in the fp32 reduce dtype until its
last backward and, under a float8 all-gather, its gathered linear weights at 1 byte; the search's
memory rows carry the same figures as ``estimate``; and torchtitan's Dec 2024 release cut the
local batch into pp micro-batches. No torch, analytic tables."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from synthetic_tables import llama_table

from costmodels.calibration.fp8_runs import titan_pipeline_micro_batch
from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import row_coefficients
from costmodels.model.estimate import estimate
from costmodels.model.precision import fp8_weight_share
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

TABLE = llama_table(8, 2048, 16, 4, 5632, 32000, 2048)
ARR = table_arrays(TABLE)
H100 = dataclasses.replace(load_profile("h100-80g-sxm"), hbm_bytes=1e15)   # never "does not fit"
PLAN = Plan(dp=4, tp=2, pp=2, micro_batch_size=1, zero=2, sequence_parallel=True, runtime="fsdp")


def _estimate(plan, global_batch=32):   # 8 micro-batches per step at dp 4
    return estimate(TABLE, H100, plan, plan.world_size, global_batch)


def _rank_params(e, r, tp=PLAN.tp):
    return sum(float(ARR.params[s:t].sum()) for s, t in e.stages_detail[r]["rows"]) / tp


def test_the_runtime_profile_says_fsdp_stages_run_under_torch_pipelining():
    assert load_runtime("fsdp").torch_pipelining == 1
    assert load_runtime("megatron").torch_pipelining == 0


def test_a_stage_holds_its_gradients_unsharded_in_the_fp32_reduce_dtype():
    e = _estimate(PLAN)
    for r, d in enumerate(e.stages_detail):
        # ZeRO-2's table charges 2 bytes / dp; torch pipelining holds 4 bytes, whole
        assert d["memory_bytes"]["grads"] == pytest.approx(4.0 * _rank_params(e, r), rel=1e-9)
        assert d["memory_bytes"]["params"] == pytest.approx(2.0 * _rank_params(e, r), rel=1e-9)
    e1 = _estimate(PLAN.with_(pp=1, dp=8))   # no pipeline: FSDP2 reduce-scatters every backward
    assert e1.memory_bytes["grads"] == pytest.approx(2.0 * _rank_params(e1, 0) / 8, rel=1e-9)


def test_without_a_shard_group_nothing_changes():
    e = _estimate(PLAN.with_(dp=1), 8)
    assert all(np.isclose(d["memory_bytes"]["grads"], 2.0 * _rank_params(e, r)) for r, d in enumerate(e.stages_detail))


def test_float8_all_gather_holds_the_gathered_linear_weights_at_one_byte():
    plan = PLAN.with_(precision="fp8")
    e = _estimate(plan)
    share = fp8_weight_share(ARR, plan, "fsdp", 2)
    assert share.min() < 1.0
    for r, d in enumerate(e.stages_detail):
        want = sum(2.0 * float((ARR.params[s:t] * share[s:t]).sum()) for s, t in d["rows"]) / plan.tp
        assert d["memory_bytes"]["params"] == pytest.approx(want, rel=1e-9)
        assert d["memory_bytes"]["params"] < 2.0 * _rank_params(e, r)


def test_the_search_memory_rows_charge_what_estimate_charges():
    for plan in (PLAN, PLAN.with_(precision="fp8")):
        co = row_coefficients(TABLE, H100, plan, "bf16-mixed")
        e = _estimate(plan)
        for d in e.stages_detail:
            rows = slice(*d["rows"][0])
            mem = d["memory_bytes"]
            assert float(co.state_bytes[rows].sum()) == pytest.approx(
                mem["params"] + mem["grads"] + mem["optimizer"], rel=1e-9)


def test_torchtitan_dec_2024_rows_cut_the_local_batch_into_pp_micro_batches():
    old = {"container": "torch 1963fc8 (2024-12-23), torchao eab345c, torchtitan 9dec370"}
    assert titan_pipeline_micro_batch(old, 32, 8) == 4
    assert titan_pipeline_micro_batch({"container": "torchtitan 0.2.2"}, 32, 8) == 1


def test_torchtitans_unfused_loss_holds_its_fp32_gradients_at_the_backwards_start():
    from costmodels.model.loss_backward_memory import loss_backward_bytes
    from costmodels.model.memory import activation_bytes
    plan = PLAN.with_(pp=1, dp=8)
    fsdp = load_runtime("fsdp")
    extra = loss_backward_bytes(ARR, plan, fsdp, "bf16-mixed")
    head = [i for i, r in enumerate(TABLE.rows) if r.kind == "head"]
    logits = float(ARR.loss_logits.sum()) / TABLE.micro_batch
    # fp32 d(log-probs) + d(logits); at tp 2 torch's loss_parallel() backward holds one fp32 shard more
    assert extra[head].sum() == pytest.approx(12.0 * logits / plan.tp)
    assert loss_backward_bytes(ARR, plan.with_(tp=1, sequence_parallel=False), fsdp, "bf16-mixed").sum() == \
        pytest.approx(8.0 * logits)
    assert extra.sum() == extra[head].sum()
    assert not loss_backward_bytes(ARR, plan, load_runtime("megatron"), "bf16-mixed").any()   # in place
    assert not loss_backward_bytes(ARR, plan, load_runtime("fsdp:fused_cross_entropy"), "bf16-mixed").any()
    # under full recompute the transient and the recompute working set never meet
    full = loss_backward_bytes(ARR, plan.with_(recompute="full"), fsdp, "bf16-mixed")
    assert 0 <= full[head].sum() < extra[head].sum()
    co = row_coefficients(TABLE, H100, plan, "bf16-mixed")   # the search's rows carry it too
    saved = activation_bytes(ARR, plan.tp, plan.sequence_parallel, 1, "none", plan.attention, "bf16-mixed",
                             fsdp.loss_saved_bytes)
    from costmodels.model.torch_tp_memory import saved_bytes as gathered  # torch TP's whole inputs (tp 2, sp)
    np.testing.assert_allclose(co.act_bytes, saved + extra + gathered(ARR, plan, fsdp, "bf16-mixed"))


def test_zero3_stages_keep_the_weights_each_backward_gathers():
    plan = PLAN.with_(zero=3)
    e = _estimate(plan)
    co = row_coefficients(TABLE, H100, plan, "bf16-mixed")
    for r, d in enumerate(e.stages_detail):
        assert d["memory_bytes"]["params"] == pytest.approx(2.0 * _rank_params(e, r), rel=1e-9)   # whole
        rows = slice(*d["rows"][0])
        mem = d["memory_bytes"]
        assert float(co.state_bytes[rows].sum()) == pytest.approx(
            mem["params"] + mem["grads"] + mem["optimizer"], rel=1e-9)
