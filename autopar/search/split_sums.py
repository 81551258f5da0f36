"""Sections 1 and 2 of the split program (``autopar.search.split_model``'s docstring): the cut
variables and the per-stage sums of row coefficients joined to them.

Why a module of its own: these are the program's data plumbing (prefix tables as affine
expressions or element constraints), shared by the uniform program and ``pool_split``'s per-pool
one, and independent of the objective and the solve around them.
"""
from __future__ import annotations

import numpy as np

from autopar.search.split_memory import up


def _kink_counts(table: list[int]) -> list[int]:
    """``k[i]``: how many of the second differences ``table[j+2] − 2·table[j+1] + table[j]``,
    ``j < i``, are non-zero; ``table`` is affine on ``[lo, hi]`` iff ``k[hi − 1] == k[lo]``."""
    out, run = [0], 0
    for j in range(len(table) - 2):
        run += (table[j + 2] - table[j + 1]) != (table[j + 1] - table[j])
        out.append(run)
    return out


class SplitSums:
    """``SplitModel``'s cut variables (``x``, ``dom``) and stage sums (``A``, ``Bk``, ``Pi`` …)."""

    # 1. -------------------------------------------------------------------------------------
    def _split_points(self):
        n, S, md = self.n, self.S, self.model
        self.dom = [(0, 0)] + [(v, n - S + v) for v in range(1, S)] + [(n, n)]
        if self.fixed_stages is not None:
            self.dom = [(a, a) for a, _b in self.fixed_stages] + [(n, n)]
        self.x = ([md.NewConstant(0)] + [md.NewIntVar(*self.dom[v], f"x{v}") for v in range(1, S)]
                  + [md.NewConstant(n)])
        for v in range(S):
            md.Add(self.x[v] + 1 <= self.x[v + 1])

    # 2. -------------------------------------------------------------------------------------
    def _at(self, name: str, table: list[int]):
        """[table[x_v] for v = 0..S] as CP-SAT expressions.

        Where ``table`` is affine over the domain of ``x_v`` (a run of identical rows, as the
        repeated blocks of a transformer are) the expression is that affine function of ``x_v``,
        exact and linear; elsewhere an element constraint links them."""
        out = []
        kinks = _kink_counts(table)   # affine runs found once per table, not once per stage
        for v, xv in enumerate(self.x):
            if v == 0:
                out.append(table[0])
                continue
            if v == self.S:
                out.append(table[self.n])
                continue
            lo, hi = self.dom[v]
            if hi - lo < 2 or kinks[hi - 1] == kinks[lo]:
                d = table[lo + 1] - table[lo] if hi > lo else 0
                out.append(xv * d + (table[lo] - d * lo))
                continue
            seg = table[lo:hi + 1]
            var = self.model.NewIntVar(min(seg), max(seg), f"{name}{v}")
            self.model.AddElement(xv, table, var)
            out.append(var)
        return out

    def _sums(self, name: str, per_row: list[int]):
        pref = [0]
        for w in per_row:
            pref.append(pref[-1] + w)
        at = self._at(name, pref)
        return [at[v + 1] - at[v] for v in range(self.S)]

    def _stage_sums(self):
        t, co = self.t, self.co
        self.A = self._sums("pA", self._ns(co.row_s))
        self.Bk = self._sums("pB", self._ns(co.bwd_window_s))
        self.Pi = self._sums("pP", [int(p) for p in np.rint(co.params)])
        self.Sig = self._sums("pS", up(co.state_bytes))
        self.U = self._sums("pU", up(co.act_bytes))
        if t.zero3_gathers:
            self.F = self._sums("pF", self._ns(co.fwd_window_s))
            self.Zf = self._sums("pZ", self._ns(co.zero_fwd_s))
            self.Bz = self._sums("pBz", self._ns(co.zero_bwd_window_s))
            self.Zb = self._sums("pZb", self._ns(co.zero_bwd_s))
            if not co.legacy:
                self.SF = self._sums("pSF", self._ns(co.slowdown * co.zero_fwd_s))
                self.SB = self._sums("pSB", self._ns(co.slowdown * co.zero_bwd_s))
        if t.dp_sync:
            self.Dt = self._sums("pD", self._ns(co.dp_per_param_s * co.params))
            if not co.legacy:
                s_ = co.slowdown
                self.Dt1 = self._sums("pD1", self._ns((1.0 - s_) * co.dp_per_param_s * co.params))
                self.Dts = self._sums("pDs", self._ns(s_ * co.dp_per_param_s * co.params))
                self.Da = self._sums("pDa", self._ns(co.dp_after_per_param_s * co.params))
        self.Ot = self._sums("pO", self._ns(co.optimizer_per_param_s * co.params))
        if t.full_recompute:
            self.K = self._sums("pK", [int(b) for b in co.is_block])

    def _has(self, expr, name):
        """Boolean ⇔ expr ≥ 1 (expr a non-negative integer expression)."""
        b = self.model.NewBoolVar(name)
        self.model.Add(expr >= 1).OnlyEnforceIf(b)
        self.model.Add(expr == 0).OnlyEnforceIf(b.Not())
        return b
