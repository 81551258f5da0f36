"""torch's micro-pipeline TP (torchtitan async TP) hides each collective behind the GEMMs it is
fused with, not behind the whole row (costmodels.model.async_tp_windows): the attention core
hides nothing, a collective longer than its GEMMs stays partly exposed, the backward's
reduce-scatter fuses only where one column linear produces it."""
from __future__ import annotations

import dataclasses

import numpy as np
from synthetic_tables import llama_table

from costmodels.contracts.plan import Plan
from costmodels.model.async_tp_fusion import unfused_bwd_reduce_scatter_s
from costmodels.model.async_tp_windows import fused_collective_windows, linear_roles
from costmodels.model.coefficients import plan_row_times
from costmodels.model.table_arrays import table_arrays
from costmodels.model.tp_overlap import exposed
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

H100 = load_profile("h100-80g-sxm")
ASYNC = load_runtime("fsdp:async_tp")


def _times(table, b: int, tp: int = 8, runtime: str = "fsdp:async_tp", recompute: str = "none"):
    plan = Plan(dp=1, tp=tp, micro_batch_size=b, sequence_parallel=True, runtime=runtime, recompute=recompute)
    return plan_row_times(table_arrays(table), H100, plan, "bf16-mixed", load_runtime(runtime))


def _with_pairs(table, rows):
    """``table`` with each block row rebuilt by ``rows(row)``."""
    return dataclasses.replace(table, rows=tuple(rows(r) if r.kind == "block" else r for r in table.rows))


def test_pairs_match_the_row_linears_in_either_listing():
    merged = llama_table(2, 2048, 16, 4, 5632, 32000, 1024)   # qkv and w1|w3 listed as one GEMM each
    roles = linear_roles(table_arrays(merged))
    assert roles.matched[1:3].all() and not roles.matched[[0, 3]].any()
    assert roles.is_row.tolist() == [False, True, False, True] * 2 and not roles.pair_single.any()
    h, kv, f, m = 2048, 512, 5632, 1024

    def split(r):   # wq, wk, wv and w1, w3 as the trace lists them
        return dataclasses.replace(r, matmul_dims=((m, h, h), (m, kv, h), (m, kv, h), *r.matmul_dims[1:3],
                                                   (m, h, h), (m, f, h), (m, f, h), (m, h, f)))
    roles = linear_roles(table_arrays(_with_pairs(merged, split)))
    assert roles.is_row.tolist() == [False, False, False, True, False, False, True] * 2
    assert roles.matched[1:3].all()

    def broken(r):   # a GEMM missing: the row cannot be matched and keeps the row-wide window
        return dataclasses.replace(r, matmul_dims=r.matmul_dims[:-1])
    odd = _with_pairs(merged, broken)
    assert not linear_roles(table_arrays(odd)).matched.any()
    plain = _times(odd, 1, runtime="fsdp")
    atp = _times(odd, 1)
    blk = np.array([r.kind == "block" for r in odd.rows])
    np.testing.assert_allclose(atp.tp_fwd_s[blk], exposed(plain.tp_fwd_s, plain.fwd_s, 8)[blk], rtol=1e-12)


def test_the_attention_core_hides_nothing():
    # the same tokens per micro-batch (8 x 512 and 1 x 4096): the same linears and TP bytes,
    # eight times the attention FLOPs per token in the long rows
    short, long_ = llama_table(4, 2048, 16, 4, 5632, 32000, 512), llama_table(4, 2048, 16, 4, 5632, 32000, 4096)
    a, b = _times(short, 8), _times(long_, 1)
    pa, pb = _times(short, 8, runtime="fsdp"), _times(long_, 1, runtime="fsdp")
    blk = np.array([r.kind == "block" for r in short.rows])
    np.testing.assert_allclose(pa.tp_fwd_s[blk], pb.tp_fwd_s[blk], rtol=1e-12)   # the same collectives
    assert (pb.fwd_s[blk] > 1.2 * pa.fwd_s[blk]).all()                          # a longer row
    np.testing.assert_allclose(a.tp_fwd_s[blk], b.tp_fwd_s[blk], rtol=1e-12)     # exposes the same
    np.testing.assert_allclose(a.tp_bwd_s[blk], b.tp_bwd_s[blk], rtol=1e-12)
    # a row-wide window (tp_overlap alone) would hide more behind the longer row; at h = 2048
    # over 8 NVLink ranks a reduce-scatter outlasts the GEMM it is fused with, so more stays
    # exposed than that, never more than the collectives themselves
    wide_short, wide_long = exposed(pa.tp_fwd_s, pa.fwd_s, 8), exposed(pb.tp_fwd_s, pb.fwd_s, 8)
    assert (wide_long[blk] < wide_short[blk] * (1 - 1e-3)).all()
    assert (b.tp_fwd_s[blk] > wide_short[blk] * (1 + 1e-3)).all() and (b.tp_fwd_s[blk] < pb.tp_fwd_s[blk]).all()


def test_a_full_recompute_reruns_the_forward_windows():
    t = llama_table(4, 2048, 16, 4, 5632, 32000, 2048)
    rt = _times(t, 2, recompute="full")
    blk = np.array([r.kind == "block" for r in t.rows])
    np.testing.assert_allclose(rt.tp_recompute_s[blk], rt.tp_fwd_s[blk], rtol=1e-12)
    assert not _times(t, 2).tp_recompute_s.any()


def test_a_lone_column_linear_fuses_the_backward_reduce_scatter():
    t = llama_table(4, 2048, 16, 4, 5632, 32000, 2048)

    def lone(r):   # GPT's one c_attn / c_fc per pair: the dgrad GEMM alone produces the gradient
        return dataclasses.replace(r, tp_pairs=tuple(dataclasses.replace(p, column=p.column[:1]) for p in r.tp_pairs))
    g = _with_pairs(t, lone)
    arr, arr_g = table_arrays(t), table_arrays(g)
    assert linear_roles(arr_g).pair_single.all()
    tier = H100.group_link(Plan(tp=8, sequence_parallel=True), "tp")
    assert unfused_bwd_reduce_scatter_s(arr, ASYNC, tier, 8, 2, True)[arr.is_block].min() > 0
    assert not unfused_bwd_reduce_scatter_s(arr_g, ASYNC, tier, 8, 2, True).any()
    many, one = _times(t, 2), _times(g, 2)
    blk = arr.is_block
    assert (one.tp_bwd_s[blk] < many.tp_bwd_s[blk]).all()
    np.testing.assert_allclose(one.tp_fwd_s[blk], many.tp_fwd_s[blk], rtol=1e-12)   # the forward fuses both
    # ... and pays the fused reduce-scatter's partial-sum reduction and decomposed dgrad GEMM
    assert (one.bwd_s[blk] > many.bwd_s[blk]).all()


def test_only_micro_pipeline_tp_is_repriced():
    t = llama_table(2, 2048, 16, 4, 5632, 32000, 1024)
    arr = table_arrays(t)
    rt = _times(t, 1, runtime="fsdp")
    kernels = H100
    for runtime, plan in ((load_runtime("fsdp"), Plan(tp=8, sequence_parallel=True)),
                          (load_runtime("megatron:tp_comm_overlap"), Plan(tp=8, sequence_parallel=True)),
                          (ASYNC, Plan(tp=8, sequence_parallel=False)), (ASYNC, Plan(tp=1))):
        tier = H100.group_link(plan, "tp")
        assert fused_collective_windows(rt, arr, kernels, plan, runtime, tier, plan.tp, 1) is rt
