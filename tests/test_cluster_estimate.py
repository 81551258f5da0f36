"""Heterogeneous clusters, pricing side: --hardware / cluster.toml parsing, the Plan's pool
fields, and ``estimate`` pricing every pipeline rank on its own pool (costmodels/profiles/cluster*.py)."""
from __future__ import annotations

import json

import pytest
from synthetic_tables import gpt3_175b, tiny_gpt

from costmodels.contracts.errors import PlanError, ProfileError
from costmodels.contracts.plan import Plan
from costmodels.contracts.plan_pools import global_gpu, gpu_of_rank
from costmodels.model.estimate import estimate
from costmodels.profiles.cluster import Cluster, Pool, load_cluster, parse_hardware
from costmodels.profiles.hardware_files import load_profile

A100, H100 = "a100-80g-sxm", "h100-80g-sxm"


def _two_same(n: int) -> Cluster:
    a = load_profile(A100)
    return Cluster((Pool(A100, a, n, A100), Pool(A100, a, n, A100)))   # not merged on purpose


def test_uniform_plan_json_is_unchanged_and_old_json_loads():
    p = Plan(dp=2, tp=4, pp=2)
    d = p.to_dict()
    assert "pools" not in d and "stage_pools" not in d
    assert Plan.from_dict(json.loads(p.to_json())) == p


def test_pooled_plan_round_trips_through_json():
    p = Plan(dp=2, tp=4, pp=3, pools=((A100, 16), (H100, 8)), stage_pools=(1, 0, 0))
    back = Plan.from_dict(json.loads(p.to_json()))
    assert back == p and back.pools == ((A100, 16), (H100, 8)) and back.stage_pools == (1, 0, 0)
    assert "pools:h100-80g-sxm×1+a100-80g-sxm×2" in p.label()


@pytest.mark.parametrize("changes, words", [
    ({"stage_pools": (0, 0)}, "one pool index"),
    ({"stage_pools": (0, 0, 2)}, "one pool index"),
    ({"stage_pools": (1, 1, 1)}, "but it has 8"),
    ({"pools": ((A100, 16),)}, "one pool index"),
    ({"placement": "dp,tp,pp"}, "placement must be tp,dp,pp"),
])
def test_bad_pool_fields_are_one_line(changes, words):
    base = {"dp": 2, "tp": 4, "pp": 3, "pools": ((A100, 16), (H100, 8)), "stage_pools": (1, 0, 0)}
    base.update(changes)
    with pytest.raises(PlanError, match=words):
        Plan(**base)
    with pytest.raises(PlanError, match="go together"):
        Plan(dp=2, tp=4, pp=3, stage_pools=(0, 0, 0))


def test_rank_to_gpu_rule():
    p = Plan(dp=2, tp=2, pp=3, pools=((A100, 8), (H100, 8)), stage_pools=(1, 0, 0))
    # rank = tp_i + tp·(dp_i + dp·r): ranks 0..3 are stage 0 on H100's first 4 GPUs, 4..7 stage 1
    # on A100's first four, 8..11 stage 2 on A100's next four
    assert [gpu_of_rank(p, r) for r in (0, 3, 4, 7, 8, 11)] == [(1, 0), (1, 3), (0, 0), (0, 3), (0, 4), (0, 7)]
    assert global_gpu(p, 0) == 8 and global_gpu(p, 11) == 7


@pytest.mark.parametrize("plan", [
    Plan(dp=8, tp=8, pp=8, zero=1),
    Plan(dp=4, tp=8, pp=16, micro_batch_size=2, recompute="full", sequence_parallel=True),
    Plan(dp=16, tp=4, pp=8, zero=3, schedule="gpipe"),
    Plan(dp=8, tp=8, pp=8, vpp=3, schedule="interleaved-1f1b", runtime="megatron", zero=1),
])
def test_two_pools_of_one_profile_price_exactly_as_the_uniform_cluster(plan):
    table = gpt3_175b()
    uni = estimate(table, A100, plan, 512, 1536).to_dict()
    half = plan.pp // 2
    pooled = plan.with_(pools=((A100, 256), (A100, 256)), stage_pools=(0,) * half + (1,) * half)
    got = estimate(table, _two_same(256), pooled, 512, 1536).to_dict()
    for key in ("step_time_s", "mfu", "memory_bytes", "breakdown_s", "comm_bytes", "fits", "comm"):
        assert got[key] == uni[key], key
    assert [s["fwd_s"] for s in got["stages_detail"]] == [s["fwd_s"] for s in uni["stages_detail"]]


def test_each_stage_priced_on_its_own_pool():
    table = gpt3_175b()
    c = parse_hardware(f"{A100}:64,{H100}:64")
    rows = len(table.rows)
    st = ((0, rows // 2), (rows // 2, rows))
    plan = Plan(dp=8, tp=8, pp=2, stages=st, pools=c.spec(), stage_pools=(0, 1))
    est = estimate(table, c, plan, 128, 64)
    a, h = est.stages_detail
    assert a["hardware"] == A100 and h["hardware"] == H100
    # same blocks on both (the head is on H100): the H100 stage computes ~2-3x faster per block
    assert h["fwd_s"][0] < 0.6 * a["fwd_s"][0]
    flipped = estimate(table, c, plan.with_(stage_pools=(1, 0)), 128, 64)
    assert flipped.step_time_s != est.step_time_s
    assert est.to_dict()["cluster"]["pools"][1]["used"] == 64


def test_cluster_link_prices_the_cross_pool_sends(tmp_path):
    table = gpt3_175b()
    f = tmp_path / "c.toml"
    body = (f'[[pool]]\nname="old"\nprofile="{A100}"\nnodes=8\n[[pool]]\nname="new"\nprofile="{H100}"\nnodes=8\n')
    f.write_text(body)
    fast = load_cluster(f)
    f.write_text(body + '[[link]]\npools=["old","new"]\nbandwidth_bytes_per_s=1e9\nlatency_s=1e-4\n')
    slow = load_cluster(f)
    plan = Plan(dp=8, tp=8, pp=2, pools=fast.spec(), stage_pools=(0, 1))
    e_fast, e_slow = estimate(table, fast, plan, 128, 64), estimate(table, slow, plan, 128, 64)
    assert e_slow.step_time_s > e_fast.step_time_s
    assert e_slow.to_dict()["cluster"]["links"][0]["bandwidth_bytes_per_s"] == 1e9


def test_hardware_pools_parsing():
    assert parse_hardware(A100) is None                          # the uniform path
    merged = parse_hardware(f"{A100}:64,{A100}:64")
    assert len(merged.pools) == 1 and merged.pools[0].gpus == 128
    two = parse_hardware(f"{A100}:64,{H100}:32")
    assert two.label() == f"{A100}:64,{H100}:32" and two.gpus == 96


@pytest.mark.parametrize("text, words", [
    ("a100-80g-sxn:64,h100-80g-sxm:8", "did you mean a100-80g-sxm"),
    (f"{A100}:12,{H100}:8", "not a whole number of 8-GPU nodes"),
    (f"{A100},{H100}:8", "has no GPU count"),
    (f"{A100}:x,{H100}:8", "not a whole number of GPUs"),
    (f"{A100}:8,,{H100}:8", "empty pool"),
])
def test_bad_hardware_pools_are_one_line(text, words):
    with pytest.raises(ProfileError, match=words):
        parse_hardware(text)


def test_plan_needs_fitting_tp_and_its_cluster():
    table = tiny_gpt()
    c = parse_hardware(f"{A100}:8,{H100}:8")
    with pytest.raises(PlanError, match="has no 'pools'"):
        estimate(table, c, Plan(dp=2, pp=2), 4, 4)
    other = parse_hardware(f"{A100}:16,{H100}:8")
    plan = Plan(dp=2, pp=2, pools=c.spec(), stage_pools=(0, 1))
    with pytest.raises(PlanError, match="not the cluster's"):
        estimate(table, other, plan, 4, 4)
