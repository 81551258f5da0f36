"""The bounds of ``zb_exact``'s branch-and-bound on a partial split (some stages fixed): what the
fixed stages imply for each rank's room under the incumbent, which values of the next cut can
still be under it, and a lower bound on every completion (the ranks' starts from the op graph's
head, their least work, the dp sync and optimizer floors, the whole op graph last).

Why apart from ``zb_stage_costs``: that module prices a *whole* split exactly (the estimate's
step time); this one only bounds, and is where the search's speed is won or lost. ``NodeBounds``
is a mixin of ``StageCosts`` and reads its prefix tables.
"""
from __future__ import annotations

import numpy as np

from costmodels.model.schedule_program import op_ends


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


class NodeBounds:
    """``StageCosts``'s bounds on partial splits (module docstring)."""

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


    def set_least_stages(self, row, fr, b_rows, wr) -> None:
        """Per stage, the least F / B / W durations and rows' work any split gives it, and the
        least p2p of its cuts (issue 30).

        Why: a free stage's least durations were one row's, over *all* rows, so the tiny
        embedding row made every free stage nearly free and the op graph at a node saw almost
        no warm-up or cool-down (pinned interleaved-zb on gpt3-175b, pp 8 vpp 12: the tree
        pruned almost nothing of its 4,656 splits). But row 0 always sits in stage 0 and row
        ``n − 1`` in stage ``S − 1``, so every other stage holds at least one *inner* row, stage 0
        at least row 0 and the last at least row ``n − 1`` (sums of non-negative row terms only
        grow); and every stage pays the p2p of its cuts (``stage``: one per side, none at the
        V's turn) at the cheapest cut at least. Where a row term can be negative, the old
        all-rows minimum stays."""
        n, S = self.n, self.S
        cut_min = min(self.cutq[1:n]) if n > 1 else 0.0
        cut_min = max(0.0, cut_min)
        self.least_f, self.least_b, self.least_w = [], [], []
        self.least_a, self.least_q = [], []
        inner = slice(1, n - 1)
        for v in range(S):
            sides = ((v < S - 1 and v != self.turn)
                     + (v > 0 and (self.turn is None or v != self.turn + 1)))
            q = sides * cut_min
            least = []
            for col in (fr, b_rows, wr, row):
                if n < 3 or (col < 0).any():
                    least.append(max(0.0, float(col.min())))
                elif v == 0:
                    least.append(float(col[0]) if S > 1 else float(col.sum()))
                elif v == S - 1:
                    least.append(float(col[n - 1]))
                else:
                    least.append(float(col[inner].min()))
            self.least_f.append(least[0])
            self.least_b.append(least[1])
            self.least_w.append(least[2])
            self.least_a.append(least[3])
            self.least_q.append(q)

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
                tfix[self.rank_of[v]] += self.least_q[v]   # its p2p is paid whatever its rows
        head_free = fixed[self.S - 1] is None
        infos = [None if free[r] else self._rank_info(r, fixed) for r in range(pp)]
        done = [info for info in infos if info is not None]
        if any(info[6] for info in done):
            return None   # a complete rank over the GPU's memory
        o_lb = max([self.o_mean] + [info[0] for info in done])
        p_max = max([self.p_mean] + [info[1] for info in done])
        extra = o_lb + max(self._data_parallel_bound(infos), self._dp_floor(p_max), self._dp_exposed_floor(p_max))
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

    def _dp_exposed_floor(self, params: float) -> float:
        """The dp sync of the rank with the most parameters (at least ``params``) that *all* the
        backward windows could hide, and no more (issue 30): ``dp_rank_cost``'s
        ``max(0, Dt + lat − before) + after`` with ``before`` at most every row's window. Where
        no backward hides the sync (interleaved-zb on gpt3-175b: windows 0) this is the whole
        sync, 0.70 s at pp 8, where ``_dp_floor`` (no hiding assumed possible to undo) gave 0.31 s
        and the nodes missed the difference until every rank was complete."""
        co = self.co
        if not self.dp:
            return 0.0
        e = max(0.0, co.dp_per_param_s * params + co.dp_latency_s - self.pBk[-1])
        if not self.legacy:
            e += co.dp_after_per_param_s * params + co.dp_after_latency_s * (params >= 1)
        return e

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
        least = [0.0] * self.pp   # the free stages' least rows' work (set_least_stages)
        for v in range(self.S):
            if fixed[v] is None:
                least[self.rank_of[v]] += self.least_a[v]
        t_rank = [tfix[r] + max(forced[r] if forced else 0.0, least[r]) for r in range(self.pp)]
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
            half_q = self.least_q[v] / 2      # F and B each carry half the stage's p2p
            dur[s] = max(self.least_f[v], self.rf * work) + half_q
            dur[s + 1] = max(self.least_b[v], self.rb * work) + half_q
            dur[s + 2] = max(self.least_w[v], self.rw * work)
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
