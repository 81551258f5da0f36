"""An MoE row under cp and in FP8: the rank's share of the routed tokens (cp divides them as it
divides every other per-token figure of the row) and the routed experts' GEMMs in FP8 under
Transformer Engine (costmodels/model/expert_precision.py)."""
from __future__ import annotations

import dataclasses

from costmodels.calibration.moe_tables import moe_table
from costmodels.contracts.plan import Plan
from costmodels.model.context_parallel import local_table
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

MEGATRON = "megatron:overlap_grad_reduce,overlap_param_gather,force_balance"


def _table(seq=4096):
    return moe_table(4, 2048, 16, 8, 8192, 32000, seq, experts=8, top_k=2, expert_ffn=8192)


def test_cp_local_table_divides_routed_tokens_dispatch_and_expert_flops():
    t = _table()
    loc = local_table(t, 2)
    for a, b in zip(t.rows, loc.rows):
        if a.experts:
            assert b.routed_tokens * 2 == a.routed_tokens
            assert b.dispatch_bytes * 2 == a.dispatch_bytes
            assert abs(b.expert_fwd_flops * 2 - a.expert_fwd_flops) < 1e-6 * a.expert_fwd_flops


def test_fp8_experts_faster_than_fp8_dense_linears_alone():
    prof = load_profile("h100-80g-sxm")
    t = _table()
    plan = Plan(dp=8, tp=1, ep=8, micro_batch_size=1, zero=1, runtime=MEGATRON)
    bf16 = estimate(t, prof, plan, 8, 64).step_time_s
    fp8 = estimate(t, prof, dataclasses.replace(plan, precision="fp8"), 8, 64).step_time_s
    # the same table with its experts made invisible to the FP8 recipe: only the dense linears in FP8
    no_moe = dataclasses.replace(t, rows=tuple(dataclasses.replace(r, experts=0, expert_fwd_flops=0.0,
                                                                   routed_tokens=0, dispatch_bytes=0,
                                                                   expert_params=0) for r in t.rows))
    dense_gain = (estimate(no_moe, prof, plan, 8, 64).step_time_s
                  - estimate(no_moe, prof, dataclasses.replace(plan, precision="fp8"), 8, 64).step_time_s)
    assert fp8 < bf16
    assert bf16 - fp8 > 1.2 * dense_gain   # the experts' GEMMs gain too
