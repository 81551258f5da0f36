"""Pipeline timelines: per-stage order of forwards and backwards for each schedule, placed in time."""
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autopar.report.timeline import drawn_micro_batches, simulate, stage_order


def uniform(pp, vpp, f=1.0, b=2.0):
    return [[f] * vpp for _ in range(pp)], [[b] * vpp for _ in range(pp)]


def check_valid(t, fwd, bwd):
    pp, vpp, m = t.pp, t.vpp, t.micro_batches
    ops = {(o.kind, o.chunk * pp + o.rank, o.micro_batch): o for o in t.ops}
    # every forward and backward of every micro-batch on every virtual stage, exactly once
    assert len(t.ops) == len(ops) == 2 * pp * vpp * m
    for (kind, v, mb), o in ops.items():
        r, c = v % pp, v // pp
        assert o.end - o.start == pytest.approx(fwd[r][c] if kind == "F" else bwd[r][c])
        if kind == "F" and v > 0:
            assert o.start >= ops[("F", v - 1, mb)].end - 1e-12
        if kind == "B":
            assert o.start >= ops[("F", v, mb)].end - 1e-12
            if v < pp * vpp - 1:
                assert o.start >= ops[("B", v + 1, mb)].end - 1e-12
    for r in range(pp):  # one operation at a time per rank
        mine = sorted((o for o in t.ops if o.rank == r), key=lambda o: o.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(mine, mine[1:]))


@pytest.mark.parametrize("schedule, pp, vpp, m", [
    ("gpipe", 4, 1, 8), ("gpipe", 1, 1, 3), ("1f1b", 4, 1, 8), ("1f1b", 8, 1, 8), ("1f1b", 4, 1, 2),
    ("interleaved-1f1b", 4, 2, 8), ("interleaved-1f1b", 4, 3, 12), ("interleaved-1f1b", 2, 4, 6),
])
def test_uniform_bubble_matches_the_textbook(schedule, pp, vpp, m):
    """With equal stages the idle time is (pp-1)/(vpp·m) of the work: Narayanan et al. 2021."""
    f, b = uniform(pp, vpp)
    t = simulate(schedule, pp, vpp, m, f, b)
    check_valid(t, f, b)
    work = m * vpp * 3.0
    assert (t.makespan - work) / work == pytest.approx((pp - 1) / (vpp * m))


@pytest.mark.parametrize("pp, m", [(4, 8), (8, 16), (3, 2)])
def test_in_flight_micro_batches_per_schedule(pp, m):
    """1F1B keeps at most pp - r micro-batches in flight on rank r; GPipe keeps all m."""
    for schedule, limit in (("1f1b", lambda r: min(pp - r, m)), ("gpipe", lambda r: m)):
        for r in range(pp):
            live = peak = 0
            for kind, _, _ in stage_order(schedule, pp, 1, m, r):
                live += 1 if kind == "F" else -1
                peak = max(peak, live)
            assert peak == limit(r)


def test_interleaved_order_matches_megatron():
    # pp=2, vpp=2, m=4 on rank 0: warm-up 2·(pp-1) + (vpp-1)·pp = 4 forwards
    order = stage_order("interleaved-1f1b", 2, 2, 4, 0)
    assert order[:4] == [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1)]
    assert order[4:6] == [("F", 0, 2), ("B", 1, 0)]


@settings(max_examples=60, deadline=None)
@given(schedule=st.sampled_from(["gpipe", "1f1b", "interleaved-1f1b"]), pp=st.integers(1, 6),
       vpp=st.integers(1, 3), m=st.integers(1, 14), data=st.data())
def test_any_stage_times_give_a_valid_timeline(schedule, pp, vpp, m, data):
    if schedule != "interleaved-1f1b":
        vpp = 1
    elif pp < 2:
        pp = 2
    times = st.floats(0.01, 5.0)
    f = [[data.draw(times) for _ in range(vpp)] for _ in range(pp)]
    b = [[data.draw(times) for _ in range(vpp)] for _ in range(pp)]
    t = simulate(schedule, pp, vpp, m, f, b)
    check_valid(t, f, b)
    # the slowest rank's own work is a lower bound, the serial sum an upper one
    own = max(m * sum(f[r][c] + b[r][c] for c in range(vpp)) for r in range(pp))
    assert own - 1e-9 <= t.makespan <= m * sum(map(sum, f)) + m * sum(map(sum, b)) + 1e-9


def test_large_counts_are_capped():
    assert drawn_micro_batches("1f1b", 8, 1, 6) == 6
    assert drawn_micro_batches("1f1b", 8, 1, 768) == 16
    assert drawn_micro_batches("interleaved-1f1b", 8, 3, 384) % 8 == 0
    for pp, vpp in itertools.product((16, 32, 64, 128), (1, 2, 4)):
        n = drawn_micro_batches("interleaved-1f1b" if vpp > 1 else "1f1b", pp, vpp, 10**5)
        assert n >= pp and 2 * pp * vpp * n <= max(4000, 2 * pp * vpp * pp)


def test_zero_bubble_plan_timeline_draws_w_passes_and_the_v(tmp_path):
    """A zb-v plan's estimate (stages_detail with bwd_b_s / bwd_w_s) rendered: the SVG timeline
    has weight-gradient blocks of both chunks (gid ops-W0 / ops-W1) beside F and B, the Markdown
    timeline 'W' cells on every rank and each rank's two stages (V placement: r and 2·pp − 1 − r),
    the caption names the split backward; the same plan under interleaved 1F1B has no W."""
    import json

    from synthetic_tables import gpt_table

    from autopar.report import make_report
    from costmodels.contracts.plan import Plan
    from costmodels.model.estimate import estimate
    from costmodels.profiles.hardware_files import load_profile
    table = gpt_table(8, 256, 4, 1000, 128, model="gpt:layers=8,hidden=256,heads=4,vocab=1000,seq=128")
    prof = load_profile("a100-80g-sxm")
    files = {}
    for sched in ("zb-v", "interleaved-1f1b"):
        e = estimate(table, prof, Plan(pp=4, vpp=2, schedule=sched), 4, 8).to_dict()
        files[sched] = tmp_path / f"{sched}.json"
        files[sched].write_text(json.dumps([e]))
    one = lambda *k: (None, "test")  # noqa: E731
    html = make_report([str(files["zb-v"])], fmt="html", one_gpu_time=one)
    assert all(f"ops-{k}{c}" in html for k in "FBW" for c in (0, 1))
    assert "weight-gradient passes" in html
    md = make_report([str(files["zb-v"])], fmt="md", one_gpu_time=one)
    rows = [ln for ln in md.splitlines() if ln.startswith("rank ")]
    assert len(rows) == 4 and all("W" in ln.split("|")[1] for ln in rows)
    assert rows[0].startswith("rank   0 (stages 0, 7)") and rows[3].startswith("rank   3 (stages 3, 4)")
    plain = make_report([str(files["interleaved-1f1b"])], fmt="html", one_gpu_time=one)
    assert "ops-F0" in plain and "ops-W" not in plain
