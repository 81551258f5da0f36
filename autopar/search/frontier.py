"""The best-first frontier of one search: configurations on a heap, three levels deep.

``autopar.search.engine`` fills a ``Frontier`` with every configuration and steps it until the
top plans are out; its docstring has the algorithm and why the ranking is exact ("Decomposition").
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import replace

from autopar.search.frontier_keys import (  # noqa: F401  (re-exported: engine, pools, fallback, tests)
    Candidate,
    SearchStats,
    _step_bound,
    _step_to_beat,
    _ties,
    objective_key,
    same_but_zero,
)
from autopar.search.frontier_margins import CHEAP_DEFERRAL, DEFER_GROWTH, RETRY_FACTOR, STOP_MARGIN
from autopar.search.frontier_seeding import SeedingMixin
from autopar.search.space import Config


class Frontier(SeedingMixin):
    """The best-first frontier of one search (``autopar.search.engine``'s steps 2–4).

    Configurations wait on a heap keyed by a bound on their objective, at one of three levels:
    0 with the cheap bound (``offer``), 1 with the split-independent bound and their terms,
    2 with an exact plan. ``run`` pops the best entry and ``advance`` moves it one level on, or
    drops it (memory bound above HBM, no split fits, too slow for the target); an entry popped
    at level 2 is the next-best plan. ``stats`` counts what happened, ``proved`` says whether
    the ranking is exact under the model. Every key is a lower bound on what the entry can still
    become, so the plans come out best first. Before a configuration's first split solve its
    bound is raised by ``autopar.search.memory_blocks`` (memory's floor; it waits unsolved when
    that puts it behind the next entry), and a solve that stalls before any k-th plan exists
    waits for that plan's cut (``awaiting_cut``, ``_seed_ahead``)."""

    def __init__(self, costs, *, objective: str, top: int, target_step_time_s: float | None,
                 fixed_stages, solve_limit_s: float, deadline: float):
        self.costs, self.objective, self.top = costs, objective, top
        self.target = target_step_time_s
        self.fixed_stages = fixed_stages
        self.solve_limit_s, self.deadline = solve_limit_s, deadline
        self.stats = SearchStats()
        self.heap: list = []
        self._tie = itertools.count()
        self.results: list[Candidate] = []
        # the best key known per configuration: its exact plan, or a split CP-SAT found on the way
        # (one that fits, scored by the evaluator); the k-th smallest bounds the k-th plan
        self.known: dict = {}
        self.exact_keys: list = []     # sorted values of ``known``
        self.known_splits: dict = {}   # configuration -> (its best key, that split's stages): own_cut
        self.unresolved: list = []     # (config, proved lower bound on its step time) of unfinished proofs
        self.memory_dropped: list = []  # (memory lower bound, config) for the explanation
        self.retried: set = set()      # configurations whose split CP-SAT gets a second, longer try
        self._evaluated: dict = {}     # plan -> the evaluator's prediction
        self.seeded: set = set()       # configurations whose min-max split was scored (_seed)
        self.awaiting_cut: set = set()  # unproved twice, solved again under the k-th plan's cut
        self.second_chances: set = set()   # unproved configurations solved once more at the end
        self.chance_counts: dict = {}  # configuration -> its end-of-search chances (further_chances)
        self.deferrals: dict = {}      # configuration -> times its solve was deferred (DEFER_GROWTH)
        from autopar.search.twins import Twins
        self.twins = Twins(costs)      # dense: ZeRO twins of one objective share their proofs
        self._early_seeds = 0          # dense: seed-ahead scans before a k-th plan is known
        self.offered: set = set()      # every configuration of the searched space (twins stay inside it)
        self.counted: set = set()      # srch7: configurations whose block-count split was tried (block_counts)

    def push(self, c: Config, step_time: float, level: int, payload=None):
        key = objective_key(self.objective, c, step_time)
        heapq.heappush(self.heap, (key, next(self._tie), level, c, payload))
        return key

    def pop(self):
        _, _, level, c, payload = heapq.heappop(self.heap)
        return level, c, payload

    def done(self) -> bool:
        """Nothing left, or ``top`` plans out and the next entry does not tie the last of them
        (a plan of the same step time may be its ZeRO twin, merged by ``_add_result``)."""
        if not self.heap or len(self.results) < self.top:
            return not self.heap
        last = self.results[-1]
        last_key = objective_key(self.objective, last.config, last.prediction["step_time_s"])
        # searchregress: an entry under the last plan (a second chance, ``_second_chance``, goes
        # back at its proved bound) may still enter the top k: not done until it is resolved
        return not (self.heap[0][0] < last_key or _ties(self.heap[0][0], last_key))

    def offer(self, c: Config) -> None:
        """Level 0: ``c`` under its cheap bound (``Costs.quick_bound``)."""
        from autopar.search.dense_first import held  # issue 30 (zbdef): dense plans first
        if held(self, c):
            return
        self.offered.add(c)
        lb = self.costs.quick_bound(c)
        if not self._misses_target(lb):
            self.push(c, lb, 0)

    def run(self, progress: Callable[[Callable[[], str]], None]) -> bool:
        """Step until ``top`` plans are out or nothing is left; False when the deadline cut it.
        ``progress`` is called after every pop with ``describe``."""
        while True:
            while not self.done():
                if time.perf_counter() > self.deadline:
                    return False
                level, c, payload = self.pop()
                progress(self.describe)
                self.advance(level, c, payload)
            if not self._second_chance():
                return True

    def _second_chance(self) -> bool:
        """Once the top plans are out, each configuration CP-SAT left unproved under the last
        plan's key is solved once more, under the k-th plan's cut alone and a longer budget
        (True: some went back on the heap; up to ``further_chances.MAX_CHANCES`` times, each
        longer). The order in which configurations meet their cuts decides which proofs stall
        (GPT 1T, dp32·pp12 vpp4: unproved at a bound of 69.3 s before the 5th plan, 70.8 s, was
        known); under the final cut such a program is mostly infeasible at once, which is the
        proof the ranking lacked."""
        if len(self.results) < self.top or self.proved():
            return False
        last = self.results[-1]
        last_key = objective_key(self.objective, last.config, last.prediction["step_time_s"])
        from autopar.search.further_chances import count_chance, may_have_another
        again = [(c, b) for c, b in self.unresolved if may_have_another(self, c)
                 and (b is None or objective_key(self.objective, c, b) < last_key)]
        for c, b in again:
            self.unresolved.remove((c, b))
            self.stats.not_proved -= 1
            count_chance(self, c)   # frontier6: more chances, each longer, while time allows
            self.retried.add(c)
            self.awaiting_cut.add(c)
            self.push(c, b if b is not None else 0.0, 1, self.costs.terms(c))
        return bool(again)

    def advance(self, level: int, c: Config, payload) -> None:
        """Move a popped entry one level on: bound it, split it, or return its plan."""
        if level == 0:
            self._bound(c)
        elif level == 1:
            self._split(c, payload)
        else:
            self._add_result(payload)

    def _add_result(self, cand: Candidate) -> None:
        """Append a plan, or merge it with a shown plan it ties with (``same_but_zero``): the tie
        goes to the plan with less memory, so the top-k lists distinct layouts. A configuration is
        shown once, at its best split (``result_order.replace_own_plan``: a second chance's)."""
        from autopar.search.result_order import replace_last_if_better, replace_own_plan
        if replace_own_plan(self.results, cand, self.objective):
            return
        for i, shown in enumerate(self.results):
            if same_but_zero(shown, cand):
                self.stats.ties_merged += 1
                if cand.prediction["memory_bytes"]["total"] < shown.prediction["memory_bytes"]["total"]:
                    self.results[i] = cand
                return
        if len(self.results) < self.top:   # a tie popped after the top-k is full merges or goes
            self.results.append(cand)
        else:   # searchregress: a second chance's plan under the last one takes its place
            replace_last_if_better(self.results, cand, self.objective)

    def describe(self) -> str:
        best = (f"best {self.results[0].prediction['step_time_s']:.4g} s" if self.results
                else "no plan yet")
        return (f"{self.stats.configurations} configurations, {self.stats.bounded} bounded, "
                f"{self.stats.solved} split by CP-SAT, {len(self.heap)} open, {best}")

    def proved(self) -> bool:
        """A CP-SAT run cut short leaves its configuration between its proved bound and the split
        it found; the ranking is still proved when that bound cannot beat the last plan returned
        (and, short of ``top`` plans, when nothing else is left)."""
        if not self.unresolved:
            return True
        if len(self.results) < self.top and self.heap:
            return False
        if not self.results:
            return False
        last = self.results[-1]
        last_key = objective_key(self.objective, last.config, last.prediction["step_time_s"])
        return all(bound is not None and not objective_key(self.objective, c, bound) < last_key
                   for c, bound in self.unresolved)

    # ---- one level on ----------------------------------------------------------------------
    def _misses_target(self, step_time: float) -> bool:
        if self.target is not None and step_time > self.target:
            self.stats.pruned_target += 1
            return True
        return False

    def _bound(self, c: Config) -> None:
        """Level 0 → 1: the configuration's terms and its split-independent bounds."""
        self.stats.bounded += 1
        mlb = self.costs.memory_lower_bound(c)   # (no coefficients of c's own for this)
        if mlb > self.costs.profile.hbm_bytes:
            self.stats.pruned_memory += 1
            self.memory_dropped.append((mlb, c))
            return
        terms = self.costs.terms(c)
        from autopar.search.stage_memory import estimate_stage_bound, stage_memory_bound  # moesearch
        mlb = max(stage_memory_bound(terms), estimate_stage_bound(self.costs, c, terms))
        if mlb > terms.hbm:
            self.stats.pruned_memory += 1
            self.memory_dropped.append((mlb, c))
            return
        lb = terms.time_lower_bound()
        if not self._misses_target(lb):
            self.push(c, lb, 1, terms)

    def _split(self, c: Config, terms) -> None:
        """Level 1 → 2: CP-SAT places the split points, bounded by the k-th plan found so far."""
        from autopar.search.split_model import SplitModel
        from autopar.search.split_stop import some_split_fits
        if terms.blocks is None and self.fixed_stages is None:
            # before its first solve, the bound that sees memory (memory_blocks): where it puts
            # the configuration behind the next entry, it waits there unsolved. (Before the
            # zero-bubble graph bound: set_block_floor clears the bounds it would keep.)
            terms.set_block_floor()
            lb = terms.time_lower_bound()
            if self._misses_target(lb):
                return
            if self.heap and objective_key(self.objective, c, lb) > self.heap[0][0]:
                self.stats.memory_floored += 1
                self.push(c, lb, 1, terms)
                return
        from autopar.search.zb_bound import defer_by_graph_bound
        if defer_by_graph_bound(self, c, terms):   # issue 30: a zero-bubble op graph's LP bound first
            return
        self._seed(c, terms)
        from autopar.search.block_counts import reach_by_counts
        if reach_by_counts(self, c, terms):   # srch7: a block-count split at the level-1 bound is optimal
            return
        left = self.deadline - time.perf_counter()
        ub = _step_bound(self.objective, c, self.exact_keys, self.top, self.target)
        if ub is None and c not in self.awaiting_cut and self._early_seeds < 8:
            self._early_seeds += 1   # dense: a k-th plan's cut before CP-SAT (a few heap scans)
            self._seed_ahead()
            ub = _step_bound(self.objective, c, self.exact_keys, self.top, self.target)
        if ub is None and c in self.awaiting_cut:   # give it a k-th plan's cut: seed the next ones
            self._seed_ahead()
            ub = _step_bound(self.objective, c, self.exact_keys, self.top, self.target)
        from autopar.search.further_chances import budget_factor
        limit = self.solve_limit_s * (RETRY_FACTOR if c in self.retried else 1) * budget_factor(self, c)
        # the entry next in line: once CP-SAT proves every split of c sorts after it, c waits
        stop = _step_to_beat(self.objective, c, self.heap[0][0]) if self.heap else None
        if c in self.awaiting_cut and ub is not None:
            stop = None   # the k-th plan's cut alone: its infeasibility is the proof it waited for
        if stop is not None:   # a margin: fewer re-solves of one configuration in small steps
            stop *= 1 + STOP_MARGIN * DEFER_GROWTH ** self.deferrals.get(c, 0)
        if ub is not None and not terms.split_backward and self.twins.proved_out(self, c, terms, ub):
            self.stats.pruned_bound += 1   # dense: a twin with no more bytes has no split under the cut
            return
        from autopar.search.own_cut import own_cut, push_own_split
        cut, own = own_cut(self, c, ub)   # a re-solve: under its own best split where that is tighter
        model = SplitModel(terms, time_limit_s=limit, wall_limit_s=max(0.05, left), fixed_stages=self.fixed_stages,
                           upper_bound_s=cut, stop_above_s=stop)
        from autopar.search.reached_bound import watch
        watch(model, c, terms, self._evaluate)   # issue 30: stop at a split that reaches the bound
        if terms.split_backward and not some_split_fits(model):
            # the op-graph program of a zero-bubble schedule costs CP-SAT far more than its memory
            # program alone: a configuration no split fits is dropped on the memory program
            self.stats.infeasible += 1
            self.memory_dropped.append((terms.memory_lower_bound(), c))
            return
        res = None
        from autopar.search.zb_exact import takes  # issue 30: which split-backward ones (zbpin)
        if terms.split_backward and self.fixed_stages is None and takes(terms):
            from autopar.search.zb_exact import solve_split  # issue 30: whole blocks, exactly
            res = solve_split(self, c, terms, ub, stop)
        res = res or self._solve(c, model)
        if res.stopped:
            # not out of time: its proved bound puts it behind the next entry; it is solved again
            # (from scratch, under the k-th plan's cut then in force) if that bound comes up
            self.stats.deferred += 1
            # grown only while the deferring solves stay cheap: a wider margin asks CP-SAT to prove
            # more, which the configurations of stalling bounds cannot (GPT 1T, dp32·pp12 vpp 6:
            # its bound stalls near 68 s, and a margin past that left it unproved)
            self.deferrals[c] = self.deferrals.get(c, 0) + 1 if res.det_s < CHEAP_DEFERRAL else 0
            self._incumbent(c, res)
            self.push(c, max(res.bound_s, terms.time_lower_bound()), 1, terms)
            return
        if res.status == "infeasible":
            if own is not None:       # no split beats the one c holds: that one is its optimum
                push_own_split(self, c, own)
                return
            if ub is not None:        # no split fits *and* beats the k-th plan: out
                self.stats.pruned_bound += 1
                self.twins.record(terms, ub)
                return
            self.stats.infeasible += 1
            self.memory_dropped.append((terms.memory_lower_bound(), c))
            return
        if res.status != "optimal" and c not in self.retried and res.bound_s is not None:
            # one more, longer try when its turn comes again (the proved bound keeps it in order):
            # large uneven interleavings can take CP-SAT a few seconds to prove
            self.retried.add(c)
            if ub is None:   # its retry waits for a k-th plan's cut too (awaiting_cut below)
                self.awaiting_cut.add(c)
            self._incumbent(c, res)
            self.push(c, max(res.bound_s, terms.time_lower_bound()), 1, terms)
            return
        if (res.status != "optimal" and ub is None and c not in self.awaiting_cut
                and res.bound_s is not None):
            # unproved twice before any k-th plan existed: once one does, its cut often proves
            # in one solve that no split enters the top k (GPT 1T, dp32·pp12 vpp 6: its bound
            # stalls near 69.9 s, under the cut of 70.8 s it is infeasible), so it waits for it
            self.awaiting_cut.add(c)
            self._incumbent(c, res)
            self.push(c, max(res.bound_s, terms.time_lower_bound()), 1, terms)
            return
        if res.status != "optimal":   # what CP-SAT proved still bounds the configuration
            self.stats.not_proved += 1
            # (issue 30: the zero-bubble graph bound, zb_bound, where CP-SAT proved less)
            self.unresolved.append((c, res.bound_s if res.bound_s is None
                                    else max(res.bound_s, terms.time_lower_bound())))
            if res.status != "feasible":   # out of time before any split
                return
        self._score(c, res)

    def _solve(self, c: Config, model):
        """Solve ``model``; where its objective was only a lower bound on the estimate (the fast
        program of a split-backward schedule, ``autopar.search.split_schedules``) and the estimate
        of its split is above it, solve again with the exact program: the split is then optimal
        under the estimate itself."""
        from autopar.search.split_model import SplitModel
        res = model.solve()
        self.stats.solved += 1
        self.stats.solver_s += res.wall_s
        self.stats.solver_det += res.det_s
        if res.bound_only and res.status == "optimal":
            pred = self._evaluate(c.plan(res.stages))
            if pred["step_time_s"] > res.objective_s + res.slack_s:
                left = self.deadline - time.perf_counter()
                res = SplitModel(model.t, time_limit_s=RETRY_FACTOR * model.time_limit_s, wall_limit_s=max(0.05, left),
                                 fixed_stages=model.fixed_stages, upper_bound_s=model.upper_bound_s,
                                 exact=True).solve()
                self.stats.solved += 1
                self.stats.exact_resolves += 1
                self.stats.solver_s += res.wall_s
                self.stats.solver_det += res.det_s
        return res

    def _evaluate(self, plan) -> dict:
        """The evaluator (``costmodels.model.estimate``), once per plan."""
        pred = self._evaluated.get(plan)
        if pred is None:
            te = time.perf_counter()
            pred = self._evaluated[plan] = self.costs.evaluate(plan)
            self.stats.evaluator_s += time.perf_counter() - te
        return pred

    def _score(self, c: Config, res) -> None:
        """The evaluator scores CP-SAT's split; the plan goes back on the heap at its exact key."""
        plan = c.plan(res.stages)
        pred = self._evaluate(plan)
        if not pred.get("fits", True):
            # the integer model and the evaluator disagree on memory by rounding only; treat as
            # infeasible rather than return a plan that does not fit
            self.stats.infeasible += 1
            return
        if self._misses_target(pred["step_time_s"]):
            return
        cand = Candidate(c, plan, pred, res.objective_s, res.status)
        self._know(c, self.push(c, pred["step_time_s"], 2, cand), res.stages)

    def _know(self, c: Config, key, stages=None) -> None:
        if c not in self.known or key < self.known[c]:
            self.known[c] = key
            if stages is not None:
                self.known_splits[c] = (key, stages)
            # configurations that differ only in ZeRO stage at the same key become one plan of
            # the top-k (``_add_result``), so they count once towards the k-th plan's bound
            self.exact_keys = sorted({(replace(c2, zero=0), k2) for c2, k2 in self.known.items()},
                                     key=lambda ck: ck[1])
            self.exact_keys = [k2 for _, k2 in self.exact_keys]

    def _incumbent(self, c: Config, res) -> None:
        """A split CP-SAT found before proving it best: a real plan of ``c``, so its key bounds
        what ``c`` will score, and with k such configurations the k-th plan (the cut passed to
        CP-SAT keeps a rounding slack, so a configuration that rounds a hair above is not lost)."""
        if res.stages is None:
            return
        pred = self._evaluate(c.plan(res.stages))
        if pred.get("fits", True):
            self._know(c, objective_key(self.objective, c, pred["step_time_s"]), res.stages)
