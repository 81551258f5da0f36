"""Transformer Engine userbuffers with ``fp8_buf`` (NeMo 2's FP8 H100 configs): the forward
reduce-scatters of the attention-output and MLP-down GEMMs move FP8
(costmodels.model.fp8_tensor_parallel.fp8_ub_reduce_scatter, megatron option ub_fp8_rs)."""
from __future__ import annotations

import numpy as np
from synthetic_tables import llama_table

from costmodels.calibration.fp8_run_runtimes import nemo_fp8_runtime
from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import plan_row_times
from costmodels.model.comm import collective_time
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

TABLE = llama_table(8, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")
H100 = load_profile("h100-80g-sxm")


def _times(runtime: str, precision: str = "fp8"):
    plan = Plan(dp=1, tp=8, micro_batch_size=1, sequence_parallel=True, runtime=runtime, precision=precision)
    return plan, plan_row_times(table_arrays(TABLE), H100, plan, "bf16-mixed", load_runtime(runtime))


def test_fp8_buffers_halve_the_forward_reduce_scatters_only():
    arr = table_arrays(TABLE)
    plan, base = _times("megatron")
    _, ub = _times("megatron:ub_fp8_rs")
    _, half = _times("megatron:ub_fp8_rs_proj")
    tier = H100.group_link(plan, "tp")
    v = arr.tp_comm_bytes / TABLE.micro_batch * 1
    _, t16 = collective_time("reduce_scatter", v, 8, tier)
    _, t8 = collective_time("reduce_scatter", v / 2, 8, tier)
    want = np.where(v > 0, arr.tp_collectives * (t8 - t16), 0.0)
    assert (want < 0).any()
    np.testing.assert_allclose(ub.tp_fwd_s - base.tp_fwd_s, want, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(half.tp_fwd_s - base.tp_fwd_s, want / 2, rtol=1e-9, atol=1e-15)
    np.testing.assert_array_equal(ub.tp_bwd_s, base.tp_bwd_s)       # the backward's stay BF16
    # a BF16 plan has no FP8 buffers
    _, b16 = _times("megatron", "bf16")
    _, b16ub = _times("megatron:ub_fp8_rs", "bf16")
    np.testing.assert_array_equal(b16ub.tp_fwd_s, b16.tp_fwd_s)


def test_nemo2_h100_fp8_rows_of_the_configured_models_get_it():
    row = {"framework": "NeMo 2 (Megatron-core + TE)", "precision": "fp8", "gpu": "H100 80GB SXM",
           "model": "llama3.1-405b"}
    rt = "megatron:overlap_grad_reduce,tp_comm_overlap"
    assert nemo_fp8_runtime(row, rt).split(",")[-1] == "ub_fp8_rs"
    assert nemo_fp8_runtime({**row, "model": "gpt3-175b"}, rt).endswith("ub_fp8_rs_proj")
    assert "ub_fp8" not in nemo_fp8_runtime({**row, "gpu": "B200"}, rt)          # B200 configs: BF16 buffers
    assert "ub_fp8" not in nemo_fp8_runtime({**row, "model": "nemotron4-15b"}, rt)   # no such config
    assert "ub_fp8" not in nemo_fp8_runtime(row, "megatron:overlap_grad_reduce")   # no userbuffers
    assert "ub_fp8" not in nemo_fp8_runtime({**row, "framework": "NeMo 1"}, rt)
