"""A full recompute under torch's non-reentrant checkpoint stops at the block's last saved tensor
(costmodels.model.recompute_early_stop): the down projection's GEMM, its TP collective and the
residual add are not re-run where the runtime profile says so, and nowhere else."""
from __future__ import annotations

import dataclasses

import numpy as np
from synthetic_tables import llama_table

from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import plan_row_times
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.kernel_stacks import stack_profile
from costmodels.profiles.runtime import load_runtime

H100 = load_profile("h100-80g-sxm")
TABLE = llama_table(2, 2048, 16, 4, 5632, 32000, 1024)


def _pair(runtime: str, **plan):
    """Row times of one plan under ``runtime`` with early stop on (its profile) and off."""
    p = Plan(dp=1, micro_batch_size=1, recompute="full", runtime=runtime, **plan)
    rt = load_runtime(runtime)
    arr = table_arrays(TABLE)
    on = plan_row_times(arr, H100, p, "bf16-mixed", rt)
    off = plan_row_times(arr, H100, p, "bf16-mixed", dataclasses.replace(rt, recompute_early_stop=0))
    return arr, rt, on, off


def test_profiles_say_which_checkpoint_stops_early():
    assert load_runtime("fsdp").recompute_early_stop == 1          # torch non-reentrant / compile
    assert load_runtime("fsdp:fsdp1").recompute_early_stop == 1    # Composer, reentrant: false
    assert load_runtime("autopar").recompute_early_stop == 1       # autopar/rewrite/recompute.py
    assert load_runtime("fsdp:te").recompute_early_stop == 0       # TE autograd Functions
    assert load_runtime("megatron").recompute_early_stop == 0      # reentrant CheckpointFunction
    assert load_runtime("deepspeed").recompute_early_stop == 0


def test_tp1_skips_the_last_gemm_and_the_residual_add():
    arr, rt, on, off = _pair("fsdp")
    blk = arr.is_block
    m, n, k = TABLE.rows[1].matmul_dims[-1]   # w2: the block's last GEMM
    kern = stack_profile(H100, rt.kernel_stack)
    f = 2.0 * m * n * k
    gemm = f / kern.peak_flops_per_s(TABLE.act_dtype_bytes) / float(kern.matmul_efficiency(np.array([f]))[0])
    add = 3.0 * arr.boundary / kern.elementwise_bw
    np.testing.assert_allclose((off.recompute_s - on.recompute_s)[blk], gemm + add[blk], rtol=1e-9)
    assert (on.recompute_s[blk] > 0.5 * off.recompute_s[blk]).all()   # the rest is still re-run
    np.testing.assert_array_equal(on.recompute_s[~blk], off.recompute_s[~blk])
    np.testing.assert_array_equal(on.fwd_s, off.fwd_s)
    np.testing.assert_array_equal(on.bwd_s, off.bwd_s)


def test_tp_skips_one_of_the_block_forward_collectives():
    arr, _, on, off = _pair("fsdp", tp=4)          # two pairs a block, one all-reduce each
    blk = arr.is_block
    assert (off.tp_recompute_s[blk] > 0).all()
    np.testing.assert_allclose(on.tp_recompute_s[blk], off.tp_recompute_s[blk] / 2, rtol=1e-12)
    arr, _, on, off = _pair("fsdp", tp=4, sequence_parallel=True)   # AG + RS per pair: one RS of four
    np.testing.assert_allclose(on.tp_recompute_s[blk], off.tp_recompute_s[blk] * 3 / 4, rtol=1e-12)
    arr, _, on, off = _pair("fsdp:async_tp", tp=4, sequence_parallel=True)   # the fused RS whole
    assert (on.recompute_s[blk] < off.recompute_s[blk]).all()
    assert (on.tp_recompute_s[blk] <= off.tp_recompute_s[blk]).all()


def test_whole_forward_runtimes_are_unchanged():
    for runtime in ("megatron", "deepspeed"):
        p = Plan(dp=1, tp=2, micro_batch_size=1, recompute="full", runtime=runtime)
        arr = table_arrays(TABLE)
        rt = plan_row_times(arr, H100, p, "bf16-mixed", load_runtime(runtime))
        again = plan_row_times(arr, H100, p, "bf16-mixed", dataclasses.replace(load_runtime(runtime),
                                                                               recompute_early_stop=1))
        assert (again.recompute_s[arr.is_block] < rt.recompute_s[arr.is_block]).all()   # the switch is live
        np.testing.assert_array_equal(rt.fwd_s, again.fwd_s)


def test_torchtitan_export_asks_for_early_stop_on_full_recompute():
    from autopar.export import export_plan
    from costmodels.contracts.files import tomllib
    from tests.export_plans import ctx_for
    for recompute, want in (("full", True), ("none", None)):
        plan = Plan(dp=2, tp=2, micro_batch_size=1, recompute=recompute, runtime="fsdp", zero=3,
                    sequence_parallel=True)
        ac = tomllib.loads(export_plan(plan, "torchtitan", ctx_for(plan)).text)["activation_checkpoint"]
        assert ac["mode"] == recompute and ac.get("early_stop") == want
