"""The B / W split of each row's backward: the trace's ``bwd_weight_flops`` (the FLOPs of the
weight-gradient products) against a hand count on the built-in families, and how a layer table
without the field loads."""
import json

import pytest

from autopar.trace import table_for
from costmodels.contracts.errors import SpecError
from costmodels.contracts.layer_table import LayerTable

B, S, H, V = 2, 16, 64, 100


def test_gpt_weight_gradients_by_hand():
    # a block's linears: c_attn h→3h, c_proj h→h, fc h→4h, proj 4h→h; dW of x·Wᵀ costs 2·tokens·in·out
    t = table_for(f"gpt:layers=2,hidden={H},heads=4,vocab={V},seq={S}", micro_batch=B)
    tokens = B * S
    block = 2 * tokens * (H * 3 * H + H * H + H * 4 * H + 4 * H * H)
    emb, b0, b1, head = t.rows
    assert emb.bwd_weight_flops == 0             # an embedding's gradient is a scatter, no product
    assert b0.bwd_weight_flops == b1.bwd_weight_flops == block
    assert head.bwd_weight_flops == 2 * tokens * H * V   # the (tied) output projection
    # attention's Q·Kᵀ and scores·V have no weight: a block's W is less than half its backward
    assert b0.bwd_weight_flops < b0.bwd_flops / 2


def test_llama_weight_gradients_by_hand():
    kv, ffn = 2, 96
    t = table_for(f"llama:layers=2,hidden={H},heads=4,kv_heads={kv},ffn={ffn},vocab={V},seq={S}", micro_batch=B)
    tokens, kv_dim = B * S, H // 4 * kv
    # q, o: h→h; k, v: h→kv_dim (grouped-query); w1, w3: h→ffn; w2: ffn→h
    block = 2 * tokens * (2 * H * H + 2 * H * kv_dim + 3 * H * ffn)
    assert [r.bwd_weight_flops for r in t.rows] == [0, block, block, 2 * tokens * H * V]


def test_a_table_without_the_field_reads_half_the_backward():
    t = table_for(f"gpt:layers=2,hidden={H},heads=4,vocab={V},seq={S}")
    d = json.loads(t.to_json())
    for row in d["rows"]:
        del row["bwd_weight_flops"]
    old = LayerTable.from_dict(d)
    assert all(r.bwd_weight_flops is None for r in old.rows)
    assert [r.weight_grad_flops for r in old.rows] == [r.bwd_flops / 2 for r in old.rows]
    assert LayerTable.from_dict(json.loads(t.to_json())) == t


def test_more_weight_gradient_than_backward_is_refused():
    d = json.loads(table_for(f"gpt:layers=2,hidden={H},heads=4,vocab={V},seq={S}").to_json())
    d["rows"][1]["bwd_weight_flops"] = d["rows"][1]["bwd_flops"] * 1.5
    with pytest.raises(SpecError, match="row 1: field bwd_weight_flops .* cannot exceed"):
        LayerTable.from_dict(d)
