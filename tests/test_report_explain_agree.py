"""`autopar explain` and `autopar report` name the same bottleneck for the same plan.

Both read ``costmodels.contracts.breakdown.bottleneck``. Before, explain took the largest breakdown term
and the report called a plan compute-bound only above 75% of the step, else named the largest
overhead: on llama3-8b dp16·tp4 (compute 74.99% of the step, exposed TP 16%) explain said
compute and the report said exposed TP communication. The plans here are real estimates
(synthetic tables, no torch) and the report's fixtures, several pipelined, several of them
cases where the two old definitions disagreed.
"""
import json
import os

import pytest
from synthetic_tables import gpt3_175b, llama3_8b, tiny_gpt

from autopar.report.analysis import groups, why
from autopar.report.load import records_of
from autopar.search import explain_plans, render_explanation
from costmodels.contracts.breakdown import BREAKDOWN_KEYS, term_label
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_file import PlanResult
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "report")
LLAMA, GPT3, TINY = llama3_8b(seq=4096), gpt3_175b(), tiny_gpt(layers=6)
CASES = [   # (table, hardware, gpus, global batch, plan)
    (LLAMA, "h100-80g-sxm", 64, 128, Plan(dp=8, tp=8, micro_batch_size=2)),
    (LLAMA, "h100-80g-sxm", 64, 128, Plan(dp=2, tp=8, pp=4, zero=1)),
    (LLAMA, "h100-80g-sxm", 64, 128, Plan(dp=8, tp=2, pp=4, recompute="full")),
    (GPT3, "a100-80g-sxm", 1024, 1536, Plan(dp=32, tp=8, pp=4, recompute="full", sequence_parallel=True)),
    (GPT3, "a100-80g-sxm", 1024, 1536, Plan(dp=8, tp=8, pp=16, vpp=2, schedule="interleaved-1f1b",
                                            recompute="selective", sequence_parallel=True)),
    (TINY, "cpu-2core", 8, 16, Plan(dp=2, tp=2, pp=2)),
    (TINY, "cpu-2core", 8, 16, Plan(dp=8)),
    (TINY, "cpu-2core", 8, 16, Plan(pp=8, schedule="gpipe")),
    (TINY, "cpu-2core", 8, 16, Plan(dp=4, pp=2, stages=((0, 2), (2, 8)))),
]


def old_report_rule(d: dict) -> str:
    """The report's bottleneck before the two were unified (for the record of disagreements)."""
    b, step = d["breakdown_s"], d["step_time_s"]
    overhead = {k: b[k] for k in BREAKDOWN_KEYS if k != "compute"}
    worst = max(overhead, key=overhead.get)
    return "compute" if b["compute"] / step >= 0.75 or overhead[worst] <= 0 else worst


def both_say(d: dict):
    """(explain's best, its text, the report's key, its sentence) for a plans file holding ``d``."""
    data = {"version": 1, "plans": [dict(d, rank=1)]}
    ex = explain_plans(data)
    (group,) = groups(records_of(json.loads(json.dumps(data)), "case.json"))
    w = why(group)
    return ex["best"], render_explanation(ex), w["bottleneck"], w["bottleneck_text"]


def fixture_plans():
    out = []
    for name in ("g256.json", "g512.json", "g1024.json"):
        with open(os.path.join(FIX, name)) as f:
            data = json.load(f)
        out += [dict(p, **{k: data[k] for k in ("model", "hardware", "gpus", "global_batch", "seq")
                           if k in data and k not in p}) for p in data["plans"]]
    return out


ESTIMATES = [estimate(t, load_profile(hw), p, g, b).to_dict() for t, hw, g, b, p in CASES]


@pytest.mark.parametrize("d", ESTIMATES + fixture_plans(), ids=lambda d: PlanResult.from_dict(d).plan.label())
def test_explain_and_report_name_the_same_bottleneck(d):
    best, text, key, sentence = both_say(d)
    assert key == best["bottleneck"] in BREAKDOWN_KEYS
    bd = d["breakdown_s"]
    assert bd[key] == max(bd[k] for k in BREAKDOWN_KEYS)          # the largest term
    where = f"{term_label(key)} on pipeline stage {best['bottleneck_stage']}"
    if best["bottleneck_stage"] is not None:                      # both name the same stage
        assert d["pp"] > 1 and where in text and where in sentence
    else:
        assert "pipeline stage" not in text and "on pipeline stage" not in sentence


def test_the_old_definitions_disagreed_on_some_of_these_plans():
    plans = ESTIMATES + fixture_plans()
    split = [d for d in plans if old_report_rule(d) != both_say(d)[0]["bottleneck"]]
    assert len(split) >= 3
    llama = ESTIMATES[0]       # dp8·tp8 mb2: compute under 75% but the largest term, exposed TP the largest overhead
    share = llama["breakdown_s"]["compute"] / llama["step_time_s"]
    assert 0.5 < share < 0.75 and old_report_rule(llama) == "tp_exposed"
    best, _, key, sentence = both_say(llama)
    assert key == best["bottleneck"] == "compute"
    assert sentence.startswith("compute-bound") and "exposed TP communication" in sentence


def test_the_stage_named_is_the_slowest_pipeline_rank():
    heavy_last = estimate(TINY, "cpu-2core", Plan(dp=4, pp=2, stages=((0, 2), (2, 8))), 8, 16).to_dict()
    heavy_first = estimate(TINY, "cpu-2core", Plan(dp=4, pp=2, stages=((0, 6), (6, 8))), 8, 16).to_dict()
    assert both_say(heavy_last)[0]["bottleneck_stage"] == 1
    assert both_say(heavy_first)[0]["bottleneck_stage"] == 0


def test_no_breakdown_means_no_bottleneck_in_either():
    d = {k: v for k, v in ESTIMATES[0].items() if k != "breakdown_s"}
    best, text, key, sentence = both_say(d)
    assert best["bottleneck"] is None and key is None
    assert "bottleneck" not in text and "no step-time breakdown" in sentence
