"""Every preset and family traces; the user-code and hf: paths; the graph; micro-batch linearity."""
import os

import networkx as nx
import pytest
import torch

from autopar.models import FAMILIES, PRESETS, load_model
from autopar.trace import table_for, trace_graph, trace_model

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

FAMILY_SPECS = {
    "gpt": "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32",
    "llama": "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=160,vocab=128,seq=32",
    "bert": "bert:layers=2,hidden=64,heads=4,vocab=128,seq=32",
    "vit": "vit:layers=2,hidden=64,heads=4,image=32,patch=8,classes=10",
    "mlp": "mlp:layers=3,hidden=64,seq=8",
    "moe": "moe:layers=2,hidden=64,heads=4,kv_heads=2,ffn=160,vocab=128,seq=32,experts=4,top_k=2,expert_ffn=32",
}


def _model_params(spec):
    model = load_model(spec).build("meta", seed=None)
    return sum(p.numel() for p in model.parameters())


def _check_table(table, layers):
    names = [r.name for r in table.rows]
    assert names[0] == "embedding" and names[-1] == "head"
    assert [r.kind for r in table.rows[1:-1]] == ["block"] * layers
    assert table.layers == layers
    for r in table.rows:
        assert r.fwd_flops >= 0 and r.bwd_flops >= r.fwd_flops * 0.99 or r.fwd_flops == 0
        assert r.saved_activation_bytes >= r.act_tp_bytes >= r.act_attention_core_bytes >= 0
        assert r.boundary_bytes > 0
    assert table.act_dtype_bytes == 2


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_traces(preset):
    table = table_for(preset)
    cfg = PRESETS[preset]
    _check_table(table, cfg.layers)
    assert table.total_params == _model_params(preset)
    assert table.seq == cfg.tokens_per_sample
    block = table.rows[1]
    assert block.fwd_flops > 0 and block.tp_pairs and block.tp_comm_bytes == 2 * table.seq * cfg.hidden
    if cfg.family != "mlp":
        attn = [p for p in block.tp_pairs if p.heads]
        assert attn and (attn[0].heads, attn[0].kv_heads) == (cfg.heads, cfg.n_kv_heads)


def test_every_family_is_tested():
    assert set(FAMILY_SPECS) == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILY_SPECS))
def test_every_family_traces(family):
    spec = FAMILY_SPECS[family]
    table = table_for(spec)
    _check_table(table, int(spec.split("layers=")[1].split(",")[0]))
    assert table.total_params == _model_params(spec)


def test_preset_override_changes_seq():
    t = table_for("gpt2-small:seq=512")
    assert t.seq == 512
    assert table_for("gpt2-small", seq=256).seq == 256


def test_micro_batch_is_linear():
    spec = FAMILY_SPECS["gpt"]
    one, two = table_for(spec, micro_batch=1), table_for(spec, micro_batch=2)
    assert two.micro_batch == 2
    for a, b in zip(one.rows, two.rows):
        assert b.fwd_flops == 2 * a.fwd_flops and b.bwd_flops == 2 * a.bwd_flops
        assert b.boundary_bytes == 2 * a.boundary_bytes
        assert b.act_tp_bytes == 2 * a.act_tp_bytes
        # a causal mask (s² bytes, shared by the batch) is the only non-linear saved tensor
        assert abs(b.saved_activation_bytes - 2 * a.saved_activation_bytes) <= 32 * 32


def test_dropout_masks_are_one_byte():
    """Korthikanti counts 1-byte dropout masks (GPU native_dropout); the trace must too."""
    base = "gpt:layers=1,hidden=64,heads=4,vocab=128,seq=32"
    a = table_for(base).rows[1]
    b = table_for(base + ",dropout=0.1").rows[1]
    s, h, heads = 32, 64, 4
    # + two residual dropout masks (s·h each) + attention mask (a·s²) + its saved output (2·a·s²)
    assert b.saved_activation_bytes - a.saved_activation_bytes == 2 * s * h + 3 * heads * s * s


def test_user_code_nanogpt():
    table = trace_model(load_model(f"{FIXTURES}/nanogpt.py:gpt"))
    assert [r.name for r in table.rows] == ["embedding", "transformer.h.0", "transformer.h.1",
                                            "transformer.h.2", "head"]
    assert (table.hidden, table.heads, table.kv_heads, table.vocab, table.seq) == (64, 4, 4, 512, 64)
    block = table.rows[1]
    pairs = {p.row: p for p in block.tp_pairs}
    assert pairs["attn.c_proj"].column == ("attn.c_attn",) and pairs["attn.c_proj"].heads == 4
    assert pairs["mlp.c_proj"].column == ("mlp.c_fc",)
    s, b, h, a = 64, 1, 64, 4
    assert abs(block.saved_activation_bytes - s * b * h * (34 + 5 * a * s / h)) <= 0.05 * s * b * h * 34
    assert block.act_attention_core_bytes == 5 * a * s * s * b
    # the tied embedding / output projection is counted once, in the embedding row
    assert table.rows[0].tied_params == ("transformer.wte.weight",)
    assert table.rows[-1].tied_params == ("lm_head.weight",)
    gpt = load_model(f"{FIXTURES}/nanogpt.py:gpt").build("meta", seed=None)
    assert table.total_params == sum(p.numel() for p in gpt.parameters())


def test_hf_tiny_llama():
    pytest.importorskip("transformers")
    table = table_for(f"hf:{FIXTURES}/tiny_llama_config.json")
    assert table.layers == 2 and table.seq == 32
    assert (table.hidden, table.heads, table.kv_heads, table.vocab) == (64, 4, 2, 256)
    block = table.rows[1]
    pairs = {p.row.split(".")[-1]: p for p in block.tp_pairs}
    assert pairs["o_proj"].heads == 4 and pairs["o_proj"].kv_heads == 2
    assert [c.split(".")[-1] for c in pairs["o_proj"].column] == ["q_proj", "k_proj", "v_proj"]
    assert [c.split(".")[-1] for c in pairs["down_proj"].column] == ["gate_proj", "up_proj"]
    # same shapes as autopar's own llama family: the same parameters and matmul FLOPs per block
    ours = table_for("llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=160,vocab=256,seq=32")
    assert table.total_params == ours.total_params
    assert block.params == ours.rows[1].params
    assert block.fwd_flops == ours.rows[1].fwd_flops


def test_graph_is_networkx_with_node_figures():
    res = trace_graph(load_model(FAMILY_SPECS["gpt"]))
    g = res.graph
    assert isinstance(g, nx.DiGraph) and nx.is_directed_acyclic_graph(g)
    total_fwd = sum(d["fwd_flops"] for _, d in g.nodes(data=True))
    total_bwd = sum(d["bwd_flops"] for _, d in g.nodes(data=True))
    assert total_fwd == sum(r.fwd_flops for r in res.table.rows)
    assert total_bwd == sum(r.bwd_flops for r in res.table.rows)
    linear = [d for n, d in g.nodes(data=True) if n.endswith("attn_c_attn")]
    assert len(linear) == 2 and all(d["param_bytes"] == (64 * 192 + 192) * 2 and d["fwd_flops"] > 0 for d in linear)
    assert all(d["output_bytes"] >= 0 for _, d in g.nodes(data=True))


def test_big_model_costs_no_weight_memory():
    import resource
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    table_for("llama3-405b")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 500


def test_leaf_modules_argument():
    table = trace_model(load_model(f"{FIXTURES}/untraceable.py:build"), leaf_modules=("FusedMLP",))
    assert table.layers == 2 and table.rows[1].fwd_flops > 0
    assert torch.is_tensor(torch.zeros(1))


def test_inspect_json_round_trips_to_layer_table(capsys):
    import json

    from autopar.cli.main import main
    from costmodels.contracts.layer_table import LayerTable
    spec = FAMILY_SPECS["llama"]
    assert main(["inspect", spec, "--json", "--micro-batch", "2", "--seq", "16"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["micro_batch"] == 2 and d["seq"] == 16 and d["num_layers"] == 2
    assert LayerTable.from_dict(d) == table_for(spec, micro_batch=2, seq=16)


def test_inspect_table_for_people(capsys):
    from autopar.cli.main import main
    assert main(["inspect", f"{FIXTURES}/nanogpt.py:gpt"]) == 0
    out = capsys.readouterr().out
    assert "transformer.h.0" in out and "c_attn→c_proj (4 heads)" in out and "embedding" in out
