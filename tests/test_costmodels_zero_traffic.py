"""ZeRO's HBM traffic (costmodels.model.zero_traffic): per micro-batch, each ZeRO-2/3 collective and the
runtime's copies around it add their HBM bytes / bandwidth to the rows' forward and backward on
a GPU — by the formula, per runtime, and nowhere else (CPU profiles, no ZeRO, one rank)."""
import dataclasses

import numpy as np
import pytest
from synthetic_tables import gpt_table

from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import grad_bytes, zero_hbm_param_s
from costmodels.model.compute import row_times
from costmodels.model.estimate import estimate
from costmodels.model.zero_traffic import NCCL_HBM_PASSES, grad_accumulate_s
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import _REGISTERED, load_runtime, register_runtime

H100 = load_profile("h100-80g-sxm")


@pytest.mark.parametrize("runtime, zero, dp", [("fsdp", 3, 8), ("fsdp:fsdp1,bf16_reduce", 3, 64),
                                               ("fsdp:bf16_reduce", 2, 16), ("autopar", 3, 8)])
def test_seconds_per_parameter_follow_the_formula(runtime, zero, dp):
    rt = load_runtime(runtime)
    plan = Plan(dp=dp, zero=zero, runtime=runtime)
    f = (dp - 1) / dp
    w, g, bw = 2.0, grad_bytes("bf16-mixed", rt), H100.hbm_bandwidth_bytes_per_s
    gather = (NCCL_HBM_PASSES["all_gather_into_tensor"] * f + rt.gather_copy_passes) * w / bw
    reduce = (NCCL_HBM_PASSES["reduce_scatter_tensor"] * f + rt.reduce_copy_passes) * g / bw
    fwd_gathers = zero == 3 or rt.zero2_gather_per_micro_batch
    want_f = gather if fwd_gathers else 0.0
    want_b = gather * (zero == 3) + reduce * bool(rt.zero_reduce_per_micro_batch)
    # autopar's fp32 gradients: every micro-batch's cast and accumulation (zero_traffic.grad_accumulate_s)
    want_b += grad_accumulate_s(rt.grad_accumulate_bytes, "bf16-mixed", H100.elementwise_bw)
    assert zero_hbm_param_s(plan, H100, rt) == pytest.approx((want_f, want_b), rel=1e-12)
    assert want_f > 0 and want_b > 0 or runtime == "autopar"


def test_fsdp1_and_fsdp2_copy_differently():
    """FSDP1 gathers into the flat parameter (no copy-out) but joins and pre-divides gradients;
    FSDP2 copies the gathered weights out and the gradients in (fsdp.toml sources)."""
    one = zero_hbm_param_s(Plan(dp=8, zero=3), H100, load_runtime("fsdp:fsdp1,bf16_reduce"))
    two = zero_hbm_param_s(Plan(dp=8, zero=3), H100, load_runtime("fsdp:bf16_reduce"))
    bw = H100.hbm_bandwidth_bytes_per_s
    assert two[0] - one[0] == pytest.approx(2 * 2.0 / bw)                  # FSDP2's copy-out, forward
    assert two[1] - one[1] == pytest.approx((2 * 2.0 - 2 * 2.0) / bw)      # +copy-out −2 reduce passes


@pytest.mark.parametrize("plan, hardware", [(Plan(dp=8, zero=1, runtime="fsdp"), "h100-80g-sxm"),
                                            (Plan(dp=1, zero=3, runtime="fsdp"), "h100-80g-sxm"),
                                            (Plan(dp=8, zero=3, runtime="fsdp"), "cpu-2core")])
def test_nothing_without_zero_traffic_on_a_gpu(plan, hardware):
    assert zero_hbm_param_s(plan, load_profile(hardware), load_runtime(plan.runtime)) == (0.0, 0.0)


def test_rows_pay_it_per_parameter_and_the_step_grows_by_it():
    t = gpt_table(layers=4, hidden=1024, heads=16, vocab=8192, seq=512)
    plan = Plan(dp=8, zero=3, micro_batch_size=2, runtime="fsdp")
    zp = zero_hbm_param_s(plan, H100, load_runtime("fsdp"))
    base = row_times(t, H100, 1, False, 2, "none", "flash")
    with_it = row_times(t, H100, 1, False, 2, "none", "flash", zero_param_s=zp)
    params = np.array([r.params for r in t.rows], dtype=float)
    assert np.allclose(with_it.fwd_s - base.fwd_s, zp[0] * params)
    assert np.allclose(with_it.bwd_s - base.bwd_s, zp[1] * params)
    assert np.array_equal(with_it.bwd_w_s, base.bwd_w_s)          # the weight-gradient pass: untouched
    # through estimate: a runtime without the copies is faster by exactly m · Σ params · Δ
    name = "fsdp-no-copies-test"
    if name not in _REGISTERED:
        register_runtime(dataclasses.replace(load_runtime("fsdp"), name=name, gather_copy_passes=0.0,
                                             reduce_copy_passes=0.0))
    lean = dataclasses.replace(plan, runtime=name)
    dz = np.subtract(zp, zero_hbm_param_s(lean, H100, load_runtime(name)))
    e, e0 = estimate(t, H100, plan, 8, 32), estimate(t, H100, lean, 8, 32)
    want = e.num_micro_batches * params.sum() * dz.sum()
    assert want > 0 and e.breakdown_s["compute"] - e0.breakdown_s["compute"] == pytest.approx(want, rel=1e-9)


def test_a_full_recompute_re_runs_the_compute_not_the_gather():
    """Under ZeRO-3 the backward's gather serves the recomputed forward too: the recompute pays
    the forward's compute again, not its HBM traffic (that is the backward's, already counted)."""
    t = gpt_table(layers=4, hidden=1024, heads=16, vocab=8192, seq=512)
    zp = zero_hbm_param_s(Plan(dp=8, zero=3, runtime="fsdp"), H100, load_runtime("fsdp"))
    base = row_times(t, H100, 1, False, 2, "full", "flash")
    with_it = row_times(t, H100, 1, False, 2, "full", "flash", zero_param_s=zp)
    assert zp[0] > 0 and np.array_equal(with_it.recompute_s, base.recompute_s)
    assert (with_it.fwd_s > base.fwd_s).all()
