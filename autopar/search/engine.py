"""The search driver: best-first over configurations, CP-SAT for the split points, top-k plans.

``search(...)`` is the Python API behind ``autopar search`` (and ``autopar report --scale``).

Algorithm (``autopar.search.split_model`` writes the integer program; the optimality argument is
below):

1. list every configuration (``autopar.search.space.configurations``), for one GPU count or, for
   the GPU-count objectives, for every count up to ``--gpus``;
2. offer each to a ``Frontier`` (``autopar.search.frontier``), a heap keyed by a cheap bound on
   its objective (``costs.quick_bound``: the compute every rank must do, no communication);
3. pop the smallest; a configuration popped the first time gets its full terms (``costs.terms``)
   and is pushed back with the tighter split-independent bound (``Terms.time_lower_bound``) —
   unless its memory bound already exceeds HBM, which drops it; popped the second time, CP-SAT
   places its split points (``SplitModel``), the evaluator (``costmodels.model.estimate``) scores the
   resulting plan, and it is pushed back with that exact prediction; popped the third time it is
   the next-best plan. CP-SAT stops early once its proved bound passes the next entry's key: the
   configuration goes back on the heap at level 1 with that bound (``SearchStats.deferred``) and
   is solved again only if the bound comes up — most never do, which spares proving the optimum
   of configurations far behind the answer;
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

import itertools
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from autopar.search.fallback import FALLBACK_SHARE, balanced_fallback  # noqa: F401  (moesearch: engine's API)
from autopar.search.frontier import Candidate, Frontier, SearchStats, objective_key
from autopar.search.precision_space import search_precisions
from autopar.search.space import Shape, check_fix_against, configurations, gpu_counts
from costmodels.contracts.errors import NoFeasiblePlanError, PlanError
from costmodels.model.checks import check_plan
from costmodels.profiles.runtime import load_runtime

OBJECTIVES = ("step_time", "throughput_per_gpu", "fewest_gpus")


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
    runtime: str = "autopar"
    excluded: list[str] = field(default_factory=list)   # what the searched space left out
    # (below, above) when no plan uses all ``gpus``: the plans then run on ``below`` GPUs
    nearest_gpu_counts: tuple[int | None, int | None] | None = None

    def gpu_count_note(self) -> str | None:
        """One line saying that no plan uses every GPU, and what the search did instead."""
        if not self.nearest_gpu_counts:
            return None
        below, above = self.nearest_gpu_counts
        other = f"; {above} would use a larger cluster" if above else ""
        return (f"no plan can use all {self.gpus} GPUs (the divisibility rules leave nothing); planned on "
                f"{below} GPUs, the nearest count below, leaving {self.gpus - below} idle{other}")

    def plans_file(self) -> dict:
        """The plans file of docs/CONTRACTS.md."""
        from costmodels.contracts.plans_file import PLANS_FILE_VERSION
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
                           "plans_merged_as_ties": self.stats.ties_merged,
                           **({"nearest_gpu_counts": list(self.nearest_gpu_counts),
                               "gpu_count_note": self.gpu_count_note()} if self.nearest_gpu_counts else {}),
                           "solver_s": round(self.stats.solver_s, 4),
                           "solver_objective_s": [c.solver_objective_s for c in self.plans],
                           "runtime": self.runtime,
                           "balanced_fallback": any(c.status == "balanced-fallback" for c in self.plans),
                           "optimal_over": "the searched space, which excludes: " + "; ".join(self.excluded)}}


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


def run_search(costs, *, gpus: int, global_batch: int, fix: dict | None = None, top: int = 5,
               objective: str = "step_time", target_step_time_s: float | None = None,
               allow_cross_node_tp: bool = False, max_micro_batch: int | None = None,
               time_limit_s: float = 600.0, solve_limit_s: float = 2.0,
               progress: Progress | None = None,
               context: dict | None = None, zero_bubble: bool = False) -> SearchResult:
    """Search over ``costs`` (a ``autopar.search.costs.Costs``: table + profile + batch): fill a
    ``Frontier`` with every configuration, run it to ``top`` plans or ``time_limit_s``, and
    explain why when no plan comes out. ``zero_bubble``: also search the zero-bubble schedules
    (``autopar.search.space._schedules``; a pinned one is searched either way)."""
    t0 = time.perf_counter()
    _check_request(objective, target_step_time_s, top)
    fix = dict(fix or {})
    check_fix_against(fix, gpus if objective == "step_time" else None)
    deadline = t0 + time_limit_s   # the whole search's, balanced_fallback included
    frontier = Frontier(costs, objective=objective, top=top, target_step_time_s=target_step_time_s,
                        fixed_stages=fix.get("stages"), solve_limit_s=solve_limit_s,
                        deadline=deadline - FALLBACK_SHARE * time_limit_s)
    shape = Shape.of(costs.table)
    counts = [gpus] if objective == "step_time" else gpu_counts(gpus, costs.profile.gpus_per_node)
    from autopar.search.dense_first import hold_back, release  # issue 30 (zbdef): dense plans first
    if zero_bubble and "schedule" not in fix:
        hold_back(frontier)
    _offer_configurations(frontier, shape, counts, global_batch, fix, allow_cross_node_tp,
                          max_micro_batch, zero_bubble)
    nearest = None
    pinned = set(fix) - {"runtime", "precision", "attention", "placement"}
    if frontier.stats.configurations == 0 and objective == "step_time" and not pinned:
        # no plan uses every GPU: plan on the nearest count below (fewest idle), name both sides;
        # not when the user pinned a degree or schedule (their pin, not the count, rules plans out)
        from autopar.search.gpu_counts import nearest_gpu_counts
        nearest = nearest_gpu_counts(shape, gpus, global_batch, costs.profile.gpus_per_node, fix,
                                     allow_cross_node_tp, max_micro_batch, zero_bubble)
        if nearest[0] is not None:
            _offer_configurations(frontier, shape, [nearest[0]], global_batch, fix, allow_cross_node_tp,
                                  max_micro_batch, zero_bubble)
    if frontier.stats.configurations == 0:
        near = "" if not nearest or nearest[1] is None else f" (the nearest count that works is {nearest[1]})"
        raise NoFeasiblePlanError(_no_configuration_message(shape, gpus, global_batch, costs, fix,
                                                            allow_cross_node_tp, objective) + near)
    progress = progress or Progress(False)
    finished = frontier.run(progress)
    if release(frontier):   # issue 30 (zbdef): the zero-bubble ones under the dense k-th plan
        finished = frontier.run(progress)
    if not finished and frontier.results:   # plans on the way: the fallback's share goes to them
        frontier.deadline = deadline
        finished = frontier.run(progress)
    optimal = finished and frontier.proved()
    progress.done()
    results = frontier.results
    from autopar.search.schedule_gain import schedule_gain
    for i, cand in enumerate(results):
        cand.prediction["rank"] = i + 1
        gain = schedule_gain(costs, cand.config)   # what a zero-bubble schedule bought (bubble)
        if gain is not None:
            cand.prediction["schedule_gain"] = gain
    ctx = context or {}
    if not results and not optimal and objective == "step_time":
        results = balanced_fallback(costs, shape, gpus, global_batch, fix, allow_cross_node_tp,
                                    max_micro_batch, zero_bubble, top, deadline=deadline, frontier=frontier)
    if not results:
        if not optimal:   # cut by the deadline, or CP-SAT runs that ended without an answer
            raise NoFeasiblePlanError(f"the search ran past its time limit ({time_limit_s:g} s) before "
                                      "finding a plan; raise --time-limit or pin fields with --fix")
        from autopar.search.infeasible import explain_infeasible
        raise NoFeasiblePlanError(explain_infeasible(costs, gpus=gpus, global_batch=global_batch,
                                                     fix=fix, objective=objective,
                                                     target_step_time_s=target_step_time_s,
                                                     dropped=frontier.memory_dropped,
                                                     stats=frontier.stats,
                                                     allow_cross_node_tp=allow_cross_node_tp,
                                                     context=ctx))
    from autopar.search.scope import space_exclusions
    return SearchResult(model=ctx.get("model", costs.table.model),
                        hardware=ctx.get("hardware", costs.profile.name), gpus=gpus,
                        global_batch=global_batch, seq=costs.table.seq, objective=objective,
                        plans=results, optimal=optimal,
                        search_time_s=time.perf_counter() - t0, stats=frontier.stats,
                        nearest_gpu_counts=nearest,
                        runtime=load_runtime(fix.get("runtime")).name,
                        excluded=space_exclusions(fix, allow_cross_node_tp=allow_cross_node_tp,
                                                  max_micro_batch=max_micro_batch, objective=objective,
                                                  zero_bubble=zero_bubble))


def _check_request(objective: str, target_step_time_s: float | None, top: int) -> None:
    if objective not in OBJECTIVES:
        raise PlanError(f"--objective '{objective}' is not one of {', '.join(OBJECTIVES)}")
    if objective == "fewest_gpus" and target_step_time_s is None:
        raise PlanError("--objective fewest_gpus needs a target: --target-step-time SECONDS or "
                        "--target-tokens-per-s N")
    if top < 1:
        raise PlanError(f"--top {top} must be at least 1")


def _offer_configurations(frontier: Frontier, shape: Shape, counts, global_batch: int, fix: dict,
                          allow_cross_node_tp: bool, max_micro_batch: int | None, zero_bubble: bool = False) -> None:
    """Level 0 of every configuration for the GPU counts; with pinned stages only those with as
    many virtual stages, the stages checked once (the same one-line PlanError as 'autopar
    estimate')."""
    costs, fixed_stages, checked = frontier.costs, fix.get("stages"), False
    from autopar.search.expert_bounds import StaticMemory
    static = StaticMemory(costs)   # moesearch: states over HBM under any split, before any bound
    for g in counts:
        for c in configurations(shape, g, global_batch, costs.profile.link_domain, fix,
                                allow_cross_node_tp, max_micro_batch, zero_bubble,
                                    precisions=search_precisions(costs.profile, fix)):
            if frontier.stats.configurations % 256 == 255 and time.perf_counter() > frontier.deadline:
                return   # moesearch: past the deadline the frontier stops unproved (run -> False)
            frontier.stats.configurations += 1
            if fixed_stages is not None:
                if len(fixed_stages) != c.pp * c.vpp:
                    continue
                if not checked:
                    check_plan(costs.table, c.plan(fixed_stages), g, global_batch)
                    checked = True
            if static.over_hbm(c):
                frontier.stats.pruned_memory += 1
                frontier.memory_dropped.append((static.bound(c), c))
                continue
            frontier.offer(c)


def _no_configuration_message(shape: Shape, gpus, global_batch, costs, fix, allow_cross, objective) -> str:
    from autopar.search.space import divisors, tp_candidates
    bits = []
    tps = tp_candidates(shape, costs.profile.link_domain, allow_cross, gpus)
    if not tps:
        bits.append(f"no tensor-parallel degree divides both heads={shape.heads}, kv_heads={shape.kv_heads} "
                    f"and {gpus} GPUs")
    dps = [gpus // d for d in divisors(gpus)]
    if not any(global_batch % dp == 0 for dp in dps):
        bits.append(f"no data-parallel degree dividing {gpus} GPUs divides the global batch {global_batch}")
    if fix.get("schedule") == "dualpipe-v" and tps:
        # torch's ScheduleDualPipeV needs m ≥ 2·pp: B ≥ 2·dp·pp·mbs ≥ 2·gpus/tp
        need = 2 * gpus // max(tps)
        if global_batch < need:
            return (f"schedule 'dualpipe-v' needs at least 2·pp micro-batches per step (torch's "
                    f"ScheduleDualPipeV), so a global batch of at least 2·dp·pp ≥ 2·{gpus}/tp = {need} "
                    f"on {gpus} GPUs (tp at most {max(tps)} here); raise the global batch to {need}, "
                    "use fewer GPUs, or schedule zb-v (any micro-batch count)")
    from costmodels.profiles.fp8_shapes import pinned_reason  # FP8 GEMM shapes (fp8_shapes)
    fp8_why = pinned_reason(load_runtime(fix.get("runtime")), fix, shape.fp8)
    if fp8_why:
        bits.append(fp8_why)
    if fix:
        bits.append(f"the pinned fields {', '.join(f'{k}={v}' for k, v in fix.items())} rule out "
                    "the rest")
    why = "; ".join(bits) or ("the divisibility rules (tp | heads, kv_heads; dp·micro_batch | batch; "
                              "pp·vpp ≤ rows) leave nothing")
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
                    max_micro_batch: int | None = None, zero_bubble: bool = False) -> list[tuple[tuple, Any, dict]]:
    """Exhaustive enumeration through the evaluator: every configuration × every split, scored by
    ``costs.evaluate`` (the cost model). Returns ``[(key, plan, prediction)]`` of the plans that
    fit, best first — the best split per configuration. For small spaces (tests)."""
    fix = dict(fix or {})
    shape = Shape.of(costs.table)
    counts = [gpus] if objective == "step_time" else gpu_counts(gpus, costs.profile.gpus_per_node)
    out = []
    for g in counts:
        for c in configurations(shape, g, global_batch, costs.profile.link_domain, fix,
                                allow_cross_node_tp, max_micro_batch, zero_bubble,
                                    precisions=search_precisions(costs.profile, fix)):
            best = None
            splits = [fix["stages"]] if fix.get("stages") else all_splits(shape.rows, c.pp * c.vpp)
            for st in splits:
                if len(st) != c.pp * c.vpp:
                    continue
                plan = c.plan(st)
                pred = costs.evaluate(plan)
                if not pred["fits"]:
                    continue
                k = objective_key(objective, c, pred["step_time_s"])
                if best is None or k < best[0]:
                    best = (k, plan, pred)
            if best is not None:
                out.append(best)
    out.sort(key=lambda t: t[0])
    return merge_zero_ties(out)


def _layout(plan) -> dict:
    """A plan's fields but its ZeRO stage and split (what ``merge_zero_ties`` compares)."""
    d = plan.to_dict()
    d.pop("zero"), d.pop("stages")
    return d


def merge_zero_ties(entries: list) -> list:
    """``[(key, plan, prediction)]`` best first, with plans that differ only in their ZeRO stage
    at the same step time shown once, the one with less memory (as the search's top-k does,
    ``frontier.same_but_zero``)."""
    out: list = []
    for k, plan, pred in entries:
        for i, (_, p2, pr2) in enumerate(out):
            t1, t2 = pred["step_time_s"], pr2["step_time_s"]
            if (plan.zero != p2.zero and _layout(plan) == _layout(p2)
                    and abs(t1 - t2) <= 1e-9 * max(t1, t2)):
                if pred["memory_bytes"]["total"] < pr2["memory_bytes"]["total"]:
                    out[i] = (k, plan, pred)
                break
        else:
            out.append((k, plan, pred))
    return out
