"""estimate(): plan checks, the result contract, the decomposition the search relies on, and the
pipeline / communication formulas."""
from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_tables import gpt3_175b, gpt_table, llama3_70b, tiny_gpt

from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_file import PlanResult
from costmodels.contracts.split import balanced_stages, partition
from costmodels.model.checks import check_plan
from costmodels.model.coefficients import dp_sync
from costmodels.model.comm import collective_bytes, collective_time, group_tier, plan_tiers
from costmodels.model.estimate import BREAKDOWN_KEYS, MEMORY_KEYS, chunk_cost, estimate
from costmodels.model.optimizer import optimizer_step_s
from costmodels.model.pipeline import bubble_fraction_uniform, pipeline_time
from costmodels.profiles.hardware import LinkTier
from costmodels.profiles.hardware_files import load_profile

A100 = "a100-80g-sxm"


# ------------------------------------------------------------------------ plan checks
@pytest.mark.parametrize("plan,gpus,batch,match", [
    (Plan(dp=2, tp=8, pp=4), 64, 64, None),
    (Plan(dp=2, tp=8, pp=4), 16, 64, r"dp·cp·tp·pp = 2·1·8·4 = 64 but --gpus is 16"),
    (Plan(tp=5), 5, 8, r"tp=5 does not divide heads=96"),
    (Plan(dp=3, micro_batch_size=2), 3, 8, r"global batch 8 is not divisible by dp·micro_batch_size"),
    (Plan(dp=2), 2, 0, r"global batch=0 must be a positive integer"),
    (Plan(pp=4, vpp=2, schedule="interleaved-1f1b"), 4, 6, r"multiple of pp=4"),
    (Plan(pp=64, vpp=2, schedule="interleaved-1f1b"), 64, 128, r"only 98 layer rows"),
    (Plan(pp=2, stages=((0, 40), (40, 90))), 2, 8, r"ends at row 90 but the model has 98 rows"),
])
def test_check_plan_names_the_constraint(plan, gpus, batch, match):
    t = gpt3_175b()
    if match is None:
        assert len(check_plan(t, plan, gpus, batch)) == plan.pp * plan.vpp
    else:
        with pytest.raises(PlanError, match=match):
            check_plan(t, plan, gpus, batch)


@pytest.mark.parametrize("batch", [0, -4, 2.5, True])
def test_plan_refuses_a_batch_that_is_not_a_positive_integer(batch):
    # runtime / validate / verify ask the Plan directly, without check_plan
    with pytest.raises(PlanError, match="must be a positive integer"):
        Plan(dp=2).num_micro_batches(batch)


def test_plan_takes_plan_fields_only_and_plan_result_splits_the_rest():
    d = {"dp": 2, "step_time_s": 1.0, "measured_step_s": 2.0, "predicted_memory_bytes": 5,
         "memory_error": 0.1, "loss": 3.2}
    with pytest.raises(PlanError, match=r"unknown plan field\(s\) \['loss', 'measured_step_s'"):
        Plan.from_dict(d)
    r = PlanResult.from_dict(d)
    assert r.plan == Plan(dp=2) and r.values == {k: v for k, v in d.items() if k != "dp"}
    with pytest.raises(PlanError, match=r"unknown plan field\(s\) \['tpp'\]"):
        Plan.from_dict({"dp": 2, "tpp": 2})


def test_tp_must_divide_kv_heads():
    t = llama3_70b()                    # 64 heads, 8 kv heads
    with pytest.raises(PlanError, match="kv_heads=8"):
        check_plan(t, Plan(tp=16), 16, 16)
    check_plan(t, Plan(tp=8), 8, 8)


def test_balanced_stages_used_when_absent():
    t = gpt3_175b()
    e = estimate(t, A100, Plan(pp=8, tp=8), 64, 64)
    assert e.stages == balanced_stages(t, 8)
    assert e.stages[0][0] == 0 and e.stages[-1][1] == len(t.rows)


# ------------------------------------------------------------------------ result contract
PLAN_FIELDS = set(Plan().to_dict())
RESULT_KEYS = {"model", "hardware", "gpus", "global_batch", "seq", "num_micro_batches", "step_time_s",
               "tokens_per_s", "tflops_per_gpu", "mfu", "bubble_fraction", "memory_bytes", "hbm_bytes",
               "fits", "comm_bytes", "breakdown_s", "stages_detail", "comm"}


def test_to_dict_matches_the_contract():
    plan = Plan(dp=4, tp=8, pp=8, vpp=3, schedule="interleaved-1f1b", recompute="selective",
                sequence_parallel=True, zero=1)
    d = estimate(gpt3_175b(), A100, plan, 256, 512).to_dict()
    assert PLAN_FIELDS | RESULT_KEYS <= set(d)
    assert set(d["memory_bytes"]) == set(MEMORY_KEYS)
    assert set(d["breakdown_s"]) == set(BREAKDOWN_KEYS)
    assert set(d["comm_bytes"]) == {"dp", "tp", "pp", "zero"}
    assert d["num_micro_batches"] == 512 // 4
    assert sum(d["breakdown_s"].values()) == pytest.approx(d["step_time_s"], rel=1e-9)
    assert d["tokens_per_s"] == pytest.approx(512 * 2048 / d["step_time_s"])
    assert len(d["stages_detail"]) == 8 and all(len(s["rows"]) == 3 == len(s["fwd_s"]) for s in d["stages_detail"])
    assert {c["kind"] for c in d["comm"]} == {"tp", "pp", "dp"}
    json.dumps(d)                                   # JSON-serialisable
    assert PlanResult.from_dict(d).plan == plan     # PlanResult splits the plan from the rest


# --------------------------------------------------- decomposition (what the search rebuilds)
@pytest.mark.parametrize("plan,gpus,batch", [
    (Plan(dp=4, tp=8, pp=8, vpp=3, schedule="interleaved-1f1b", recompute="selective",
          sequence_parallel=True, attention="math"), 256, 512),
    (Plan(dp=16, tp=4, pp=2, zero=3, recompute="full", micro_batch_size=2), 128, 256),
    (Plan(dp=8, tp=8, zero=2), 64, 64),
    (Plan(tp=8, pp=16, schedule="gpipe", placement="tp,pp,dp", dp=2), 256, 64),
])
def test_estimate_equals_its_pieces(plan, gpus, batch):
    t = gpt3_175b()
    prof = load_profile(A100)
    e = estimate(t, prof, plan, gpus, batch)
    stages = check_plan(t, plan, gpus, batch)
    m = plan.num_micro_batches(batch)
    tiers = plan_tiers(plan, prof.gpus_per_node)
    chunks = [chunk_cost(t, prof, plan, s, e_, c) for c, (s, e_) in enumerate(stages)]
    ranks = [[chunks[c] for c in range(len(stages)) if c % plan.pp == r] for r in range(plan.pp)]
    pipe, _ = pipeline_time([[c.total_s for c in cs] for cs in ranks], m, plan.vpp)
    s = prof.collective_slowdown      # the GPU's: a hidden sync still costs s of its time
    # interleaved: each chunk syncs after its own last backward, the window is pp - (pp-1)/vpp
    # micro-batch backwards (costmodels/profiles/interleaved_dp_window.py)
    chunked = plan.schedule == "interleaved-1f1b" and plan.vpp > 1
    w = (1 - s) * (prof.overlap(plan.zero) * ((plan.pp - (plan.pp - 1) / plan.vpp) if chunked else 1.0))
    bwd = [w * sum(c.bwd_s + c.recompute_s for c in cs) for cs in ranks]
    params = [sum(c.params for c in cs) for cs in ranks]
    sync = [dp_sync(params[r], plan, prof, tiers["dp"])[2] for r in range(plan.pp)]
    dp_exp = max(max(0.0, s * sync[r], sync[r] - bwd[r] - sum(bwd[:r])) for r in range(plan.pp))
    opt = max(optimizer_step_s(p / (plan.dp if plan.zero else 1), prof) for p in params)
    assert e.step_time_s == pipe + dp_exp + opt            # bit-identical
    assert e.breakdown_s["dp_exposed"] == dp_exp


# ------------------------------------------------------------------------ pipeline formulas
@pytest.mark.parametrize("p,m,v", [(1, 8, 1), (4, 8, 1), (8, 64, 1), (4, 8, 2), (8, 64, 3)])
def test_uniform_pipeline_bubble(p, m, v):
    T = 1.0
    total, bubble = pipeline_time([T] * p, m, v)
    assert total == pytest.approx((m + (p - 1) / v) * T)
    assert bubble / (m * T) == pytest.approx(bubble_fraction_uniform(p, m, v))


def test_imbalance_slowest_stage_sets_the_pace():
    total, bubble = pipeline_time([1.0, 2.0, 1.0], m=10)
    assert total == pytest.approx(10 * 2.0 + 2.0)
    assert bubble == pytest.approx(2.0)


def test_more_micro_batches_and_interleaving_shrink_the_bubble():
    t = gpt3_175b()
    base = dict(tp=8, pp=8, recompute="selective", sequence_parallel=True)
    f = [estimate(t, A100, Plan(**base), 64, b).bubble_fraction for b in (16, 64, 256)]
    assert f[0] > f[1] > f[2]
    inter = estimate(t, A100, Plan(**base, vpp=3, schedule="interleaved-1f1b"), 64, 64).bubble_fraction
    assert inter < f[1]


# ------------------------------------------------------------------------ communication
def test_collective_bytes_nccl_conventions():
    S = 1e9
    assert collective_bytes("all_reduce", S, 8) == pytest.approx(2 * 7 / 8 * S)
    assert collective_bytes("all_gather", S, 8) == pytest.approx(7 / 8 * S)
    assert collective_bytes("reduce_scatter", S, 8) == pytest.approx(7 / 8 * S)
    assert collective_bytes("p2p", S, 2) == S
    assert collective_bytes("all_reduce", S, 1) == 0
    tier = LinkTier("x", 100e9, 1e-5)
    b, t = collective_time("all_reduce", S, 8, tier)
    assert t == pytest.approx(14 * 1e-5 + b / 100e9)
    assert collective_time("all_gather", 0.0, 8, tier)[1] == 0.0


def test_group_tiers_follow_placement():
    sizes = {"tp": 8, "dp": 4, "pp": 2}
    assert group_tier("tp,dp,pp", sizes, "tp", 8) == "intra_node"
    assert group_tier("tp,dp,pp", sizes, "dp", 8) == "inter_node"
    assert group_tier("tp,dp,pp", {"tp": 2, "dp": 4, "pp": 2}, "dp", 8) == "intra_node"
    assert group_tier("dp,tp,pp", {"tp": 2, "dp": 8, "pp": 2}, "tp", 8) == "inter_node"


def test_tp_across_nodes_is_slower():
    t = gpt3_175b()
    inside = estimate(t, A100, Plan(tp=8, dp=2), 16, 16)
    across = estimate(t, A100, Plan(tp=8, dp=2, placement="dp,tp,pp"), 16, 16)
    # NCCL's two-level ring: 4 ranks a node on 4 of its NICs (88 GB/s) instead of NVLink (230 GB/s)
    assert across.breakdown_s["tp_exposed"] > 2 * inside.breakdown_s["tp_exposed"]
    assert [c["tier"] for c in across.comm if c["kind"] == "tp"] == ["inter_node"]


def test_dp_allreduce_is_overlapped_and_zero3_adds_gathers():
    t = gpt_table(layers=24, hidden=2048, heads=16, vocab=50000, seq=2048)
    z0 = estimate(t, A100, Plan(dp=64), 64, 256)
    # autopar's runtime reduces fp32 gradients (fp32 parameters under autocast: autopar.toml)
    assert z0.comm_bytes["dp"] == pytest.approx(2 * 63 / 64 * 4 * t.total_params)
    dp = next(c for c in z0.comm if c["kind"] == "dp")
    assert dp["exposed_s"] <= dp["time_s"]
    z3 = estimate(t, A100, Plan(dp=64, zero=3), 64, 256)
    assert z3.comm_bytes["zero"] > 0 and z3.memory_bytes["total"] < z0.memory_bytes["total"]


def test_zero1_is_priced_as_the_runtime_runs_it():
    """Megatron's ZeRO-1 (bf16-mixed): reduce-scatter + all-gather, overlapped with backward;
    autopar's runtime (amp): DDP's all-reduce, overlapped, then the owners' broadcasts of the
    fp32 weights after the optimizer step, never hidden."""
    import dataclasses
    t = gpt_table(layers=4, hidden=512, heads=8, vocab=8000, seq=256)
    prof = dataclasses.replace(load_profile("cpu-2core"), comm_overlap=0.0)
    tier = prof.tier("intra_node")
    P = t.total_params
    mega = estimate(t, prof, Plan(dp=2, zero=1), 2, 8)
    rt = estimate(t, prof, Plan(dp=2, zero=1), 2, 8, precision="amp")
    # the fp32 gradients autopar's runtime reduces (autopar.toml grad_reduce_bytes), bf16 weights
    rs_ag = (collective_time("reduce_scatter", 4 * P, 2, tier)[1]
             + collective_time("all_gather", 2 * P, 2, tier)[1])
    assert mega.breakdown_s["dp_exposed"] == pytest.approx(rs_ag)
    ar = collective_time("all_reduce", 4 * P, 2, tier)
    bc = [2 * x for x in collective_time("all_gather", 4 * P / 2, 2, tier)]   # one per owner
    assert rt.breakdown_s["dp_exposed"] == pytest.approx(ar[1] + bc[1])
    dp = next(c for c in rt.comm if c["kind"] == "dp")
    assert dp["collective"] == "all_reduce+broadcast" and dp["bytes_per_gpu"] == pytest.approx(ar[0] + bc[0])
    z0 = estimate(t, prof, Plan(dp=2), 2, 8, precision="amp")
    assert rt.breakdown_s["dp_exposed"] - z0.breakdown_s["dp_exposed"] == pytest.approx(bc[1])


def test_gradient_sync_keeps_the_line_where_per_call_collectives_read_the_curve():
    """Measured in-step points bend the per-call collectives (ZeRO-3 gathers here) but not the
    gradient sync, which the search needs linear in a stage's parameters."""
    import dataclasses
    t = gpt_table(layers=4, hidden=512, heads=8, vocab=8000, seq=256)
    base = dataclasses.replace(load_profile("cpu-2core"), comm_overlap=0.0, fsdp_overlap=0.0)
    intra = base.intra_node
    xs = (1e3, 1e9)
    slow = tuple((k, 2, xs, (1.0, 2.0)) for k in ("reduce_scatter_tensor", "all_gather_into_tensor"))
    curved = dataclasses.replace(base, intra_node=dataclasses.replace(intra, curves=slow))
    plan = Plan(dp=2, zero=3)
    a, b = estimate(t, base, plan, 2, 8), estimate(t, curved, plan, 2, 8)
    assert b.breakdown_s["dp_exposed"] == pytest.approx(a.breakdown_s["dp_exposed"])   # the line
    assert b.breakdown_s["zero_exposed"] > a.breakdown_s["zero_exposed"] + 1.0         # the curve


def test_sequence_parallel_same_bytes_less_memory():
    t = gpt3_175b()
    a = estimate(t, A100, Plan(tp=8, attention="math"), 8, 8)
    b = estimate(t, A100, Plan(tp=8, sequence_parallel=True, attention="math"), 8, 8)
    assert b.comm_bytes["tp"] == pytest.approx(a.comm_bytes["tp"])
    assert b.memory_bytes["activations"] < a.memory_bytes["activations"]


def test_recompute_costs_time_and_flash_is_faster_than_math():
    t = gpt_table(layers=8, hidden=4096, heads=32, vocab=50000, seq=4096)
    times = {rc: estimate(t, A100, Plan(tp=8, recompute=rc, attention="math"), 8, 8).step_time_s
             for rc in ("none", "selective", "full")}
    assert times["none"] < times["selective"] < times["full"]
    flash = estimate(t, A100, Plan(tp=8, attention="flash"), 8, 8)
    assert flash.step_time_s < times["none"]


def test_faster_hardware_is_faster():
    t = gpt3_175b()
    plan = Plan(tp=8, pp=8, dp=16)
    s = [estimate(t, h, plan, 1024, 1024).step_time_s for h in ("a100-80g-sxm", "h100-80g-sxm", "b200-180g-sxm")]
    assert s[0] > s[1] > s[2]


def test_fits_flag():
    t = gpt3_175b()
    assert not estimate(t, A100, Plan(dp=8), 8, 8).fits               # 175B on one GPU each
    ok = estimate(t, A100, Plan(dp=16, tp=8, pp=8, recompute="selective", sequence_parallel=True,
                                zero=1), 1024, 1536)
    assert ok.fits and ok.memory_bytes["total"] <= ok.hbm_bytes


# ------------------------------------------------------------------------ split + properties
@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=9), st.data())
def test_partition_is_an_optimal_min_max_split(weights, data):
    k = data.draw(st.integers(1, len(weights)))
    split = partition(weights, k)
    assert len(split) == k and split[0][0] == 0 and split[-1][1] == len(weights)
    assert all(a < b for a, b in split) and all(split[i][1] == split[i + 1][0] for i in range(k - 1))
    best = min(max(sum(weights[a:b]) for a, b in zip((0,) + c, c + (len(weights),)))
               for c in itertools.combinations(range(1, len(weights)), k - 1))
    assert max(sum(weights[a:b]) for a, b in split) == best


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2, 3, 6]), dp=st.sampled_from([1, 2, 4]),
       mb=st.sampled_from([1, 2]), zero=st.integers(0, 3), rc=st.sampled_from(["none", "selective", "full"]),
       sched=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]), attn=st.sampled_from(["flash", "math"]),
       hw=st.sampled_from(["a100-80g-sxm", "h100-80g-sxm", "cpu-2core"]))
def test_invariants_on_random_plans(tp, pp, dp, mb, zero, rc, sched, attn, hw):
    t = gpt_table(layers=12, hidden=256, heads=8, vocab=1000, seq=128)
    if sched == "interleaved-1f1b" and pp < 2:
        sched = "1f1b"
    vpp = 2 if sched == "interleaved-1f1b" else 1
    plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch_size=mb, zero=zero, recompute=rc,
                sequence_parallel=tp > 1, schedule=sched, attention=attn)
    gb = dp * mb * pp * 2
    e = estimate(t, hw, plan, dp * tp * pp, gb)
    assert e.step_time_s > 0 and 0 < e.mfu < 1
    assert sum(e.breakdown_s.values()) == pytest.approx(e.step_time_s, rel=1e-9)
    assert all(v >= 0 for v in e.breakdown_s.values())
    assert 0 <= e.bubble_fraction < 1
    m = e.memory_bytes
    assert m["total"] == pytest.approx(sum(m[k] for k in MEMORY_KEYS if k != "total"))
    assert e.fits == (m["total"] <= e.hbm_bytes)
    assert max(s["memory_bytes"]["total"] for s in e.stages_detail) == m["total"]


def test_cpu_profile_on_a_tiny_model():
    e = estimate(tiny_gpt(), "cpu-2core", Plan(dp=2), 2, 8)
    assert e.fits and 1e-6 < e.step_time_s < 10


def test_flash_attentions_backward_takes_two_and_a_half_forwards():
    """A flash kernel's backward recomputes the scores it did not store: 5 matmuls against the
    forward's 2 (compute.FLASH_BWD_RATIO), though MFU counts it as 2 forwards. Slowing the
    attention core by a change of its efficiency slows each block's backward 2.5 times as much
    as its forward, and leaves math attention alone."""
    import dataclasses

    from synthetic_tables import llama3_8b

    from costmodels.model.compute import FLASH_BWD_RATIO, row_times
    from costmodels.profiles.hardware_files import load_profile
    t = llama3_8b(seq=4096)
    fast = load_profile("h100-80g-sxm")
    slow = dataclasses.replace(fast, attention_efficiency=fast.attention_efficiency / 2)
    a, b = (row_times(t, p, 1, False, 1, "none", "flash", "intra_node", "bf16-mixed") for p in (fast, slow))
    blocks = t.block_rows()
    dfwd, dbwd = b.fwd_s[blocks] - a.fwd_s[blocks], b.bwd_s[blocks] - a.bwd_s[blocks]
    assert FLASH_BWD_RATIO == 2.5 and (dfwd > 0).all()
    assert abs(dbwd / dfwd - 2.5).max() < 1e-9
    m1, m2 = (row_times(t, p, 1, False, 1, "none", "math", "intra_node", "bf16-mixed") for p in (fast, slow))
    assert (m1.bwd_s == m2.bwd_s).all()
