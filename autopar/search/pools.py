"""The search on a heterogeneous cluster: which pools run which pipeline stages, and where to cut.

Why apart from ``engine``: the uniform search's configurations are degrees for one GPU count; on
pools a configuration also says how many stages each pool runs and in which order along the
pipeline, and its split program prices every stage on its own pool (``pool_split``).

Space (``pool_configurations``): every ordered, non-empty choice of pools (one contiguous block
of pipeline ranks per pool; every order is tried, so the faster pool may come first or last) ×
tp (inside a node of every pool used) × dp (``dp·mb`` divides the batch) × micro-batch × ZeRO ×
recompute × sequence parallel, 1F1B with one stage per rank (vpp = 1; no interleaving across
pools yet). A pool used runs ``⌊GPUs / (tp·dp)⌋`` stages: as many as fit, and the GPUs that do
not make a whole stage stay idle; a pool left out of the order is wholly idle. dp is the same on
every stage (the micro-batch stream is shared), so the pools' stage counts follow from tp·dp.
The runtime's rules and ``pp ≤ rows`` hold as in the uniform space; placement is ``tp,dp,pp``.

Search: best-first as in ``engine``. Each configuration gets a bound that holds for every split:
with ``μ_i = min_q τ_{q,i}`` (row i on its fastest pool used) and ``s_q = min_i τ_{q,i}/τ_{0,i}``
(pool q at its most favourable speed against the first pool), the slowest rank takes
``T ≥ max(max_i μ_i, Σ_i τ_{0,i} / Σ_q k_q/s_q)`` and all ranks together ``Σ_r T_r ≥ Σ_i μ_i``,
so the 1F1B step is at least ``(m − 1)·T + Σ_i μ_i``; and a memory bound (every GPU's states and
one micro-batch's activations must fit the HBM of the stages there are). Configurations are
solved by increasing bound (CP-SAT, ``PoolSplitModel``, cut by the k-th plan so far), every
solution scored by ``costmodels.model.estimate`` on the cluster; the search stops once the next bound
is no better than the k-th plan, so the best plan is optimal over this space whenever each solve
ended OPTIMAL or INFEASIBLE (``optimal``). ``enumerate_pool_plans`` is the solver-free check.
"""
from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

import numpy as np

from autopar.search.costs import Costs
from autopar.search.engine import Progress, SearchResult, all_splits
from autopar.search.frontier import Candidate, SearchStats
from autopar.search.pool_explain import split_reasons
from autopar.search.pool_split import PoolSplitModel
from autopar.search.space import Config, Shape, _recomputes, divisors, runnable, tp_candidates
from costmodels.contracts.errors import NoFeasiblePlanError, PlanError
from costmodels.contracts.runnable import ModelDims, is_runnable
from costmodels.model.coefficients import cut_p2p, zero_hbm_param_s
from costmodels.model.compute import host_block_floor, row_times
from costmodels.model.estimate import estimate
from costmodels.model.memory import activation_bytes, model_state_bytes
from costmodels.model.recompute_early_stop import early_stop_recompute
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.runtime import load_runtime

UNSUPPORTED_FIX = ("vpp", "stages", "placement", "attention")


@dataclass(frozen=True)
class PoolConfig:
    """A configuration on pools: ``config`` (pp = Σ stages) and ``layout``, the (pool, stages)
    blocks in pipeline order."""
    config: Config
    layout: tuple[tuple[int, int], ...]

    @property
    def stage_pools(self) -> tuple[int, ...]:
        return tuple(q for q, k in self.layout for _ in range(k))

    def plan(self, cluster, stages=None):
        return self.config.plan(stages).with_(pools=cluster.spec(), stage_pools=self.stage_pools)


def _layouts(n_pools: int):
    for size in range(1, n_pools + 1):
        yield from itertools.permutations(range(n_pools), size)


def pool_configurations(shape: Shape, cluster, global_batch: int, fix: dict | None = None,
                        max_micro_batch: int | None = None):
    """Every pooled configuration (module docstring), honouring ``fix``."""
    fix = dict(fix or {})
    bad = [k for k in UNSUPPORTED_FIX if k in fix and not (k == "vpp" and fix[k] == 1)]
    if bad:
        raise PlanError(f"--fix {bad[0]} is not searched on a cluster of pools (pooled plans: one stage per "
                        "rank, tp,dp,pp placement, balanced by the search); drop it")
    if fix.get("schedule", "1f1b") not in ("1f1b", "gpipe"):
        raise PlanError(f"--fix schedule={fix['schedule']}: pooled plans run 1f1b or gpipe (vpp = 1)")
    dims = ModelDims(rows=shape.rows, heads=shape.heads, kv_heads=shape.kv_heads, seq=shape.seq)
    rt = load_runtime(fix.get("runtime"))
    pools = cluster.pools
    for used in _layouts(len(pools)):
        limit = min(pools[q].gpus for q in used)
        tps = set.intersection(*[set(tp_candidates(shape, pools[q].profile.gpus_per_node, False, limit))
                                 for q in used])
        for tp in sorted(tps):
            if "tp" in fix and fix["tp"] != tp:
                continue
            for dp in divisors(global_batch):
                ks = [pools[q].gpus // (tp * dp) for q in used]
                pp = sum(ks)
                if min(ks) == 0 or pp > shape.rows or fix.get("dp", dp) != dp or fix.get("pp", pp) != pp:
                    continue
                layout = tuple(zip(used, ks))
                per = global_batch // dp
                for mbs in divisors(per):
                    if (max_micro_batch and mbs > max_micro_batch) or fix.get("micro_batch_size", mbs) != mbs:
                        continue
                    for zero, rec, sp in itertools.product([0, 1, 2, 3] if dp > 1 else [0],
                                                           _recomputes(fix), [False, True] if tp > 1 else [False]):
                        if any(k in fix and fix[k] != v for k, v in
                               (("zero", zero), ("recompute", rec), ("sequence_parallel", sp))):
                            continue
                        c = Config(dp=dp, tp=tp, pp=pp, vpp=1, micro_batch_size=mbs, zero=zero, recompute=rec,
                                   sequence_parallel=sp, schedule=fix.get("schedule", "1f1b"), runtime=rt.name)
                        if runnable(rt, c) and is_runnable(c.plan(), dims, per // mbs):
                            yield PoolConfig(c, layout)


class PoolCosts:
    """Per-pool cost-model views (``Costs`` on each pool's profile) and the pooled bounds."""

    def __init__(self, table, cluster, global_batch: int):
        self.table, self.cluster, self.global_batch = table, cluster, global_batch
        self.costs = [Costs(table, p.profile, global_batch) for p in cluster.pools]
        self.arr = table_arrays(table)
        self._tau: dict = {}
        self._act: dict = {}

    def _row_s(self, q: int, c: Config) -> np.ndarray:
        prof = self.cluster.pools[q].profile
        tier = prof.group_link(c, "tp")
        rtp = load_runtime(c.runtime)
        zp = zero_hbm_param_s(c, prof, rtp)
        key = (q, c.tp, c.sequence_parallel, c.micro_batch_size, c.recompute, tier, c.runtime, zp)
        if key not in self._tau:
            rt = row_times(self.table, prof, c.tp, c.sequence_parallel, c.micro_batch_size,
                           c.recompute, c.attention, tier, elementwise_traffic=rtp.elementwise_traffic,
                           host_block_s=host_block_floor(prof, rtp), zero_param_s=zp)
            # what estimate's checkpoint early stop leaves out of a full recompute, or the bound
            # would sit above estimate and prune plans it must keep (recompute_early_stop.py)
            rt = early_stop_recompute(rt, self.arr, prof, c.plan(), rtp, tier, c.tp, c.micro_batch_size,
                                      host_block_floor(prof, rtp))
            self._tau[key] = np.asarray(rt.row_total_s, dtype=float)
        return self._tau[key]

    def bound(self, pc: PoolConfig) -> float:
        c = pc.config
        taus = [self._row_s(q, c) for q, _ in pc.layout]
        mu = np.min(np.vstack(taus), axis=0)
        ref = taus[0]
        pos = ref > 0
        speed = 0.0
        for (_q, k), tau in zip(pc.layout, taus):
            s = float(np.min(tau[pos] / ref[pos])) if pos.any() else 1.0
            speed += k / max(s, 1e-300)
        t_lb = max(float(mu.max()), float(ref.sum()) / speed, self._block_bound(pc, taus))
        m = self.global_batch // (c.dp * c.micro_batch_size)
        return (m - 1) * t_lb + float(mu.sum())

    def _block_bound(self, pc: PoolConfig, taus) -> float:
        """The smallest T at which the stages can hold every block, a block on pool q taking at
        least ``b_q`` (its cheapest block row): ``Σ_q k_q·⌊T/b_q⌋ ≥ blocks`` (whole blocks only)."""
        blk = self.arr.is_block
        n = int(blk.sum())
        if n == 0:
            return 0.0
        bq = [float(tau[blk].min()) for tau in taus]
        if min(bq) <= 0:
            return 0.0
        ks = [k for _, k in pc.layout]
        cands = sorted({j * b for b in bq for j in range(1, n + 1)})
        lo, hi = 0, len(cands) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if sum(k * int(cands[mid] / b * (1 + 1e-12)) for k, b in zip(ks, bq)) >= n:
                hi = mid
            else:
                lo = mid + 1
        return cands[lo] * (1 - 1e-9)

    def memory_possible(self, pc: PoolConfig) -> bool:
        c = pc.config
        key = (c.tp, c.sequence_parallel, c.micro_batch_size, c.recompute, c.attention)
        if key not in self._act:
            self._act[key] = float(activation_bytes(self.arr, c.tp, c.sequence_parallel, c.micro_batch_size,
                                                    c.recompute, c.attention, loss_bytes=0.0).sum())
        states = sum(model_state_bytes(float(self.arr.params.sum()) / c.tp, c.dp, c.zero))
        room = sum(k * (self.cluster.pools[q].profile.hbm_bytes - self.cluster.pools[q].profile.memory_reserve_bytes)
                   for q, k in pc.layout)
        return states + self._act[key] <= room

    def split_program(self, pc: PoolConfig, **kw) -> PoolSplitModel:
        c, sp = pc.config, pc.stage_pools
        per_pool = {q: self.costs[q].terms(c) for q, _ in pc.layout}
        links = {}
        for v in range(c.pp - 1):
            if sp[v] != sp[v + 1]:
                link = self.cluster.link(sp[v], sp[v + 1], c)
                links[v] = cut_p2p(self.arr, c.micro_batch_size, c.tp, link)[1]
        return PoolSplitModel([per_pool[q] for q in sp], links, **kw)

    def evaluate(self, plan) -> dict:
        return estimate(self.table, self.cluster, plan, plan.world_size, self.global_batch).to_dict()


def search_pools(table, cluster, global_batch: int, *, fix: dict | None = None, top: int = 5,
                 max_micro_batch: int | None = None, time_limit_s: float = 600.0,
                 solve_limit_s: float = 2.0, progress: Progress | None = None,
                 context: dict | None = None) -> SearchResult:
    """Top-``top`` plans over the pooled space (module docstring), best first."""
    t0 = time.perf_counter()
    if top < 1:
        raise PlanError(f"--top {top} must be at least 1")
    pc_costs, stats = PoolCosts(table, cluster, global_batch), SearchStats()
    heap = []
    for i, pc in enumerate(pool_configurations(Shape.of(table), cluster, global_batch, fix, max_micro_batch)):
        stats.configurations += 1
        if not pc_costs.memory_possible(pc):
            stats.pruned_memory += 1
            continue
        heap.append((pc_costs.bound(pc), i, pc))
    if stats.configurations == 0:
        raise NoFeasiblePlanError(f"no pooled configuration exists for {cluster.label()} at global batch "
                                  f"{global_batch}: no tp·dp fits whole stages in the pools with dp dividing "
                                  "the batch; try a batch with more factors of two, or drop --fix")
    heapq.heapify(heap)
    progress = progress or Progress(False)
    results: list[Candidate] = []
    optimal = True
    while heap:
        bound, _, pc = heapq.heappop(heap)
        kth = results[top - 1].prediction["step_time_s"] if len(results) >= top else None
        if kth is not None and bound >= kth:
            break
        if time.perf_counter() - t0 > time_limit_s:
            optimal = False
            break
        stats.bounded += 1
        progress(lambda: f"{stats.solved} pooled splits solved, {len(heap)} configurations left")
        res = pc_costs.split_program(pc, time_limit_s=solve_limit_s, upper_bound_s=kth).solve()
        stats.solved += 1
        stats.solver_s += res.wall_s
        if res.status not in ("optimal", "infeasible"):
            optimal = False
        if res.stages is None:
            stats.infeasible += res.status == "infeasible"
            continue
        plan = pc.plan(cluster, res.stages)
        pred = pc_costs.evaluate(plan)
        if not pred["fits"]:
            continue
        results.append(Candidate(pc.config, plan, pred, res.objective_s or 0.0, res.status))
        results.sort(key=lambda cand: cand.prediction["step_time_s"])
        del results[top:]
    progress.done()
    if not results:
        raise NoFeasiblePlanError(f"no pooled plan fits {cluster.label()} at global batch {global_batch}: "
                                  "every configuration runs out of memory on some pool (or the time limit "
                                  "cut the search); raise --time-limit, add GPUs or lower the batch")
    for i, cand in enumerate(results):
        cand.prediction["rank"] = i + 1
        cand.prediction.setdefault("cluster", {})["why"] = split_reasons(table, cluster, cand, pc_costs)
    ctx = context or {}
    return SearchResult(model=ctx.get("model", table.model), hardware=cluster.label(), gpus=cluster.gpus,
                        global_batch=global_batch, seq=table.seq, objective="step_time", plans=results,
                        optimal=optimal, search_time_s=time.perf_counter() - t0, stats=stats,
                        runtime=load_runtime((fix or {}).get("runtime")).name,
                        excluded=["interleaved schedules (vpp > 1) on pools", "pools used for fewer stages "
                                  "than fit (⌊GPUs/(tp·dp)⌋)", "tp across nodes", "placements other than tp,dp,pp"])


def enumerate_pool_plans(table, cluster, global_batch: int, fix: dict | None = None,
                         max_micro_batch: int | None = None) -> list[tuple[float, object, dict]]:
    """Solver-free: every pooled configuration × every split through ``estimate``; the best split
    of each configuration that fits, best first (tests, tiny spaces)."""
    pc_costs, out = PoolCosts(table, cluster, global_batch), []
    for pc in pool_configurations(Shape.of(table), cluster, global_batch, fix, max_micro_batch):
        best = None
        for st in all_splits(len(table.rows), pc.config.pp):
            plan = pc.plan(cluster, st)
            pred = pc_costs.evaluate(plan)
            if pred["fits"] and (best is None or pred["step_time_s"] < best[0]):
                best = (pred["step_time_s"], plan, pred)
        if best is not None:
            out.append(best)
    out.sort(key=lambda t: t[0])
    return out
