"""FP8 mechanisms of the last round of issue 28: a full recompute re-runs the forward's matmuls
in FP8, torchao's float8 tensor parallelism all-gathers in FP8, and the published runs are priced
with the switches their recipes set for FP8 only (NeMo 2's bf16 gradient reduce, torchtitan's
async TP)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from synthetic_tables import llama_table

from costmodels.calibration.fp8_runs import fp8_runs
from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import plan_row_times
from costmodels.model.precision import stack_scale
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

TABLE = llama_table(4, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")
H100 = load_profile("h100-80g-sxm")
CSV = Path(__file__).parent / "data" / "validation" / "fp8_runs.csv"


def _rows(plan, **runtime):
    arr = table_arrays(TABLE)
    rt = dataclasses.replace(load_runtime(plan.runtime), **runtime)
    return arr, plan_row_times(arr, H100, plan, "bf16-mixed", rt)


def test_full_recompute_reruns_the_forward_in_fp8():
    base = Plan(dp=1, tp=1, micro_batch_size=2, recompute="full", runtime="fsdp")
    whole = {"recompute_early_stop": 0}   # a checkpoint that replays the whole forward
    arr, b16 = _rows(base, **whole)
    _, f8 = _rows(base.with_(precision="fp8"), **whole)
    blk = arr.is_block
    saved_fwd = b16.fwd_s[blk] - f8.fwd_s[blk]
    assert (saved_fwd > 0).all()
    # the re-run forward saves what the forward saved, row by row
    np.testing.assert_allclose(b16.recompute_s[blk] - f8.recompute_s[blk], saved_fwd, rtol=1e-9)
    # torch's early stop (recompute_early_stop) does not re-run the last GEMM: less to save
    _, e16 = _rows(base)
    _, e8 = _rows(base.with_(precision="fp8"))
    saved_rec = e16.recompute_s[blk] - e8.recompute_s[blk]
    assert (saved_rec > 0).all() and (saved_rec < saved_fwd).all()


@pytest.mark.parametrize("runtime,plain", [("fsdp", "fp8-rowwise"), ("megatron", None)])
def test_tp_sequence_all_gathers_move_fp8(runtime, plain):
    """torchao's tensorwise float8 TP and Transformer Engine quantize before the all-gather;
    torchao's rowwise recipe keeps BF16 TP."""
    base = Plan(dp=1, tp=2, micro_batch_size=2, sequence_parallel=True, recompute="full", runtime=runtime)
    arr, b16 = _rows(base)
    _, f8 = _rows(base.with_(precision="fp8"))
    blk = arr.is_block & (b16.tp_bytes_fwd > 0)
    assert blk.any()
    # one all-gather + one reduce-scatter of equal bytes per pair; the all-gather at 1 byte of 2
    for name in ("tp_bytes_fwd", "tp_bytes_bwd", "tp_bytes_recompute"):
        np.testing.assert_allclose(getattr(f8, name)[blk], 0.75 * getattr(b16, name)[blk], rtol=1e-9)
    if plain:
        _, rw = _rows(base.with_(precision=plain))
        np.testing.assert_allclose(rw.tp_bytes_fwd[blk], b16.tp_bytes_fwd[blk], rtol=1e-12)


def test_published_runs_carry_the_switches_their_recipes_set_for_fp8_only():
    runs = {r.row_id: r for r in fp8_runs(CSV)[0]}
    nemo2 = runs["dgxc-v25.04.02-nemotron4-15b-fp8-16"]
    assert "bf16_grad_reduce" in nemo2.plans[0].runtime
    assert "bf16_grad_reduce" not in nemo2.bf16_plans[0].runtime
    nemo1 = runs["dgxc-v24.11.1-llama3-8b-fp8-8"]
    assert nemo1.plans[0].runtime == nemo1.bf16_plans[0].runtime
    atp = runs["ttperf-405b-128-float8-asynctp"]
    assert atp.plans[0].runtime == "fsdp:async_tp" and atp.bf16_plans[0].runtime == "fsdp"
    assert runs["ttperf-405b-128-float8"].plans[0].runtime == "fsdp"
    # the yaml's dropout where the row states it (the same runs' BF16 copies in dgxc_nemo_h100.csv)
    assert "dropout=0.1" in runs["dgxc-v24.11.1-gpt3-175b-fp8-128"].spec
    assert "dropout=0," in runs["dgxc-v25.04.02-gpt3-175b-fp8-128"].spec


def test_rowwise_reads_its_own_gemm_figure_where_the_profile_has_one():
    scales = dict(H100.fp8_matmul_scale)
    assert stack_scale(H100, "fsdp", "fp8-rowwise") == scales["fsdp-rowwise"] != scales["fsdp"]
    assert stack_scale(H100, "fsdp", "fp8") == scales["fsdp"]
    b200 = load_profile("b200-180g-sxm")
    assert stack_scale(b200, "fsdp", "fp8-rowwise") == dict(b200.fp8_matmul_scale)["fsdp"]
    base = Plan(dp=1, tp=1, micro_batch_size=2, runtime="fsdp")
    _, tw = _rows(base.with_(precision="fp8"))
    _, rw = _rows(base.with_(precision="fp8-rowwise"))
    assert rw.fwd_s.sum() > tw.fwd_s.sum()   # the slower GEMM: same casts, no FP8 gathers at dp 1
