"""Issue 27: the cost model prices autopar's own runtime's routed experts as it runs them — their
states whole on every expert-dp rank at every ZeRO stage (``[moe] experts_zero_sharded = 0`` in
runtime-profiles/autopar.toml; ``autopar/runtime/step/experts.py`` keeps them out of DDP, ZeRO-1's
partition and FSDP2), and ZeRO-3 gathering none of them — while the runtimes that shard them
(Megatron-core, torchtitan's FSDP2) keep ``ZeRO over expert-dp``; the search's split program
charges what ``estimate`` charges for a fixed split under the autopar runtime too."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from autopar.search.costs import Costs
from autopar.search.space import Shape, configurations
from costmodels.calibration.moe_tables import moe_table
from costmodels.contracts.plan import Plan
from costmodels.model.allocator import optimizer_share
from costmodels.model.estimate import estimate
from costmodels.model.experts import expert_zero_group, experts_zero_sharded
from costmodels.model.memory import STATE_BYTES
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from split_memory import assert_split_memory_equals_estimate  # noqa: E402

H100 = load_profile("h100-80g-sxm")


def table():
    """Experts far larger than the embedding, so a MoE row is among a rank's two largest."""
    return moe_table(4, 1024, 16, 4, 2816, 32000, 2048, experts=64, top_k=2, expert_ffn=2048, shared=1)


def states(plan, t):
    mem = estimate(t, H100, plan, 8, 64).memory_bytes
    return mem["params"] + mem["grads"] + mem["optimizer"], mem


def test_the_profiles_say_who_shards_the_experts():
    assert not experts_zero_sharded(Plan(dp=8, ep=2))                      # autopar's own (default)
    assert not experts_zero_sharded(Plan(dp=8, ep=2, runtime="autopar:compile"))
    for rt in ("megatron", "fsdp"):
        assert experts_zero_sharded(Plan(dp=8, ep=2, runtime=rt)), rt
    assert "step/experts.py" in load_runtime("autopar").sources["moe.experts_zero_sharded"]   # its source
    assert expert_zero_group(Plan(dp=8, ep=2, zero=3)) == 1
    assert expert_zero_group(Plan(dp=8, ep=2, zero=3, runtime="fsdp")) == 4
    # at ep = tp = 1 autopar's runtime shards nothing apart: the experts are plain parameters
    assert expert_zero_group(Plan(dp=8, zero=3)) == 8 and expert_zero_group(Plan(dp=8, tp=2, zero=3)) == 1


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_autopar_runtime_keeps_expert_states_whole_over_expert_dp(zero):
    """dp 8, ep 2 (expert-dp 4): the dense states ZeRO-sharded over the 8 dp ranks, the rank's
    ep shard of the experts (half of them) whole under autopar's runtime and sharded over the
    4 expert-dp ranks under fsdp (torchtitan), by ZeRO's table (weights at 3, gradients at
    2 and 3, the optimizer at 1-3)."""
    t = table()
    params, e = sum(r.params for r in t.rows), sum(r.expert_params for r in t.rows)
    bp, bg, bo = STATE_BYTES["bf16-mixed"]

    def hand(rt, e_group):
        o = bo * optimizer_share(load_runtime(rt), "bf16-mixed")
        cut = lambda n, at: n if zero >= at else 1   # noqa: E731
        return ((params - e) * (bp / cut(8, 3) + bg / cut(8, 2) + o / 8)
                + e / 2 * (bp / cut(e_group, 3) + bg / cut(e_group, 2) + o / e_group))
    for rt, e_group in (("autopar", 1), ("fsdp", 4)):
        if zero == 1 and rt == "fsdp":
            continue   # fsdp runs no ZeRO-1
        got, _ = states(Plan(dp=8, ep=2, zero=zero, runtime=rt), t)
        assert got == pytest.approx(hand(rt, e_group), rel=1e-12), (rt, got, hand(rt, e_group))


def test_zero3_under_autopar_gathers_only_the_dense_parts():
    """ZeRO-3's buffer holds a rank's two largest rows as it gathers them: under autopar's
    runtime the rows' dense parts only (here the embedding and head, larger than a MoE row's
    attention and router), under fsdp a MoE row's dense part and its ep shard of the experts."""
    t = table()
    dense = sorted(r.params - r.expert_params for r in t.rows)
    moe = max((r.params - r.expert_params + r.expert_params / 2) for r in t.rows if r.experts)
    got = estimate(t, H100, Plan(dp=8, zero=3, ep=2), 8, 64).memory_bytes["gathered"]
    sharded = estimate(t, H100, Plan(dp=8, zero=3, ep=2, runtime="fsdp"), 8, 64).memory_bytes["gathered"]
    assert got == pytest.approx(2.0 * sum(dense[-2:]), rel=1e-12)   # bf16 weights
    assert sharded == pytest.approx(2.0 * 2 * moe, rel=1e-12)


def test_search_memory_equals_estimate_with_whole_experts():
    t = table()
    gpus, batch = 32, 128
    costs = Costs(t, H100, batch)
    configs = [c for c in configurations(Shape.of(t), gpus, batch, H100.gpus_per_node,
                                         fix={"runtime": "autopar"}) if c.ep > 1 and c.zero >= 1]
    rng = random.Random(7)
    for c in rng.sample([c for c in configs if c.zero == 3], 4) + rng.sample(configs, 4):
        assert_split_memory_equals_estimate(costs, c, t, H100, gpus, batch, rng)


def test_autopar_step_peak_counts_no_autocast_cache_nor_ddp_bucket_for_experts():
    """amp (autopar's runtime recipe), before ``fix_stage_memory``: autocast caches no bf16 copy
    of an expert (each runs on a view w[e] of the stacked weights; autocast caches leaf tensors
    only), DDP's buckets leave the ignored expert shards out, and the optimizer step's foreach
    temporaries cover the rank's whole ep shard of the experts (it steps it itself)."""
    import numpy as np

    from costmodels.model.memory import stage_memory
    from costmodels.model.table_arrays import table_arrays
    t = table()
    arr = table_arrays(t)
    n = len(t.rows)
    params = sum(r.params for r in t.rows)
    experts = sum(r.expert_params for r in t.rows)
    cached = sum(r.params for r in t.rows if r.kind in ("block", "head")) - experts
    kw = dict(tp=1, dp=8, zero=1, sp=False, b=1, recompute="none", attention="flash", inflight=[1],
              reserve=0.0, precision="amp", ep=2)
    # huge activations: the first backward is the peak (weights and autocast's cache)
    first = stage_memory(arr, [(0, n)], act_rows=np.full(n, 1e12), **kw)
    assert first["params"] == pytest.approx(4.0 * params + 2.0 * cached, rel=1e-12)
    # no activations: the optimizer step is (DDP buckets + fp32 gradients + AdamW's temporaries)
    step = stage_memory(arr, [(0, n)], act_rows=np.zeros(n), **kw)
    hand = 4.0 * (params - experts) + 4.0 * params + 4.0 * ((params - experts) / 8 + experts / 2)
    assert step["grads"] == pytest.approx(hand, rel=1e-12)
    # ep = tp = 1: the experts are plain parameters there (DDP buckets them, ZeRO-1 partitions them)
    plain = stage_memory(arr, [(0, n)], act_rows=np.zeros(n), **{**kw, "ep": 1})
    assert plain["grads"] == pytest.approx(4.0 * params + 4.0 * params + 4.0 * params / 8, rel=1e-12)
