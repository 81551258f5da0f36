"""``autopar.search.twins``: configurations whose split programs share an objective and differ in
bytes only; the one with no more bytes per row fits every split the other fits, at the same step
time, so its infeasibility under a cut proves the other's (issue 30)."""
import dataclasses

from synthetic_tables import gpt_table

from autopar.search.costs import Costs
from autopar.search.engine import all_splits
from autopar.search.space import Shape, configurations
from autopar.search.twins import no_more_memory, signature
from costmodels.contracts.plan import Plan
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

BASE = load_profile("a100-80g-sxm")


def test_a_twin_with_no_more_bytes_fits_every_split_the_other_fits_at_the_same_time():
    t = gpt_table(6, 64, 4, 256, 64, model="gpt:layers=6,hidden=64,heads=4,vocab=256,seq=64")
    serial = estimate(t, dataclasses.replace(BASE, hbm_bytes=1e15), Plan(), 1, 16).memory_bytes["total"]
    prof = dataclasses.replace(BASE, name="tiny-test", hbm_bytes=0.0012 * serial, memory_reserve_bytes=1000.0)
    costs = Costs(t, prof, 16)
    configs = [c for c in configurations(Shape.of(t), 4, 16, 8, {"tp": 1}) if c.pp >= 2
               and c.schedule in ("1f1b", "interleaved-1f1b")]
    pairs = 0
    for b in configs:
        for z in range(3):
            if z == b.zero:
                continue
            a = dataclasses.replace(b, zero=z)
            ta, tb = costs.terms(a), costs.terms(b)
            if signature(ta) != signature(tb) or not no_more_memory(ta, tb):
                continue
            pairs += 1
            for st in all_splits(ta.n, ta.n_virtual):
                pa, pb = costs.evaluate(a.plan(st)), costs.evaluate(b.plan(st))
                assert pa["step_time_s"] == pb["step_time_s"], (a, b, st)
                assert pa["fits"] or not pb["fits"], (a, b, st)
    assert pairs >= 4


def test_a_twin_outside_the_searched_space_is_never_solved():
    """A ZeRO twin the space lacks (a stage the runtime does not have, or one --fix excludes) is
    no plan: solving it would hand its split on as one (megatron has no ZeRO-2: the search once
    failed with "runtime ... has no ZeRO-2" through such a twin)."""
    import time

    from autopar.search.frontier import Frontier
    t = gpt_table(6, 64, 4, 256, 64, model="gpt:layers=6,hidden=64,heads=4,vocab=256,seq=64")
    costs = Costs(t, BASE, 16)
    pairs = 0
    for b in [c for c in configurations(Shape.of(t), 4, 16, 8, {"tp": 1}) if c.pp >= 2]:
        tb = costs.terms(b)
        for z in range(3):
            a = dataclasses.replace(b, zero=z)
            if z == b.zero or signature(costs.terms(a)) != signature(tb) \
                    or not no_more_memory(costs.terms(a), tb):
                continue
            pairs += 1
            fr = Frontier(costs, objective="step_time", top=1, target_step_time_s=None,
                          fixed_stages=None, solve_limit_s=5.0, deadline=time.perf_counter() + 30)
            fr.offered = {b}
            cut = 3 * costs.quick_bound(b)
            assert not fr.twins.proved_out(fr, b, tb, cut)
            assert a not in fr.twins.tried and not fr.known
            fr.offered = {a, b}   # inside the space the twin is solved
            fr.twins.proved_out(fr, b, tb, cut)
            assert a in fr.twins.tried
    assert pairs >= 2
