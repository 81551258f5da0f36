"""A Megatron-core step's once-a-step work (costmodels.model.step_tail): the gradient buffer
zeroed over every parameter held, the FP8 primary weights cast from the fp32 master shard (and
their transposed copy re-made on Hopper), the overlapped parameter all-gather's first bucket; in
``estimate`` and in the coefficients the search reads alike."""
from __future__ import annotations

import math

import pytest
from synthetic_tables import llama_table

from costmodels.contracts.plan import Plan
from costmodels.model import estimate as estimate_module
from costmodels.model.coefficients import dp_sync, dp_sync_line, row_coefficients
from costmodels.model.comm import collective_time
from costmodels.model.estimate import estimate
from costmodels.model.optimizer import optimizer_step_s
from costmodels.model.precision import linear_dims
from costmodels.model.step_tail import FP8_MASTER_CAST_BYTES, FP8_TRANSPOSE_BYTES, step_tail_per_param_s
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.kernel_stacks import stack_profile
from costmodels.profiles.runtime import load_runtime

TABLE = llama_table(8, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")
H100, GB200 = load_profile("h100-80g-sxm"), load_profile("gb200-nvl72")
NEMO = "megatron:overlap_grad_reduce,overlap_param_gather"


def _plan(runtime=NEMO, precision="bf16", dp=4):
    return Plan(dp=dp, tp=2, pp=2, zero=1, micro_batch_size=1, sequence_parallel=True,
                schedule="1f1b", runtime=runtime, precision=precision)


def test_the_step_zeroes_the_whole_grad_buffer_once():
    plan = _plan()
    with_tail = estimate(TABLE, H100, plan, 16, 64)
    rt = load_runtime(NEMO)
    params = max(d["memory_bytes"]["params"] for d in with_tail.stages_detail) / 2   # bf16 weights held
    # Megatron-core zeroes 4-byte (fp32) grads of every parameter held; the optimizer's 40 bytes
    # already count 2 bytes on its 1/dp shard
    want = params * (4.0 - 2.0 / 4) / H100.hbm_bandwidth_bytes_per_s
    assert rt.grad_buffer_zero_passes == 1 and want > 0
    got = step_tail_per_param_s(table_arrays(TABLE), plan, rt, stack_profile(H100, rt.kernel_stack), 4.0, 4)
    assert math.isclose(params * got, want, rel_tol=1e-9)
    # a runtime without the figure (autopar's) pays nothing
    assert step_tail_per_param_s(table_arrays(TABLE), plan, load_runtime("autopar"), H100, 4.0, 4) == 0.0


def test_estimate_and_the_search_coefficients_carry_it(monkeypatch):
    plan = _plan(precision="fp8")
    step = estimate(TABLE, H100, plan, 16, 64).step_time_s
    monkeypatch.setattr(estimate_module, "step_tail_per_param_s", lambda *a: 0.0)
    assert step > estimate(TABLE, H100, plan, 16, 64).step_time_s   # estimate adds it
    rt = load_runtime(NEMO)
    kernels = stack_profile(H100, rt.kernel_stack)
    co = row_coefficients(TABLE, H100, plan)
    tail = step_tail_per_param_s(table_arrays(TABLE), plan, rt, kernels, 4.0, 4)
    assert tail > 0
    assert math.isclose(co.optimizer_per_param_s, optimizer_step_s(1.0, kernels) / 4 + tail, rel_tol=1e-12)


@pytest.mark.parametrize("profile, transpose", [(H100, True), (GB200, False)])
def test_fp8_primary_weights_cast_on_the_shard_and_transposed_on_hopper(profile, transpose):
    arr = table_arrays(TABLE)
    rt = load_runtime(NEMO)
    kernels = stack_profile(profile, rt.kernel_stack)
    b16 = step_tail_per_param_s(arr, _plan(), rt, kernels, 4.0, 4)
    f8 = step_tail_per_param_s(arr, _plan(precision="fp8"), rt, kernels, 4.0, 4)
    share = float(linear_dims(arr).weights.sum()) / float(arr.params.sum())
    per_weight = FP8_MASTER_CAST_BYTES / 4 + (FP8_TRANSPOSE_BYTES if transpose else 0.0)
    assert math.isclose(f8 - b16, share * per_weight / kernels.elementwise_bw, rel_tol=1e-9)


def test_the_first_overlapped_param_gather_bucket_is_exposed():
    plan = _plan()
    link = H100.group_link(plan, "dp")
    _, want = collective_time("all_gather", 2.0 * 4.0e7, 4, link, line=True)   # 40M bf16 params
    lat, per_param = dp_sync_line(plan, H100, "inter_node", "bf16-mixed", "after")
    assert want > 0 and math.isclose(lat, want, rel_tol=1e-12) and per_param == 0.0
    assert math.isclose(dp_sync(1e9, plan, H100, "inter_node", "bf16-mixed", "after")[2], want, rel_tol=1e-12)
    # without the overlap the whole gather follows the step (its own line), no extra bucket
    plain = _plan("megatron:overlap_grad_reduce")
    lat0, _ = dp_sync_line(plain, H100, "inter_node", "bf16-mixed", "after")
    full = dp_sync(1e9, plain, H100, "inter_node", "bf16-mixed", "after")[2]
    assert math.isclose(full, collective_time("all_gather", 2e9, 4, link, line=True)[1], rel_tol=1e-9)
    assert lat0 < want
