"""Issue 2's "must show": parameter, FLOP and activation counts against published formulas.

GPT-3 175B (Megatron: l=96, h=12288, a=96, V=51200, s=2048) at micro-batch 1:
* total parameters within 0.5% of 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h)) (Narayanan et al. 2021);
* a transformer layer's forward FLOPs within 2% of 24·b·s·h²·(1 + s/(6h));
* a layer's activation bytes saved for backward within 2% of s·b·h·(34 + 5·a·s/h), the
  "no parallelism" row of Korthikanti et al. 2022, Table 2 (tests/data/validation/activation_formulas.csv);
  of which s·b·h·(24 + 5·a·s/h) inside tensor-parallel regions and 5·a·s²·b in the attention core.
Llama 3 presets within 1% of Meta's 8.03 B, 70.55 B and 405.85 B.
"""
import csv
import json
import os

import pytest

from autopar.cli.main import main
from autopar.trace import table_for

L, H, A, V, S, B = 96, 12288, 96, 51200, 2048, 1
VALIDATION = os.path.join(os.path.dirname(__file__), "data", "validation", "activation_formulas.csv")


def close(x, ref, tol):
    return abs(x - ref) <= tol * abs(ref)


@pytest.fixture(scope="module")
def gpt3():
    return table_for("gpt3-175b")


def test_gpt3_params_match_megatron(gpt3):
    megatron = 12 * L * H**2 * (1 + 13 / (12 * H) + (V + S) / (12 * L * H))
    assert close(gpt3.total_params, megatron, 0.005), (gpt3.total_params, megatron)


def test_gpt3_block_forward_flops(gpt3):
    ref = 24 * B * S * H**2 * (1 + S / (6 * H))
    blocks = [r for r in gpt3.rows if r.kind == "block"]
    assert len(blocks) == L
    for r in blocks:
        assert close(r.fwd_flops, ref, 0.02), (r.name, r.fwd_flops, ref)
        assert close(r.bwd_flops, 2 * ref, 0.02)


def _korthikanti_no_parallelism():
    """Korthikanti Table 2's "no parallelism" formula, read from tests/data/validation."""
    with open(VALIDATION, newline="") as f:
        [formula] = [row["bytes_per_layer"] for row in csv.DictReader(f)
                     if row["setting"].strip() == "no parallelism"]
    return eval(formula, {}, {"s": S, "b": B, "h": H, "a": A})  # noqa: S307 — a published formula


def test_gpt3_block_activation_bytes_match_korthikanti(gpt3):
    block = next(r for r in gpt3.rows if r.kind == "block")
    assert close(block.saved_activation_bytes, _korthikanti_no_parallelism(), 0.02)
    assert close(block.act_tp_bytes, S * B * H * (24 + 5 * A * S / H), 0.02)
    assert close(block.act_attention_core_bytes, 5 * A * S * S * B, 0.02)
    assert block.boundary_bytes == 2 * S * B * H
    assert block.tp_comm_bytes == 2 * S * B * H


def test_gpt3_tp_pairs_and_tied_embedding(gpt3):
    block = next(r for r in gpt3.rows if r.kind == "block")
    pairs = {p.row: p for p in block.tp_pairs}
    assert pairs["attn.c_proj"].column == ("attn.c_attn",)
    assert (pairs["attn.c_proj"].heads, pairs["attn.c_proj"].kv_heads) == (A, A)
    assert pairs["mlp.c_proj"].column == ("mlp.c_fc",) and pairs["mlp.c_proj"].heads is None
    emb, head = gpt3.rows[0], gpt3.rows[-1]
    assert emb.tied_params and head.tied_params
    assert head.params == 2 * H  # the tied output projection is counted in the embedding row


@pytest.mark.parametrize("preset,billions", [("llama3-8b", 8.03), ("llama3-70b", 70.55), ("llama3-405b", 405.85)])
def test_llama3_param_counts(preset, billions):
    table = table_for(preset)
    assert close(table.total_params, billions * 1e9, 0.01), table.total_params


def test_llama3_gqa_pairs():
    block = next(r for r in table_for("llama3-70b").rows if r.kind == "block")
    pairs = {p.row: p for p in block.tp_pairs}
    assert pairs["attn.wo"].column == ("attn.wq", "attn.wk", "attn.wv")
    assert (pairs["attn.wo"].heads, pairs["attn.wo"].kv_heads) == (64, 8)
    assert pairs["mlp.w2"].column == ("mlp.w1", "mlp.w3")


def test_inspect_json_gpt3(capsys):
    assert main(["inspect", "gpt3-175b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    megatron = 12 * L * H**2 * (1 + 13 / (12 * H) + (V + S) / (12 * L * H))
    assert out["model"] == "gpt3-175b"
    assert close(out["total_params"], megatron, 0.005)
    layers = out["layers"]
    assert [r["name"] for r in layers[:2]] == ["embedding", "blocks.0"] and layers[-1]["name"] == "head"
    for key in ("name", "kind", "params", "fwd_flops", "bwd_flops", "saved_activation_bytes", "boundary_bytes",
                "act_tp_bytes", "act_attention_core_bytes", "tp_pairs", "tied_params", "tp_comm_bytes",
                "matmul_dims"):
        assert key in layers[1], key
    assert close(layers[1]["fwd_flops"], 24 * B * S * H**2 * (1 + S / (6 * H)), 0.02)
