"""The search space: --fix parsing, candidate degrees, divisibility, canonical forms."""
import pytest

from autopar.search.space import Shape, configurations, parse_fix, tp_candidates
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import MULTI_STAGE_SCHEDULES, V_SCHEDULES


def test_parse_fix_values_and_aliases():
    f = parse_fix("tp=8,schedule=1f1b,mbs=2,sp=true,zero=3,recompute=full,placement=tp-dp-pp")
    assert f == {"tp": 8, "schedule": "1f1b", "micro_batch_size": 2, "sequence_parallel": True,
                 "zero": 3, "recompute": "full", "placement": "tp,dp,pp"}
    assert parse_fix("stages=0:3;3:6") == {"stages": ((0, 3), (3, 6))}
    assert parse_fix("schedule=interleaved,vpp=2") == {"schedule": "interleaved-1f1b", "vpp": 2}
    assert parse_fix("") == {} and parse_fix(None) == {}


@pytest.mark.parametrize("text, needle", [
    ("tpp=8", "not a plan field"),
    ("tp=eight", "positive integer"),
    ("tp=0", "positive integer"),
    ("zero=4", "0, 1, 2 or 3"),
    ("schedule=zigzag", "gpipe"),
    ("recompute=some", "selective"),
    ("sp=maybe", "true or false"),
    ("tp8", "key=value"),
    ("tp=8,tp=4", "twice"),
    ("stages=0-3", "row ranges"),
])
def test_parse_fix_errors_are_one_line(text, needle):
    with pytest.raises(PlanError) as e:
        parse_fix(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


SHAPE = Shape(rows=98, layers=96, heads=96, kv_heads=96)


def test_tp_inside_a_node_unless_allowed():
    assert tp_candidates(SHAPE, 8, False, 1024) == [1, 2, 4, 8]
    assert 16 in tp_candidates(SHAPE, 8, True, 1024)
    # kv heads limit tp (llama3: 8 kv heads)
    assert tp_candidates(Shape(rows=128, layers=126, heads=128, kv_heads=8), 8, True, 1024) == [1, 2, 4, 8]


def test_configurations_respect_divisibility():
    cs = list(configurations(SHAPE, 64, 96, 8))
    assert cs
    for c in cs:
        assert c.dp * c.tp * c.pp == 64
        assert 96 % c.tp == 0 and c.tp <= 8
        assert 96 % (c.dp * c.micro_batch_size) == 0
        assert c.pp * c.vpp <= SHAPE.rows
        m = 96 // (c.dp * c.micro_batch_size)
        if c.vpp > 1:   # autopar's runtime cuts uneven virtual stages: any vpp with pp·vpp ≤ rows
            assert c.schedule in MULTI_STAGE_SCHEDULES and c.pp >= 2
            if c.schedule == "interleaved-1f1b":
                assert m % c.pp == 0
            if c.schedule in V_SCHEDULES:
                assert c.vpp == 2
            if c.schedule == "interleaved-zb":   # torch: rounds of m // pp divide m
                assert m % max(1, m // c.pp) == 0
            if c.schedule == "dualpipe-v":
                assert m >= 2 * c.pp
        if c.dp == 1:
            assert c.zero == 0
        if c.tp == 1:
            assert not c.sequence_parallel
        if c.pp == 1:
            assert c.schedule == "1f1b"
    assert len(set(cs)) == len(cs)


def test_configurations_honour_fix():
    fix = parse_fix("tp=4,schedule=gpipe,zero=1")
    cs = list(configurations(SHAPE, 64, 96, 8, fix))
    assert cs and all(c.tp == 4 and c.schedule == "gpipe" and c.zero == 1 for c in cs)


def test_uneven_interleaving_only_where_the_runtime_runs_it():
    """autopar's runtime and Megatron-core interleave when the blocks do not divide pp·vpp;
    DeepSpeed's pipeline engine does not interleave at all; a runtime profile without uneven
    interleaving keeps Megatron's old rule."""
    import dataclasses

    from costmodels.profiles.runtime import load_runtime
    uneven = {(c.pp, c.vpp) for c in configurations(Shape(rows=128, layers=126, heads=128, kv_heads=8),
                                                     256, 256, 8) if c.vpp > 1}
    assert (16, 2) in uneven and (16, 8) in uneven        # 126 blocks divide no 16·vpp
    assert (2, 3) in uneven and (2, 4) not in uneven      # pp=2 has even ones (126 = 2·3·21)
    pinned = {c.vpp for c in configurations(SHAPE, 64, 96, 8, {"pp": 2, "vpp": 5})}
    assert pinned == {5}                                  # pinned: searched even where uneven
    cs = list(configurations(SHAPE, 64, 96, 8, zero_bubble=True))
    uneven = {(c.pp, c.vpp) for c in cs if c.vpp > 1 and c.schedule not in V_SCHEDULES}
    assert all(96 % (p * v) == 0 for p, v in uneven)       # every pp here has an even vpp
    uneven = {(c.pp, c.vpp) for c in cs if c.vpp > 1 and c.schedule == "interleaved-1f1b"}
    # the V schedules have one vpp, 2: listed wherever 2·pp ≤ rows, even or not (96 % 64 ≠ 0)
    assert {c.pp for c in cs if c.schedule == "zb-v"} == {2, 4, 8, 16, 32}
    mega = {(c.pp, c.vpp) for c in configurations(SHAPE, 64, 96, 8, {"runtime": "megatron"}) if c.vpp > 1}
    assert mega == uneven
    assert not any(c.vpp > 1 for c in configurations(SHAPE, 64, 96, 8, {"runtime": "deepspeed"}))
    import costmodels.profiles.runtime as runtime
    even = dataclasses.replace(load_runtime("megatron"), name="even", uneven_interleaving=False)
    runtime._CACHE[("even",)] = even
    from autopar.search import space
    cs = [c for c in space.configurations(SHAPE, 64, 96, 8) if c.vpp > 1]
    cs = [c for c in space.configurations(SHAPE, 64, 96, 8, {"pp": 2, "vpp": 5})] + cs
    kept = [c for c in cs if not space.interleaving_rule(even, c, SHAPE.layers)]
    assert kept and all(SHAPE.layers % (c.pp * c.vpp) == 0 for c in kept) and len(kept) < len(cs)


def test_configurations_follow_the_runtime_capabilities():
    """megatron: ZeRO 0/1 only, no GPipe; deepspeed: ZeRO-2/3 only without a pipeline; fsdp: no
    ZeRO-1. Every configuration carries the runtime's name."""
    mega = list(configurations(SHAPE, 64, 96, 8, {"runtime": "megatron"}))
    assert mega and {c.zero for c in mega} == {0, 1} and "gpipe" not in {c.schedule for c in mega}
    assert {c.runtime for c in mega} == {"megatron"}
    ds = list(configurations(SHAPE, 64, 96, 8, {"runtime": "deepspeed"}))
    assert {c.zero for c in ds if c.pp == 1} == {0, 1, 2, 3} and {c.zero for c in ds if c.pp > 1} == {0, 1}
    fsdp = list(configurations(SHAPE, 64, 96, 8, {"runtime": "fsdp"}))
    assert {c.zero for c in fsdp} == {0, 2, 3}
    opt = list(configurations(SHAPE, 64, 96, 8, parse_fix("runtime=megatron:overlap_grad_reduce")))
    assert {c.runtime for c in opt} == {"megatron:overlap_grad_reduce"}


@pytest.mark.parametrize("text, name", [
    ("zb", "interleaved-zb"), ("InterleavedZeroBubble", "interleaved-zb"), ("interleaved_zb", "interleaved-zb"),
    ("zbv", "zb-v"), ("ZBVZeroBubble", "zb-v"), ("ScheduleZBVZeroBubble", "zb-v"), ("ZB-V", "zb-v"),
    ("dualpipev", "dualpipe-v"), ("DualPipeV", "dualpipe-v"), ("dualpipe_v", "dualpipe-v"),
    ("Interleaved1F1B", "interleaved-1f1b"), ("GPipe", "gpipe"),
])
def test_schedule_aliases(text, name):
    assert parse_fix(f"schedule={text}") == {"schedule": name}


def test_dualpipe_without_v_is_refused_with_the_v_form_named():
    with pytest.raises(PlanError, match="dualpipe-v"):
        parse_fix("schedule=dualpipe")


@pytest.mark.parametrize("text, needle", [
    ("schedule=zb-v,vpp=3", "exactly two stages per rank"),
    ("schedule=dualpipe-v,vpp=1", "vpp >= 2"),
    ("schedule=interleaved-zb,vpp=1", "vpp >= 2"),
    ("schedule=1f1b,vpp=2", "several stages per rank"),
    ("schedule=zb-v,pp=1", "needs a pipeline"),
    ("schedule=zb-v,runtime=megatron", "runtime 'megatron' has no such schedule"),
    ("schedule=interleaved-zb,runtime=deepspeed", "--runtime autopar / fsdp"),
])
def test_fix_schedule_rules_are_one_line(text, needle):
    from autopar.search.space import check_fix_against
    with pytest.raises(PlanError) as e:
        check_fix_against(parse_fix(text), 64)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_zero_bubble_schedules_join_the_space_where_the_runtime_runs_them():
    """autopar's runtime and torchtitan (fsdp) run torch's zero-bubble schedules; Megatron-core
    and DeepSpeed have none. V schedules always have vpp = 2; interleaved-zb takes the same vpps
    as interleaved 1F1B, and also micro-batch counts that are not a multiple of pp (torch's
    rounds), which interleaved 1F1B refuses."""
    for runtime in ("autopar", "fsdp"):
        cs = list(configurations(SHAPE, 64, 96, 8, {"runtime": runtime}, zero_bubble=True))
        got = {c.schedule for c in cs}
        assert {"interleaved-zb", "zb-v", "dualpipe-v"} <= got
        assert {c.vpp for c in cs if c.schedule in V_SCHEDULES} == {2}
        ilv = {(c.pp, c.vpp) for c in cs if c.schedule == "interleaved-1f1b"}
        izb = {(c.pp, c.vpp) for c in cs if c.schedule == "interleaved-zb"}
        assert ilv and ilv <= izb
    for runtime in ("megatron", "deepspeed"):
        got = {c.schedule for c in configurations(SHAPE, 64, 96, 8, {"runtime": runtime}, zero_bubble=True)}
        assert not got & {"interleaved-zb", "zb-v", "dualpipe-v"}
    # pp = 4, 6 micro-batches: interleaved 1F1B refuses (6 % 4), torch's interleaved-zb runs one
    # round of 6, zb-v runs any count, DualPipeV needs 2·pp = 8
    fix = {"pp": 4, "tp": 1, "micro_batch_size": 1}
    cs = [c for c in configurations(Shape(rows=34, layers=32, heads=8, kv_heads=8), 16, 24, 8, fix,
                                    zero_bubble=True)]
    got = {c.schedule for c in cs}
    assert "interleaved-zb" in got and "zb-v" in got and not got & {"interleaved-1f1b", "dualpipe-v"}


def test_pinned_zero_bubble_schedule_is_the_only_one_listed():
    cs = list(configurations(SHAPE, 64, 96, 8, parse_fix("schedule=zbv")))
    assert cs and {c.schedule for c in cs} == {"zb-v"} and {c.vpp for c in cs} == {2}
    assert {c.pp for c in cs} >= {2, 4, 8}


def test_zero_bubble_schedules_only_when_asked_or_pinned():
    """The default space keeps its schedules (the split program is exact but slow at scale);
    --zero-bubble adds the three, a pinned one is searched without it, and the search says what
    it left out."""
    from autopar.search.scope import space_exclusions
    plain = {c.schedule for c in configurations(SHAPE, 64, 96, 8)}
    assert plain == {"gpipe", "1f1b", "interleaved-1f1b"}
    asked = {c.schedule for c in configurations(SHAPE, 64, 96, 8, zero_bubble=True)}
    assert asked == plain | {"interleaved-zb", "zb-v", "dualpipe-v"}
    assert {c.schedule for c in configurations(SHAPE, 64, 96, 8, parse_fix("schedule=dualpipe-v"))} == {"dualpipe-v"}
    said = " ".join(space_exclusions({}))
    assert "zero-bubble schedules interleaved-zb, zb-v, dualpipe-v (--zero-bubble" in said
    assert "zero-bubble" not in " ".join(space_exclusions({}, zero_bubble=True))
    assert "zero-bubble" not in " ".join(space_exclusions({"runtime": "megatron"}))
