"""The zero-bubble schedules' op-graph bound (``autopar.search.zb_bound``): never above the best
split's step time under the estimate, for random row costs, every split-backward schedule, both
tiers of the bound; and tighter than the split-independent bound it replaces."""
import dataclasses
import random

import pytest
from synthetic_tables import gpt_table, no_host_runtime

from autopar.search.costs import Costs
from autopar.search.engine import all_splits
from autopar.search.space import Shape, configurations
from autopar.search.zb_bound import TIERS, graph_bound
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile

NEW = ("interleaved-zb", "zb-v", "dualpipe-v")


def _random_rows(table, rng):
    """The table with every block's compute, activations and parameters scaled at random (0.4–2.5×,
    each its own factor): uneven rows, as embedding, head and odd blocks make them."""
    rows = []
    for row in table.rows:
        if row.kind == "block":
            f, a, p = rng.uniform(0.4, 2.5), rng.uniform(0.4, 2.5), rng.uniform(0.4, 2.5)
            row = dataclasses.replace(row, fwd_flops=row.fwd_flops * f, bwd_flops=row.bwd_flops * f,
                                      saved_activation_bytes=int(row.saved_activation_bytes * a),
                                      params=int(row.params * p))
        rows.append(row)
    return dataclasses.replace(table, rows=rows)


def random_configurations(rng, layer_choices, schedule: str, gpus_per_node: int):
    """A random small table (``_random_rows``), pp 2 or 3, GPUs and batch, and ``schedule``'s
    configurations on them (runtime without host overheads): ``(table, gpus, batch, configs)``."""
    layers = rng.choice(layer_choices)
    table = _random_rows(gpt_table(layers, 256, 4, 5000, 128, model=f"gpt-{layers}"), rng)
    pp = rng.choice([2, 3])
    gpus = pp * rng.choice([1, 2, 4])
    batch = gpus * rng.choice([2, 4, 8])
    configs = list(configurations(Shape.of(table), gpus, batch, gpus_per_node,
                                  fix={"schedule": schedule, "pp": pp, "runtime": no_host_runtime()}))
    return table, gpus, batch, configs


@pytest.mark.parametrize("schedule", NEW)
def test_graph_bound_never_exceeds_the_best_split(schedule):
    """Against every split scored by the estimate, on random row costs, pp 2 and 3, with and
    without dp (its gradient sync), across ZeRO stages: each tier of the bound is at most the
    best split's step time, and the whole graph's is above ``Terms.time_lower_bound`` somewhere."""
    rng = random.Random(30 + NEW.index(schedule))
    prof = load_profile("a100-80g-sxm")
    checked = tighter = 0
    for case in range(3):
        layers = rng.choice([6, 7, 8])
        base = gpt_table(layers, 256, 4, 5000, 128, model=f"gpt-{layers}")
        table = _random_rows(base, rng)
        pp = 2 if case < 2 else 3
        gpus = pp * rng.choice([1, 2])
        batch = gpus * rng.choice([4, 6, 8])
        costs = Costs(table, prof, batch)
        configs = list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node,
                                      fix={"schedule": schedule, "pp": pp, "tp": 1, "recompute": "none",
                                           "runtime": no_host_runtime()}))
        for c in rng.sample(configs, min(2, len(configs))):
            best = min(estimate(table, prof, c.plan(st), gpus, batch).step_time_s
                       for st in all_splits(len(table.rows), c.pp * c.vpp))
            terms = costs.terms(c)
            bounds = [graph_bound(terms, keep) for keep in TIERS]
            assert all(b <= best * (1 + 1e-9) for b in bounds), (c, bounds, best)
            assert bounds[0] <= bounds[-1] * (1 + 1e-9)   # the cheap tier relaxes the whole graph
            checked += 1
            tighter += bounds[-1] > terms.time_lower_bound() * (1 + 1e-6)
    assert checked >= 4 and tighter >= 1
