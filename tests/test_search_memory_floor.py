"""``autopar.search.memory_blocks``: the bound that sees how evenly memory lets the blocks spread
holds for every split that fits, and lifts the bound where memory binds (issue 30)."""
import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synthetic_tables import no_torch_pipelining_runtime, tight_memory_costs

from autopar.search.engine import all_splits
from autopar.search.space import Shape, configurations
from costmodels.contracts.errors import AutoparError
from costmodels.profiles.hardware_files import load_profile

BASE = load_profile("a100-80g-sxm")


def _costs(layers, batch, fraction):
    return tight_memory_costs(layers, batch, fraction)


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([4, 6]), st.sampled_from([8, 16]), st.sampled_from([0.0009, 0.0012, 0.002]))
def test_the_memory_floor_never_exceeds_a_split_that_fits(layers, batch, fraction):
    costs = _costs(layers, batch, fraction)
    shape = Shape.of(costs.table)
    for c in configurations(shape, 4, batch, 8, {"tp": 1}):
        if c.pp < 2:
            continue
        terms = costs.terms(c)
        terms.set_block_floor()
        lb = terms.time_lower_bound()
        for st_ in all_splits(shape.rows, c.pp * c.vpp):
            try:
                pred = costs.evaluate(c.plan(st_))
            except AutoparError:
                continue
            if pred["fits"]:
                assert lb <= pred["step_time_s"] * (1 + 1e-9), (c, st_, lb, pred["step_time_s"])


def test_the_floor_lifts_the_bound_where_memory_binds():
    """Eight blocks on pp 4 under 1F1B: rank 0 holds four micro-batches in flight, rank 3 one; with
    HBM a little above the least memory any split needs, the first ranks take fewer blocks than
    two, so the slowest takes more."""
    costs = _costs(8, 16, 1e6)
    c = next(c for c in configurations(Shape.of(costs.table), 4, 16, 8, {"tp": 1, "pp": 4, "schedule": "1f1b",
                                                                         "zero": 0, "recompute": "none",
                                                                         "micro_batch_size": 1,
                                                                         "runtime": no_torch_pipelining_runtime()}))
    roomy = costs.terms(c)
    roomy.set_block_floor()
    assert roomy.blocks[0] == 2                   # 8 blocks on 4 ranks: memory does not bind
    tight = dataclasses.replace(roomy, hbm=1.3 * roomy.memory_lower_bound())
    before = tight.time_lower_bound()
    tight.set_block_floor()
    assert tight.blocks[0] > 2 and tight.time_lower_bound() > before
