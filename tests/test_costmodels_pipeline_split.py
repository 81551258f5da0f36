"""The estimate's pipeline time for the split-backward schedules (costmodels.model.pipeline_split)
against the schedule simulator run over every micro-batch, for UNEVEN stages as real plans have
them (pipeline_split's docstring): within 2 % for every new schedule; and the estimate itself
on a real table with pinned uneven stages."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_tables import gpt3_175b

from costmodels.contracts.plan import Plan, stages_of_rank
from costmodels.model.estimate import estimate
from costmodels.model.pipeline_split import rank_work, split_pipeline_time
from costmodels.model.schedule_program import makespan
from costmodels.model.schedule_sim import simulate

SPLIT = ("interleaved-zb", "zb-v", "dualpipe-v")


@st.composite
def uneven(draw, schedule):
    """(fwd, bwd, wgt, m) per rank and chunk: stages of n or n + 1 blocks (sometimes n − 2 …
    n + 3), the embedding on the first stage, the head on the last, backward 2–3× forward, W
    30–50 % of the backward."""
    p = draw(st.integers(2, 6))
    v = draw(st.integers(2, 3)) if schedule == "interleaved-zb" else 2
    n = draw(st.integers(1, 6))
    nv = p * v
    f = []
    for s in range(nv):
        k = n + draw(st.integers(0, 1)) if draw(st.booleans()) or draw(st.booleans()) \
            else max(1, n + draw(st.integers(-2, 3)))
        f.append(float(k) + (draw(st.floats(0.0, 0.5)) if s == 0 else 0.0)
                 + (draw(st.floats(0.5, 3.0)) if s == nv - 1 else 0.0))
    b = [x * draw(st.floats(2.0, 3.0)) for x in f]
    w = [x * draw(st.floats(0.3, 0.5)) for x in b]
    low = 2 * p if schedule == "dualpipe-v" else 1
    if schedule == "interleaved-zb":
        m = p * draw(st.integers(1, 12))
    else:
        m = draw(st.integers(low, 12 * p))
    per_rank = [stages_of_rank(schedule, p, v, r) for r in range(p)]
    pick = [[[x[s] for s in stages] for stages in per_rank] for x in (f, b, w)]
    return (*pick, m)


@pytest.mark.parametrize("schedule", SPLIT)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_estimate_pipeline_time_within_2_percent_of_the_simulator(schedule, data):
    f, b, w, m = data.draw(uneven(schedule))
    total, bubble = split_pipeline_time(schedule, f, b, w, m)
    sim = simulate(schedule, len(f), len(f[0]), m, f, b, wgt=w).makespan
    assert abs(total / sim - 1) <= 0.02, (total, sim, m)
    assert bubble == pytest.approx(total - m * max(rank_work(f, b)))
    assert total >= m * max(rank_work(f, b)) * (1 - 1e-12)   # never below the busiest rank's work


@pytest.mark.parametrize("schedule", SPLIT)
def test_uniform_stages_leave_less_bubble_than_1f1b(schedule):
    # the point of these schedules: W fills the fill/drain; F = 1, B = W = 1 per chunk
    p, v, m = 4, 2, 16
    f, b, w = [[1.0] * v] * p, [[2.0] * v] * p, [[1.0] * v] * p
    total, bubble = split_pipeline_time(schedule, f, b, w, m)
    one_f_one_b = (m + p - 1) * v * 3.0          # 1F1B on the same per-rank work
    assert m * v * 3.0 < total < one_f_one_b
    assert 0 < bubble < (p - 1) * v * 3.0


def test_w_is_not_waited_for():
    # moving time from B to W (same backward) never slows zb-v: W only fills gaps
    p, m = 4, 12
    f = [[1.0, 1.0]] * p
    b = [[2.5, 2.5]] * p
    times = [makespan("zb-v", p, 2, m, f, b, [[x, x]] * p) for x in (0.0, 0.5, 1.0)]
    assert times[0] >= times[1] >= times[2]
    assert times[0] > times[2]


@pytest.mark.parametrize("schedule", SPLIT)
def test_estimate_of_uneven_pinned_stages_agrees_with_its_simulation(schedule):
    table = gpt3_175b()
    pp, n = 4, len(table.rows)
    cuts = [0, 5, 17, 29, 41, 53, 66, 80, n]       # uneven: 5 … 14 rows per stage
    plan = Plan(dp=2, tp=8, pp=pp, vpp=2, schedule=schedule, recompute="selective",
                sequence_parallel=True, stages=tuple(zip(cuts[:-1], cuts[1:])))
    e = estimate(table, "a100-80g-sxm", plan, 64, 128)
    d = e.stages_detail
    assert all(len(s["bwd_w_s"]) == 2 and 0 < s["bwd_w_s"][0] < s["bwd_s"][0] for s in d)
    assert [s["virtual_stages"] for s in d] == [list(stages_of_rank(schedule, pp, 2, r)) for r in range(pp)]
    fwd, bwd, wgt = ([s[k] for s in d] for k in ("fwd_s", "bwd_s", "bwd_w_s"))
    pipeline = e.breakdown_s["bubble"] + e.num_micro_batches * max(rank_work(fwd, bwd))
    sim = simulate(schedule, pp, 2, e.num_micro_batches, fwd, bwd, wgt=wgt).makespan
    assert pipeline == pytest.approx(sim, rel=0.02)
