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
from costmodels.contracts.plan import V_SCHEDULES
from costmodels.model.pipeline_split import split_pipeline_time
from costmodels.model.schedule_program import op_ends


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


def first_op_ends(head, pp: int, dur: list[float]) -> list[float]:
    """``schedule_program.op_ends`` over a prefix of the program (``(rank, slot, waits)`` rows)."""
    free = [0.0] * pp
    ends: list[float] = []
    for r, slot, waits in head:
        t = free[r]
        for i in waits:
            if ends[i] > t:
                t = ends[i]
        t += dur[slot]
        ends.append(t)
        free[r] = t
    return ends


def _prefix(a) -> list[float]:
    return [0.0] + np.cumsum(np.asarray(a, dtype=float)).tolist()


class StageCosts:
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

    def _rank_info(self, r: int, fixed) -> tuple:
        """A complete rank's sums, kept per (rank, stages): optimizer step, parameters, backward
        window, dp sync, the dp terms no backward hides (``dp_rank_cost``: its head less the
        tail, and the after-part), and whether it is over the GPU's memory."""
        vs = self.ranks[r]
        key = (r,) + tuple(fixed[v][4] * (self.n + 1) + fixed[v][5] for v in vs)
        got = self._info.get(key)
        if got is not None:
            return got
        part = lambda pref: self._sum(pref, fixed, vs)  # noqa: E731
        head = after = bk = dt = 0.0
        if self.dp:
            co, s_ = self.co, self.co.slowdown
            bk, dt = part(self.pBk), part(self.pDt)
            if not self.legacy:
                mn = min(part(self.pDt1) + (1.0 - s_) * co.dp_latency_s, (1.0 - s_) * co.dp_bucket_s)
                head = mn + part(self.pDts) + s_ * co.dp_latency_s
                after = part(self.pDa) + co.dp_after_latency_s * (part(self.pPi) >= 1)
        got = self._info[key] = (part(self.pOt), part(self.pP), bk, dt, head, after,
                                 self.over_memory(r, fixed))
        return got

    def _data_parallel_bound(self, infos) -> float:
        """A lower bound on ``_data_parallel`` from the complete ranks (``infos[r]``, None where
        free): exact where every rank up to it is complete; else the terms no backward hides."""
        if not self.dp:
            return 0.0
        lat = self.co.dp_latency_s
        worst, before, known = 0.0, 0.0, True
        for info in infos:
            if info is None:
                known = False
                continue
            before += info[2]
            e = max(0.0, info[3] + lat - before) if known else 0.0
            if not self.legacy:
                e = max(e, info[4]) + info[5]
            worst = max(worst, e)
        return worst

    def seed_cuts(self) -> list[int] | None:
        """The min-max split of the row times (``incumbents.incumbent_split``) as cuts."""
        from autopar.search.incumbents import incumbent_split
        st = incumbent_split(self.terms)
        return None if st is None else [a for a, _ in st] + [self.n]

    # ---- partial splits (zb_exact's nodes) ------------------------------------------------------
    def _node(self, fixed, upper, starts=None):
        """What a node's fixed stages (``fixed[v]`` not None) imply: per rank its fixed work, its
        free stages, the most work its free stages can take under ``upper`` (``cap``; whole
        blocks where the free rows are blocks and the head) and the least they must
        (``forced``); the dp sync and optimizer floors; None where no completion is under ``upper``."""
        pp = self.pp
        tfix, free = [0.0] * pp, [0] * pp
        left, odd_free = self.pA[self.n], self.odd[self.n] if self.odd else 0
        for v in range(self.S):
            st = fixed[v]
            if st is not None:
                tfix[self.rank_of[v]] += st[3]
                left -= self.pA[st[5]] - self.pA[st[4]]
                if self.odd:
                    odd_free -= self.odd[st[5]] - self.odd[st[4]]
            else:
                free[self.rank_of[v]] += 1
        head_free = fixed[self.S - 1] is None
        infos = [None if free[r] else self._rank_info(r, fixed) for r in range(pp)]
        done = [info for info in infos if info is not None]
        if any(info[6] for info in done):
            return None   # a complete rank over the GPU's memory
        o_lb = max([self.o_mean] + [info[0] for info in done])
        p_max = max([self.p_mean] + [info[1] for info in done])
        extra = o_lb + max(self._data_parallel_bound(infos), self._dp_floor(p_max))
        if upper == float("inf"):
            return tfix, free, float("inf"), left, None, None, extra
        t_ub = (upper - extra) / self.m * (1 + 1e-9)
        blocks = self.block is not None and odd_free == (1 if head_free and self.head_odd else 0)
        cap = [0.0] * pp
        for r in range(pp):
            if not free[r]:
                continue
            # the rank works m·T_r after its first op starts: T_r ≤ (upper − extra − start_r)/m
            room = (t_ub if starts is None else min(t_ub, (upper - extra - starts[r]) / self.m * (1 + 1e-9))) - tfix[r]
            if not blocks:
                cap[r] = room
                continue
            holds = head_free and r == self.last_rank and self.head_odd
            head = self.pA[self.n] - self.pA[self.n - 1] if holds else 0.0
            nb = int(np.floor((room - head) / self.block + 1e-9))
            if nb < free[r] - holds or room < head:
                return None      # its free stages cannot each take a row under the cut
            cap[r] = nb * self.block + head
        total_cap = sum(cap)
        if total_cap < left - 1e-12 * self.pA[self.n]:
            return None
        forced = [max(0.0, left - (total_cap - cap[r])) if free[r] else 0.0 for r in range(pp)]
        return tfix, free, t_ub, left, cap, forced, extra

    def over_memory(self, r: int, fixed) -> bool:
        """Whether rank r, its stages fixed, is over its GPU's memory in the estimate."""
        if self.memory is None:
            return False
        rng = [(fixed[v][4], fixed[v][5]) for v in self.ranks[r]]
        key = (r, tuple(rng))
        got = self._mem.get(key)
        if got is None:
            got = self._mem[key] = self.memory.total(r, rng) > self.memory.hbm
        return got

    def _sum(self, pref, fixed, vs) -> float:
        return sum(pref[fixed[v][5]] - pref[fixed[v][4]] for v in vs)

    def _dp_floor(self, params: float) -> float:
        """The dp cost of a rank of ``params`` parameters that no backward hides (``dp_rank_cost``
        less its tail): increasing in ``params``, so the slowest rank's is at least the one of the
        rank with most parameters."""
        co, s_ = self.co, self.co.slowdown
        if not self.dp or self.legacy:
            return 0.0
        g = co.dp_per_param_s * params
        mn = min((1.0 - s_) * g + (1.0 - s_) * co.dp_latency_s, (1.0 - s_) * co.dp_bucket_s)
        return (mn + s_ * g + s_ * co.dp_latency_s + co.dp_after_per_param_s * params
                + co.dp_after_latency_s * (params >= 1))

    def children(self, x: list, fixed: list, i: int, upper: float) -> list[int]:
        """The values of cut ``i`` (its neighbours in ``x`` fixed or None) that can still be under
        ``upper``, nearest the even share of the rows between its fixed neighbours first."""
        lo_i = max(j for j in range(i) if x[j] is not None)
        hi_i = min(j for j in range(i + 1, self.S + 1) if x[j] is not None)
        lo, hi = x[lo_i] + (i - lo_i), x[hi_i] - (hi_i - i)
        node = self._node(fixed, upper)
        if node is None:
            return []
        _, free, _, _, cap, forced, _ = node
        xs = range(lo, hi + 1)
        if cap is not None:   # a stage this cut completes must fit its rank's room
            for v, a_fixed in ((i - 1, lo_i == i - 1), (i, hi_i == i + 1)):
                if not a_fixed:
                    continue
                r = self.rank_of[v]
                least = forced[r] * (1 - 1e-9) - 1e-15 if free[r] == 1 else -1.0
                most = cap[r] * (1 + 1e-12)
                if v == i - 1:   # stage i−1 = [x[i−1], y)
                    xs = [y for y in xs if least <= self.pA[y] - self.pA[x[i - 1]] <= most]
                else:            # stage i = [y, x[i+1])
                    xs = [y for y in xs if least <= self.pA[x[i + 1]] - self.pA[y] <= most]
        share = (self.pA[x[hi_i]] - self.pA[x[lo_i]]) / (hi_i - lo_i)
        return sorted(xs, key=lambda y: abs(self.pA[y] - self.pA[x[lo_i]] - share * (i - lo_i)))

    def node_bound(self, fixed: list, upper: float) -> float:
        """A lower bound on the step time of every completion of the fixed stages (``zb_exact``):
        the cheap path bounds first (each rank's start + its work), the rooms tightened by the
        ranks' starts, and the whole op graph last, each only while the ones before left the node
        under ``upper``."""
        node = self._node(fixed, upper)
        if node is None:
            return float("inf")
        bound, dur, t_lb = self._path_bound(node, fixed, upper)
        if node[4] is None or bound >= upper:
            return bound
        node = self._node(fixed, upper, self._starts)   # rooms tightened by each rank's start
        if node is None:
            return float("inf")
        b2, dur, t_lb = self._path_bound(node, fixed, upper)
        bound = max(bound, b2)
        if bound >= upper:
            return bound
        ms = max(op_ends(self.schedule, self.pp, self.vpp, self.m_sim, dur))
        return max(bound, max(ms, self.m_sim * t_lb) + (self.m - self.m_sim) * t_lb + node[6])

    def _path_bound(self, node, fixed, upper: float):
        """(bound, least durations, T's floor) of a node: ``max_r(s_r + m_sim·T_r)`` with ``s_r``
        the start of rank r's first op (the op graph up to the last first op, least durations)."""
        tfix, free, t_ub, left, cap, forced, extra = node
        level = self._water_level(sorted(tfix[r] for r in range(self.pp) if free[r]), left)
        t_rank = [tfix[r] + (forced[r] if forced else 0.0) for r in range(self.pp)]
        t_lb = max(max(t_rank), level, self.t_floor)
        cheap = self.m * t_lb + extra
        if cheap >= upper or t_lb > t_ub:
            return max(cheap, upper), None, t_lb
        dur = [0.0] * (3 * self.S)
        for v in range(self.S):
            s = self.slot_of[v]
            if fixed[v] is not None:
                f, bw, w = fixed[v][0], fixed[v][1], fixed[v][2]
                dur[s], dur[s + 1], dur[s + 2] = f, bw - w, w
                continue
            r = self.rank_of[v]
            work = forced[r] if forced and free[r] == 1 else 0.0
            dur[s] = max(self.min_f, self.rf * work)
            dur[s + 1] = max(self.min_b, self.rb * work)
            dur[s + 2] = max(self.min_w, self.rw * work)
        ends = first_op_ends(self._head, self.pp, dur)
        self._starts = [ends[i] - dur[self._head[i][1]] for i in self._first_op]
        ms = max(self._starts[r] + self.m_sim * t_rank[r] for r in range(self.pp))
        return max(ms, self.m_sim * t_lb) + (self.m - self.m_sim) * t_lb + extra, dur, t_lb

    @staticmethod
    def _water_level(levels: list[float], amount: float) -> float:
        """The least ``L`` with ``Σ max(0, L − levels_i) ≥ amount`` (``levels`` sorted)."""
        if not levels:
            return 0.0
        filled = 0.0
        for i, x in enumerate(levels):
            nxt = levels[i + 1] if i + 1 < len(levels) else float("inf")
            cap = (nxt - x) * (i + 1)
            if filled + cap >= amount:
                return x + (amount - filled) / (i + 1)
            filled += cap
        return levels[-1]
