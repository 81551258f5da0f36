"""The CP-SAT model is the cost model: for fixed split points its step time and its most loaded
GPU's memory equal ``costmodels.model.estimate`` (up to the integer rounding) on many configurations of
a GPT-3-shaped table — every schedule, ZeRO stage, recompute policy, sequence parallel, and
interleaving. Guards the search against drift of the cost model's formulas."""
import dataclasses
import random

import pytest
from synthetic_tables import gpt3_175b, llama_table

from autopar.search.costs import Costs
from autopar.search.space import Shape, configurations
from autopar.search.split_model import SplitModel, time_unit
from costmodels.model.estimate import estimate
from costmodels.profiles.hardware_files import load_profile


def _random_split(rng, n, S):
    cuts = sorted(rng.sample(range(1, n), S - 1))
    b = [0] + cuts + [n]
    return tuple((b[i], b[i + 1]) for i in range(S))


def _measured_like(name):
    """A profile with the optional measured rates a CPU host's `autopar profile` writes: partial
    comm/compute overlap (none for FSDP2), per-collective alpha-beta and in-step points, slow
    element-wise kernels and optimizer."""
    from costmodels.profiles.hardware import LinkTier
    p = load_profile(name)
    t = p.intra_node
    own = (("all_reduce", 3 * t.latency_s, t.bandwidth_bytes_per_s / 2),
           ("reduce_scatter", 5 * t.latency_s, t.bandwidth_bytes_per_s / 7),
           ("all_gather", 4 * t.latency_s, t.bandwidth_bytes_per_s / 3),
           ("all_gather_into_tensor", 6 * t.latency_s, t.bandwidth_bytes_per_s / 5),   # FSDP2's
           ("reduce_scatter_tensor", 7 * t.latency_s, t.bandwidth_bytes_per_s / 11))
    # measured in-step points over 2 ranks (interpolated for pairs: p2p, tp=2 or dp=2 groups;
    # the dp gradient sync keeps its line), with a per-byte cost rising out of cache
    xs = (8e3, 1e6, 8e6, 32e6)
    curves = tuple((k, 2, xs, tuple(f * y for y in (1e-4, 3e-4, 2e-3, 1.2e-2))) for k, f in
                   (("all_reduce", 1.0), ("p2p", 0.5), ("all_gather_into_tensor", 2.0),
                    ("reduce_scatter_tensor", 2.5)))
    return dataclasses.replace(
        p, comm_overlap=0.3, fsdp_overlap=0.0, attention_efficiency=0.25,
        elementwise_bandwidth_bytes_per_s=p.hbm_bandwidth_bytes_per_s / 3,
        optimizer_bandwidth_bytes_per_s=p.hbm_bandwidth_bytes_per_s / 2,
        ce_logits=(1e6, 1e8), ce_rates=(4e10, 1e10),
        intra_node=LinkTier("intra_node", t.bandwidth_bytes_per_s, t.latency_s, own, curves))


@pytest.mark.parametrize("table_fn, gpus, batch, hw", [
    (gpt3_175b, 1024, 1536, "a100-80g-sxm"),
    (lambda: llama_table(16, 2048, 16, 4, 5632, 32000, 2048, model="llama-small"), 64, 256, "h100-80g-sxm"),
    (lambda: llama_table(16, 2048, 16, 4, 5632, 32000, 2048, model="llama-small"), 16, 64, "measured-like"),
])
def test_fixed_split_objective_and_memory_equal_estimate(table_fn, gpus, batch, hw):
    table = table_fn()
    prof = _measured_like("h100-80g-sxm") if hw == "measured-like" else load_profile(hw)
    costs = Costs(table, prof, batch)
    configs = list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node,
                                  fix={"recompute": "selective", "attention": "math"}))
    configs += list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node))
    configs += list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node,
                                   fix={"attention": "flash"}))
    rng = random.Random(0)
    sample = rng.sample(configs, 60)
    for c in sample:
        S = c.pp * c.vpp
        stages = _random_split(rng, len(table.rows), S)
        est = estimate(table, prof, c.plan(stages), gpus, batch)
        terms = costs.terms(c)
        roomy = dataclasses.replace(terms, hbm=float(2 ** 60))
        r = SplitModel(roomy, fixed_stages=stages, exact=True).solve()   # exact: split_schedules
        assert r.status == "optimal" and r.stages == stages
        tol = time_unit(terms.time_lower_bound()) * len(table.rows) * 4 * (terms.m + 2)
        assert abs(r.objective_s - est.step_time_s) <= tol, (c, r.objective_s, est.step_time_s)
        mem = SplitModel(terms, objective="memory", fixed_stages=stages).solve()
        total = est.memory_bytes["total"]
        # bytes are rounded up per row in the integer model: never below, at most a few bytes above
        assert total - 1 <= mem.objective_s <= total + 4 * len(table.rows) + 8, (c, mem.objective_s, total)
        assert (total <= prof.hbm_bytes) == est.fits


@pytest.mark.parametrize("pp,vpp,gpus,batch", [(2, 2, 2, 8), (2, 3, 4, 16), (3, 2, 3, 6)])
def test_interleaved_split_is_the_best_of_every_split_and_its_bounds_hold(pp, vpp, gpus, batch):
    """Interleaved pipeline time (m·Σ_c C_c + (pp−1)·max_c C_c) through CP-SAT, with its
    redundant column cut, against every split of a 12-block table scored by the estimate: CP-SAT's
    optimum is the enumeration's, and no split beats ``time_lower_bound`` or ``column_sum_bound``."""
    from synthetic_tables import gpt_table

    from autopar.search.engine import all_splits
    table = gpt_table(12, 256, 4, 5000, 128, model="gpt-12")
    prof = load_profile("a100-80g-sxm")
    costs = Costs(table, prof, batch)
    configs = [c for c in configurations(Shape.of(table), gpus, batch, prof.gpus_per_node,
                                         fix={"recompute": "none", "attention": "math", "tp": 1,
                                              "pp": pp, "vpp": vpp})]
    assert configs
    for c in configs[:3]:
        terms = dataclasses.replace(costs.terms(c), hbm=float(2 ** 60))
        best, best_cols = float("inf"), float("inf")
        for stages in all_splits(len(table.rows), pp * vpp):
            e = estimate(table, prof, c.plan(stages), gpus, batch)
            best = min(best, e.step_time_s)
            t = [[f + b for f, b in zip(s["fwd_s"], s["bwd_s"])] for s in e.stages_detail]
            best_cols = min(best_cols, sum(max(row[j] for row in t) for j in range(vpp)))
        assert terms.time_lower_bound() <= best * (1 + 1e-9)
        assert terms.column_sum_bound() <= best_cols * (1 + 1e-9)   # tight: float summation order
        r = SplitModel(terms).solve()
        tol = time_unit(terms.time_lower_bound()) * len(table.rows) * 4 * (terms.m + pp + 2)
        assert r.status == "optimal" and abs(r.objective_s - best) <= tol, (c, r.objective_s, best)


@pytest.mark.parametrize("runtime", ["megatron", "megatron:overlap_grad_reduce,overlap_param_gather",
                                     "deepspeed", "deepspeed:overlap_comm", "fsdp", "fsdp:fsdp1,bf16_reduce",
                                     "megatron:tp_comm_overlap,distributed_fused_adam,bf16_grad_reduce",
                                     "fsdp:async_tp", "autopar:default_allocator"])
def test_objective_equals_estimate_for_every_runtime(runtime):
    """Each runtime prices overlap its own way (the dp sync's bucket and after-part, ZeRO's
    exposed edges, per-micro-batch reduce-scatters, the compute slowdown): for fixed split points
    CP-SAT's objective and memory still equal ``estimate`` on the configurations that runtime runs."""
    table = llama_table(16, 2048, 16, 4, 5632, 32000, 2048, model="llama-small")
    for hw, gpus, batch in (("h100-80g-sxm", 64, 256), ("a100-80g-sxm", 16, 64)):
        prof = load_profile(hw)
        costs = Costs(table, prof, batch)
        configs = list(configurations(Shape.of(table), gpus, batch, prof.gpus_per_node,
                                      fix={"runtime": runtime}))
        rng = random.Random(1)
        groups: dict = {}   # every ZeRO stage, with and without a pipeline and data parallelism
        for c in configs:
            groups.setdefault((c.zero, c.pp > 1, c.dp > 1, c.vpp > 1), []).append(c)
        sample = [c for g in groups.values() for c in rng.sample(g, min(4, len(g)))]
        assert len(groups) >= 4
        for c in sample:
            stages = _random_split(rng, len(table.rows), c.pp * c.vpp)
            est = estimate(table, prof, c.plan(stages), gpus, batch)
            terms = costs.terms(c)
            r = SplitModel(dataclasses.replace(terms, hbm=float(2 ** 60)), fixed_stages=stages, exact=True).solve()
            assert r.status == "optimal" and r.stages == stages
            tol = time_unit(terms.time_lower_bound()) * len(table.rows) * 4 * (terms.m + 2)
            assert abs(r.objective_s - est.step_time_s) <= tol, (c, r.objective_s, est.step_time_s)
            assert terms.time_lower_bound() <= est.step_time_s * (1 + 1e-9), c
            mem = SplitModel(terms, objective="memory", fixed_stages=stages).solve()
            total = est.memory_bytes["total"]
            assert total - 1 <= mem.objective_s <= total + 4 * len(table.rows) + 8, (c, mem.objective_s, total)
