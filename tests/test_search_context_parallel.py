"""Context parallelism and HSDP in the search: the split program's objective and memory equal
``estimate`` on cp and HSDP configurations for every runtime that runs them, the space holds cp
only where its rules admit it, and a long sequence makes the search choose cp."""
import dataclasses
import random

import pytest
from synthetic_tables import llama_table

from autopar.search.context_space import CP_MIN_SEQ, cp_candidates
from autopar.search.costs import Costs
from autopar.search.space import Shape, configurations
from autopar.search.split_model import SplitModel, time_unit
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile
from costmodels.profiles.runtime import load_runtime


def _table(seq):
    return llama_table(8, 2048, 16, 4, 5632, 32000, seq, model=f"llama-small-{seq}")


@pytest.mark.parametrize("runtime", ["autopar", "megatron", "fsdp", "fsdp:cp_alltoall"])
def test_objective_and_memory_equal_estimate_under_cp_and_hsdp(runtime):
    table, prof, gpus, batch = _table(32768), load_profile("h100-80g-sxm"), 32, 8
    costs = Costs(table, prof, batch)
    configs = list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node, fix={"runtime": runtime}))
    cps = {c.cp for c in configs}
    # HSDP with every ZeRO stage the runtime shards in groups (the default space: ZeRO-3's only)
    configs += list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node,
                                   fix={"runtime": runtime, "dp_shard": 2}))
    assert {1, 2, 4, 8} <= cps, cps
    groups: dict = {}
    for c in configs:
        if c.cp > 1 or c.dp_shard:
            groups.setdefault((c.cp, c.pp > 1, c.zero, c.dp_shard is not None), []).append(c)
    rng = random.Random(2)
    sample = [c for g in groups.values() for c in rng.sample(g, min(2, len(g)))]
    assert any(c.dp_shard for c in sample) and any(c.cp > 1 and c.pp > 1 for c in sample)
    for c in sample[:24]:
        S = c.pp * c.vpp
        cuts = sorted(rng.sample(range(1, len(table.rows)), S - 1))
        b = [0] + cuts + [len(table.rows)]
        stages = tuple((b[i], b[i + 1]) for i in range(S))
        est = estimate(table, prof, c.plan(stages), gpus, batch)
        assert est.plan.cp == c.cp and est.seq == 32768 and est.global_batch == batch
        terms = costs.terms(c)
        r = SplitModel(dataclasses.replace(terms, hbm=float(2 ** 60)), fixed_stages=stages, exact=True).solve()
        assert r.status == "optimal" and r.stages == stages
        tol = time_unit(terms.time_lower_bound()) * len(table.rows) * 4 * (terms.m + 2)
        assert abs(r.objective_s - est.step_time_s) <= tol, (c, r.objective_s, est.step_time_s)
        assert costs.quick_bound(c) <= est.step_time_s * (1 + 1e-9), c
        mem = SplitModel(terms, objective="memory", fixed_stages=stages).solve()
        total = est.memory_bytes["total"]
        assert total - 1 <= mem.objective_s <= total + 4 * len(table.rows) + 8, (c, mem.objective_s, total)


def test_cp_divides_the_work_and_pays_for_its_ring():
    """cp=2 halves a rank's activations and its matmul time (the sample is split), keeps the
    tokens per step, syncs gradients over dp·cp; the ring's K/V traffic is its cost."""
    table, prof = _table(32768), load_profile("h100-80g-sxm")
    base = estimate(table, prof, Plan(dp=2, zero=1, runtime="megatron"), 2, 8)
    cp = estimate(table, prof, Plan(dp=1, cp=2, runtime="megatron"), 2, 8)
    assert cp.memory_bytes["activations"] == pytest.approx(base.memory_bytes["activations"] / 2, rel=0.02)
    assert cp.num_micro_batches == 2 * base.num_micro_batches
    assert cp.tokens_per_s == pytest.approx(8 * 32768 / cp.step_time_s)
    # the same model FLOPs on the same GPUs: MFU and throughput agree on what was done
    assert cp.mfu / base.mfu == pytest.approx(base.step_time_s / cp.step_time_s)
    assert [c["kind"] for c in cp.comm] == ["dp", "cp"] and cp.comm[1]["group_size"] == 2
    # across nodes the exchange shows: a ring hides each step's send, one all-gather less so
    ring = estimate(table, prof, Plan(cp=16, runtime="megatron"), 16, 8)
    gather = estimate(table, prof, Plan(cp=16, runtime="megatron:cp_all_gather"), 16, 8)
    assert gather.step_time_s > ring.step_time_s and "all_gather" in gather.comm[1]["collective"]
    assert ring.comm[1]["tier"] == "inter_node"


def test_hsdp_shards_states_over_the_shard_group_and_syncs_two_levels():
    table, prof = _table(4096), load_profile("h100-80g-sxm")
    flat = estimate(table, prof, Plan(dp=16, zero=2, runtime="fsdp"), 16, 64)
    hsdp = estimate(table, prof, Plan(dp=16, zero=2, dp_shard=8, runtime="fsdp"), 16, 64)
    assert hsdp.memory_bytes["optimizer"] == pytest.approx(2 * flat.memory_bytes["optimizer"])
    assert "all_reduce(replicas)" in hsdp.comm[0]["collective"]
    assert hsdp.step_time_s != flat.step_time_s


def test_the_rules_refuse_in_one_line():
    table, prof = _table(32768), load_profile("h100-80g-sxm")
    with pytest.raises(PlanError, match=r"2·cp = 4 chunks"):
        estimate(_table(32766), prof, Plan(cp=2), 2, 2)
    with pytest.raises(PlanError, match="runtime 'deepspeed' has no context parallelism"):
        estimate(table, prof, Plan(cp=2, runtime="deepspeed"), 2, 2)
    with pytest.raises(PlanError, match="runtime 'deepspeed' runs no HSDP"):
        estimate(table, prof, Plan(dp=4, zero=1, dp_shard=2, runtime="deepspeed"), 4, 4)
    with pytest.raises(PlanError, match="runtime 'autopar' runs only with ZeRO 2, 3"):
        estimate(table, prof, Plan(dp=4, zero=1, dp_shard=2), 4, 4)


def test_cp_is_searched_for_long_sequences_only_unless_pinned():
    rt = load_runtime("autopar")
    short, long_ = Shape.of(_table(8192)), Shape.of(_table(131072))
    assert cp_candidates(short, 64, {}, rt) == [1]
    assert cp_candidates(short, 64, {"cp": 2}, rt) == [2]
    assert cp_candidates(long_, 64, {}, rt) == [1, 2, 4, 8, 16, 32] and 131072 >= CP_MIN_SEQ
    assert cp_candidates(long_, 64, {}, load_runtime("deepspeed")) == [1]


def test_a_long_sequence_search_chooses_cp():
    from autopar.search.engine import run_search
    table, prof = _table(131072), load_profile("h100-80g-sxm")
    res = run_search(Costs(table, prof, 16), gpus=16, global_batch=16, fix={"runtime": "megatron"}, top=1)
    assert res.plans and res.plans[0].plan.cp > 1, res.plans[0].plan.label()


def test_topology_places_cp_right_outside_tp():
    from costmodels.profiles.topology import plan_tiers
    assert plan_tiers(Plan(dp=2, cp=2, tp=2), 8) == {"tp": "intra_node", "cp": "intra_node",
                                                      "dp": "intra_node", "pp": "intra_node"}
    tiers = plan_tiers(Plan(dp=2, cp=4, tp=4), 8)        # tp·cp = 16 ranks: cp crosses nodes
    assert tiers["tp"] == "intra_node" and tiers["cp"] == "inter_node" and tiers["dp"] == "inter_node"
    assert plan_tiers(Plan(dp=2, tp=4), 8) == {"tp": "intra_node", "dp": "intra_node", "pp": "intra_node"}
