"""The CP-SAT model is the cost model: for fixed split points its step time and its most loaded
GPU's memory equal ``costmodels.estimate`` (up to the integer rounding) on many configurations of
a GPT-3-shaped table — every schedule, ZeRO stage, recompute policy, sequence parallel, and
interleaving. Guards the search against drift of the cost model's formulas."""
import dataclasses
import random

import pytest

from costmodels.estimate import estimate
from costmodels.hardware import load_profile
from autopar.search.costs import Costs
from autopar.search.model import SplitModel, time_unit
from autopar.search.space import Shape, configurations
from synthetic_tables import gpt3_175b, llama_table


def _random_split(rng, n, S):
    cuts = sorted(rng.sample(range(1, n), S - 1))
    b = [0] + cuts + [n]
    return tuple((b[i], b[i + 1]) for i in range(S))


@pytest.mark.parametrize("table_fn, gpus, batch, hw", [
    (gpt3_175b, 1024, 1536, "a100-80g-sxm"),
    (lambda: llama_table(16, 2048, 16, 4, 5632, 32000, 2048, model="llama-small"), 64, 256, "h100-80g-sxm"),
])
def test_fixed_split_objective_and_memory_equal_estimate(table_fn, gpus, batch, hw):
    table = table_fn()
    prof = load_profile(hw)
    costs = Costs(table, prof, batch)
    configs = list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node,
                                  fix={"recompute": "selective", "attention": "math"}))
    configs += list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node))
    rng = random.Random(0)
    sample = rng.sample(configs, 60)
    for c in sample:
        S = c.pp * c.vpp
        stages = _random_split(rng, len(table.rows), S)
        est = estimate(table, prof, c.plan(stages), gpus, batch)
        terms = costs.terms(c)
        roomy = dataclasses.replace(terms, hbm=float(2 ** 60))
        r = SplitModel(roomy, fixed_stages=stages).solve()
        assert r.status == "optimal" and r.stages == stages
        tol = time_unit(terms.time_lower_bound()) * len(table.rows) * 4 * (terms.m + 2)
        assert abs(r.objective_s - est.step_time_s) <= tol, (c, r.objective_s, est.step_time_s)
        mem = SplitModel(terms, objective="memory", fixed_stages=stages).solve()
        total = est.memory_bytes["total"]
        # bytes are rounded up per row in the integer model: never below, at most a few bytes above
        assert total - 1 <= mem.objective_s <= total + 4 * len(table.rows) + 8, (c, mem.objective_s, total)
        assert (total <= prof.hbm_bytes) == est.fits
