"""Model specs: presets, overrides, families, and the messages for bad ones."""
import pytest

from autopar.models import FAMILIES, PRESETS, load_model, parse_config
from costmodels.contracts.errors import SpecError


def test_presets_listed():
    assert set(PRESETS) == {"gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-175b", "llama3-8b",
                            "llama3-70b", "llama3-405b", "bert-large", "vit-huge",
                            "deepseek-v3-like", "qwen3-moe-like", "mixtral-like"}
    assert set(FAMILIES) == {"gpt", "llama", "bert", "vit", "mlp", "moe"}


def test_gpt3_shape():
    c = PRESETS["gpt3-175b"]
    assert (c.layers, c.hidden, c.heads, c.vocab, c.seq, c.tied) == (96, 12288, 96, 51200, 2048, True)


def test_override_and_seq():
    assert parse_config("gpt3-175b", "seq=4096").seq == 4096
    assert load_model("gpt3-175b", seq=1024).seq == 1024
    assert load_model("gpt:layers=2,hidden=64,heads=4,vocab=100,seq=16").config.ffn_dim == 256


@pytest.mark.parametrize("spec,match", [
    ("gpt-3", "did you mean"),
    ("gpt:layers=2,hidden=64,heads=4,vocab=100,seq=16,bogus=1", "unknown setting 'bogus' for family gpt; allowed:"),
    ("gpt:layers=2,hidden=64", "needs"),
    ("gpt:layers=2,hidden=64,heads=5,vocab=100,seq=16", "not divisible"),
    ("llama:layers=x,hidden=64,heads=4,ffn=8,vocab=10,seq=8", "must be an integer"),
    ("hf:does/not/exist.json", "does not exist"),
    ("does_not_exist.py:fn", "does not exist"),
])
def test_bad_specs(spec, match):
    with pytest.raises(SpecError, match=match):
        load_model(spec)


def test_meta_build_is_cheap_and_real_build_is_seeded():
    import torch
    src = load_model("gpt:layers=1,hidden=32,heads=2,vocab=50,seq=8")
    a = src.build("cpu", seed=3)
    b = src.build("cpu", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert a.embedding.wte.weight.std() > 0.01          # initialised on real devices
    m = src.build("meta", seed=None)
    assert m.embedding.wte.weight.is_meta
    # nn.init works normally again after a meta build
    t = torch.nn.init.normal_(torch.zeros(100))
    assert t.std() > 0.5


def test_models_command_lists_presets_with_params(capsys):
    import json

    from autopar.cli.main import main
    assert main(["models", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    params = {r["name"]: r["params"] for r in out["presets"]}
    assert set(params) == set(PRESETS)
    assert abs(params["llama3-8b"] - 8.03e9) < 0.01 * 8.03e9
    assert abs(params["gpt2-small"] - 124.4e6) < 0.01 * 124.4e6
    assert out["families"] == list(FAMILIES)


def test_moe_presets_have_their_published_sizes():
    """Total parameters of the MoE presets against their model cards (DeepSeek-V3 671B with MLA,
    here with full attention: within 1 %; Qwen3-30B-A3B 30.5B with head_dim 128, here 64: within
    2 %; Mixtral 8x7B 46.7B)."""
    from autopar.models.moe import MoE  # noqa: F401  (the family's module imports)
    sizes = {"deepseek-v3-like": 671e9, "qwen3-moe-like": 30.5e9, "mixtral-like": 46.7e9}
    for name, published in sizes.items():
        c = PRESETS[name]
        attn = c.hidden * (c.heads + 2 * c.n_kv_heads) * c.head_dim + c.heads * c.head_dim * c.hidden
        moe = c.hidden * c.experts + 3 * c.hidden * c.expert_ffn_dim * (c.experts + c.shared_experts)
        dense = 3 * c.hidden * c.ffn_dim
        total = c.layers * attn + c.dense_layers * dense + (c.layers - c.dense_layers) * moe + 2 * c.vocab * c.hidden
        assert abs(total / published - 1) < 0.02, (name, total)


def test_moe_settings_checked():
    with pytest.raises(SpecError, match="top_k=4 is above experts=2"):
        load_model("moe:layers=2,hidden=32,heads=4,ffn=64,vocab=64,seq=8,experts=2,top_k=4")
    with pytest.raises(SpecError, match="dense_layers=2 leaves no MoE block"):
        load_model("moe:layers=2,hidden=32,heads=4,ffn=64,vocab=64,seq=8,experts=2,top_k=1,dense_layers=2")
    assert parse_config("mixtral-like", "capacity_factor=dropless").capacity_factor == 0.0
    assert parse_config("mixtral-like", "capacity_factor=1.25").capacity_factor == 1.25
