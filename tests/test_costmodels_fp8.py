"""FP8 plans (issue 28): priced on GPUs with FP8, refused in one line elsewhere, searched jointly
with the layout at exactly estimate's price, and NVLink-domain tiers on the NVL72 profiles."""
from __future__ import annotations

import dataclasses
import random

import pytest
from synthetic_tables import llama_table

from autopar.search.costs import Costs
from autopar.search.precision_space import search_precisions
from autopar.search.space import Shape, configurations, parse_fix
from autopar.search.split_model import SplitModel, time_unit
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile, parse_profile

TABLE = llama_table(16, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")


def _split(rng, n, S):
    cuts = sorted(rng.sample(range(1, n), S - 1))
    b = [0] + cuts + [n]
    return tuple((b[i], b[i + 1]) for i in range(S))


@pytest.mark.parametrize("hw,runtime", [("a100-80g-sxm", "autopar"), ("cpu-2core", "autopar"),
                                        ("h100-80g-sxm", "deepspeed")])
def test_fp8_plan_without_fp8_hardware_or_stack_is_refused_in_one_line(hw, runtime):
    with pytest.raises(PlanError) as e:
        estimate(TABLE, hw, Plan(dp=8, runtime=runtime, precision="fp8"), 8, 64)
    msg = str(e.value)
    assert "\n" not in msg and "precision" in msg and "bf16" in msg


def test_fp8_under_the_fp32_recipe_is_refused():
    with pytest.raises(PlanError, match="fp32"):
        estimate(TABLE, "h100-80g-sxm", Plan(dp=8, precision="fp8"), 8, 64, precision="fp32")


def test_fp8_shortens_the_matmuls_not_attention_and_gathers_fp8_weights():
    """FP8 moves only the block linears: a longer sequence (more attention) gains less; torchao's
    FP8 all-gather halves the ZeRO-3 bytes of the linear weights; TE saves FP8 inputs."""
    def step(seq, runtime="autopar", zero=3, precision="fp8"):
        t = llama_table(8, 2048, 16, 4, 5632, 32000, seq, model="l")
        p = Plan(dp=8, zero=zero, runtime=runtime, precision=precision)
        return estimate(t, "h100-80g-sxm", p, 8, 8)
    gain_short = step(2048, precision="bf16").step_time_s / step(2048).step_time_s
    gain_long = step(16384, precision="bf16").step_time_s / step(16384).step_time_s
    assert 1.1 < gain_short < 2.0 and 1.0 < gain_long < gain_short
    z8, z16 = step(2048).comm_bytes["zero"], step(2048, precision="bf16").comm_bytes["zero"]
    assert 0.5 * z16 < z8 < 0.75 * z16
    te8 = step(2048, runtime="megatron", zero=1)
    te16 = step(2048, runtime="megatron", zero=1, precision="bf16")
    assert te8.memory_bytes["activations"] < te16.memory_bytes["activations"]


def test_search_lists_fp8_only_where_the_gpu_has_it_and_fix_holds_it():
    h100, a100 = load_profile("h100-80g-sxm"), load_profile("a100-80g-sxm")
    assert search_precisions(h100, {}) == ("bf16", "fp8")
    assert search_precisions(a100, {}) == ("bf16",)
    assert search_precisions(h100, {"runtime": "deepspeed"}) == ("bf16",)
    fix = parse_fix("precision=bf16")
    assert search_precisions(h100, fix) == ("bf16",)
    with pytest.raises(PlanError):
        parse_fix("precision=fp4")
    with pytest.raises(PlanError, match="no FP8 tensor cores"):   # pinned on an A100: one line
        search_precisions(a100, parse_fix("precision=fp8"))


@pytest.mark.parametrize("runtime", ["autopar", "megatron", "fsdp"])
def test_objective_equals_estimate_for_fp8_plans(runtime):
    prof = load_profile("h100-80g-sxm")
    gpus, batch = 64, 256
    costs = Costs(TABLE, prof, batch)
    fix = {"runtime": runtime}
    configs = [c for c in configurations(Shape.of(TABLE), gpus, batch, prof.link_domain, fix=fix,
                                         precisions=search_precisions(prof, fix))
               if c.precision == "fp8"]
    assert configs
    rng = random.Random(3)
    for c in rng.sample(configs, min(6, len(configs))):
        stages = _split(rng, len(TABLE.rows), c.pp * c.vpp)
        est = estimate(TABLE, prof, c.plan(stages), gpus, batch)
        terms = costs.terms(c)
        r = SplitModel(dataclasses.replace(terms, hbm=float(2 ** 60)), fixed_stages=stages, exact=True).solve()
        tol = time_unit(terms.time_lower_bound()) * len(TABLE.rows) * 4 * (terms.m + 2)
        assert r.status == "optimal" and abs(r.objective_s - est.step_time_s) <= tol, (c, r.objective_s)
        assert costs.quick_bound(c) <= est.step_time_s * (1 + 1e-9)
        bf16 = estimate(TABLE, prof, dataclasses.replace(c, precision="bf16").plan(stages), gpus, batch)
        assert est.step_time_s < bf16.step_time_s


def test_nvl72_tiers_follow_the_nvlink_domain():
    """tp = 16 on an NVL72 rack stays on NVLink (a 72-GPU domain of 4-GPU trays); on HGX it would
    cross nodes. A profile's domain must be a multiple of its node."""
    gb = load_profile("gb200-nvl72")
    assert gb.gpus_per_node == 4 and gb.link_domain == 72
    plan = Plan(dp=4, tp=16)
    assert gb.group_link(plan, "tp").name == "intra_node"
    assert gb.group_link(Plan(dp=4, tp=2, pp=9), "pp").name == "intra_node"      # 72 GPUs
    assert gb.group_link(Plan(dp=4, tp=2, pp=10), "pp").name == "inter_node"     # 80: two racks
    assert load_profile("b200-180g-sxm").group_link(plan, "tp").name == "inter_node"
    import tomllib
    with open(gb.path, "rb") as f:
        doc = tomllib.load(f)
    doc["node"]["nvlink_domain_gpus"]["value"] = 70
    with pytest.raises(PlanError.__mro__[1], match="multiple"):
        parse_profile(doc, "x.toml")


def test_precision_gain_says_the_gain_and_what_changed():
    from autopar.search.precision_gain import compare_precisions
    best = {"precision": "fp8", "step_time_s": 10.0, "dp": 16, "tp": 4, "pp": 4,
            "breakdown_s": {"compute": 8.0, "tp_exposed": 1.5}}
    bf16 = {"step_time_s": 14.0, "dp": 32, "tp": 4, "pp": 2, "breakdown_s": {"compute": 12.0, "tp_exposed": 1.4}}
    g = compare_precisions(best, bf16)
    assert g["gain"] == pytest.approx(1.4)
    assert g["changed"] == {"dp": (32, 16), "pp": (2, 4)}
    assert "1.40×" in g["text"] and "dp 32 → 16" in g["text"] and "compute 12.00 → 8.00 s" in g["text"]
