"""What torch's fused all-gather-matmul / matmul-reduce-scatter (torchtitan async TP) cost beyond
the chunk pipeline (costmodels.model.async_tp_fusion.micro_pipeline_tp_cost): the forward GEMMs
decomposed into per-shard GEMMs (two at a time on two streams), the shard copy into symmetric
memory and the partial-sum reduction the pipeline cannot hide; in the backward, the input-gradient
GEMMs of the row linears, whose output gradient's all-gather torch fuses with them."""
from __future__ import annotations

import numpy as np
from synthetic_tables import llama_table

from costmodels.contracts.plan import Plan
from costmodels.model.coefficients import plan_row_times
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

TABLE = llama_table(8, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")
H100 = load_profile("h100-80g-sxm")


def _extra(tp: int, precision: str = "bf16"):
    """(forward, backward) seconds async TP adds per row over the same plan without it, and the
    copies alone, computed here from the bytes."""
    arr = table_arrays(TABLE)
    plan = Plan(dp=1, tp=tp, micro_batch_size=2, sequence_parallel=True, runtime="fsdp:async_tp",
                precision=precision)
    atp = plan_row_times(arr, H100, plan, "bf16-mixed", load_runtime(plan.runtime))
    plain = plan_row_times(arr, H100, plan.with_(runtime="fsdp"), "bf16-mixed", load_runtime("fsdp"))
    v = arr.tp_comm_bytes * 2 / TABLE.micro_batch
    ag = 0.5 if precision == "fp8" else 1.0   # torchao's float8 TP gathers FP8 shards
    ew = H100.elementwise_bw
    copies_f = arr.tp_collectives * (ag * 2 * v / tp + v + v / tp) / ew
    copies_b = arr.tp_collectives * (ag * 2 * v / tp) / ew
    blk = arr.is_block & (arr.tp_comm_bytes > 0)
    assert blk.any()
    return (atp.fwd_s - plain.fwd_s)[blk], (atp.bwd_s - plain.bwd_s)[blk], copies_f[blk], copies_b[blk], \
        (atp.fwd_s - plain.fwd_s)[~blk]


def test_async_tp_pays_its_unhidden_copies_and_decomposed_gemms():
    fwd, bwd, copies_f, copies_b, rest = _extra(8)
    assert (copies_f > 0).all() and (fwd > copies_f * (1 + 1e-6)).all()   # + 8 shards' GEMMs, 2 at a time
    # backward: the gradient shards' copies + the decomposed input-gradient GEMMs of the row
    # linears (wo, w2) only: fewer GEMMs lose efficiency than in the forward (all four)
    assert (bwd > copies_b * (1 + 1e-6)).all() and ((bwd - copies_b) < 0.9 * (fwd - copies_f)).all()
    assert not rest.any()                                         # rows without TP collectives: nothing


def test_two_streams_cover_the_two_shards_of_tp2():
    fwd, bwd, copies_f, copies_b, _ = _extra(2)
    np.testing.assert_allclose(fwd, copies_f, rtol=1e-9)
    np.testing.assert_allclose(bwd, copies_b, rtol=1e-9)


def test_fp8_gemms_decompose_at_their_own_rate():
    f16, b16, c16, cb16, _ = _extra(8, "bf16")
    f8, b8, c8, cb8, _ = _extra(8, "fp8")
    split16, split8 = f16 - c16, f8 - c8
    assert (split8 > 0).all() and (split8 < split16).all()   # shorter FP8 GEMMs lose fewer seconds
    assert (b8 - cb8 > 0).all() and (b8 - cb8 < b16 - cb16).all()   # the backward's alike
