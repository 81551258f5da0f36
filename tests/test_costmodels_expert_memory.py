"""A MoE plan's memory (costmodels/model/experts.py ``fix_stage_memory``, ``expert_state_bytes``):
ZeRO-3's gathered weights are the rank's own ep shard of the experts, HSDP shards the experts'
states over the expert-dp ranks inside its shard group, and the search's split program charges
exactly what ``estimate`` charges for a fixed split under both."""
from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

from autopar.search.costs import Costs
from autopar.search.space import Shape, configurations
from costmodels.calibration.moe_tables import moe_table
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.model.experts import expert_state_bytes
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.hardware_files import load_profile

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from split_memory import assert_split_memory_equals_estimate  # noqa: E402

H100 = load_profile("h100-80g-sxm")
FSDP = "fsdp"   # the runtime with ZeRO-2/3 and HSDP (optimizer bytes: the recipe's 12)


def table(experts=64):
    """Experts far larger than the embedding, so a MoE row is among a rank's two largest."""
    return moe_table(4, 1024, 16, 4, 2816, 32000, 2048, experts=experts, top_k=2, expert_ffn=2048,
                     shared=1)


def moe_rows(t):
    """(dense, expert) parameters of the table's MoE rows."""
    return [(r.params - r.expert_params, r.expert_params) for r in t.rows if (r.experts or 0) > 0]


def test_zero3_gathers_only_the_local_expert_shard():
    t = table()
    dense, experts = max(moe_rows(t), key=lambda de: de[0] + de[1])
    for tp, ep, etp in ((1, 8, 1), (2, 4, 2), (2, 8, 1)):
        plan = Plan(dp=8, tp=tp, zero=3, ep=ep, etp=etp, runtime=FSDP)
        got = estimate(t, H100, plan, 8 * tp, 64).memory_bytes["gathered"]
        hand = 2 * 2.0 * (dense / tp + experts / (ep * etp))   # two MoE rows, bf16 weights
        assert abs(got - hand) <= 1e-6 * hand, (tp, ep, etp, got, hand)
        assert got < 2 * 2.0 * (dense + experts) / tp / 2   # not every expert of the row
    # twice the experts on twice the ranks: a rank's own shard is the same; only the router
    # (h weights per expert, dense) grows, by 32·h in each of the two gathered rows
    small = estimate(table(32), H100, Plan(dp=8, zero=3, ep=4, runtime=FSDP), 8, 64).memory_bytes
    big = estimate(table(64), H100, Plan(dp=8, zero=3, ep=8, runtime=FSDP), 8, 64).memory_bytes
    assert big["gathered"] - small["gathered"] == 2 * 2.0 * 32 * 1024


def test_hsdp_expert_states_sharded_inside_the_shard_group():
    t = table()
    arr = table_arrays(t)
    params = sum(r.params for r in t.rows)
    e_all = sum(r.expert_params for r in t.rows)
    # zero 2: weights whole (2 B), gradients (2 B) and optimizer (12 B) over the group
    for dp_shard, ep, e_group in ((8, 2, 4), (8, 4, 2), (8, 8, 1), (4, 8, 1), (16, 4, 4)):
        plan = Plan(dp=16, dp_shard=dp_shard, zero=2, ep=ep, runtime=FSDP)
        hand = ((params - e_all) * (2 + 14 / dp_shard)
                + e_all / ep * (2 + 14 / e_group))
        sigma = float(expert_state_bytes(arr, plan, "bf16-mixed").sum())
        assert abs(sigma - hand) <= 1e-9 * hand, (dp_shard, ep, sigma, hand)
        mem = estimate(t, H100, plan, 16, 64).memory_bytes
        states = mem["params"] + mem["grads"] + mem["optimizer"]
        assert abs(states - hand) <= 1e-9 * hand, (dp_shard, ep, states, hand)


def test_search_memory_equals_estimate_under_zero3_hsdp_and_runtime_optimizer_bytes():
    t = table()
    gpus, batch = 32, 128
    costs = Costs(t, H100, batch)
    space = lambda rt: [c for c in configurations(Shape.of(t), gpus, batch, H100.gpus_per_node,  # noqa: E731
                                                  fix={"runtime": rt}) if c.ep > 1]
    configs = space(FSDP)
    zero3 = [c for c in configs if c.zero == 3 and c.dp_shard is None]
    hsdp = [c for c in configs if c.dp_shard is not None]
    assert zero3 and hsdp
    hsdp += [dataclasses.replace(c, zero=2) for c in hsdp[::7]]   # the space lists HSDP at ZeRO-3
    # NeMo's distributed Adam keeps 10 optimizer bytes a parameter, not 12: the experts' too
    adam10 = space("megatron:distributed_fused_adam")
    rng = random.Random(5)
    for c in rng.sample(zero3, 4) + rng.sample(hsdp, 8) + rng.sample(adam10, 4):
        assert_split_memory_equals_estimate(costs, c, t, H100, gpus, batch, rng)
