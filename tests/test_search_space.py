"""The search space: --fix parsing, candidate degrees, divisibility, canonical forms."""
import pytest

from autopar.search.space import Shape, configurations, parse_fix, tp_candidates
from costmodels.errors import PlanError


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
            assert c.schedule == "interleaved-1f1b" and c.pp >= 2 and m % c.pp == 0
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

    from costmodels.runtime import load_runtime
    uneven = {(c.pp, c.vpp) for c in configurations(Shape(rows=128, layers=126, heads=128, kv_heads=8),
                                                     256, 256, 8) if c.vpp > 1}
    assert (16, 2) in uneven and (16, 8) in uneven        # 126 blocks divide no 16·vpp
    assert (2, 3) in uneven and (2, 4) not in uneven      # pp=2 has even ones (126 = 2·3·21)
    pinned = {c.vpp for c in configurations(SHAPE, 64, 96, 8, {"pp": 2, "vpp": 5})}
    assert pinned == {5}                                  # pinned: searched even where uneven
    uneven = {(c.pp, c.vpp) for c in configurations(SHAPE, 64, 96, 8) if c.vpp > 1}
    assert all(96 % (p * v) == 0 for p, v in uneven)       # every pp here has an even vpp
    mega = {(c.pp, c.vpp) for c in configurations(SHAPE, 64, 96, 8, {"runtime": "megatron"}) if c.vpp > 1}
    assert mega == uneven
    assert not any(c.vpp > 1 for c in configurations(SHAPE, 64, 96, 8, {"runtime": "deepspeed"}))
    import costmodels.runtime as runtime
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
