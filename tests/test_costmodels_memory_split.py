"""Activations in flight under the split-backward schedules (costmodels.model.memory.split_in_flight):
the closed forms of memory's docstring against the simulator's peak, counted from the simulated
timeline (live micro-batches per rank over time), and the V placement's balance."""
import pytest
from synthetic_tables import gpt3_175b, no_torch_pipelining_runtime

from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.model.memory import split_in_flight
from costmodels.model.schedule_sim import simulate

CASES = [(s, p, m) for s in ("interleaved-zb", "zb-v", "dualpipe-v") for p, m in
         [(2, 4), (2, 8), (3, 9), (4, 8), (4, 12), (4, 24), (6, 18)]]


def timeline_peak(schedule, p, v, m, rank):
    """Most micro-batch chunk-passes rank ``rank`` holds at any time of the simulated step: a
    forward's activations live from its start to the end of that micro-batch's W."""
    f, b, w = [[1.0] * v] * p, [[2.4] * v] * p, [[1.0] * v] * p
    ops = [o for o in simulate(schedule, p, v, m, f, b, wgt=w).ops if o.rank == rank]
    start = {(o.chunk, o.micro_batch): o.start for o in ops if o.kind == "F"}
    end = {(o.chunk, o.micro_batch): o.end for o in ops if o.kind == "W"}
    times = sorted(start.values())
    return max(sum(1 for k in start if start[k] <= t < end[k]) for t in times)


def closed_form_total(schedule, p, v, m, rank):
    """memory's docstring: chunk-passes held at the peak, uniform stages."""
    return {"interleaved-zb": p * v, "zb-v": 2 * p, "dualpipe-v": 2 * p + 1}[schedule]


@pytest.mark.parametrize("schedule,p,m", CASES)
def test_closed_form_equals_the_simulated_peak(schedule, p, m):
    v = 2
    for r in range(p):
        held, w_bytes = split_in_flight(schedule, p, v, m, r, [1.0] * v, [0.0] * v)
        assert sum(held) == closed_form_total(schedule, p, v, m, r) == timeline_peak(schedule, p, v, m, r)
        assert w_bytes == 0.0


@pytest.mark.parametrize("p", [2, 4, 6])
def test_v_placement_holds_both_chunks_as_the_docstring_says(p):
    m = 4 * p
    for r in range(p):
        assert split_in_flight("zb-v", p, 2, m, r, [1.0, 1.0], [0.0, 0.0])[0] in ([2 * p - 1 - r, r + 1],
                                                                                  [2 * p - r, r])
        assert split_in_flight("dualpipe-v", p, 2, m, r, [1.0, 1.0], [0.0, 0.0])[0] == [2 * p - r, r + 1]
        # a heavy chunk 0 picks the moment with more of chunk 0 in flight
        assert split_in_flight("zb-v", p, 2, m, r, [10.0, 1.0], [0.0, 0.0])[0] == [2 * p - r, r]


def test_more_micro_batches_past_three_periods_change_nothing():
    for m in (12, 40):
        assert split_in_flight("zb-v", 4, 2, m, 1, [2.0, 3.0], [0.5, 0.5]) == \
            split_in_flight("zb-v", 4, 2, 12, 1, [2.0, 3.0], [0.5, 0.5])


def test_v_placement_balances_memory_across_ranks():
    # 1F1B: rank 0 holds pp micro-batches, the last rank one; zb-v: every rank about the same
    table = gpt3_175b()
    kw = dict(dp=2, tp=8, pp=4, recompute="selective", sequence_parallel=True,
              runtime=no_torch_pipelining_runtime())   # no held outputs: in-flight counts alone
    act = {}
    for schedule, vpp in (("1f1b", 1), ("zb-v", 2)):
        e = estimate(table, "a100-80g-sxm", Plan(schedule=schedule, vpp=vpp, **kw), 64, 128)
        act[schedule] = [s["memory_bytes"]["activations"] for s in e.stages_detail]
    spread = {k: max(v) / min(v) for k, v in act.items()}
    assert spread["1f1b"] > 2.5
    assert spread["zb-v"] < 1.35
    assert max(act["zb-v"]) < 1.2 * max(act["1f1b"])
