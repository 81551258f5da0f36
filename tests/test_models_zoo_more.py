"""The zoo's second shelf (issue 33, tests/fixtures/zoo_more.py): families people bring beyond the
first ten. Their layer tables are their runtime rows (same logits); a model without SDPA in
transformers runs (and is priced with) its eager attention; BatchNorm is traced without moving
its statistics, synchronised under dp and refused, in one line, where micro-batches would each
normalise alone; modules the tp rewrite cannot shard are refused by name; a stage's output is
contiguous. The runtime matrix of all of them: ``benchmarks/bench_runtime_zoo.py --more``."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from autopar.models.outputs import serial_forward
from autopar.runtime.assemble.prelaunch import check_before_launch
from autopar.runtime.assemble.rows import StageModule, model_rows
from autopar.trace import trace_model
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import zoo  # noqa: E402
from test_trace_zoo import chain, source  # noqa: E402

pytest.importorskip("transformers")

# one of each new structure: constants in a block's tuple (DeBERTa-v2, Falcon), a module called
# but not installed (RoBERTa's gelu), an encoder-decoder (T5), CNNs, nn.MultiheadAttention, ALiBi
ROWS = ["deberta_v2", "falcon", "roberta", "t5", "resnet", "convnext", "mha", "bloom", "gemma2"]


@pytest.mark.parametrize("name", ROWS)
def test_new_families_rows_are_the_trace_rows_and_give_the_logits(name):
    model = zoo.build(name)
    inputs, targets = zoo.zoo_batch(name, 2, 0)
    rows = model_rows(model, inputs)
    table = trace_model(source(name))
    assert rows.names == [r.name for r in table.rows]
    assert rows.kinds[0] == "embedding" and rows.kinds[-1] == "head" and rows.kinds.count("block") >= 3
    torch.testing.assert_close(chain(rows, inputs), serial_forward(model, inputs, targets), rtol=1e-5, atol=1e-6)


def _hf_config(tmp_path, name):
    cfg = zoo.hf_model(name).config.to_dict()
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return f"hf:{path}"


def test_attention_follows_what_the_model_supports(tmp_path):
    """Gemma-2 has no SDPA attention in transformers: a flash plan builds it eager (it used to
    raise transformers' ValueError), the layer table says so, and the estimate prices the
    attention that runs (math) — the same figures as a math plan; Llama keeps SDPA."""
    from autopar.models import load_model
    from costmodels.model.estimate import estimate
    spec = _hf_config(tmp_path, "gemma2")
    src = load_model(spec)
    model = src.build("cpu", seed=0, attention="flash")
    assert model.model.config._attn_implementation == "eager" and not src.fused_attention
    table = trace_model(src)
    assert table.fused_attention is False and table.to_dict()["fused_attention"] is False
    est = {a: estimate(table, "a100-80g-sxm", Plan(dp=2, attention=a), 2, 4) for a in ("flash", "math")}
    assert est["flash"].plan.attention == "math"   # the estimate says which attention runs
    assert est["flash"].step_time_s == est["math"].step_time_s
    assert est["flash"].memory_bytes == est["math"].memory_bytes
    llama = load_model(_hf_config(tmp_path, "llama"))
    assert llama.fused_attention and llama.build("cpu", attention="flash").model.config._attn_implementation == "sdpa"
    table = trace_model(llama)
    assert "fused_attention" not in table.to_dict()   # default left out of the JSON
    ll = {a: estimate(table, "a100-80g-sxm", Plan(dp=2, attention=a), 2, 4) for a in ("flash", "math")}
    assert ll["flash"].plan.attention == "flash" and ll["flash"].memory_bytes != ll["math"].memory_bytes


def test_batch_norm_trace_leaves_statistics_and_micro_batching_is_refused():
    model = zoo.build("resnet")
    inputs = zoo.zoo_batch("resnet", 1, 0)[0]
    ready = check_before_launch(model, Plan(dp=2), num_micro_batches=1, example_inputs=inputs)
    assert all(int(m.num_batches_tracked) == 0 for m in model.modules() if hasattr(m, "num_batches_tracked"))
    assert model.training and model.bn1.training
    assert len(ready.rows) == 6
    for plan, m, why in [(Plan(pp=2), 2, "pipeline stages (pp=2)"),
                         (Plan(dp=2), 2, "2 micro-batches per step (gradient accumulation)")]:
        with pytest.raises(PlanError) as e:
            check_before_launch(model, plan, num_micro_batches=m, example_inputs=inputs)
        line = str(e.value)
        assert "\n" not in line and why in line and "--allow-batch-statistics" in line and "bn1" in line
        check_before_launch(model, plan, num_micro_batches=m, example_inputs=inputs, allow_batch_statistics=True)


@pytest.mark.parametrize("name, plan, words", [
    ("mha", Plan(tp=2), ["blocks.0.attn", "nn.MultiheadAttention", "use tp=1"]),
    ("convnext", Plan(tp=2), ["stages.0.conv_dw", "Conv2d", "does not shard convolutions"]),
])
def test_tp_refuses_what_it_cannot_shard_by_name(name, plan, words):
    model = zoo.build(name)
    with pytest.raises(PlanError) as e:
        check_before_launch(model, plan, num_micro_batches=1, example_inputs=zoo.zoo_batch(name, 1, 0)[0])
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_stage_sends_contiguous_activations():
    """A ConvNeXt block returns a permuted (channels-last) activation; a pipeline stage sends
    its output as is, and the send needs it contiguous."""
    model = zoo.build("convnext")
    x = zoo.zoo_batch("convnext", 2, 0)[0]
    rows = model_rows(model, x)
    assert not rows.modules[1](rows.modules[0](*x)).is_contiguous()
    out = StageModule(rows.modules[:2], rows.kinds[:2])(*x)
    assert out.is_contiguous()


@pytest.mark.slow
def test_batch_norm_under_dp_and_convnext_under_pp_equal_serial():
    """ResNet under dp2 and dp2·ZeRO-3 (BatchNorm synchronised over dp), ConvNeXt under pp2 and
    T5 under interleaved 1F1B (non-contiguous activations between stages): losses and parameters
    equal serial training."""
    from zoo_cases import zoo_case

    from autopar.runtime.verify import sweep
    cases = [sweep.SweepCase("resnet", tuple(sorted(dict(dp=2).items())), 1),
             sweep.SweepCase("resnet", tuple(sorted(dict(dp=2, zero=3).items())), 1),
             sweep.SweepCase("convnext", tuple(sorted(dict(pp=2, schedule="1f1b").items())), 2),
             sweep.SweepCase("t5", tuple(sorted(dict(pp=2, vpp=2, schedule="interleaved-1f1b").items())), 4)]
    result = sweep.run(cases, world=2, steps=2, make_case=zoo_case)
    for c in cases:
        assert result.results[c.name]["status"] == "pass", (c.name, result.results[c.name])


def test_plan_commands_share_the_runtimes_answer_on_tp(tmp_path, capsys):
    """Blocks on ``nn.MultiheadAttention`` (a user's file) are refused by the runtime's rewrite:
    search --fix tp=2 and estimate of a tp plan fail with that one line, an unpinned search
    proposes tp=1 only and inspect says why; Phi-3 (fused qkv with grouped-query heads, cut per
    part by the rewrite) gets its tp plans, as Qwen3 (separate q/k/v) does."""
    from autopar.cli.main import main
    fixtures = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
    user = tmp_path / "mha_model.py"
    user.write_text(f"import sys\nsys.path.insert(0, {fixtures!r})\nimport torch\nfrom zoo_more import MHAEncoder\n\n"
                    "def build(batch_size=1):\n    return MHAEncoder(), (torch.randint(0, 64, (batch_size, 8)),)\n")
    mha, phi3, qwen3 = f"{user}:build", _hf_config(tmp_path, "phi3"), _hf_config(tmp_path, "qwen3")
    common = ["--hardware", "a100-80g-sxm", "--gpus", "4", "--global-batch", "8"]
    assert main(["search", mha, *common, "--fix", "tp=2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nn.MultiheadAttention" in err and "'tp'=2" in err, err
    assert main(["estimate", mha, *common, "--plan", '{"tp": 2, "dp": 2}', "--json"]) == 2
    assert "nn.MultiheadAttention" in capsys.readouterr().err
    assert main(["search", mha, *common, "--json"]) == 0
    assert {p["tp"] for p in json.loads(capsys.readouterr().out)["plans"]} == {1}
    assert main(["inspect", mha]) == 0
    assert "tensor parallel: refused" in capsys.readouterr().out
    for spec in (phi3, qwen3):
        assert main(["search", spec, *common, "--fix", "tp=2", "--json"]) == 0
        assert {p["tp"] for p in json.loads(capsys.readouterr().out)["plans"]} == {2}


@pytest.mark.parametrize("name", ["nanogpt", "llama"])
def test_meta_built_models_materialise_row_by_row(name):
    """Built under ``torch.device("meta")`` (torchtitan's way): the position ids a forward makes
    with ``torch.arange`` are recomputed on the row's device (no ``_tensor_constant`` on meta),
    and tensors a row reads without their module (transformers' rotary ``inv_freq``, the final
    norm traced into the head row) get the model's own initialiser: the same values as a model
    built for real, where the initialiser sets them."""
    from autopar.runtime.assemble.materialize import init_serial
    with torch.device("meta"):
        model = zoo.build(name)
    inputs, targets = zoo.zoo_batch(name, 2, 0)
    rows = model_rows(model, tuple(t[:1] for t in inputs))
    assert not any(n.startswith("_tensor_constant") for m in rows.modules for n, _ in m.named_buffers())
    init_serial(model, 0, example_inputs=tuple(t[:1] for t in inputs))
    assert not [n for n, t in [*model.named_parameters(), *model.named_buffers()]
                if t.is_meta and "original_inv_freq" not in n]
    real = zoo.build(name)
    if name == "llama":
        torch.testing.assert_close(model.model.rotary_emb.inv_freq, real.model.rotary_emb.inv_freq)
        assert torch.equal(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    logits = serial_forward(model, inputs, targets)
    assert torch.isfinite(logits).all() and logits.std() < 10
