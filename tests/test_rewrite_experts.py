"""The tensor-parallel rewrite of a MoE row (autopar/rewrite/experts.py): the routed experts stay one
leaf, whole on every tp rank, fed this rank's part of the tokens (tp without sp: split, then the
outputs all-gathered; sp: the sequence shard as it is); attention and the shared experts are
sharded as in a dense block. Single process, FakeGroup, meta shapes only."""
from __future__ import annotations

import torch

from autopar.models import load_model
from autopar.rewrite import rewrite_row
from autopar.rewrite.collectives import FakeGroup
from autopar.rewrite.experts import TokenGather, TokenSplit, is_expert_module

MOE = ("moe:layers=2,hidden=32,heads=4,kv_heads=2,ffn=64,vocab=64,seq=8,experts=4,top_k=2,"
       "expert_ffn=16,shared_experts=1,dense_layers=1")


def _rewrite(sp: bool):
    block = load_model(MOE).build("meta", seed=None).blocks[1]
    gm = rewrite_row(block, kind="block", tp_rank=1, tp_size=2, tp_group=FakeGroup(1, 2),
                     sequence_parallel=sp, recompute="none",
                     example_input=torch.zeros(2, 8, 32, device="meta"))
    calls = {n.target: n for n in gm.graph.nodes if n.op == "call_module"}
    return block, gm, calls


def test_routed_experts_are_one_whole_leaf_fed_this_ranks_tokens():
    block, gm, calls = _rewrite(sp=False)
    experts = gm.get_submodule("mlp.experts")
    assert is_expert_module(experts) and "mlp.experts" in calls
    for name in ("w1", "w2", "w3"):   # whole experts on each tp rank (etp = 1)
        assert getattr(experts, name).shape == getattr(block.mlp.experts, name).shape
    feeds = [gm.get_submodule(a.target) for a in calls["mlp.experts"].args]
    assert all(isinstance(f, TokenSplit) for f in feeds) and len(feeds) == 3   # tokens, index, weights
    gather = [n for n in calls["mlp.experts"].users if n.op == "call_module"]
    assert [type(gm.get_submodule(n.target)) for n in gather] == [TokenGather]
    pairs = gm.autopar_info["pairs"]
    assert set(pairs) == {"attn.wo", "mlp.shared.w2"}   # the router stays whole
    assert gm.get_submodule("mlp.router.gate").weight.shape == block.mlp.router.gate.weight.shape


def test_under_sequence_parallel_each_rank_routes_its_sequence_shard():
    _, gm, calls = _rewrite(sp=True)
    node = calls["mlp.experts"]
    assert not any(isinstance(gm.get_submodule(a.target), TokenSplit)
                   for a in node.args if getattr(a, "op", None) == "call_module")
    assert not any(isinstance(gm.get_submodule(n.target), TokenGather)
                   for n in gm.graph.nodes if n.op == "call_module")
    # the router's weight meets sharded tokens: its gradient is summed over tp inside autograd
    assert "mlp.router.gate.weight_grad_all_reduce" in calls


def test_a_capacity_factor_with_tokens_split_over_tp_is_refused_in_one_line():
    import pytest

    from autopar.runtime.assemble.prelaunch import check_before_launch
    from costmodels.contracts.errors import PlanError
    from costmodels.contracts.plan import Plan
    source = load_model(MOE + ",capacity_factor=1.25")
    with pytest.raises(PlanError, match="'tp'=2 splits the tokens of a MoE layer with a capacity factor"):
        check_before_launch(source.build("meta", seed=None), Plan(tp=2), probe=False,
                            example_inputs=source.example_inputs(1, "cpu"))
    check_before_launch(source.build("meta", seed=None), Plan(dp=2, ep=2), probe=False,
                        example_inputs=source.example_inputs(1, "cpu"))   # ep: dropless
