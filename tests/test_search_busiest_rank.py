"""The whole-block floors of the dense split programs (``autopar.search.busiest_rank``): every
split of a small interleaved and a 1F1B configuration, priced by ``estimate``, is at or above
the configuration's bound and each floor, and the floors are reached (so they are tight, and a
floor set too high fails here)."""
import itertools

import pytest
from synthetic_tables import gpt_table

from autopar.search import busiest_rank
from autopar.search.costs import Costs
from autopar.search.space import Config
from costmodels.profiles.hardware_files import load_profile


def _splits(n: int, stages: int):
    for cuts in itertools.combinations(range(1, n), stages - 1):
        xs = (0, *cuts, n)
        yield tuple((xs[i], xs[i + 1]) for i in range(stages))


@pytest.mark.parametrize("pp,vpp,schedule", [(2, 2, "interleaved-1f1b"), (3, 1, "1f1b")])
def test_every_split_is_above_the_floors_and_some_reach_them(pp, vpp, schedule):
    # 7 blocks over pp·vpp stages: uneven, as GPT 1T's 128 blocks over 48 stages
    t = gpt_table(7, 256, 4, 512, 64, model="gpt:layers=7,hidden=256,heads=4,vocab=512,seq=64")
    costs = Costs(t, load_profile("a100-80g-sxm"), 32)
    c = Config(dp=4, tp=1, pp=pp, vpp=vpp, micro_batch_size=1, zero=1, recompute="none",
               sequence_parallel=False, schedule=schedule)
    terms = costs.terms(c)
    assert not terms.coef.legacy and terms.dp_sync   # the unhidden dp part the floor reads
    lb = terms.time_lower_bound()
    floor_d = busiest_rank.dp_floor_s(terms)
    floor_o = busiest_rank.optimizer_floor_s(terms)
    assert floor_d > 0
    steps, dps = [], []
    for stages in _splits(terms.n, pp * vpp):
        pred = costs.evaluate(c.plan(stages))
        steps.append(pred["step_time_s"])
        dps.append(pred["breakdown_s"]["dp_exposed"])
    assert min(steps) >= lb
    assert min(dps) >= floor_d
    assert min(dps) == pytest.approx(floor_d, rel=1e-9)   # the busiest rank's ⌈L/pp⌉ blocks
    assert floor_o <= terms.coef.optimizer_per_param_s * float(terms.coef.params.sum())
    if vpp > 1:   # the busiest column holds ⌈⌈L/pp⌉/vpp⌉ blocks: 2 of 7 over 2·2 chunks
        assert busiest_rank.column_max_floor_s(terms) >= 2 * float(terms.coef.row_s[1])
    # the floors as cuts keep the program's optimum: CP-SAT's split prices at the enumeration's best
    from autopar.search.split_model import SplitModel
    res = SplitModel(terms, time_limit_s=5.0).solve()
    assert res.status == "optimal"
    assert costs.evaluate(c.plan(res.stages))["step_time_s"] == pytest.approx(min(steps), rel=1e-9)
    # and stopped at a split that reaches the bound (reached_bound): still the enumeration's best
    from autopar.search.reached_bound import watch
    model = SplitModel(terms, time_limit_s=5.0)
    watch(model, c, terms, costs.evaluate)
    res = model.solve()
    assert res.status == "optimal"
    assert costs.evaluate(c.plan(res.stages))["step_time_s"] == pytest.approx(min(steps), rel=1e-9)


@pytest.mark.parametrize("tightness,forced", [(0.0, 4), (0.1, 3), (0.3, 2)])
def test_memory_column_floor_is_the_least_busiest_chunk_of_the_splits_that_fit(tightness, forced):
    # 8 blocks over pp 2 · vpp 2 chunks: 2 in the busiest chunk without memory; with less HBM the
    # first chunks (most micro-batches in flight) take fewer, so the busiest takes more
    import dataclasses
    t = gpt_table(8, 256, 4, 512, 256, model="gpt:layers=8,hidden=256,heads=4,vocab=512,seq=256")
    base = load_profile("a100-80g-sxm")
    c = Config(dp=2, tp=1, pp=2, vpp=2, micro_batch_size=4, zero=1, recompute="none",
               sequence_parallel=False, schedule="interleaved-1f1b")
    unlimited = Costs(t, dataclasses.replace(base, hbm_bytes=1e15, memory_reserve_bytes=1000.0), 64)
    mems = [unlimited.evaluate(c.plan(s))["memory_bytes"]["total"] for s in _splits(10, 4)]
    hbm = min(mems) + tightness * (max(mems) - min(mems))
    costs = Costs(t, dataclasses.replace(base, hbm_bytes=hbm, memory_reserve_bytes=1000.0), 64)
    terms = costs.terms(c)
    terms.set_block_floor()
    fitting = [s for s in _splits(terms.n, 4) if costs.evaluate(c.plan(s))["fits"]]
    busiest = min(max(b - a - (a == 0) - (b == terms.n) for a, b in s) for s in fitting)
    assert busiest == forced
    assert busiest_rank.memory_column_floor(terms) == forced
