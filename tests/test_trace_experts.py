"""MoE blocks recognised by the trace without ``--leaf`` (autopar/trace/experts.py): the built-in
``moe`` family and transformers' Mixtral, Qwen2-MoE and DeepSeek-V3 built from small configs (the
latter where transformers has it; torchtitan 0.2.2's MoE module imports triton, absent here), each
block one row with its router, experts and shared experts, the FLOPs of the k of E experts each
token runs, and the MoE fields of the layer table (expert parameters, routed tokens, dispatch
bytes)."""
from __future__ import annotations

import json

import pytest

from autopar.models import load_model
from autopar.trace import trace_model
from costmodels.contracts.layer_table import LayerTable

T = pytest.importorskip("transformers")
V, C, S, L, H = 64, 32, 8, 2, 4


def hf_spec(tmp_path, name, cfg):
    cfg = cfg.to_dict()
    cfg["_attn_implementation"] = "eager"
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return f"hf:{path}"


def configs():
    small = dict(vocab_size=V, hidden_size=C, num_hidden_layers=L, num_attention_heads=H,
                 num_key_value_heads=2, max_position_embeddings=S)
    out = {"mixtral": (T.MixtralConfig(intermediate_size=2 * C, num_local_experts=4, num_experts_per_tok=2,
                                       **small), 4, 2, 2 * C, 0)}
    out["qwen2_moe"] = (T.Qwen2MoeConfig(intermediate_size=2 * C, moe_intermediate_size=16, num_experts=4,
                                         num_experts_per_tok=2, shared_expert_intermediate_size=16,
                                         **small), 4, 2, 16, 16)
    if hasattr(T, "DeepseekV3Config"):   # MLA attention, a leading dense block, a shared expert
        out["deepseek_v3"] = (T.DeepseekV3Config(
            intermediate_size=2 * C, moe_intermediate_size=16, n_shared_experts=1, n_routed_experts=8,
            num_experts_per_tok=2, first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=16,
            kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8,
            **{**small, "num_hidden_layers": L + 1, "num_key_value_heads": H}), 8, 2, 16, 16)
    return out


@pytest.mark.parametrize("name", list(configs()))
def test_transformers_moe_blocks_traced_without_leaf(tmp_path, name):
    cfg, experts, k, ffn, shared = configs()[name]
    spec = hf_spec(tmp_path, name, cfg)
    table = trace_model(load_model(spec, seq=S))
    blocks = [r for r in table.rows if r.kind == "block" and r.experts]
    assert len(blocks) == L     # DeepSeek-V3's leading dense block has none
    for r in blocks:
        assert r.experts == experts and r.routed_tokens == S * k
        assert r.expert_params == 3 * C * ffn * experts           # gate, up, down of every expert
        assert r.dispatch_bytes == S * k * C * table.act_dtype_bytes
        # the experts actually run: k of E per token, one multiply-add per weight and token
        assert r.expert_fwd_flops == 2 * S * k * 3 * C * ffn
        assert r.fwd_flops >= r.expert_fwd_flops + 2 * S * C * experts    # + the router (+ shared)
    if name != "deepseek_v3":   # MLA: the trace's heads / kv_heads guess (4 / 3) does not reload
        assert LayerTable.from_dict(json.loads(table.to_json())) == table


def test_mixtral_block_is_a_llama_block_with_k_experts_and_a_router(tmp_path):
    cfg, experts, k, ffn, _ = configs()["mixtral"]
    mixtral = trace_model(load_model(hf_spec(tmp_path, "mixtral", cfg), seq=S)).rows[1].fwd_flops
    llama_cfg = T.LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=2 * C, num_hidden_layers=L,
                              num_attention_heads=H, num_key_value_heads=2, max_position_embeddings=S)
    llama = trace_model(load_model(hf_spec(tmp_path, "llama", llama_cfg), seq=S)).rows[1].fwd_flops
    mlp = 2 * S * 3 * C * ffn
    assert mixtral == llama - mlp + k * mlp + 2 * S * C * experts


def test_builtin_moe_rows_count_the_routed_experts():
    spec = ("moe:layers=3,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=64,seq=8,experts=4,top_k=2,"
            "expert_ffn=16,shared_experts=1,dense_layers=1")
    table = trace_model(load_model(spec))
    dense, moe = table.rows[1], table.rows[2]
    assert dense.experts == 0 and dense.expert_params == 0
    assert moe.experts == 4 and moe.expert_params == 3 * 32 * 16 * 4 and moe.routed_tokens == 16
    # the dense block's SwiGLU (ffn 64) against the MoE block's router + 2 of 4 experts + shared
    attn = dense.fwd_flops - 2 * 8 * 3 * 32 * 64
    assert moe.fwd_flops == attn + 2 * 8 * 32 * 4 + moe.expert_fwd_flops + 2 * 8 * 3 * 32 * 16
    # the dense table keeps its JSON: no MoE field where a row has none
    assert "experts" not in table.to_dict()["rows"][1] and table.to_dict()["rows"][2]["experts"] == 4
