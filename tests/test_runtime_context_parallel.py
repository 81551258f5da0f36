"""Context parallelism and HSDP in the runtime (issue 26, the runtime's must-show).

One world of 4 gloo processes (``autopar.runtime.verify.sweep.run``) runs cp2, cp2·tp2, cp2·pp2,
cp2·dp2 with ZeRO-3 and HSDP 2×2 (dp 4 = 2 replicas × 2 shards, ZeRO-3) on autopar's built-in
gpt (tied head) and llama (GQA, rotary) and on a transformers Llama (tests/fixtures/zoo.py),
plus cp2·tp2 on the torchtitan-shaped Llama (its rotary table sliced from a buffer in forward) and
cp2·pp2 under the zero-bubble ZB-V schedule on llama: losses of 3 SGD steps within 1e-5 relative
and every parameter within 1e-4 of the serial model. The same world then saves a cp2·dp2·ZeRO-3
checkpoint and resumes it under cp2·tp2 and dp2·pp2 (tests/fixtures/cp_checkpoint.py).
Beside it, without processes: the load-balanced chunk order, the groups, and the one-line
refusals (a block without attention, a sequence 2·cp does not divide, a padding or non-causal
attention mask among the inputs).
"""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn as nn

from autopar.rewrite.cp_attention import load_balanced_positions, sequence_slice
from autopar.runtime.verify import sweep
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
from cp_cases import cp_case  # noqa: E402
from train_loop import assert_resumed_equal_serial  # noqa: E402
from world_prefetch import Job, result  # noqa: E402

MUST_SHOW = [(dict(cp=2), 2), (dict(cp=2, tp=2), 1), (dict(cp=2, pp=2), 2),
             (dict(cp=2, dp=2, zero=3), 1), (dict(dp=4, dp_shard=2, zero=3), 1)]
MODELS = ("gpt", "llama", "hf_llama")
CASES = [sweep.SweepCase(m, tuple(sorted(p.items())), mb) for m in MODELS for p, mb in MUST_SHOW]
CASES.append(sweep.SweepCase("titan_llama", (("cp", 2), ("tp", 2)), 1))   # table[:T, 0] rotary slices
# a zero-bubble schedule (backward split into input- and weight-gradient passes) under cp
CASES.append(sweep.SweepCase("llama", (("cp", 2), ("pp", 2), ("schedule", "zb-v"), ("vpp", 2)), 4))


def cp_world():
    """The world of 4 ranks: the cases, then the checkpoint scenario in a folder of its own."""
    import tempfile

    from cp_checkpoint import cp_checkpoint
    with tempfile.TemporaryDirectory(prefix="autopar-cp-ckpt-") as ckpt:
        return sweep.run(CASES, world=4, steps=3, make_case=cp_case, then=cp_checkpoint, then_args=(ckpt,))


# run ahead of this module's turn, beside the single-process tests (tests/world_prefetch.py)
PREFETCH_WORLD = Job(cp_world)


@pytest.fixture(scope="module")
def world():
    return result(__name__, PREFETCH_WORLD)


@pytest.fixture(scope="module")
def world_results(world):
    return world.results


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name for c in CASES])
def test_cp_and_hsdp_equal_serial(world_results, index):
    res = world_results[CASES[index].name]
    assert res["status"] == "pass", res
    assert res["rel"] <= 1e-5 and res["param_rel"] <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("resumed", ["cp2tp2", "dp2pp2"])
def test_a_cp_checkpoint_resumes_under_another_plan_equal_to_serial(world, resumed):
    """Saved under cp2·dp2·ZeRO-3 after 3 AdamW steps (equal to serial), resumed under another cp
    layout and under no cp: steps 4–6 equal to the serial run (tests/fixtures/cp_checkpoint.py)."""
    out = world.then
    assert out is not None, world.results
    assert_resumed_equal_serial(out, resumed)


def test_load_balanced_order_gives_each_rank_a_chunk_and_its_mirror():
    assert load_balanced_positions(4, 2, 0).tolist() == [0, 1, 6, 7]
    assert load_balanced_positions(4, 2, 1).tolist() == [2, 3, 4, 5]
    every = torch.cat([load_balanced_positions(2, 4, r) for r in range(4)])
    assert sorted(every.tolist()) == list(range(8))
    ids = torch.arange(16).view(2, 8)
    assert sequence_slice(ids, 2, 1).tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]


def test_sync_groups_span_dp_and_cp_and_hsdp_splits_them():
    from autopar.runtime.faults.dist import layout_rank_sets
    plan = Plan(dp=4, cp=2, dp_shard=2, zero=3)     # order tp, cp, dp, pp: rank = cp + 2·dp
    sets = layout_rank_sets(plan, list(range(8)))
    assert (0, 1) in sets                       # a cp group
    assert tuple(range(8)) in sets              # the dp·cp sync group (here the whole plan)
    assert (0, 1, 2, 3) in sets and (4, 5, 6, 7) in sets   # shard groups: one replica's dp_shard·cp
    assert (0, 4) in sets and (3, 7) in sets    # replicate groups: same shard index, cp


class _NoAttentionBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.fc(x).cumsum(1)     # mixes tokens without attention


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(16, 8)
        self.blocks = nn.ModuleList([_NoAttentionBlock()])
        self.head = nn.Linear(8, 16)

    def forward(self, idx):
        return self.head(self.blocks[0](self.embedding(idx)))


def test_a_block_without_attention_is_refused_in_one_line_naming_it():
    from autopar.runtime.assemble.prelaunch import check_before_launch
    with pytest.raises(PlanError) as e:
        check_before_launch(_Model(), Plan(cp=2), example_inputs=(torch.zeros(1, 8, dtype=torch.long),))
    line = str(e.value)
    assert "\n" not in line and "blocks.0" in line and "cp=1" in line


def test_a_sequence_two_cp_does_not_divide_is_refused_before_launch():
    from autopar.runtime.verify.serial import verify
    with pytest.raises(PlanError, match="2·cp = 8"):
        verify("gpt:layers=1,hidden=16,heads=2,vocab=32,seq=12", Plan(cp=4), steps=1)


@pytest.mark.parametrize("attention", ["math", "flash"])
def test_attention_dropout_is_refused_under_cp(attention):
    from autopar.models import load_model
    from autopar.rewrite import FakeGroup, rewrite_row
    block = load_model("gpt:layers=1,hidden=16,heads=2,vocab=32,seq=8,dropout=0.1").build(
        "cpu", seed=0, attention=attention).blocks[0]
    with pytest.raises(PlanError, match="attention dropout p=0.1"):
        rewrite_row(block, kind="block", tp_rank=0, tp_size=1, tp_group=None, sequence_parallel=False,
                    recompute="none", context_parallel=dict(cp=2, rank=0, group=FakeGroup(0, 2), name="blocks.0"))


def _hf_llama():
    import zoo  # tests/fixtures (on sys.path above)
    return zoo.hf_model("llama")


def test_a_padding_mask_input_is_refused_under_cp_naming_it_and_an_all_ones_one_runs():
    """transformers' Llama reads ``attention_mask``; under cp the rewritten attention cannot apply
    it (autopar.runtime.step.cp_masks), so a mask with padding is refused before launch, in one
    line naming the model and the input, and an all-ones one (which masks nothing) is accepted."""
    from autopar.runtime.assemble.prelaunch import check_before_launch
    from autopar.runtime.step.context import local_example
    model, ids = _hf_llama(), torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    pad = torch.ones(2, 8, dtype=torch.long)
    pad[1, :3] = 0
    with pytest.raises(PlanError) as e:
        check_before_launch(model, Plan(cp=2), example_inputs=(ids, pad))
    line = str(e.value)
    assert "\n" not in line and "'attention_mask'" in line and "LlamaForCausalLM" in line
    assert "3 of its 16 tokens" in line and "cp=1" in line
    local = local_example((ids, torch.ones_like(pad)), Plan(cp=2), model)   # masks nothing: runs
    assert [tuple(t.shape) for t in local] == [(2, 4), (2, 4)]


def test_each_step_refuses_a_padding_or_non_causal_mask_and_keeps_a_causal_one():
    """The Runner's per-step slice (context_slice) checks the batch, not only the example: a bool
    input is a mask by its dtype; a full (S, S) mask must be causal (bool or additive)."""
    from autopar.runtime.step.context import context_slice
    ids = torch.arange(16).view(2, 8)
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[0, -1] = False
    with pytest.raises(PlanError, match=r"input 1 of Net is a padding mask hiding 1 of its 16 tokens"):
        context_slice((ids, keep), ids, 2, 0, None, "Net")
    causal = torch.tril(torch.ones(8, 8, dtype=torch.bool))
    additive = torch.zeros(8, 8).masked_fill(~causal, float("-inf"))
    for full in (causal, additive[None, None]):
        inputs, _ = context_slice((ids, full), ids, 2, 1, ("idx", "attn_mask"))
        assert inputs[0].tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]
    bidirectional = torch.ones(8, 8, dtype=torch.bool)
    with pytest.raises(PlanError, match=r"input 1 \('attn_mask'\) of the model is an attention mask .* not causal"):
        context_slice((ids, bidirectional), ids, 2, 0, ("idx", "attn_mask"))


@pytest.mark.parametrize("attention", ["math", "flash"])
def test_an_sdpa_attention_is_marked_for_torchs_ring_on_cuda_and_cpu_keeps_our_op(attention):
    """A model calling F.scaled_dot_product_attention ("flash") gets the cp op that runs torch's
    context-parallel attention on CUDA over NCCL (autopar.rewrite.cp_torch_ring; not run here,
    no GPU); a written-out softmax core ("math") keeps the all-gather op. On CPU neither takes
    torch's path, and the torch this project pins has the API that path calls."""
    from autopar.models import load_model
    from autopar.rewrite import FakeGroup, rewrite_row
    from autopar.rewrite.cp_attention import ContextParallelAttention
    from autopar.rewrite.cp_torch_ring import _torch_cp, torch_ring_usable
    block = load_model("gpt:layers=1,hidden=16,heads=2,vocab=32,seq=8").build(
        "cpu", seed=0, attention=attention).blocks[0]
    row = rewrite_row(block, kind="block", tp_rank=0, tp_size=1, tp_group=None, sequence_parallel=False,
                      recompute="none", context_parallel=dict(cp=2, rank=0, group=FakeGroup(0, 2), name="blocks.0"))
    [op] = [m for m in row.modules() if isinstance(m, ContextParallelAttention)]
    assert op.sdpa is (attention == "flash") and op.causal
    assert not torch_ring_usable(torch.zeros(1, 2, 4, 8), op.group)
    api = _torch_cp()
    assert api is not None and api._cp_options.rotate_method.name == "ALL_GATHER"


def test_a_mask_the_model_computes_reaches_the_cp_op_which_refuses_padding_in_it():
    """A padding mask the model builds inside (tests/fixtures/zoo.py's PaddedGPT: token 0 is
    padding, ``keep`` crosses the cut into each block) is handed to the cp op, which counts the
    tokens it hides from themselves (a causal mask never does) and refuses the step on every cp
    rank alike (run end to end in a 2-rank world by hand: see the report)."""
    import zoo

    from autopar.rewrite import FakeGroup, rewrite_row
    from autopar.rewrite.cp_attention import ContextParallelAttention, hidden_diagonal
    from autopar.runtime.assemble.prelaunch import check_before_launch
    from autopar.runtime.assemble.stages import row_inputs
    from autopar.runtime.step.context import local_example
    ids = torch.tensor([[5, 0, 7, 9, 0, 3, 2, 1]])
    plan = Plan(cp=2)
    ready = check_before_launch(zoo.build("padded_gpt"), plan, example_inputs=(ids,))
    x = row_inputs(ready.rows, local_example((ids,), plan), ready.stages, range(len(ready.stages)))[1]
    assert ready.rows.kinds[1] == "block"
    gm = rewrite_row(ready.rows.modules[1], kind="block", tp_rank=0, tp_size=1, tp_group=None,
                     sequence_parallel=False, recompute="none", example_input=x,
                     context_parallel=dict(cp=2, rank=0, group=FakeGroup(0, 2), name="h.0"))
    [op] = [m for m in gm.modules() if isinstance(m, ContextParallelAttention)]
    assert op.mask_kind == "attend" and op.where == "h.0"
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    keep = torch.tensor([[True, False, True, True]])
    assert hidden_diagonal(causal, "attend", 4) == 0
    assert hidden_diagonal(causal & keep[:, None, None, :], "attend", 4) == 1
    assert hidden_diagonal(~causal, "fill", 4) == 0 and hidden_diagonal(~keep[:, None, None, :], "fill", 4) == 1
    additive = torch.zeros(1, 1, 4, 4).masked_fill(~causal, float("-inf"))
    assert hidden_diagonal(additive, "additive", 4) == 0
    assert hidden_diagonal(additive.masked_fill(~keep[:, None, None, :], -1e9), "additive", 4) == 1
