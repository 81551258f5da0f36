"""``zb_bound``'s op-graph LP at ``zb_exact``'s shallow nodes: the configuration's LP with the
rows of the fixed stages pinned, built once per configuration and re-solved by GLOP per node.

Why: the branch-and-bound's own node bound gives each free stage its least duration (one row),
so until most stages are fixed it sees little of the bubble: on gpt3-175b (zb-v, pp 8, m 16)
its root bound is 16.38 s where the LP's is 17.24 s and the optimum 17.50 s, and a cut between
them took thousands of nodes. The LP spreads the free rows over the free stages fluidly and
charges the op graph for every spread; with the fixed stages' rows pinned (``x[k][v]`` = the
rows of type ``k`` in stage ``v``) it is a relaxation of every completion of the node (the
placements of the free rows are a subset of its points, each at most the estimate's step time:
``zb_bound``'s docstring), so a node whose LP is above the cut has no completion under it.

Only where it pays: the LP is built once per branch-and-bound (0.005–0.1 s at pp ≤ 16) and
solved only at the nodes where a rank has just been completed, up to ``MAX_DEPTH`` cuts deep
(at every depth in small graphs), after the cheap bounds left the node under the cut.
"""
from __future__ import annotations

from autopar.search.zb_bound import SAFETY, SCALE, build_lp, solve_lp

# zb-v only: on dualpipe-v (gpt3-175b, pp 8) its solves cost ~15 ms a node and pruned little, and
# the pinned search took 150 s CPU with it against 132 s without
LP_SCHEDULES = ("zb-v",)
MAX_DEPTH = 4        # cuts fixed: the first two ranks of a V schedule
ALL_DEPTHS_OPS = 1200   # graphs up to this (pp 8, m 24) get it at every depth (~5 ms a solve)
V_LP_OPS = 2400      # op graphs up to this (3·S·m_sim ops: pp 16, m 24) get the LP
KEEP_MB = 4          # micro-batches at each end whose cross-rank waits it keeps (all: 4× slower)


class NodeLP:
    """``bound(fixed)``: the LP's bound in seconds on every completion of ``fixed``."""

    def __init__(self, terms, sc):
        self.sc = sc
        self.lp = None
        ops = 3 * sc.S * sc.m_sim
        if ops > V_LP_OPS:
            return
        built = build_lp(terms, keep_mb=KEEP_MB)
        if built is None:
            return
        self.lp, self.var, types = built
        self.counts = [float(t[1]) for t in types]
        n = sc.n
        self.type_of = [None] * n           # rows 1 … n−2: their type; rows 0, n−1: constants
        for k, t in enumerate(types):
            for i in t[2]:
                self.type_of[i] = k
        self.K = len(types)
        self.pinned: set = set()

    def bound(self, fixed) -> float:
        """Seconds; 0 where no LP (too large a graph, too small a table) or no optimum."""
        if self.lp is None:
            return 0.0
        S, K = self.sc.S, self.K
        now = {v for v in range(S) if fixed[v] is not None}
        for v in self.pinned - now:     # stages pinned at the last node, free here
            for k in range(K):
                self.var[k * S + v].SetBounds(0.0, self.counts[k])
        for v in now:
            a, b = fixed[v][4], fixed[v][5]
            cnt = [0] * K
            for i in range(a, b):
                k = self.type_of[i]
                if k is not None:
                    cnt[k] += 1
            for k in range(K):
                self.var[k * S + v].SetBounds(float(cnt[k]), float(cnt[k]))
        self.pinned = now
        best = solve_lp(self.lp)
        return best / SCALE * SAFETY if best > 0 else 0.0
