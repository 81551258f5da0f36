"""torchtitan's loss memory. Its compiled loss (fsdp:compiled_loss, costmodels/calibration/titan_releases.py): from
pytorch/torchtitan bbb1b616e on, torch.compile compiles the cross-entropy too, which keeps the
bf16 logits (2 bytes per logit) instead of an fp32 log-softmax (4) and whose backward writes one
bf16 gradient (2) instead of eager's two fp32 ones (8); the harness gives the switch to the rows
whose release did that, the search's memory rows carry the same figure as ``estimate``. Under
torch's loss_parallel() (tp > 1) its backward holds one fp32 shard more. No torch."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from synthetic_tables import llama_table

from costmodels.calibration.fp8_runs import fp8_runs
from costmodels.calibration.titan_releases import release_options, with_release
from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import row_coefficients
from costmodels.model.estimate import estimate
from costmodels.model.memory import logits
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

TABLE = llama_table(4, 1024, 8, 4, 2816, 32000, 2048)
ARR = table_arrays(TABLE)
H100 = dataclasses.replace(load_profile("h100-80g-sxm"), hbm_bytes=1e15)   # never "does not fit"
PLAN = Plan(dp=8, micro_batch_size=2, zero=3, runtime="fsdp")
CSV = Path(__file__).parent / "data" / "validation" / "fp8_runs.csv"


def test_the_option_sets_the_compiled_loss_bytes():
    eager, compiled = load_runtime("fsdp"), load_runtime("fsdp:compiled_loss")
    assert (eager.loss_saved_bytes or 4.0, eager.loss_grad_bytes) == (4.0, 8.0)
    assert (compiled.loss_saved_bytes, compiled.loss_grad_bytes) == (2.0, 2.0)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_a_compiled_loss_holds_eight_bytes_per_logit_less(recompute):
    plan = PLAN.with_(recompute=recompute)
    e = estimate(TABLE, H100, plan, 8, 16)
    c = estimate(TABLE, H100, plan.with_(runtime="fsdp:compiled_loss"), 8, 16)
    per_mb = float(logits(ARR, 2).sum())   # one micro-batch in flight: (4 + 8) - (2 + 2) bytes a logit
    assert e.memory_bytes["total"] - c.memory_bytes["total"] == pytest.approx(8.0 * per_mb, rel=1e-9)
    # the search's per-row activation bytes move by the same figure (its program equals estimate)
    a = row_coefficients(TABLE, H100, plan).act_bytes.sum()
    b = row_coefficients(TABLE, H100, plan.with_(runtime="fsdp:compiled_loss")).act_bytes.sum()
    assert a - b == pytest.approx(8.0 * per_mb, rel=1e-9)


def test_the_release_decides_the_switch():
    assert release_options("torchtitan e7c0cae + torch.compile", "NGC PyTorch 25.05") == ["compiled_loss"]
    assert release_options("torchtitan 6fc499f + torch.compile", "pytorch 2.9.0.dev") == ["compiled_loss"]
    # Dec 2024: the loss compile was commented out (e8977b0); torchao's README: torchtitan 0.0.2, Mar 2025
    assert release_options("torchtitan (FSDP2, torch.compile)", "torchtitan 9dec370") == []
    assert release_options("torchtitan 0.0.2 + torch.compile", "pytorch 2.7.0a0") == []
    assert release_options("torchtitan e7c0cae", "eager") == []   # no compile: the loss runs eagerly
    assert with_release("fsdp:async_tp", "torchtitan 6fc499f + torch.compile", "") == "fsdp:async_tp,compiled_loss"
    assert with_release("megatron", "torchtitan 6fc499f + torch.compile", "") == "megatron"


def test_the_fp8_harness_gives_the_newer_rows_their_compiled_loss():
    runs = {r.row_id: r for r in fp8_runs(CSV)[0]}
    for rid, run in runs.items():
        compiled = any("compiled_loss" in p.runtime for p in run.plans + run.bf16_plans)
        assert compiled == rid.startswith(("tt-trainy-", "ttmx-")), rid


def test_under_loss_parallel_the_backward_holds_three_fp32_shards():
    """tp > 1: torch's loss_parallel() backward (zeros, exp and their sum beside the saved
    log-softmax) holds 12 bytes per logit shard, not the unsharded loss's 8; tp 1 is unchanged."""
    plan = PLAN.with_(dp=4, tp=2, sequence_parallel=True)
    e = estimate(TABLE, H100, plan, 8, 8)
    c = estimate(TABLE, H100, plan.with_(runtime="fsdp:compiled_loss"), 8, 8)
    shard = float(logits(ARR, 2).sum()) / 2
    # eager under loss parallel: 4 saved + 12; compiled: 2 + 2
    assert e.memory_bytes["total"] - c.memory_bytes["total"] == pytest.approx(12.0 * shard, rel=1e-9)
    assert load_runtime("fsdp").loss_parallel_grad_bytes == 12.0
    assert load_runtime("fsdp:fused_cross_entropy").loss_parallel_grad_bytes == 0.0
    assert load_runtime("megatron").loss_parallel_grad_bytes is None   # its own vocab-parallel loss
