"""The search driver: best-first over configurations, CP-SAT for the split points, top-k plans.

``search(...)`` is the Python API behind ``autopar search`` (and ``autopar report --scale``).

Algorithm (``autopar.search.split_model`` writes the integer program; the optimality argument is
below):

1. list every configuration (``autopar.search.space.configurations``), for one GPU count or, for
   the GPU-count objectives, for every count up to ``--gpus``;
2. push each with a cheap bound on its objective (``costs.quick_bound``: the compute every rank
   must do, no communication) on a heap;
3. pop the smallest; a configuration popped the first time gets its full terms (``costs.terms``)
   and is pushed back with the tighter split-independent bound (``Terms.time_lower_bound``) —
   unless its memory bound already exceeds HBM, which drops it; popped the second time, CP-SAT
   places its split points (``SplitModel``), the evaluator (``costmodels.estimate``) scores the
   resulting plan, and it is pushed back with that exact prediction; popped the third time it is
   the next-best plan;
4. stop after ``top`` plans. Every configuration still on the heap has a bound no better than the
   last plan returned, so the ranking is exact under the model whenever every CP-SAT solve
   finished ``OPTIMAL`` (``optimal`` in the result says so).

``enumerate_plans`` is the solver-free path: every configuration × every split, each scored by
the evaluator. The tests check that both agree on small spaces.

Decomposition, and why the result is still optimal under the model (``autopar.search.split_model``
writes the integer program CP-SAT solves for one configuration)
-----------------------------------------------------------------------------------------
The configuration is a few thousand discrete points; the split is the hard, combinatorial part.
This module runs a best-first search over configurations keyed by lower bounds that
hold for *every* split: ``(m − 1)·T* + Στ + O_min`` for vpp = 1 and
``m·T* + (pp − 1)·max(T*/vpp, max τ) + O_min`` interleaved, ``T* = max(Στ/pp, max τ)`` (the
slowest rank does at least its share and at least the largest row, ``Σ_c C_c ≥ T``, a column's
maximum is at least its mean; communication and exposure are ≥ 0; the optimizer step is at
least the mean) and, for memory, the LP-relaxation bound of
``Terms.memory_lower_bound``. A configuration reaches the CP-SAT split model only when its bound beats
the k-th best plan found so far; the search stops once the next bound is no better than the k-th
exact plan. Each CP-SAT solve ends ``OPTIMAL`` or ``INFEASIBLE`` (otherwise the result says
``optimal: false``), so the first plan is proved optimal under the cost model.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from costmodels.errors import NoFeasiblePlanError, PlanError
from costmodels.estimate import check_plan
from autopar.search.space import Config, Shape, configurations, gpu_counts, check_fix_against

OBJECTIVES = ("step_time", "throughput_per_gpu", "fewest_gpus")


@dataclass
class Candidate:
    config: Config
    plan: Any                       # costmodels.plan.Plan with explicit stages
    prediction: dict                # estimate(...).to_dict() plus rank
    solver_objective_s: float       # a·T + k from the integer model
    status: str                     # CP-SAT status of its split


@dataclass
class SearchStats:
    configurations: int = 0
    bounded: int = 0                # full terms computed
    pruned_memory: int = 0          # dropped: memory bound above HBM
    pruned_target: int = 0          # dropped: cannot reach the target (fewest_gpus)
    pruned_bound: int = 0           # CP-SAT proved no split beats the k-th plan found
    solved: int = 0                 # CP-SAT runs
    infeasible: int = 0             # CP-SAT proved no split fits
    not_proved: int = 0             # CP-SAT stopped before proving
    solver_s: float = 0.0
    evaluator_s: float = 0.0


@dataclass
class SearchResult:
    model: str
    hardware: str
    gpus: int
    global_batch: int
    seq: int
    objective: str
    plans: list[Candidate]
    optimal: bool
    search_time_s: float
    stats: SearchStats = field(default_factory=SearchStats)

    def plans_file(self) -> dict:
        """The plans file of docs/CONTRACTS.md."""
        from costmodels.plans_file import PLANS_FILE_VERSION
        return {"version": PLANS_FILE_VERSION, "model": self.model, "hardware": self.hardware,
                "gpus": self.gpus, "global_batch": self.global_batch, "seq": self.seq,
                "objective": self.objective, "optimal": self.optimal,
                "search_time_s": round(self.search_time_s, 4),
                "plans": [c.prediction for c in self.plans],
                "search": {"configurations": self.stats.configurations,
                           "bounded": self.stats.bounded, "solved_cp_sat": self.stats.solved,
                           "cp_sat_infeasible": self.stats.infeasible,
                           "cp_sat_cut_by_kth_plan": self.stats.pruned_bound,
                           "pruned_by_memory_bound": self.stats.pruned_memory,
                           "solver_s": round(self.stats.solver_s, 4),
                           "solver_objective_s": [c.solver_objective_s for c in self.plans]}}


class Progress:
    """Progress lines on stderr, only once the search has run for more than ``after_s``."""

    def __init__(self, enabled: bool, after_s: float = 1.0, every_s: float = 0.5, stream=None):
        self.enabled = enabled
        self.after_s, self.every_s = after_s, every_s
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.last = None
        self.shown = False

    def __call__(self, msg_fn: Callable[[], str]) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.t0 < self.after_s or (self.last is not None and now - self.last < self.every_s):
            return
        self.last = now
        self.shown = True
        tty = getattr(self.stream, "isatty", lambda: False)()
        line = f"autopar search: {now - self.t0:5.1f} s  {msg_fn()}"
        self.stream.write(("\r\033[K" + line) if tty else line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.enabled and self.shown and getattr(self.stream, "isatty", lambda: False)():
            self.stream.write("\n")
            self.stream.flush()


def _key(objective: str, config: Config, step_time: float):
    if objective == "throughput_per_gpu":
        return (step_time * config.gpus,)
    if objective == "fewest_gpus":
        return (config.gpus, step_time)
    return (step_time,)


def _step_bound(objective: str, c: Config, exact_keys: list, top: int, target: float | None):
    """The step time a split of ``c`` must beat to enter the top ``top`` (None: no bound yet)."""
    bound = target
    if len(exact_keys) >= top:
        kth = exact_keys[top - 1]
        if objective == "throughput_per_gpu":
            b = kth[0] / c.gpus
        elif objective == "fewest_gpus":
            if c.gpus < kth[0]:
                b = None
            elif c.gpus == kth[0]:
                b = kth[1]
            else:
                b = 0.0
        else:
            b = kth[0]
        if b is not None:
            bound = b if bound is None else min(bound, b)
    return bound


def run_search(costs, *, gpus: int, global_batch: int, fix: dict | None = None, top: int = 5,
               objective: str = "step_time", target_step_time_s: float | None = None,
               allow_cross_node_tp: bool = False, max_micro_batch: int | None = None,
               time_limit_s: float = 600.0, solve_limit_s: float = 2.0,
               progress: Progress | None = None,
               context: dict | None = None) -> SearchResult:
    """Search over ``costs`` (a ``autopar.search.costs.Costs``: table + profile + batch)."""
    t0 = time.perf_counter()
    if objective not in OBJECTIVES:
        raise PlanError(f"--objective '{objective}' is not one of {', '.join(OBJECTIVES)}")
    if objective == "fewest_gpus" and target_step_time_s is None:
        raise PlanError("--objective fewest_gpus needs a target: --target-step-time SECONDS or "
                        "--target-tokens-per-s N")
    if top < 1:
        raise PlanError(f"--top {top} must be at least 1")
    fix = dict(fix or {})
    check_fix_against(fix, gpus if objective == "step_time" else None)
    fixed_stages = fix.get("stages")
    stages_checked = False
    shape = Shape.of(costs.table)
    counts = [gpus] if objective == "step_time" else [
        g for g in gpu_counts(gpus, costs.profile.gpus_per_node)]
    stats = SearchStats()
    progress = progress or Progress(False)
    heap: list = []
    tie = itertools.count()
    for g in counts:
        for c in configurations(shape, g, global_batch, costs.profile.gpus_per_node, fix,
                                allow_cross_node_tp, max_micro_batch):
            stats.configurations += 1
            if fixed_stages is not None:
                if len(fixed_stages) != c.pp * c.vpp:
                    continue
                if not stages_checked:   # same one-line PlanError as 'autopar estimate'
                    check_plan(costs.table, c.plan(fixed_stages), g, global_batch)
                    stages_checked = True
            lb = costs.quick_bound(c)
            if target_step_time_s is not None and lb > target_step_time_s:
                stats.pruned_target += 1
                continue
            heapq.heappush(heap, (_key(objective, c, lb), next(tie), 0, c, None))
    if stats.configurations == 0:
        raise NoFeasiblePlanError(_no_configuration_message(shape, gpus, global_batch, costs, fix,
                                                            allow_cross_node_tp, objective))
    results: list[Candidate] = []
    exact_keys: list = []         # keys of every exact plan found (popped or still on the heap)
    unresolved: list = []         # (config, proved lower bound on its step time) of unfinished proofs
    optimal = True
    memory_dropped: list = []     # (memory lower bound, config) for the explanation
    best_seen = lambda: (f"best {results[0].prediction['step_time_s']:.4g} s" if results else "no plan yet")
    while heap and len(results) < top:
        if time.perf_counter() - t0 > time_limit_s:
            optimal = False
            break
        key, _, level, c, payload = heapq.heappop(heap)
        progress(lambda: f"{stats.configurations} configurations, {stats.bounded} bounded, "
                         f"{stats.solved} split by CP-SAT, {len(heap)} open, {best_seen()}")
        if level == 0:
            terms = costs.terms(c)
            stats.bounded += 1
            mlb = terms.memory_lower_bound()
            if mlb > terms.hbm:
                stats.pruned_memory += 1
                memory_dropped.append((mlb, c))
                continue
            lb = terms.time_lower_bound()
            if target_step_time_s is not None and lb > target_step_time_s:
                stats.pruned_target += 1
                continue
            heapq.heappush(heap, (_key(objective, c, lb), next(tie), 1, c, terms))
        elif level == 1:
            terms = payload
            from autopar.search.split_model import SplitModel
            left = time_limit_s - (time.perf_counter() - t0)
            ub = _step_bound(objective, c, exact_keys, top, target_step_time_s)
            res = SplitModel(terms, time_limit_s=max(0.05, min(solve_limit_s, left)),
                             fixed_stages=fixed_stages, upper_bound_s=ub).solve()
            stats.solved += 1
            stats.solver_s += res.wall_s
            if res.status == "infeasible":
                if ub is not None:        # no split fits *and* beats the k-th plan: out
                    stats.pruned_bound += 1
                    continue
                stats.infeasible += 1
                memory_dropped.append((terms.memory_lower_bound(), c))
                continue
            if res.status not in ("optimal", "feasible"):
                # out of time before any split: what CP-SAT proved still bounds the configuration
                stats.not_proved += 1
                unresolved.append((c, res.bound_s))
                continue
            if res.status != "optimal":
                stats.not_proved += 1
                unresolved.append((c, res.bound_s))
            te = time.perf_counter()
            plan = c.plan(res.stages)
            pred = costs.evaluate(plan)
            stats.evaluator_s += time.perf_counter() - te
            if not pred.get("fits", True):
                # the integer model and the evaluator disagree on memory by rounding only; treat as
                # infeasible rather than return a plan that does not fit
                stats.infeasible += 1
                continue
            if target_step_time_s is not None and pred["step_time_s"] > target_step_time_s:
                stats.pruned_target += 1
                continue
            cand = Candidate(c, plan, pred, res.objective_s, res.status)
            k2 = _key(objective, c, pred["step_time_s"])
            bisect.insort(exact_keys, k2)
            heapq.heappush(heap, (k2, next(tie), 2, c, cand))
        else:
            results.append(payload)
    progress.done()
    # a CP-SAT run cut short leaves its configuration between its proved bound and the split it
    # found; the ranking is still proved when that bound cannot beat the last plan returned
    if unresolved:
        if len(results) < top and heap:
            optimal = False
        for c, bound in unresolved:
            if bound is None or not results or _key(objective, c, bound) < _key(
                    objective, results[-1].config, results[-1].prediction["step_time_s"]):
                optimal = False
    for i, cand in enumerate(results):
        cand.prediction["rank"] = i + 1
    ctx = context or {}
    result = SearchResult(model=ctx.get("model", costs.table.model), hardware=ctx.get("hardware", costs.profile.name),
                          gpus=gpus, global_batch=global_batch, seq=costs.table.seq, objective=objective,
                          plans=results, optimal=optimal and bool(results),
                          search_time_s=time.perf_counter() - t0, stats=stats)
    if not results:
        if not optimal:
            raise NoFeasiblePlanError(f"the search ran past its time limit ({time_limit_s:g} s) before "
                                      "finding a plan; raise --time-limit or pin fields with --fix")
        from autopar.search.infeasible import explain_infeasible
        raise NoFeasiblePlanError(explain_infeasible(costs, gpus=gpus, global_batch=global_batch,
                                                     fix=fix, objective=objective,
                                                     target_step_time_s=target_step_time_s,
                                                     dropped=memory_dropped, stats=stats,
                                                     allow_cross_node_tp=allow_cross_node_tp,
                                                     context=ctx))
    return result


def _no_configuration_message(shape: Shape, gpus, global_batch, costs, fix, allow_cross, objective) -> str:
    from autopar.search.space import divisors, tp_candidates
    bits = []
    tps = tp_candidates(shape, costs.profile.gpus_per_node, allow_cross, gpus)
    if not tps:
        bits.append(f"no tensor-parallel degree divides both heads={shape.heads}, kv_heads={shape.kv_heads} "
                    f"and {gpus} GPUs")
    dps = [gpus // d for d in divisors(gpus)]
    if not any(global_batch % dp == 0 for dp in dps):
        bits.append(f"no data-parallel degree dividing {gpus} GPUs divides the global batch {global_batch}")
    if fix:
        bits.append(f"the pinned fields {', '.join(f'{k}={v}' for k, v in fix.items())} rule out "
                    "the rest")
    why = "; ".join(bits) or "the divisibility rules (tp | heads, kv_heads; dp·micro_batch | batch; pp·vpp ≤ rows) leave nothing"
    return (f"no plan can exist for {gpus} GPUs and global batch {global_batch}: {why}; try a GPU count "
            f"and batch with common factors (e.g. powers of two), or drop --fix")


# --------------------------------------------------------------------------------------------
# solver-free path
# --------------------------------------------------------------------------------------------
def all_splits(n_rows: int, n_stages: int) -> Iterable[tuple[tuple[int, int], ...]]:
    """Every contiguous split of ``n_rows`` rows into ``n_stages`` non-empty ranges."""
    for cuts in itertools.combinations(range(1, n_rows), n_stages - 1):
        b = (0,) + cuts + (n_rows,)
        yield tuple((b[i], b[i + 1]) for i in range(n_stages))


def enumerate_plans(costs, *, gpus: int, global_batch: int, fix: dict | None = None,
                    objective: str = "step_time", allow_cross_node_tp: bool = False,
                    max_micro_batch: int | None = None) -> list[tuple[tuple, Any, dict]]:
    """Exhaustive enumeration through the evaluator: every configuration × every split, scored by
    ``costs.evaluate`` (the cost model). Returns ``[(key, plan, prediction)]`` of the plans that
    fit, best first — the best split per configuration. For small spaces (tests)."""
    fix = dict(fix or {})
    shape = Shape.of(costs.table)
    counts = [gpus] if objective == "step_time" else gpu_counts(gpus, costs.profile.gpus_per_node)
    out = []
    for g in counts:
        for c in configurations(shape, g, global_batch, costs.profile.gpus_per_node, fix,
                                allow_cross_node_tp, max_micro_batch):
            best = None
            splits = [fix["stages"]] if fix.get("stages") else all_splits(shape.rows, c.pp * c.vpp)
            for st in splits:
                if len(st) != c.pp * c.vpp:
                    continue
                plan = c.plan(st)
                pred = costs.evaluate(plan)
                if not pred["fits"]:
                    continue
                k = _key(objective, c, pred["step_time_s"])
                if best is None or k < best[0]:
                    best = (k, plan, pred)
            if best is not None:
                out.append(best)
    out.sort(key=lambda t: t[0])
    return out
