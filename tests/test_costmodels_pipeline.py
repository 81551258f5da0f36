"""The closed-form pipeline time (costmodels.model.pipeline) against the schedule simulator
(costmodels.model.schedule_sim), the reference: exact for uniform chunks, within the docstring's
measured bounds for random per-chunk times."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodels.model.pipeline import column_maxima, pipeline_time
from costmodels.model.schedule_sim import simulate

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def simulated(schedule, f, b, m):
    return simulate(schedule, len(f), len(f[0]), m, f, b).makespan


def formula(f, b, m):
    return pipeline_time([[x + y for x, y in zip(fr, br)] for fr, br in zip(f, b)], m, len(f[0]))[0]


# two regimes: "jitter" (near-even splits: forward times within 10 %, backward 2–2.2× forward)
# and "uneven" (chunks differing 4×, backward 2–3× forward, as with recompute or light rows)
REGIMES = {"jitter": (1.1, 2.2), "uneven": (4.0, 3.0)}


@st.composite
def pipelines(draw, schedule, regime):
    """(f, b, m): per-rank, per-chunk forward / backward times of one regime."""
    spread, kmax = REGIMES[regime]
    p = draw(st.integers(2, 6))
    v = draw(st.integers(2, 4)) if schedule == "interleaved-1f1b" else 1
    m = p * draw(st.integers(1, 6))
    f = [[draw(st.floats(1.0, spread)) for _ in range(v)] for _ in range(p)]
    b = [[x * draw(st.floats(2.0, kmax)) for x in row] for row in f]
    return f, b, m


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (8, 16), (4, 32)])
def test_uniform_chunks_equal_the_simulator(schedule, p, m):
    v = 3 if schedule == "interleaved-1f1b" else 1
    f, b = [[0.7] * v for _ in range(p)], [[1.6] * v for _ in range(p)]
    assert formula(f, b, m) == pytest.approx(simulated(schedule, f, b, m), rel=1e-12)


def test_interleaved_uneven_chunks_are_slower_than_their_rank_totals_say():
    # the gpt3-175b case: rank 0 runs chunks of 1, 10, 1, 1 blocks, the others 3, 3, 3, 4; every
    # rank's total is 13 blocks, yet the 10-block chunk stalls the others once per group
    p, v, m = 8, 4, 96
    blocks = [[1, 10, 1, 1]] + [[3, 3, 3, 4]] * (p - 1)
    f = [[float(x) for x in row] for row in blocks]
    b = [[2.0 * x for x in row] for row in blocks]
    sim = simulated("interleaved-1f1b", f, b, m)
    rank_total_form = m * 39 + (p - 1) * 39 / v
    assert sim > 1.2 * rank_total_form
    assert formula(f, b, m) >= sim
    assert formula(f, b, m) <= 1.2 * sim


def test_column_maxima():
    assert column_maxima([[1.0, 5.0], [3.0, 2.0]]) == [3.0, 5.0]


def test_one_number_per_rank_is_read_as_even_chunks():
    assert pipeline_time([4.0, 4.0], 8, 2) == pipeline_time([[2.0, 2.0], [2.0, 2.0]], 8, 2)


def test_imbalanced_ranks_without_interleaving():
    total, bubble = pipeline_time([[1.0], [2.0], [1.0]], m=10)
    assert total == pytest.approx(10 * 2.0 + 2.0)
    assert bubble == pytest.approx(2.0)


# measured bounds (formula / simulator) quoted in costmodels/model/pipeline.py's docstring
BOUNDS = {  # schedule: {regime: (lowest, highest)}
    "1f1b": {"jitter": (1.0, 1.07), "uneven": (1.0, 1.30)},
    "gpipe": {"jitter": (0.98, 1.0), "uneven": (0.92, 1.0)},
    "interleaved-1f1b": {"jitter": (0.995, 1.12), "uneven": (0.86, 1.65)},
}


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("regime", sorted(REGIMES))
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_closed_form_within_measured_bounds_of_the_simulator(schedule, regime, data):
    f, b, m = data.draw(pipelines(schedule, regime))
    lo, hi = BOUNDS[schedule][regime]
    ratio = formula(f, b, m) / simulated(schedule, f, b, m)
    assert lo - 1e-9 <= ratio <= hi + 1e-9, (ratio, f, b, m)
