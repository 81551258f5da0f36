"""The CP-SAT split program of a pooled configuration: stage ``v`` priced on its own pool.

Why a subclass of ``SplitModel`` and not a flag in it: the uniform program reads one set of
row coefficients for every stage; here each stage ``v`` reads those of its pool ``q(v)``
(``Terms`` built on that pool's profile: row times, ZeRO windows, dp sync line, optimizer,
reserve, HBM), and the cut between two stages of different pools pays the link between them
(``Cluster.link``) instead of the pool's pipeline tier. Everything else — the split variables,
the ZeRO-3 exposure, the data-parallel exposure, the memory families, the 1F1B objective
``m·T + (Σ_r T_r − T) + D + O`` — is the uniform program's, family by family, with the
coefficients indexed by stage. So its optimum equals ``costmodels.model.estimate`` on the pooled plan
up to the same integer rounding, as the uniform one does (``tests/test_search_pools.py``
checks it against enumeration).

Pooled configurations run one stage per pipeline rank (vpp = 1: 1F1B or GPipe); the pools'
order along the pipeline is part of the configuration (``autopar.search.pools``).
"""
from __future__ import annotations

import math

import numpy as np

from autopar.search.split_memory import top2_rows, up
from autopar.search.split_model import SplitModel


class PoolSplitModel(SplitModel):
    """``SplitModel`` with per-stage terms ``stage_terms[v]`` and cross-pool cut times
    ``link_s[v]`` (seconds per cut position x for the cut after stage v, when it crosses)."""

    def __init__(self, stage_terms, link_s: dict, **kw):
        super().__init__(stage_terms[0], **kw)
        if self.vpp != 1:
            raise ValueError("pooled split programs have one stage per rank (vpp = 1)")
        self.ts = list(stage_terms)
        self.cos = [t.coef for t in self.ts]
        self.link_s = dict(link_s)
        self._tables: dict = {}

    # 2. per-stage sums: A_v = Pτ_q(v)[x_{v+1}] − Pτ_q(v)[x_v] -----------------------------
    def _psums(self, name: str, fn) -> list:
        out = []
        for v, co in enumerate(self.cos):
            key = (name, id(co))
            if key not in self._tables:
                pref = [0]
                for w in fn(co):
                    pref.append(pref[-1] + w)
                self._tables[key] = self._at(f"{name}{len(self._tables)}_", pref)
            at = self._tables[key]
            out.append(at[v + 1] - at[v])
        return out

    def _stage_sums(self):
        t, co0 = self.t, self.co
        self.A = self._psums("pA", lambda co: self._ns(co.row_s))
        self.Bk = self._psums("pB", lambda co: self._ns(co.bwd_window_s))
        self.Pi = self._sums("pP", [int(p) for p in np.rint(co0.params)])   # not hardware
        self.Sig = self._sums("pS", up(co0.state_bytes))
        self.U = self._sums("pU", up(co0.act_bytes))
        if t.zero3_gathers:
            self.F = self._psums("pF", lambda co: self._ns(co.fwd_window_s))
            self.Zf = self._psums("pZ", lambda co: self._ns(co.zero_fwd_s))
            self.Bz = self._psums("pBz", lambda co: self._ns(co.zero_bwd_window_s))
            self.Zb = self._psums("pZb", lambda co: self._ns(co.zero_bwd_s))
            if not co0.legacy:
                self.SF = self._psums("pSF", lambda co: self._ns(co.slowdown * co.zero_fwd_s))
                self.SB = self._psums("pSB", lambda co: self._ns(co.slowdown * co.zero_bwd_s))
        if t.dp_sync:
            self.Dt = self._psums("pD", lambda co: self._ns(co.dp_per_param_s * co.params))
            if not co0.legacy:
                self.Dt1 = self._psums("pD1", lambda co: self._ns((1.0 - co.slowdown) * co.dp_per_param_s
                                                                  * co.params))
                self.Dts = self._psums("pDs", lambda co: self._ns(co.slowdown * co.dp_per_param_s * co.params))
                self.Da = self._psums("pDa", lambda co: self._ns(co.dp_after_per_param_s * co.params))
        self.Ot = self._psums("pO", lambda co: self._ns(co.optimizer_per_param_s * co.params))
        if t.full_recompute:
            self.K = self._sums("pK", [int(b) for b in co0.is_block])

    def _point(self, name: str, table) -> list:
        key = ("pt", name)
        if key not in self._tables:
            self._tables[key] = self._at(name, self._ns(table))
        return self._tables[key]

    # 3. sends: the pool's pipeline tier, or the link at a cut between pools -----------------
    def _communication(self):
        md, S = self.model, self.S
        self.Q = [0] * S
        if self.pp > 1:
            def cut(c, v):   # the cut after stage c as stage v pays it
                if c in self.link_s:
                    return self._point(f"lk{c}_", self.link_s[c])
                return self._point(f"cp{id(self.cos[v])}_", self.cos[v].cut_p2p_s)
            for v in range(S):
                q = 0
                if v < S - 1:   # the activation out of stage v
                    q = q + cut(v, v)[v + 1]
                if v > 0:       # the gradient back into stage v
                    q = q + cut(v - 1, v)[v]
                self.Q[v] = q
        self.Z = [0] * S
        if self.t.zero3_gathers:
            for v in range(S):
                co = self.cos[v]
                big = sum(self._ns(co.zero_fwd_s)) + sum(self._ns(co.zero_bwd_s)) + 1
                zf = md.NewIntVar(0, big, f"zf{v}")
                zb = md.NewIntVar(0, big, f"zb{v}")
                if co.legacy:
                    lo_f = lo_b = 0
                else:
                    lo_f = self._point(f"ef{id(co)}_", co.zero_first_fwd_s)[v] + self.SF[v]
                    lo_b = self._point(f"eb{id(co)}_", co.zero_first_bwd_s)[v] + self.SB[v]
                md.AddMaxEquality(zf, [lo_f, self.Zf[v] - self.F[v]])
                md.AddMaxEquality(zb, [lo_b, self.Zb[v] - self.Bz[v]])
                self.Z[v] = zf + zb

    # 4. rank times (one stage per rank) -----------------------------------------------------
    def _rank_time(self):
        md = self.model
        ub = 10 ** 6
        for co in self.cos:
            ub += 2 * (sum(self._ns(co.row_s)) + 2 * sum(self._ns(co.cut_p2p_s)))
            if self.t.zero3_gathers:
                ub += sum(self._ns(co.zero_fwd_s)) + sum(self._ns(co.zero_bwd_s))
        for table in self.link_s.values():
            ub += 4 * max(self._ns(table))
        self.Tr = []
        for r in range(self.pp):
            e = md.NewIntVar(0, ub, f"T{r}")
            md.Add(e == self.A[r] + self.Q[r] + self.Z[r])
            self.Tr.append(e)
        self.T = md.NewIntVar(0, ub, "T")
        md.AddMaxEquality(self.T, self.Tr)

    # 5. data parallel: rank r's sync on its own pool's dp line ------------------------------
    def _data_parallel(self):
        md, t = self.model, self.t
        self.D = 0
        if t.dp_sync:
            ub = 2 * self.n + 4
            for co in self.cos:
                ub += (sum(self._ns(co.dp_per_param_s * co.params)) + int(round(co.dp_latency_s / self.unit))
                       + sum(self._ns(co.dp_after_per_param_s * co.params))
                       + int(co.dp_after_latency_s / self.unit) + 2)
            exposed, before = [], 0
            for r in range(self.pp):
                co = self.cos[r]
                before = before + self.Bk[r]
                e = md.NewIntVar(0, ub, f"dx{r}")
                md.AddMaxEquality(e, [0, self.Dt[r] + int(round(co.dp_latency_s / self.unit)) - before])
                if not co.legacy:
                    e = self._pool_dp_cost(r, e, ub)
                exposed.append(e)
            self.D = md.NewIntVar(0, ub, "D")
            md.AddMaxEquality(self.D, exposed)
        ub = sum(sum(self._ns(co.optimizer_per_param_s * co.params)) for co in self.cos) + 1
        self.O = md.NewIntVar(0, ub, "O")
        md.AddMaxEquality(self.O, [self.Ot[r] for r in range(self.pp)])

    def _pool_dp_cost(self, r: int, tail, ub: int):
        saved = self.co
        self.co = self.cos[r]      # SplitModel._dp_rank_cost reads the rank's coefficients
        try:
            return self._dp_rank_cost(r, tail, ub)
        finally:
            self.co = saved

    # 6. memory: every rank against its own pool's HBM ---------------------------------------
    def _memory(self):
        md, co = self.model, self.co
        w = (int(math.ceil(float(co.act_none_bytes[co.is_block].max())))
             if (self.t.full_recompute and co.is_block.any()) else 0)
        self.exprs = []
        for r in range(self.pp):
            tr = self.ts[r]
            base = int(math.ceil(tr.reserve)) + self.Sig[r] + int(tr.inflight[r]) * self.U[r]
            if w:
                base = base + w * self._has(self.K[r], f"hb{r}")
            if self.t.zero3_buffer:
                base = base + top2_rows(self, [r], r)
            self.exprs.append(base)
            md.Add(base <= int(math.floor(tr.hbm)))

    def build(self) -> PoolSplitModel:
        self._split_points()
        self._hint()
        self._stage_sums()
        self._communication()
        self._rank_time()
        self._data_parallel()
        self._memory()
        self._objective()
        return self
