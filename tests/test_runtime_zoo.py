"""Models as people write them (tests/fixtures/zoo.py) run under autopar's runtime and equal serial
training: transformers GPT-2 / Llama / Qwen2 / BERT-MLM / ViT / Mixtral built from configs,
nanoGPT- and minGPT-shaped models returning ``(logits, loss)``, a torchtitan-style Llama with
``ModuleDict`` blocks and a fused-qkv state-dict hook, a timm-layout ViT.

Also the training loop's API: ``Runner.clip_grad_norm_`` equals torch's clipping of the serial
model under ZeRO-1, tp2 and pp2; a custom ``loss_fn`` under pipeline schedules (with and
without targets); ``full_state_dict`` of the torchtitan-style model loads strictly into the
serial model. One world of 4 processes for every case (``autopar.runtime.verify.sweep.run``): losses
of 3 SGD steps within 1e-5 and every parameter (``full_state_dict``, the serial keys) within 1e-4.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

from autopar.runtime.verify import sweep
from costmodels.contracts.plan import Plan

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
import zoo  # noqa: E402
from world_prefetch import Job, result  # noqa: E402
from zoo_cases import CLIP, zoo_case  # noqa: E402

pytestmark = pytest.mark.slow

PP2 = dict(pp=2, schedule="1f1b")
CASES = [
    # the training-loop API (Must show)
    ("preset/clip", dict(dp=2, zero=1), 2), ("preset/clip", dict(tp=2), 2), ("preset/clip", PP2, 4),
    ("nanogpt/clip", dict(dp=2, pp=2, zero=3), 2),
    ("nanogpt/smooth", PP2, 4), ("llama/smooth", dict(pp=2, vpp=2, schedule="interleaved-1f1b"), 4),
    ("mingpt/notargets", dict(pp=2, schedule="gpipe"), 2),
    ("titan_llama", dict(dp=2, pp=2, zero=0), 2),
    # the model matrix's small rows
    ("gpt2", PP2, 2), ("llama", dict(dp=2, pp=2, zero=1), 2),
    ("qwen2", dict(pp=2, vpp=2, schedule="interleaved-1f1b"), 2),
    ("bert", dict(dp=2, pp=2, zero=2), 2), ("vit", dict(pp=2, schedule="gpipe"), 2), ("timm_vit", dict(dp=2), 2),
    ("mingpt", dict(dp=2, pp=2, zero=3), 2), ("mixtral", PP2, 4), ("nanogpt", dict(dp=2), 2),
    # tp / sp / recompute rewrites of transformers blocks (rotary, GQA) and fused-SDPA blocks
    ("llama", dict(tp=2, sequence_parallel=True), 2), ("bert", dict(tp=2), 2),
    ("vit", dict(recompute="selective"), 2), ("qwen2", dict(tp=2, pp=2, recompute="full"), 4),
    ("titan_llama", dict(tp=2, sequence_parallel=True), 2), ("timm_vit", dict(tp=2), 2),
    ("gpt2", dict(tp=2, sequence_parallel=True), 2),   # Conv1D linears, tied vocab-parallel embedding
    # a padding mask computed from the ids crosses every pipeline cut beside the hidden state
    ("padded_gpt", dict(pp=2, vpp=2, schedule="interleaved-1f1b"), 4), ("padded_gpt", dict(dp=2, pp=2, zero=3), 2),
    ("padded_gpt", dict(tp=2, pp=2), 4),   # ... and into the rewritten blocks; a causal mask built in forward
    # attention tensors indexed by head (autopar/rewrite/head_shards.py): Phi-3's fused GQA qkv,
    # OLMo-2's q/k norms over the projected width, BLOOM's ALiBi (its last block's tuple across pp),
    # DeBERTa-v3-style relative positions under sequence parallel; at micro-batch 2 BLOOM and
    # DeBERTa merge the batch into the heads (reshape(B * H, ...)), each rank its heads of each row
    ("phi3", dict(tp=2), 1), ("olmo2", dict(tp=2, sequence_parallel=True), 1),
    ("bloom", dict(tp=2, pp=2, micro_batch_size=2), 2),
    ("deberta_v2", dict(tp=2, sequence_parallel=True, micro_batch_size=2), 1),
    # vocab-parallel tied tables (Gemma's scaled embedding and head on one shard), OPT's
    # flattened (B·S, C) tokens under sequence parallel, Falcon pp2 with selective recompute
    # (tests/test_rewrite_tied_tables.py checks the pieces in one process)
    ("gemma", dict(tp=2, micro_batch_size=2), 1),
    ("opt", dict(tp=2, sequence_parallel=True, micro_batch_size=2), 1),
    ("falcon", dict(pp=2, recompute="selective"), 2),
]
# what the rewrite cannot shard: refused before launch, one line naming the file and line
REFUSED = [("mixtral", dict(tp=2, sequence_parallel=True), ["'sequence_parallel'=true", "MoE blocks"]),
           ("vit", dict(tp=2, sequence_parallel=True), ["sequence_parallel", "(5)"]),
           ("padded_gpt", dict(tp=2, sequence_parallel=True), ["_PaddedBlockRow", "zoo.py", "line"])]


# a user's loss that raises under pp2: one line on the last stage's rank naming the function,
# file and line (last: the world it ends has no case left to run)
BAD_LOSS = ("mingpt/badloss", PP2, 2)


ZOO_CASES = [sweep.SweepCase(name, tuple(sorted(plan.items())), m) for name, plan, m in CASES + [BAD_LOSS]]
# one world of 4 processes for every case, run ahead of this module's turn (tests/world_prefetch.py)
PREFETCH_WORLD = Job(sweep.run, (ZOO_CASES,), dict(world=4, steps=3, make_case=zoo_case))


@pytest.fixture(scope="module")
def zoo_results():
    os.environ.setdefault("AUTOPAR_COLLECTIVE_TIMEOUT", "120")
    return ZOO_CASES, result(__name__, PREFETCH_WORLD)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[f"{n}-{Plan(**p).label()}-m{m}" for n, p, m in CASES])
def test_zoo_case_equals_serial(zoo_results, index):
    cases, result = zoo_results
    res = result.results[cases[index].name]
    assert res["status"] == "pass", res


def test_a_failing_loss_under_pp_is_one_line_naming_it(zoo_results):
    cases, result = zoo_results
    res = result.results[cases[-1].name]
    assert res["status"] == "error", res
    assert "loss_fn failing_loss raised RuntimeError" in res["line"] and "zoo_cases.py:" in res["line"], res


@pytest.mark.parametrize("name, plan, words", REFUSED, ids=[r[0] for r in REFUSED])
def test_what_the_rewrite_cannot_shard_is_refused_in_one_line(name, plan, words):
    line = sweep.refusal(sweep.SweepCase(name, tuple(sorted(plan.items())), 2), zoo_case)
    assert line is not None and "\n" not in line, line
    assert all(w in line for w in words), line


def test_a_tied_tensor_split_differently_in_two_rows_is_refused(monkeypatch):
    """If the rewrite made the embedding whole but the tied LM head vocab-parallel, the runtime
    would tie a shard to a whole tensor: the pre-launch probe refuses that in one line."""
    import autopar.rewrite.pairs as pairs
    monkeypatch.setattr(pairs, "_is_row_input", lambda x: False)   # the embedding stays whole
    line = sweep.refusal(sweep.SweepCase("gpt2", (("tp", 2),), 2), zoo_case)
    assert line is not None and "transformer.wte.weight of row embedding is tied to lm_head.weight" in line, line


def test_clipping_is_active_in_the_clip_cases():
    """The clip cases clip: the serial gradient norm of the first batch is above CLIP (else a
    wrong global norm could go unnoticed)."""
    for name in ("preset/clip", "nanogpt/clip"):
        case = zoo_case(name, Plan(), 2, 1)
        model = case.build()
        inputs, targets = case.batches(0)
        from autopar.models.outputs import serial_forward
        case.loss_fn(serial_forward(model, inputs, targets), targets).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        assert norm > 4 * CLIP, (name, float(norm))


def test_titan_full_state_dict_loads_strictly_into_the_serial_model():
    """The fused ``wqkv`` shows as ``wq``/``wk``/``wv`` through the model's state-dict hook; the
    runner's state dict has exactly the serial keys and loads with strict=True."""
    from autopar.runtime.apply import apply
    model = zoo.build("titan_llama")
    serial_keys = list(model.state_dict())
    assert any(k.endswith("attention.wq.weight") for k in serial_keys)
    runner = apply(model, Plan(), example_inputs=zoo.zoo_batch("titan_llama", 1, 0)[0])
    state = runner.full_state_dict()
    assert sorted(state) == sorted(serial_keys)
    fresh = zoo.build("titan_llama", seed=1)
    fresh.load_state_dict(state, strict=True)
    for k, v in zoo.build("titan_llama").state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v)
