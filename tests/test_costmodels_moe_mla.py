"""DeepSeek-V3's Multi-head Latent Attention priced as Megatron-core runs it, the recompute of its
up-projections, the dispatched tokens kept as each stack keeps them, and a MoE row's fused
attention core at the attention efficiency (issue 27, engineer moemla).

Each expectation is derived here from the structure it models (the widths of MLA's linears, what
autograd keeps), not read off the implementation."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest

from costmodels.calibration.mla import DEEPSEEK_V3
from costmodels.calibration.moe_runs import megatron_unpermutes_probs, row_mla, row_recompute_modules
from costmodels.calibration.moe_tables import moe_table
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.model.experts import expert_terms
from costmodels.model.moe_attention_core import moe_core_fix_s
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

ROOT = Path(__file__).resolve().parents[1]
H, A, S = 7168, 128, 4096
M = DEEPSEEK_V3


def _table(mla=M, recompute=False, layers=4, seq=S, dense=1):
    # DeepSeek-V3's block widths, a few layers (the first dense, as its first three are)
    return moe_table(layers, H, A, A, 18432, 129280, seq, experts=256, top_k=8, expert_ffn=2048, shared=1,
                     dense_layers=dense, mla=mla, mla_up_proj_recompute=recompute)


def test_mla_forward_flops_are_its_low_rank_linears_and_its_wider_core():
    mha, mla = _table(None).rows[2], _table().rows[2]
    qk, v = 128 + 64, 128
    linears = H * 1536 + 1536 * A * qk + H * (512 + 64) + 512 * A * (128 + v) + A * v * H
    per_token_mla = 2 * linears + 2 * S * A * (qk + v)
    per_token_mha = 2 * (H * 3 * H + H * H) + 4 * S * H        # head size H/A = 56, kv heads = heads
    assert mla.fwd_flops - mha.fwd_flops == pytest.approx(S * (per_token_mla - per_token_mha))
    assert mla.fwd_flops / S == pytest.approx(1506.1e6, rel=1e-3)   # the MoE block, experts included
    assert mla.params - mha.params == linears + 1536 + 512 - 4 * H * H


def test_attention_core_is_priced_at_mlas_widths():
    t, d = table_arrays(_table()), table_arrays(_table(None))
    blocks = t.is_block
    assert np.allclose(t.attn_core_flops[blocks], 2.0 * S * S * A * (192 + 128))
    assert np.allclose(d.attn_core_flops[blocks], 4.0 * S * S * H)   # hidden-wide heads: unchanged


def test_up_projection_recompute_drops_q_k_v_and_reruns_the_up_projections():
    plain, rec = _table().rows[2], _table(recompute=True).rows[2]
    tokens = S * 2                                                   # bf16 bytes per element
    kept_less = A * (2 * 192 + 128) * tokens                         # q, k, v (the output stays)
    assert plain.act_tp_bytes - rec.act_tp_bytes == kept_less
    # outside TP: the checkpoint keeps its inputs (compressed q, kv, RoPE key), not the fused
    # layernorms' normalized copies the plain run keeps beside them
    normed = (1536 + 512) * tokens
    assert plain.saved_activation_bytes - rec.saved_activation_bytes == kept_less + normed - 64 * tokens
    up = 2.0 * S * (1536 * A * 192 + 512 * A * 256)                  # q_up and kv_up, once more
    assert rec.bwd_flops - plain.bwd_flops == pytest.approx(up)
    assert rec.weight_grad_flops == pytest.approx(plain.weight_grad_flops)   # the W part unchanged


def test_runtimes_keep_the_dispatched_tokens_as_their_code_does():
    copies = {n: load_runtime(n).moe_saved_token_copies for n in
              ("megatron", "megatron:unpermute_probs", "fsdp", "fsdp:probs_in_activation", "autopar")}
    assert copies == {"megatron": 0, "megatron:unpermute_probs": 1, "fsdp": 1,
                      "fsdp:probs_in_activation": 0, "autopar": 1}
    table = moe_table(4, 1024, 16, 4, 2816, 32000, 2048, experts=16, top_k=2, expert_ffn=512)
    arr, prof = table_arrays(table), load_profile("h100-80g-sxm")
    plan = Plan(dp=4, tp=2, ep=4, zero=1, sequence_parallel=True)
    routed = [r for r in table.rows if r.experts]
    v = routed[0].dispatch_bytes / plan.tp                            # one GPU's routed tokens
    for c in (0, 1):
        t = expert_terms(arr, prof, plan, "none", 1.0, saved_copies=c)
        assert np.allclose(t.buffer_bytes[[r.experts > 0 for r in table.rows]], c * v)
    act = {rt: estimate(table, prof, Plan(**{**plan.to_dict(), "runtime": rt}), 8, 16).memory_bytes["activations"]
           for rt in ("megatron", "megatron:unpermute_probs")}
    assert act["megatron:unpermute_probs"] > act["megatron"]


def test_a_moe_rows_attention_core_runs_at_the_attention_efficiency():
    # the row's mean efficiency is dragged down by 256 small expert GEMMs; the core's own GEMMs
    # are large: the core must not be priced below the attention efficiency because of them
    table, prof = _table(seq=S), load_profile("h100-80g-sxm")
    arr = table_arrays(table)
    plan = Plan(dp=8, tp=2, ep=8, sequence_parallel=True)
    moe = np.array([r.experts > 0 for r in table.rows])
    fwd, bwd = moe_core_fix_s(arr, prof, plan, 1.0, moe)
    i = int(np.flatnonzero(moe)[0])
    f = arr.mm_flops[arr.mm_row == i] / plan.tp
    e = prof.matmul_efficiency(f)
    core = [j for j, (m, _, _) in enumerate(table.rows[i].matmul_dims) if m == A * S]
    eff_row, eff_core = f.sum() / (f / e).sum(), f[core].sum() / (f[core] / e[core]).sum()
    assert eff_row < prof.attention_efficiency < eff_core
    peak = prof.peak_flops_per_s(2)
    assert fwd[i] == pytest.approx(arr.attn_core_flops[i] / plan.tp / peak * (1 / eff_row - 1 / eff_core))
    assert bwd[i] == pytest.approx(2.0 * fwd[i]) and fwd[i] > 0
    assert not fwd[~moe].any()                                      # dense rows left alone
    none, _ = moe_core_fix_s(arr, prof, Plan(**{**plan.to_dict(), "attention": "math"}), 1.0, moe)
    assert not none.any()


def test_the_deepseek_rows_run_as_their_launches_state():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_costmodels_moe as bench
    rows = {r["row_id"]: r for r in csv.DictReader(open(ROOT / "tests" / "data" / "validation" / "moe_runs.csv"))}
    h100 = rows["dgxc-v25.05.05-deepseek-v3-h100-bf16-512"]
    assert row_mla(h100) == DEEPSEEK_V3 and row_mla(rows["dgxc-v24.11.1-grok1-314b-bf16-8"]) is None
    assert row_recompute_modules(h100) == ("mla_up_proj",)
    assert row_recompute_modules(rows["dgxc-v25.05.05-deepseek-v3-gb200-bf16-128"]) == ("core_attn",)
    assert not megatron_unpermutes_probs(h100)                        # nemo:25.04.01: Megatron f98b1a0
    assert megatron_unpermutes_probs(rows["dgxc-v24.11.1-grok1-314b-bf16-8"])
    got = {s["row_id"]: s for s in bench.score([h100])}[h100["row_id"]]
    assert got["fits"]                                               # it ran (85.9 GiB predicted before)
