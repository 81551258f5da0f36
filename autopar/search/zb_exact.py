"""The best split of a zero-bubble configuration (interleaved-zb, zb-v, dualpipe-v) by
branch-and-bound over whole stages, with the estimate's own step time at every leaf.

Why not CP-SAT: the split program of these schedules (``split_schedules``) is the simulator's op
graph as thousands of max-plus rows, and its LP relaxation (like ``zb_bound``'s) treats blocks as
divisible, so the configurations near the best took CP-SAT minutes to prove (gpt3-175b, pinned
``zb-v``: 312 s, not proved). But for a *given* split the step time is cheap to compute exactly —
the schedule's simulation (``costmodels.model.pipeline_split``: a pass of max/+ over a cached op
list, 1–3 ms at pp 16) plus the data-parallel sync and optimizer step of each rank — and the
splits that can be best are few once the step time's dominant term is used to bound them:

* every split has ``step ≥ m·T + O`` (``T`` the busiest rank's work per micro-batch, ``O`` the
  optimizer step ≥ its mean over ranks), so under an upper bound ``UB`` (the best split found, or
  the search's k-th plan) every rank works at most ``T_ub = (UB − Ō)/m``;
* the cuts are fixed rank by rank (``zb_stage_costs.cut_order``: for the V schedules stage 0,
  then S−1, then 1, S−2, …), so that each rank's whole work is known early. At a node the fixed
  stages' durations are exact (``StageCosts``); the free rows must fit the free stages' ranks
  under ``T_ub`` (in whole blocks where they are blocks), which prunes, and forces each free
  stage that is its rank's last free one to hold at least ``free rows − Σ other ranks' room``;
  a rank whose first op starts at ``s_r`` has ``T_r ≤ (UB − s_r − …)/m``;
* the node's bound is the op graph simulated with the fixed stages' durations and the free ones'
  least durations (the makespan only grows with any duration), the busiest rank's least work
  (a water-fill of the rows left), and the optimizer step of the complete ranks:
  ``max(M_lb, m_sim·T_lb) + (m − m_sim)·T_lb + O_lb`` — below the step time of every completion
  (``pipeline_split``: past ``m_sim`` each micro-batch adds at least ``T``).

On zb-v the nodes where a rank is completed also get the op graph's LP with the fixed stages
pinned (``zb_node_lp``), which sees the bubble the least-duration graph does not.

The search uses it for the V schedules (zb-v, dualpipe-v; ``Frontier._split``). It is exact for
interleaved-zb too (tested), but there rank r's stages r, r + pp, … leave free stages between
fixed ones until late and its rooms stay loose: on gpt3-175b (pp 8, vpp 4–12, m 16) 11 of 15
runs gave up at 5,000 nodes, so CP-SAT keeps those.

A leaf's step time is ``StageCosts.step_time``: ``split_pipeline_time`` (the estimate's function)
on the stages' F / B / W, plus the exposed dp sync and the optimizer step exactly as the split
program states them (``split_comm``). Memory is not in the branch-and-bound: the best split is
checked by the estimate itself, and where it does not fit the search falls back to CP-SAT
(``solve_split`` returns None), as it does past ``NODE_LIMIT``.
"""
from __future__ import annotations

import time

from autopar.search.split_result import SplitResult
from autopar.search.zb_node_lp import ALL_DEPTHS_OPS, LP_SCHEDULES, MAX_DEPTH, NodeLP
from autopar.search.zb_stage_costs import StageCosts

# past this many nodes (or SOLVE_WALL_S), CP-SAT's program takes over: where few micro-batches
# fill a deep pipeline (gpt3-175b, zb-v, pp 8, m 12) the bubble leaves the rooms loose and the
# tree grows past 70,000 nodes (216 s) while CP-SAT proves the same stop in 0.5 s; of the solves
# that finish on pinned zb-v gpt3-175b, 52 of 58 need fewer than 600 nodes
NODE_LIMIT = 600
SOLVE_WALL_S = 2.0     # CPU seconds of this process (wall before issue 30's zbpin)
# a configuration CP-SAT failed to prove once (``Frontier.retried``: its retry gets 5× the budget,
# which on gpt3-175b's dp16·tp8·pp8 b6 ran 9 s without a proof) gets the branch-and-bound once
# more with this many times the nodes and wall time first (there: 4,600 nodes, 2.7 s, proved)
RETRY_NODES = 10
RETRY_WALL = 3         # … and this many times the wall time (dualpipe-v: 10× spent 20 s unproved)
REL = 1e-9             # float tolerance of a bound against an incumbent


class ZbBranchAndBound:
    """Branch-and-bound over the cuts of one split-backward configuration (module docstring)."""

    def __init__(self, terms, upper_bound_s: float | None = None, node_limit: int = NODE_LIMIT,
                 wall_limit_s: float | None = None, fits=None, memory=None, cpu_limit_s: float | None = None):
        self.sc = StageCosts(terms)
        self.sc.memory = memory   # zb_memory.RankMemory: complete ranks over HBM are pruned
        self.fits = fits          # stages -> whether the split fits the GPU (None: every split)
        self.unfit = 0            # leaves better than the best that did not fit
        self.t = terms
        self.cut = upper_bound_s * (1 + REL) if upper_bound_s is not None else float("inf")
        self.node_limit = node_limit
        self.deadline = None if wall_limit_s is None else time.perf_counter() + wall_limit_s
        # the budget in this process's CPU seconds (issue 30): on the loaded 2-core machine a
        # 2 s wall budget was ~0.15 s of work, so which trees finished (and how many went to
        # CP-SAT) moved with the load; the wall deadline above still caps it (``--time-limit``)
        self.cpu_deadline = None if cpu_limit_s is None else time.process_time() + cpu_limit_s
        self.best = None          # (step time, cuts)
        self.nodes = 0
        self.complete = True      # False: the node limit or the deadline cut the search
        self.node_lp = None       # zb_node_lp.NodeLP, built at its first use
        self.lp_calls = self.lp_prunes = 0   # its solves past MAX_DEPTH, and how many pruned

    def upper(self) -> float:
        return min(self.cut, self.best[0] if self.best else float("inf"))

    def solve(self):
        """(step time, stages) of the best split under the cut, or None where none is below it."""
        sc = self.sc
        seed = sc.seed_cuts()
        if seed is not None:
            st = sc.step_time(seed)
            if st <= self.cut and self._fits(seed):
                self.best = (st, seed)
        x = [0] + [None] * (sc.S - 1) + [sc.n]
        self._dfs(x, [None] * sc.S, 0)
        if self.best is None:
            return None
        cuts = self.best[1]
        return self.best[0], tuple((cuts[v], cuts[v + 1]) for v in range(sc.S))

    def _fits(self, cuts) -> bool:
        if self.fits is None or self.fits(tuple((cuts[v], cuts[v + 1]) for v in range(self.sc.S))):
            return True
        self.unfit += 1
        return False

    def _worth(self, value: float) -> bool:
        """Whether a split or node of step time (bound) ``value`` may still improve the answer."""
        if self.best is None:
            return value <= self.cut
        return value < self.best[0] * (1 - REL) and value <= self.cut

    def _lp_worth(self, fixed: list, depth: int, done: list) -> bool:
        """Whether the op graph's LP with the fixed stages pinned (``zb_node_lp``) leaves the node
        worth a look; asked only where a cut has just completed a rank, up to ``MAX_DEPTH`` deep
        (at any depth in graphs of up to ``ALL_DEPTHS_OPS`` ops)."""
        sc = self.sc
        if sc.schedule not in LP_SCHEDULES:
            return True
        # deeper than MAX_DEPTH only in small graphs, and only while it prunes (dualpipe-v,
        # gpt3-175b pp 8: ~5 ms a node for 1 prune in 10 there)
        shallow = depth < MAX_DEPTH or (3 * sc.S * sc.m_sim <= ALL_DEPTHS_OPS
                                        and (self.lp_calls < 20 or self.lp_prunes >= 0.3 * self.lp_calls))
        if not shallow or not any(all(fixed[u] is not None for u in sc.ranks[sc.rank_of[v]]) for v in done):
            return True
        if self.node_lp is None:
            self.node_lp = NodeLP(self.t, sc)
        worth = self._worth(self.node_lp.bound(fixed))
        if depth >= MAX_DEPTH:
            self.lp_calls += 1
            self.lp_prunes += not worth
        return worth

    def _dfs(self, x: list, fixed: list, depth: int) -> None:
        """Fix cut ``sc.order[depth]`` to each value worth trying, then the next."""
        sc = self.sc
        if not self.complete:
            return
        self.nodes += 1
        if self.nodes > self.node_limit or (self.nodes % 64 == 0 and (
                (self.deadline and time.perf_counter() > self.deadline)
                or (self.cpu_deadline and time.process_time() > self.cpu_deadline))):
            self.complete = False
            return
        if depth == len(sc.order):      # every cut fixed: a leaf
            st = sc.step_time(x)
            if self._worth(st) and self._fits(x):
                self.best = (st, list(x))
            return
        i = sc.order[depth]
        for y in sc.children(x, fixed, i, self.upper()):
            x[i] = y
            done = [v for v in (i - 1, i) if x[v] is not None and x[v + 1] is not None]
            for v in done:
                fixed[v] = sc.stage(v, x[v], x[v + 1])
            if self._worth(sc.node_bound(fixed, self.upper())) and self._lp_worth(fixed, depth, done):
                self._dfs(x, fixed, depth + 1)
            for v in done:
                fixed[v] = None
            x[i] = None


def takes(terms) -> bool:
    """Whether the frontier tries the branch-and-bound before CP-SAT on this split-backward
    configuration: the V schedules only. Interleaved-zb was tried (issue 30, zbpin): with the
    node bounds of ``zb_node_bounds.set_least_stages`` gpt3-175b's pp 8 vpp 12 configurations are
    cut at the root, but the whole pinned search got worse (286.6 s CPU, 71.3 CP-SAT units, 10
    unproved against 195.2 s, 40.4 units, 6 unproved, load 6–31): many of its trees give up at
    ``NODE_LIMIT`` before CP-SAT, and the whole graph's LP tier no longer deferred them."""
    return terms.split_backward and terms.v_placement


def _chance_factor(frontier, c, terms) -> float:
    """The retry's budget times ``further_chances.budget_factor`` (2, 4, 8) on an end-of-search
    chance of ``c`` not yet given to the tree, else 0.

    Why (issue 30, zbpin): a configuration whose tree outgrew the retry's budget went to CP-SAT
    on every chance, and on pinned zb-v gpt3-175b (dp16·tp4·pp16 vpp 2 mb 2, in the top 5 at
    18.204 s) CP-SAT's 10-unit chance (26 s CPU) left it unproved while the tree proves it in
    5,253 nodes (10 s CPU). Both prove the same thing; this only decides which is asked first."""
    from autopar.search.further_chances import budget_factor, chances
    n = chances(frontier, c) if hasattr(frontier, "chance_counts") else 0
    if not n or terms._bounds.get("zb_chance") == n:
        return 0.0
    terms._bounds["zb_chance"] = n
    return budget_factor(frontier, c)


def solve_split(frontier, c, terms, ub: float | None, stop: float | None) -> SplitResult | None:
    """The frontier's split solve for a zero-bubble configuration (``Frontier._split``): the best
    split that fits the GPU (the estimate's memory, asked only of splits better than the best so
    far) under the cut ``min(ub, stop)``. Below it: that split, proved optimal. None below it:
    infeasible when the cut was ``ub`` (the k-th plan's: nothing of ``c`` enters the top k),
    else stopped at ``stop`` (the next entry's: ``c`` waits behind it, as CP-SAT's stop does).
    None (CP-SAT then) where the search was cut short by its deadline or ``NODE_LIMIT``."""
    t0 = time.perf_counter()
    left = frontier.deadline - time.perf_counter()
    cut = min([b for b in (ub, stop) if b is not None], default=None)
    gave_up = terms._bounds.get("zb_gave_up_at")
    grow = c in getattr(frontier, "retried", ()) and not terms._bounds.get("zb_grown")
    chance = _chance_factor(frontier, c, terms)
    if grow:
        terms._bounds["zb_grown"] = True
    elif chance:
        pass   # an end-of-search chance: the tree once more, with the chance's grown budget
    elif gave_up is not None and (cut is None or cut >= gave_up):
        # its tree outgrew NODE_LIMIT under a cut no looser than this one: it would again (a
        # looser cut prunes less), so CP-SAT straight away (issue 30: 15 of 29 such re-solves
        # on pinned zb-v gpt3-175b, 0.2–1 s each)
        return None

    def fits(stages) -> bool:
        return bool(frontier._evaluate(c.plan(stages)).get("fits", True))
    memory = None
    seed = StageCosts(terms).seed_cuts()
    if seed is not None:
        from autopar.search.zb_memory import RankMemory
        plan = c.plan(tuple((seed[v], seed[v + 1]) for v in range(len(seed) - 1)))
        memory = RankMemory(frontier.costs.table, frontier.costs.profile, plan, terms.m)
    k, kw = (RETRY_NODES, RETRY_WALL) if grow else (1, 1)
    if chance:
        k, kw = RETRY_NODES * chance, RETRY_WALL * chance
    bb = ZbBranchAndBound(terms, upper_bound_s=cut, node_limit=k * NODE_LIMIT,
                          wall_limit_s=max(0.05, left), cpu_limit_s=kw * SOLVE_WALL_S, fits=fits, memory=memory)
    out = bb.solve()
    st = frontier.stats
    st.exact_splits += 1
    st.exact_nodes += bb.nodes
    st.solver_s += time.perf_counter() - t0
    wall = time.perf_counter() - t0
    if not bb.complete:
        terms._bounds["zb_gave_up_at"] = float("inf") if cut is None else cut
        return None
    if out is None:
        if ub is not None and cut == ub:
            return SplitResult("infeasible", None, None, wall)
        if cut is None:   # no split fits the GPU at all
            return SplitResult("infeasible", None, None, wall)
        return SplitResult("unknown", None, None, wall, bound_s=cut, stopped=True)
    step, stages = out
    return SplitResult("optimal", stages, step, wall, bound_s=step * (1 - REL))
