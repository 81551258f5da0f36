"""One vocabulary: the bottleneck definition, the term labels, ``Plan.label()`` and PLAN_FIELDS."""
from dataclasses import fields
from itertools import product

import autopar.report.analysis as analysis
import autopar.search.explain as explain
import autopar.search.fix as fix
import autopar.validate.run as validate_run
from costmodels.contracts.breakdown import BREAKDOWN_KEYS, TERM_LABELS, bottleneck, slowest_stage
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import PLAN_FIELDS, Plan


def est(step=10.0, pp=1, **terms):
    bd = dict.fromkeys(BREAKDOWN_KEYS, 0.0) | terms
    detail = [{"stage": r, "fwd_s": [1.0], "bwd_s": [2.0 + (r == 1)]} for r in range(pp)]
    return {"step_time_s": step, "breakdown_s": bd, "stages_detail": detail}


def test_bottleneck_is_the_largest_term_whatever_its_share():
    b = bottleneck(est(compute=4.0, bubble=3.0, tp_exposed=3.0))
    assert (b.term, b.seconds, b.share, b.stage) == ("compute", 4.0, 0.4, None)
    assert bottleneck(est(compute=2.0, dp_exposed=8.0)).term == "dp_exposed"
    assert bottleneck(est(compute=5.0, bubble=5.0)).term == "compute"     # ties: the earlier key
    assert bottleneck({"step_time_s": 1.0}) is None
    assert bottleneck(est(step=0.0, compute=0.0)).share is None


def test_the_stage_is_named_for_terms_the_slowest_rank_spends():
    # rank 1 is the slowest (3 s per micro-batch against 4 s)
    assert bottleneck(est(pp=2, compute=6.0, bubble=4.0)).stage == 1
    assert bottleneck(est(pp=2, tp_exposed=6.0, compute=4.0)).where() == " on pipeline stage 1"
    assert bottleneck(est(pp=2, bubble=6.0, compute=4.0)).stage is None       # the whole pipeline's
    assert bottleneck(est(pp=2, dp_exposed=6.0, compute=4.0)).stage is None   # worst over ranks
    assert slowest_stage({"stages_detail": [{"stage": 0, "fwd_s": 1.0, "bwd_s": 2.0},
                                            {"stage": 1, "fwd_s": 1.0, "bwd_s": 2.0}]}) == 0


def test_every_term_has_one_label():
    assert set(TERM_LABELS) == set(BREAKDOWN_KEYS)
    assert len(set(TERM_LABELS.values())) == len(TERM_LABELS)


def test_plan_label_names_what_is_not_default():
    p = Plan(dp=16, tp=8, pp=8, vpp=3, zero=1, recompute="selective", sequence_parallel=True,
             schedule="interleaved-1f1b")
    assert p.label() == "dp16·tp8·pp8 vpp3 mb1 ZeRO-1 selective-recompute sp interleaved-1f1b"
    assert Plan().label() == "dp1·tp1·pp1 mb1"
    assert Plan(pp=2).label() == "dp1·tp1·pp2 mb1 1f1b"          # a pipeline always says its schedule
    assert Plan(micro_batch_size=4, schedule="gpipe", attention="math", placement="tp,pp,dp").label() == \
        "dp1·tp1·pp1 mb4 gpipe math-attention placement:tp,pp,dp"
    assert Plan(pp=2, stages=((0, 3), (3, 8))).label() == Plan(pp=2).label()   # split points left out


def test_plan_labels_tell_plans_apart():
    seen = {}
    for tp, pp, vpp, zero, rc, sp, sched, attn, place in product(
            (1, 2), (1, 2), (1, 2), (0, 1, 3), ("none", "selective", "full"), (False, True),
            ("gpipe", "1f1b", "interleaved-1f1b"), ("flash", "math"), ("tp,dp,pp", "dp,tp,pp")):
        try:
            p = Plan(dp=2, tp=tp, pp=pp, vpp=vpp, zero=zero, recompute=rc, sequence_parallel=sp,
                     schedule=sched, attention=attn, placement=place)
        except PlanError:
            continue
        assert seen.setdefault(p.label(), p) == p
    assert len(seen) > 300


def test_plan_field_lists_are_derived_from_the_dataclass():
    assert PLAN_FIELDS == tuple(f.name for f in fields(Plan) if f.name != "version")
    assert fix.PLAN_FIELDS is PLAN_FIELDS and analysis.PLAN_FIELDS is PLAN_FIELDS
    assert validate_run.PLAN_KEYS is PLAN_FIELDS
    assert explain.COMPARED_FIELDS == tuple(k for k in PLAN_FIELDS if k != "stages")
