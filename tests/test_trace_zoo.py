"""The one cutter on models as people write them (tests/fixtures/zoo.py), in one process: the
runtime's rows are the layer table's rows and chained give the model's logits; fused attention
shows its head count; image models count their tokens; MoE experts as a leaf are priced; ``hf:``
builds the training head users train."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from autopar.models.outputs import serial_forward
from autopar.models.source import ModelSource, token_loss
from autopar.runtime.assemble.rows import model_rows
from autopar.trace import trace_model

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import zoo  # noqa: E402

pytest.importorskip("transformers")
ALL = list(zoo.WRITTEN) + list(zoo.HF)


def source(name: str) -> ModelSource:
    def inputs(batch, g, device):
        x = zoo.zoo_batch(name, batch, 0)[0]
        return tuple(t.to(device) for t in x)

    def targets(inp, batch, g, device):
        return zoo.zoo_batch(name, batch, 0)[1].to(device)

    return ModelSource(spec=name, config=None, seq=zoo.S, _build=lambda attention: zoo.build(name),
                       _inputs=inputs, _targets=targets, loss_fn=token_loss)


def chain(rows, inputs):
    x = rows.modules[0](*inputs)
    for m in rows.modules[1:]:
        x = m(*x) if isinstance(x, tuple) else m(x)
    return x


@pytest.mark.parametrize("name", ALL)
def test_runtime_rows_are_the_trace_rows_and_give_the_logits(name):
    model = zoo.build(name)
    inputs, targets = zoo.zoo_batch(name, 2, 0)
    rows = model_rows(model, inputs)
    table = trace_model(source(name), leaf_modules=("MixtralExperts",) if name == "mixtral" else ())
    assert rows.names == [r.name for r in table.rows]
    assert rows.kinds == ["embedding"] + ["block"] * zoo.L + ["head"]
    torch.testing.assert_close(chain(rows, inputs), serial_forward(model, inputs, targets), rtol=1e-5, atol=1e-6)


def test_fused_attention_shows_its_heads_and_images_their_tokens():
    nano = trace_model(source("nanogpt"))
    titan = trace_model(source("titan_llama"))
    vit = trace_model(source("timm_vit"))
    assert (nano.heads, nano.kv_heads) == (zoo.H, zoo.H)
    assert (titan.heads, titan.kv_heads) == (zoo.H, 2)
    assert (vit.heads, vit.seq) == (zoo.H, (16 // 8) ** 2 + 1)   # patches + class token, not 3 channels


def test_moe_experts_as_a_leaf_are_priced():
    """A Mixtral block = a Llama block of the same sizes, less its MLP, plus the router and k of E
    experts per token (torch._grouped_mm counted exactly, whatever the routing)."""
    mixtral = trace_model(source("mixtral"), leaf_modules=("MixtralExperts",)).rows[1].fwd_flops
    llama = trace_model(source("llama")).rows[1].fwd_flops
    tokens, ffn, k, experts = zoo.S, 2 * zoo.C, 2, 4
    mlp = 2 * tokens * 3 * zoo.C * ffn
    assert mixtral == llama - mlp + k * mlp + 2 * tokens * zoo.C * experts


@pytest.mark.parametrize("name, head, seq", [("bert", "BertForMaskedLM", zoo.S),
                                             ("vit", "ViTForImageClassification", 5),
                                             ("llama", "LlamaForCausalLM", zoo.S)])
def test_hf_builds_the_training_head(tmp_path, name, head, seq):
    from autopar.models import load_model
    cfg = zoo.hf_model(name).config.to_dict()
    cfg.pop("architectures", None)   # chosen from the model type, as for a bare config.json
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    src = load_model(f"hf:{path}")
    model = src.build("meta", seed=None)
    assert type(model.model).__name__ == head and src.seq == seq
    inputs, targets = src.make_batch(2)
    if name == "vit":
        assert inputs[0].shape == (2, 3, 16, 16) and targets.shape == (2,)


def test_leaf_on_the_commands_that_trace(tmp_path, capsys):
    """Mixtral's experts are traced as a leaf whether --leaf names them or not (the trace
    recognises MoE layers, autopar/trace/experts.py): estimate (and search, verify, apply: the
    same option) prices the plan the same both ways."""
    from autopar.cli.main import main
    cfg = zoo.hf_model("mixtral").config.to_dict()
    path = tmp_path / "mixtral.json"
    path.write_text(json.dumps(cfg))
    args = ["estimate", f"hf:{path}", "--hardware", "a100-80g-sxm", "--gpus", "2", "--global-batch", "4",
            "--plan", '{"pp": 2}', "--json"]
    assert main(args) == 0
    auto = json.loads(capsys.readouterr().out)
    assert main(args + ["--leaf", "MixtralExperts"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] > 0 and out["fits"]
    assert auto["step_time_s"] == out["step_time_s"]
