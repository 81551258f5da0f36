"""The attention kernel DeepSeek-V3's MLA ran with in each open Megatron row (issue 27, engineer
moegb200): unfused ("math") on Blackwell under the Transformer Engine of nemo:25.04.01, cuDNN's
fused kernel on Hopper, and the launches' ``core_attn`` recompute as the plan's selective recompute.
The expectations come from the kernels' structure (a materialised s×s score tensor per head), not
from the implementation."""
from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from costmodels.calibration.mla import DEEPSEEK_V3
from costmodels.calibration.mla_attention_kernel import plan_recompute, row_attention
from costmodels.calibration.moe_runs import row_mla
from costmodels.calibration.moe_tables import moe_table
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

ROOT = Path(__file__).resolve().parents[1]
H, A, S, LAYERS = 7168, 128, 4096, 3


@pytest.fixture(scope="module")
def rows():
    return {r["row_id"]: r for r in csv.DictReader(open(ROOT / "tests" / "data" / "validation" / "moe_runs.csv"))}


def test_mla_runs_unfused_on_blackwell_only_under_the_old_transformer_engine(rows):
    gb200 = rows["dgxc-v25.05.05-deepseek-v3-gb200-bf16-128"]
    h100 = rows["dgxc-v25.05.05-deepseek-v3-h100-bf16-512"]
    maverick = rows["dgxc-v25.05.05-llama4-maverick-gb200-bf16-128"]
    assert row_attention(gb200, row_mla(gb200) is not None) == "math"
    assert row_attention(h100, row_mla(h100) is not None) == "flash"          # sm90: cuDNN fused
    assert row_attention(maverick, row_mla(maverick) is not None) == "flash"  # not MLA
    later = {**gb200, "container": "nvcr.io/nvidia/nemo:25.07.01"}          # TE with Blackwell MLA
    assert row_attention(later, True) == "flash"


def test_core_attn_is_the_plans_selective_recompute():
    assert plan_recompute("none", ("core_attn",)) == "selective"
    assert plan_recompute("none", ("mla_up_proj",)) == "none"     # lives in the table
    assert plan_recompute("full", ("core_attn",)) == "full"


def test_the_gb200_deepseek_rows_are_scored_with_it(rows):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_costmodels_moe as bench
    ids = [k for k in rows if k.startswith("dgxc-v25.05.05-deepseek-v3-")]
    got = {s["row_id"]: s for s in bench.score([rows[k] for k in ids])}
    for k in ids:
        plan = bench.plan_of(rows[k], got[k]["runtime"])
        gb200 = "-gb200-" in k
        assert (plan.attention, plan.recompute) == (("math", "selective") if gb200 else ("flash", "none"))
        assert got[k]["fits"]                                          # every one ran


def test_unfused_core_keeps_the_scores_unless_recomputed_and_costs_time():
    table = moe_table(LAYERS, H, A, A, 18432, 129280, S, experts=256, top_k=8, expert_ffn=2048, shared=1,
                      dense_layers=1, mla=DEEPSEEK_V3)
    prof = load_profile("gb200-nvl72")
    base = Plan(runtime="megatron:overlap_grad_reduce,overlap_param_gather,force_balance")
    est = {(a, r): estimate(table, prof, replace(base, attention=a, recompute=r), 1, 1)
           for a, r in (("flash", "none"), ("math", "none"), ("math", "selective"))}
    act = {key: e.stages_detail[0]["memory_bytes"]["activations"] for key, e in est.items()}
    scores = LAYERS * A * S * S * 2                                    # one bf16 s×s tensor per head
    assert act[("math", "none")] - act[("flash", "none")] == pytest.approx(scores, rel=1e-9)
    assert act[("math", "selective")] == pytest.approx(act[("flash", "none")], rel=1e-9)
    t = {key: e.step_time_s for key, e in est.items()}
    assert t[("flash", "none")] < t[("math", "none")] < t[("math", "selective")]
