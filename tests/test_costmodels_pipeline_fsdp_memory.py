"""FSDP2 under torch pipelining (costmodels/model/pipeline_fsdp_memory.py): a pipeline stage of
the fsdp runtime (torchtitan) holds its gradients unsharded in the fp32 reduce dtype until its
last backward, and its last stage keeps every micro-batch's output; and torchtitan's Dec 2024
release cut the local batch into pp micro-batches. No torch, analytic tables."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from synthetic_tables import llama_table

from costmodels.calibration.fp8_runs import titan_pipeline_micro_batch
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

TABLE = llama_table(8, 2048, 16, 4, 5632, 32000, 2048)
H100 = dataclasses.replace(load_profile("h100-80g-sxm"), hbm_bytes=1e15)   # never "does not fit"
PLAN = Plan(dp=4, tp=2, pp=2, micro_batch_size=1, zero=2, sequence_parallel=True, runtime="fsdp")


def _ranks(plan, global_batch):
    e = estimate(TABLE, H100, plan, plan.world_size, global_batch)
    return e, [d["memory_bytes"] for d in e.stages_detail]


def _rank_params(e, r):
    arr = table_arrays(TABLE)
    return sum(float(arr.params[s:t].sum()) for s, t in e.stages_detail[r]["rows"]) / PLAN.tp


def test_the_runtime_profile_says_fsdp_stages_run_under_torch_pipelining():
    assert load_runtime("fsdp").torch_pipelining == 1
    assert load_runtime("megatron").torch_pipelining == 0


def test_a_stage_holds_its_gradients_unsharded_in_the_fp32_reduce_dtype():
    e, mems = _ranks(PLAN, 32)   # 8 micro-batches per step
    for r, mem in enumerate(mems):
        # ZeRO-2's table would charge 2 bytes / dp; torch pipelining holds 4 bytes, whole
        assert mem["grads"] == pytest.approx(4.0 * _rank_params(e, r), rel=1e-9)
    megatron, _ = _ranks(PLAN.with_(runtime="megatron", zero=1), 32)
    assert megatron.stages_detail[0]["memory_bytes"]["grads"] == pytest.approx(2.0 * _rank_params(e, 0))


def test_the_last_stage_keeps_every_micro_batch_output():
    arr = table_arrays(TABLE)
    logits = float(arr.loss_logits.sum()) / TABLE.micro_batch      # per sequence
    one = 2.0 * logits / PLAN.tp                                   # bf16, vocab sharded over tp
    _, m8 = _ranks(PLAN, 32)
    _, m16 = _ranks(PLAN, 64)
    # the last rank's 1F1B in-flight count stays 1: each extra micro-batch adds one output kept
    # (and its two receive buffers, which the first rank grows by as well)
    grow_last = m16[-1]["activations"] - m8[-1]["activations"]
    grow_first = m16[0]["activations"] - m8[0]["activations"]
    assert grow_last - grow_first == pytest.approx(8 * one, rel=1e-6)


def test_zero3_stages_keep_the_weights_gathered_after_a_backward():
    e, mems = _ranks(PLAN.with_(zero=3), 32)
    for r, mem in enumerate(mems):
        assert mem["gathered"] + mem["params"] >= 2.0 * _rank_params(e, r) * (1 - 1e-9)


def test_without_data_parallel_shards_nothing_changes():
    e, mems = _ranks(PLAN.with_(dp=1), 8)
    assert all(np.isclose(m["grads"], 2.0 * _rank_params(e, r)) for r, m in enumerate(mems))


def test_torchtitan_dec_2024_rows_cut_the_local_batch_into_pp_micro_batches():
    old = {"container": "torch 1963fc8 (2024-12-23), torchao eab345c, torchtitan 9dec370"}
    assert titan_pipeline_micro_batch(old, 32, 8) == 4
    assert titan_pipeline_micro_batch({"container": "torchtitan 0.2.2"}, 32, 8) == 1

