"""The tp rewrite on tied vocabulary tables, flattened tokens and linears written as subclasses;
``hf:`` models built on meta (issue 33's second shelf: tests/fixtures/zoo_more.py).

* Gemma's scaled embedding traces to a functional ``F.embedding``: under tp it is vocab-parallel
  (this rank's rows, the other ids masked), the two ranks' partial lookups sum to the serial
  row, and the tied LM head holds the same rows, so the tie check passes;
* T5's encoder and decoder look up one shared table: both lookups split it one way;
* OPT flattens its tokens to (B·S, C) before the MLP: sequence parallel runs it (B = 2);
* Falcon's ``FalconLinear`` (``x @ W.T``) is kept a linear, and the attention probabilities its
  last block returns do not cross to the head: selective recompute isolates the core;
* an ``hf:`` Llama built with ``build_meta`` is cut with its rotary ``inv_freq`` real (it was a
  ``meta`` constant, materialised as garbage), and its rows give the serial logits.

Runtime equality (gloo) of these plans: the shared world of ``tests/test_runtime_zoo.py`` and
``benchmarks/bench_runtime_zoo.py --more``."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import torch.nn as nn

from autopar.rewrite import FakeGroup, rewrite_row
from autopar.runtime.assemble.prelaunch import _check_ties, check_before_launch
from autopar.runtime.assemble.rows import model_rows
from autopar.runtime.assemble.stages import row_inputs
from autopar.trace.linear_leaves import is_plain_linear
from costmodels.contracts.plan import Plan

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import zoo  # noqa: E402

pytest.importorskip("transformers")


def _rows(name, batch=1):
    model = zoo.build(name)
    inputs = zoo.zoo_batch(name, batch, 0)[0]
    rows = model_rows(model, inputs)
    return model, inputs, rows, row_inputs(rows, inputs, [(0, len(rows))], [0])


def _rewrite(rows, examples, i, rank, **kw):
    return rewrite_row(rows.modules[i], kind=rows.kinds[i], tp_rank=rank, tp_size=2,
                       tp_group=FakeGroup(rank, 2), sequence_parallel=kw.get("sp", False),
                       recompute="none", example_input=examples.get(i))


def test_gemma_scaled_tied_embedding_is_vocab_parallel_and_sums_to_serial():
    model, inputs, rows, ex = _rows("gemma", batch=2)
    shards = [_rewrite(rows, ex, 0, r) for r in (0, 1)]
    assert shards[0].autopar_shards["inner.model.embed_tokens.weight"].dim == 0
    serial = rows.modules[0](*inputs)
    # FakeGroup: the all-reduce is the identity, so each rank returns its partial lookup
    torch.testing.assert_close(shards[0](*inputs) + shards[1](*inputs), serial)
    head = _rewrite(rows, ex, len(rows) - 1, 0)
    split_of: dict = {}
    for i, gm in ((0, shards[0]), (len(rows) - 1, head)):   # embedding and head: one shard
        _check_ties(rows.modules[i], rows.names[i], gm.autopar_shards, split_of, 2)
    check_before_launch(model, Plan(tp=2, sequence_parallel=True), num_micro_batches=1, example_inputs=inputs)


def test_t5_encoder_and_decoder_lookups_split_the_shared_table_one_way():
    _, _, rows, ex = _rows("t5")
    gm = _rewrite(rows, ex, 0, 1)
    dims = {k: s.dim for k, s in gm.autopar_shards.items() if k.endswith("embed_tokens.weight")}
    assert dims == {"inner.model.encoder.embed_tokens.weight": 0, "inner.model.decoder.embed_tokens.weight": 0}
    assert gm.autopar_info["vocab_parallel"] is not None
    split_of: dict = {}
    for i, g in ((0, gm), (len(rows) - 1, _rewrite(rows, ex, len(rows) - 1, 1))):
        _check_ties(rows.modules[i], rows.names[i], g.autopar_shards, split_of, 2)


def test_opt_flat_tokens_run_under_sequence_parallel():
    model, inputs, rows, ex = _rows("opt", batch=2)
    gm = _rewrite(rows, ex, 1, 0, sp=True)
    gathers = [c for c in gm.autopar_info["collectives"] if c["module"] == "GatherSeq"]
    assert any(len(c["in_shape"]) == 3 and c["out_shape"][1] == 8 for c in gathers), gathers
    check_before_launch(model, Plan(tp=2, sequence_parallel=True, micro_batch_size=2), num_micro_batches=1,
                        example_inputs=inputs)


def test_plain_linear_subclasses_are_linears_and_falcon_recomputes_selectively():
    from transformers.models.falcon.modeling_falcon import FalconLinear

    class Scaled(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    assert is_plain_linear(FalconLinear(4, 4, bias=True)) and is_plain_linear(FalconLinear(4, 4, bias=False))
    assert not is_plain_linear(Scaled(4, 4)) and not is_plain_linear(nn.Linear(4, 4))
    model, inputs, rows, _ = _rows("falcon")
    assert any(isinstance(m, FalconLinear) for m in rows.modules[1].modules())
    last = rows.modules[-2](torch.zeros(1, zoo.S, zoo.C))
    assert isinstance(last, torch.Tensor)   # (hidden, attention_probs): only the hidden crosses
    check_before_launch(model, Plan(pp=2, recompute="selective"), num_micro_batches=2, example_inputs=inputs)


def test_hf_spec_built_on_meta_cuts_with_real_computed_tensors(tmp_path):
    from test_trace_zoo import chain

    from autopar.models import load_model
    from autopar.models.outputs import serial_forward
    from autopar.runtime.assemble.materialize import init_serial
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(zoo.hf_model("llama").config.to_dict()))
    src = load_model(f"hf:{path}")
    ex = src.example_inputs(1, "cpu")
    rows = model_rows(src.build_meta(), ex)
    assert not [n for m in rows.modules for n, b in m.named_buffers() if b.is_meta]
    model = init_serial(src.build_meta(), seed=3, example_inputs=ex)
    real_rows = model_rows(model, ex)
    x, y = src.make_batch(2, seed=5)
    torch.testing.assert_close(chain(real_rows, x), serial_forward(model, x, y))
    inv = [b for m in rows.modules for n, b in m.named_buffers() if n.endswith("inv_freq")]
    assert inv and all(torch.equal(b, model.model.model.rotary_emb.inv_freq) for b in inv)


def _hf_meta_rank(spec):
    import torch.distributed as dist

    from autopar.models import load_model
    from autopar.models.outputs import serial_forward
    from autopar.runtime.apply import apply
    from autopar.runtime.assemble.materialize import init_serial
    from autopar.runtime.faults import dist as adist
    adist.ensure_initialized(2)
    src = load_model(spec)
    runner = apply(src.build_meta(), Plan(pp=2), loss_fn=src.loss, seed=3, spec=spec)
    x, y = src.make_batch(4, seed=5)
    out = {"loss": runner.train_step(x, y), "bytes": runner.materialized}
    if dist.get_rank() == 0:
        serial = init_serial(src.build_meta(), seed=3, example_inputs=src.example_inputs(1, "cpu"))
        out["serial"] = float(src.loss(serial_forward(serial, x, y), y).detach())
        out["whole"] = sum(p.numel() * p.element_size() for p in serial.parameters())
    return out


@pytest.mark.slow
def test_hf_spec_built_on_meta_under_pp2_materialises_its_rows_and_equals_serial(tmp_path):
    """An ``hf:`` Llama built with ``build_meta`` under pp2: each rank materialises its stage's
    rows only (well under the whole model's parameter bytes, at any moment) and the first loss
    equals the serial model's (``init_serial``, same seed) — with the rotary tables real."""
    from autopar.runtime.verify.serial import spawn
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(zoo.hf_model("llama").config.to_dict()))
    ranks = spawn(_hf_meta_rank, 2, f"hf:{path}")
    whole, serial = ranks[0]["whole"], ranks[0]["serial"]
    for r in ranks:
        assert r["bytes"]["peak_param_bytes"] < 0.7 * whole, (r["bytes"], whole)
        assert abs(r["loss"] - serial) / serial < 1e-6, (r["loss"], serial)


class _DtypeReadingMLP(nn.Module):
    """T5's ``DenseReluDense``: the forward reads ``self.wo.weight.dtype`` (or, ``values``: the
    weight itself) outside the module the rewrite shards."""

    def __init__(self, values=False):
        super().__init__()
        self.wi, self.wo, self.values = nn.Linear(8, 16), nn.Linear(16, 8), values

    def forward(self, x):
        h = torch.relu(self.wi(x))
        h = h.to(self.wo.weight.dtype) if not self.values else h + self.wo.weight.sum()
        return x + self.wo(h)


def test_a_sharded_layers_tensor_read_by_path_is_the_shard():
    from costmodels.contracts.errors import TraceError
    x = torch.zeros(2, 4, 8, device="meta")
    gm = rewrite_row(_DtypeReadingMLP(), kind="block", tp_rank=1, tp_size=2, tp_group=FakeGroup(1, 2),
                     sequence_parallel=False, recompute="none", example_input=x)
    assert tuple(gm.wo.weight.shape) == (8, 8) and gm.autopar_shards["wo.weight"].dim == 1
    with pytest.raises(TraceError, match="reads wo.weight outside its module"):
        rewrite_row(_DtypeReadingMLP(values=True), kind="block", tp_rank=0, tp_size=2, tp_group=FakeGroup(0, 2),
                    sequence_parallel=False, recompute="none", example_input=x)


def test_t5_blocks_reading_the_position_bias_as_an_input_shard_their_attention():
    """T5's first decoder block computes the relative position bias, the others receive it as a
    row input added to the scores: a side input, not the hidden state, so their self- and
    cross-attention are pairs too (they were left whole under tp, silently)."""
    from autopar.rewrite.fx_util import serial_values, trace_row
    from autopar.rewrite.pairs import find_layout
    _, _, rows, ex = _rows("t5")
    m = rows.modules[2]
    example = (ex[2],) + tuple(m.autopar_inputs[1:])
    traced = trace_row(m, example)
    layout = find_layout(traced, serial_values(traced, example, lambda n, e: e), "block", 2, "T5BlockRow")
    assert sorted(layout.pair_kind.values()) == ["attention", "attention", "mlp"]
