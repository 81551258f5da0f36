"""The search with the zero-bubble schedules in its space (``zero_bubble=True``): the dense plans
are proved first and the zero-bubble configurations solved under their k-th plan
(``autopar.search.dense_first``), and the top plans still equal exhaustive enumeration of every
configuration × every split through the estimate, zero-bubble ones included."""
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_search_solver import close, serial_memory, small_profile, table

from autopar.search.costs import Costs
from autopar.search.engine import enumerate_plans, run_search
from costmodels.contracts.errors import NoFeasiblePlanError
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES

spaces = st.fixed_dictionaries({
    "layers": st.sampled_from([3, 4]),
    "hidden": st.sampled_from([32, 64]),
    "heads": st.sampled_from([2, 4]),
    "seq": st.sampled_from([16, 64]),
    "gpus": st.sampled_from([2, 4]),
    "batch": st.sampled_from([4, 8]),
    "hbm_fraction": st.sampled_from([0.3, 0.6, 2.0]),
})


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spaces)
def test_search_with_zero_bubble_equals_enumeration(s):
    t = table(s["layers"], s["hidden"], s["heads"], s["seq"])
    costs = Costs(t, small_profile(s["hbm_fraction"] * serial_memory(t, s["batch"])), s["batch"])
    brute = enumerate_plans(costs, gpus=s["gpus"], global_batch=s["batch"], zero_bubble=True)
    if not brute:
        with pytest.raises(NoFeasiblePlanError):
            run_search(costs, gpus=s["gpus"], global_batch=s["batch"], top=3, zero_bubble=True)
        return
    res = run_search(costs, gpus=s["gpus"], global_batch=s["batch"], top=3, zero_bubble=True)
    assert res.optimal
    assert len(res.plans) == min(3, len(brute))
    for cand, (_, _, pred) in zip(res.plans, brute):
        assert close(cand.prediction["step_time_s"], pred["step_time_s"]), (cand.prediction, pred)


def test_a_zero_bubble_plan_can_beat_the_dense_ones_it_waited_behind():
    """The held zero-bubble configurations are searched after the dense phase and can still take
    the first place: at pp 2 with many micro-batches the best plan is split-backward, as in
    enumeration (the schedule is not pinned, so the dense phase runs first)."""
    t = table(8, 64, 4, 64)
    costs = Costs(t, small_profile(1e15), 64)
    fix = {"pp": 2, "tp": 1, "mbs": 32, "zero": 1, "recompute": "none"}
    brute = enumerate_plans(costs, gpus=4, global_batch=64, fix=fix, zero_bubble=True)
    res = run_search(costs, gpus=4, global_batch=64, fix=fix, top=2, zero_bubble=True)
    assert res.optimal and brute[0][1].schedule in SPLIT_BACKWARD_SCHEDULES
    assert res.plans[0].plan.schedule in SPLIT_BACKWARD_SCHEDULES
    assert close(res.plans[0].prediction["step_time_s"], brute[0][2]["step_time_s"])
