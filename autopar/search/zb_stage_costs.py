"""Per-stage durations and the step time of a zero-bubble split, in seconds, from the cost model's
row coefficients: the data of ``zb_exact``'s branch-and-bound.

Why a float mirror of the split program (``split_model``, ``split_schedules``, ``split_comm``)
rather than ``estimate`` per split: the branch-and-bound scores thousands of splits and bounds
as many partial ones, and ``estimate`` builds a plan, its memory and its report each time. The
formulas here are the split program's, term for term, without its integer rounding:

* stage ``v`` on rows ``[a, b)``: work ``A = Στ``, p2p ``Q = P[b]·[v < S−1] + P[a]·[v > 0]``
  (none at the V's turn), exposed ZeRO collectives ``Z = max(EF[a] + s·Σgf, Σgf − Σf) + the
  same backward`` (``split_comm.add_communication``), forward ``F = ΣFr + (Q + Z)/2``, weight
  gradient ``W = Σ bwd_w``, whole backward ``A + Q + Z − F``;
* pipeline time: ``costmodels.model.pipeline_split.split_pipeline_time`` (the estimate's own);
* the exposed dp sync of each rank behind its own backward and those of the ranks before it,
  and the optimizer step (``split_comm.add_data_parallel``, ``dp_rank_cost``).

``tests/test_search_zb_exact.py`` checks ``step_time`` equal to ``estimate`` on random splits.
"""
from __future__ import annotations

import numpy as np

from autopar.search.split_schedules import periods, rank_stages
from autopar.search.zb_node_bounds import NodeBounds
from costmodels.contracts.plan import V_SCHEDULES
from costmodels.model.pipeline_split import split_pipeline_time


def cut_order(ranks, S: int) -> list[int]:
    """The order in which ``zb_exact`` fixes the cuts ``1 … S−1``: rank by rank, each rank's
    stages completed before the next rank's, so that a rank's whole work is known (and bounded
    by the cut) as early as can be: for the V schedules stage 0, S−1, then 1, S−2, ….
    A cut is taken when a stage of the rank needs it."""
    order: list[int] = []
    for vs in ranks:
        for v in vs:
            for i in (v, v + 1):
                if 0 < i < S and i not in order:
                    order.append(i)
    return order


def _prefix(a) -> list[float]:
    return [0.0] + np.cumsum(np.asarray(a, dtype=float)).tolist()


class StageCosts(NodeBounds):
    """Stage durations and step times of one split-backward configuration (module docstring)."""

    def __init__(self, terms):
        t, co, c = terms, terms.coef, terms.config
        self.schedule, self.pp, self.vpp, self.m, self.n = c.schedule, t.pp, t.vpp, t.m, t.n
        self.S = self.pp * self.vpp
        rt = co.times
        share = 1 / 3 if t.full_recompute else 1 / 2
        tp = rt.tp_fwd_s + rt.tp_bwd_s + rt.tp_recompute_s
        row = np.asarray(co.row_s, dtype=float)
        fr = np.asarray(rt.fwd_s + share * tp, dtype=float)
        wr = np.asarray(rt.bwd_w_s, dtype=float)
        self.pA, self.pFr, self.pW = _prefix(row), _prefix(fr), _prefix(wr)
        self.pBk = _prefix(co.bwd_window_s)
        self.cutq = [float(x) for x in co.cut_p2p_s]
        params = np.asarray(co.params, dtype=float)
        self.pPi = _prefix(np.rint(params))
        self.pOt = _prefix(co.optimizer_per_param_s * params)
        self.dp, self.legacy, self.co = t.dp_sync, co.legacy, co
        s_ = co.slowdown
        if self.dp:
            self.pDt = _prefix(co.dp_per_param_s * params)
            if not self.legacy:
                self.pDt1 = _prefix((1.0 - s_) * co.dp_per_param_s * params)
                self.pDts = _prefix(s_ * co.dp_per_param_s * params)
                self.pDa = _prefix(co.dp_after_per_param_s * params)
        self.zero = t.zero3_gathers
        if self.zero:
            self.pFw, self.pZf = _prefix(co.fwd_window_s), _prefix(co.zero_fwd_s)
            self.pBz, self.pZb = _prefix(co.zero_bwd_window_s), _prefix(co.zero_bwd_s)
            if not self.legacy:
                self.pSF, self.pSB = _prefix(s_ * co.zero_fwd_s), _prefix(s_ * co.zero_bwd_s)
                self.ef = [float(x) for x in co.zero_first_fwd_s]
                self.eb = [float(x) for x in co.zero_first_bwd_s]
        self.turn = self.pp - 1 if c.schedule in V_SCHEDULES else None
        self.ranks = rank_stages(c)
        self.rank_of = {v: r for r, vs in enumerate(self.ranks) for v in vs}
        self.slot_of = {v: (r * self.vpp + ch) * 3 for r, vs in enumerate(self.ranks) for ch, v in enumerate(vs)}
        per = periods(self.schedule, self.pp, self.m)
        self.m_sim = per[1] if per else self.m
        self.o_mean = self.pOt[-1] / self.pp
        self.t_floor = terms.rank_time_bound()
        # a free stage's least durations: one row's, or its least work × the rows' least ratios
        pos = row > 0
        b_rows = row - fr - wr
        self.min_f, self.min_b, self.min_w = float(fr.min()), float(max(0.0, b_rows.min())), float(wr.min())
        self.rf = float((fr[pos] / row[pos]).min()) if pos.any() else 0.0
        self.rb = float(max(0.0, (b_rows[pos] / row[pos]).min())) if pos.any() else 0.0
        self.rw = float((wr[pos] / row[pos]).min()) if pos.any() else 0.0
        self.set_least_stages(row, fr, b_rows, wr)   # issue 30: per stage, from the rows it must hold
        self.terms = terms
        self.pP = _prefix(params)
        self.p_mean = self.pP[-1] / self.pp
        self.last_rank = self.rank_of[self.S - 1]
        # the repeated block's time and, per row, how many rows before it are not such a block
        # (``_node``'s whole-block rooms hold where the rows left are blocks and the head)
        inner = row[1:-1]
        vals, counts = np.unique(inner, return_counts=True) if len(inner) else (np.array([]), np.array([]))
        self.block = float(vals[np.argmax(counts)]) if len(vals) and vals[np.argmax(counts)] > 0 else None
        self.odd = [0] + np.cumsum(row != self.block).tolist() if self.block is not None else None
        self.head_odd = bool(self.block is not None and row[-1] != self.block)
        self.order = cut_order(self.ranks, self.S)
        # memory: the estimate's per rank (zb_memory), once the search gives the tables for it
        self.memory = None        # zb_memory.RankMemory
        self._mem: dict = {}
        self._info: dict = {}
        from costmodels.model.schedule_program import program
        self._first_op = [0] * self.pp   # each rank's first op in the program of m_sim
        seen = set()
        ops = program(self.schedule, self.pp, self.vpp, self.m_sim)
        for i, o in enumerate(ops):
            if o.rank not in seen:
                seen.add(o.rank)
                self._first_op[o.rank] = i
        # the program up to the last rank's first op: enough for the ranks' starts
        self._head = tuple((o.rank, o.slot, o.waits) for o in ops[:max(self._first_op) + 1])

    # ---- one stage --------------------------------------------------------------------------
    def stage(self, v: int, a: int, b: int) -> tuple:
        """(F, whole backward, W, total work, a, b) of stage ``v`` on rows ``[a, b)``."""
        q = 0.0
        if v < self.S - 1 and v != self.turn:
            q += self.cutq[b]
        if v > 0 and (self.turn is None or v != self.turn + 1):
            q += self.cutq[a]
        z = 0.0
        if self.zero:
            gf, gb = self.pZf[b] - self.pZf[a], self.pZb[b] - self.pZb[a]
            lo_f = 0.0 if self.legacy else self.ef[a] + self.pSF[b] - self.pSF[a]
            lo_b = 0.0 if self.legacy else self.eb[a] + self.pSB[b] - self.pSB[a]
            z = max(lo_f, gf - (self.pFw[b] - self.pFw[a])) + max(lo_b, gb - (self.pBz[b] - self.pBz[a]))
        total = self.pA[b] - self.pA[a] + q + z
        f = self.pFr[b] - self.pFr[a] + (q + z) / 2
        return f, total - f, self.pW[b] - self.pW[a], total, a, b

    # ---- a whole split ----------------------------------------------------------------------
    def step_time(self, cuts: list[int]) -> float:
        """The step time of the split at ``cuts`` (``0 = cuts[0] < … < cuts[S] = n``)."""
        st = [self.stage(v, cuts[v], cuts[v + 1]) for v in range(self.S)]
        fwd = [[st[v][0] for v in vs] for vs in self.ranks]
        bwd = [[st[v][1] for v in vs] for vs in self.ranks]
        wgt = [[st[v][2] for v in vs] for vs in self.ranks]
        pipe = split_pipeline_time(self.schedule, fwd, bwd, wgt, self.m)[0]
        return pipe + self._data_parallel(st) + max(self._rank_sum(self.pOt, st, vs) for vs in self.ranks)

    def _rank_sum(self, pref, st, vs) -> float:
        return sum(pref[st[v][5]] - pref[st[v][4]] for v in vs)

    def _data_parallel(self, st) -> float:
        """``split_comm.add_data_parallel`` / ``dp_rank_cost`` in seconds: the slowest rank's."""
        if not self.dp:
            return 0.0
        co, s_ = self.co, self.co.slowdown
        worst, before = 0.0, 0.0
        for vs in self.ranks:
            before += self._rank_sum(self.pBk, st, vs)
            e = max(0.0, self._rank_sum(self.pDt, st, vs) + co.dp_latency_s - before)
            if not self.legacy:
                t1 = self._rank_sum(self.pDt1, st, vs) + (1.0 - s_) * co.dp_latency_s
                mn = min(t1, (1.0 - s_) * co.dp_bucket_s)
                head = max(e, mn + self._rank_sum(self.pDts, st, vs) + s_ * co.dp_latency_s)
                has = self._rank_sum(self.pPi, st, vs) >= 1
                e = head + self._rank_sum(self.pDa, st, vs) + co.dp_after_latency_s * has
            worst = max(worst, e)
        return worst

    def seed_cuts(self) -> list[int] | None:
        """The min-max split of the row times (``incumbents.incumbent_split``) as cuts."""
        from autopar.search.incumbents import incumbent_split
        st = incumbent_split(self.terms)
        return None if st is None else [a for a, _ in st] + [self.n]
