"""The data of one configuration's split program, and the bounds that hold for every split (the
search's best-first keys). The coefficients are the cost model's (``costmodels.model.coefficients``);
the program itself is ``autopar.search.split_model``."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES, V_SCHEDULES, stages_of_rank
from costmodels.model.coefficients import RowCoefficients, dp_exposed

TIME_UNIT = 1e-9  # seconds per integer time unit in the CP-SAT model (1 ns)


@dataclass
class Terms:
    """The data of one configuration's split program: the cost model's per-row coefficients
    (``costmodels.model.coefficients.RowCoefficients``: τ, f, β, P, g, π, σ, α, λ_d, γ_d, γ_o), the
    schedule's micro-batches and in-flight counts, and the GPU's memory limits."""
    config: object             # autopar.search.space.Config
    coef: RowCoefficients
    m: int                     # micro-batches per step
    inflight: list[int]        # φ_v per virtual stage v (memory.in_flight)
    reserve: float             # R  bytes
    hbm: float                 # bytes per GPU
    # split-backward schedules (memory.split_in_flight): per rank, the moments that may be its
    # peak, per chunk (micro-batches held, of which waiting for their W), and per row the bytes a
    # deferred W pass holds (memory.w_input_bytes)
    states: list | None = None
    w_input_bytes: np.ndarray | None = None
    # whether any split fits the GPU, per fixed split (split_stop.some_split_fits); not copied by
    # dataclasses.replace, whose new hbm may answer differently
    fits_memory: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _bounds: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # (blocks, block time) of autopar.search.memory_blocks, once the search has asked for it
    # (set_block_floor): how evenly memory lets the blocks spread
    blocks: tuple | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def pp(self) -> int:
        return self.config.pp

    @property
    def vpp(self) -> int:
        return self.config.vpp

    @property
    def n(self) -> int:
        return self.coef.n

    @property
    def n_virtual(self) -> int:
        return self.pp * self.vpp

    @property
    def split_backward(self) -> bool:
        """A zero-bubble schedule (backward split into B and W; ``split_schedules``)."""
        return self.config.schedule in SPLIT_BACKWARD_SCHEDULES and self.pp > 1

    @property
    def v_placement(self) -> bool:
        """Rank r holds stages r and 2·pp − 1 − r (``costmodels.contracts.plan.stages_of_rank``)."""
        return self.config.schedule in V_SCHEDULES and self.pp > 1

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return stages_of_rank(self.config.schedule, self.pp, self.vpp, rank)

    @property
    def zero3_buffer(self) -> bool:
        """ZeRO-3: every rank holds its two largest rows' weights whole."""
        return self.config.zero == 3

    @property
    def zero3_gathers(self) -> bool:
        """ZeRO collectives per row and micro-batch (ZeRO-3's gathers over dp > 1; under FSDP-like
        runtimes also ZeRO-2's and the per-micro-batch reduce-scatters)."""
        return self.coef.zero_collectives

    @property
    def dp_sync(self) -> bool:
        return self.config.dp > 1

    @property
    def full_recompute(self) -> bool:
        return self.config.recompute == "full"

    # ---- bounds that hold for every split -----------------------------------------------------
    def set_block_floor(self) -> None:
        """Solve ``memory_blocks``' program once; the time bounds then include its floor."""
        if self.blocks is None:
            from autopar.search.memory_blocks import block_floor
            self.blocks = block_floor(self) or (0, 0.0)
            self._bounds.clear()

    def memory_floor_s(self) -> float:
        """``b·Σ_c y_c`` of ``memory_blocks`` (0 before ``set_block_floor``): a floor on the
        slowest rank's time ``T`` (vpp = 1) or on the column sum ``Σ_c C_c`` (interleaved)."""
        if not self.blocks or not self.blocks[0]:
            return 0.0
        floor = self.blocks[0] * self.blocks[1]
        if self.pp > 1 and not self.split_backward:
            # dense (issue 30): the chunk holding a column's most blocks also sends, at least its
            # cheapest cut each way (one way in the first and last column, which stage 0 and the
            # last stage may be): GPT 1T dp32·tp8·pp12 vpp 4, + 0.35 s at 48 micro-batches
            q = 2 * float(self.coef.cut_p2p_s[1:self.n].min())
            floor += (self.vpp - 1) * q if self.vpp > 1 else q / 2
        return floor

    def time_lower_bound(self) -> float:
        """``_time_lower_bound``, computed once (the search asks for it at every level)."""
        if "time" not in self._bounds:
            self._bounds["time"] = self._time_lower_bound()
        return self._bounds["time"]

    def _time_lower_bound(self) -> float:
        """A bound on the step time that holds for every split (``autopar.search.split_model``).

        ``Σ_r T_r ≥ Στ + Q_min + Z_min`` where ``Q_min`` are the ``S − 1`` activation sends and
        gradient sends at their cheapest cut, and ``Z_min`` the ZeRO-3 exposure summed over
        stages (``Σ_v max(0, a_v) ≥ max(0, Σ_v a_v)``); ``T ≥ max(Σ_r T_r / pp, max τ)``; the
        optimizer step is at least the mean over ranks; data-parallel exposure ≥ 0."""
        S, co = self.n_virtual, self.coef
        total = float(co.row_s.sum())
        if self.pp > 1 and S > 1:   # each cut: an activation out and its gradient back, same size
            # (V placement: the turn between stages pp − 1 and pp stays on one rank, no send)
            total += (S - 1 - self.v_placement) * (2 * float(co.cut_p2p_s[1:self.n].min()))
        if self.zero3_gathers:   # Σ_v max(a_v, b_v) ≥ max(Σ a_v, Σ b_v)
            gf, gb, s_ = float(co.zero_fwd_s.sum()), float(co.zero_bwd_s.sum()), co.slowdown
            total += (max(s_ * gf, gf - float(co.fwd_window_s.sum()))
                      + max(s_ * gb, gb - float(co.zero_bwd_window_s.sum())))
        tsum = float(co.row_s.sum())
        tstar = max(total / self.pp, self.rank_time_bound(),
                    self.memory_floor_s() if self.vpp == 1 else 0.0)
        opt = co.optimizer_per_param_s * float(co.params.sum()) / self.pp
        from autopar.search import busiest_rank  # issue 30: whole blocks' floors (dense pipelines)
        if busiest_rank.dense(self):
            opt = max(opt, busiest_rank.optimizer_floor_s(self))
        if self.vpp == 1 or self.pp == 1:   # m·T + (Σ_r T_r − T)
            return self._t_and_dp_floor(self.m - 1.0, tsum, total, tstar) + total + opt
        if self.split_backward:   # the busiest rank works m·T whatever the W passes fill
            from autopar.search.zb_chain import chain_floor  # issue 30 (zbdef): one micro-batch's chain
            return max(self._t_and_dp_bound(float(self.m), tsum, total, tstar),
                       chain_floor(self, tsum, total, tstar)) + opt
        # interleaved: m·Σ_c C_c + (pp − 1)·max_c C_c with Σ_c C_c ≥ T (every column's maximum is
        # at least the slowest rank's chunk in it), Σ_c C_c ≥ column_sum_bound (whole blocks per
        # chunk) and max_c C_c ≥ max(Σ_c C_c / vpp, max τ)
        cols = max(self.column_sum_bound(), self.memory_floor_s()) * (1 - 1e-9)
        fill = (self.pp - 1) * max(max(tstar, cols) / self.vpp, float(co.row_s.max()),
                                   busiest_rank.column_max_floor_s(self))
        return self._t_and_dp_floor(float(self.m), tsum, total, tstar, floor=cols) + fill + opt

    def _t_and_dp_floor(self, a: float, tsum: float, total: float, tstar: float, floor: float = 0.0) -> float:
        """``_t_and_dp_bound``, and for the dense pipelines at least ``a·max(T*, floor)`` plus the
        busiest rank's unhidden dp sync (``busiest_rank.dp_floor_s``)."""
        from autopar.search import busiest_rank
        bound = self._t_and_dp_bound(a, tsum, total, tstar, floor=floor)
        if busiest_rank.dense(self):
            bound = max(bound, a * max(tstar, floor) + busiest_rank.dp_floor_s(self))
        return bound

    def _t_and_dp_bound(self, a: float, tsum: float, total: float, tstar: float, floor: float = 0.0) -> float:
        """A bound on ``a·T + D`` (slowest rank, dp exposure) valid for every split; with
        ``floor``, on ``a·X + D`` for any ``X ≥ max(T, floor)`` (interleaved: ``X = Σ_c C_c``).

        Rank 0's gradient sync hides only behind its own backward, so with ``y`` the row time
        (Σ τ) on rank 0 its exposure is ``D ≥ D(y) = max(0, λ + κ·(y − τ_0))``, where row 0
        (always on rank 0) enters exactly and ``κ = min_i (γ_d π_i − β_i)/τ_i`` over the rows that
        may join it (row n−1 sits on rank pp−1). Meanwhile ``T ≥ g1(y) = max(y, (Στ − y)/(pp−1))``
        and, since rank 0 adds at most ``Q0`` of p2p time to ``y`` (unbounded with ZeRO-3),
        ``T ≥ g2(y) = h(clamp(Σ/pp, y, y + Q0))`` with ``h(s) = max(s, (Σ − s)/(pp − 1))``, Σ the
        total rank time bound. Both ``a·g_k + D`` are convex piecewise linear in ``y``, so their
        minima sit at breakpoints; the bound is the larger of the two minima and of
        ``a·T* + min D``."""
        pp, co = self.pp, self.coef
        tau, params, bwd = co.row_s, co.params, co.bwd_window_s
        lat, per_param = co.dp_latency_s, co.dp_per_param_s
        if not self.dp_sync:
            return a * max(tstar, floor)
        if pp == 1:
            exact = dp_exposed(lat + per_param * float(params.sum()), float(bwd.sum()), co)
            if co.dp_after_per_param_s or co.dp_after_latency_s:
                exact += co.dp_after_latency_s + co.dp_after_per_param_s * float(params.sum())
            return a * tstar + exact
        mid = slice(1, self.n - 1)
        pos = tau[mid] > 0
        if not pos.any():
            return a * max(tstar, floor)
        kappa = float(np.min((per_param * params[mid][pos] - bwd[mid][pos]) / tau[mid][pos]))
        lo = float(tau[0])
        lam = lat + per_param * float(params[0]) - float(bwd[0])
        if self.v_placement:   # the last stage, with the head row, is rank 0's too
            lo += float(tau[-1])
            lam += per_param * float(params[-1]) - float(bwd[-1])

        def D(y):
            return max(0.0, lam + kappa * (y - lo))
        kinks = [lo, tsum]
        if kappa != 0:
            kinks.append(lo - lam / kappa)
        if self.zero3_gathers:
            q0 = float("inf")
        else:
            q0 = self.vpp * (2 * float(co.cut_p2p_s[1:self.n].max()))
        star = total / pp

        # with ``floor`` the terms are max(g_k, floor): still convex, with the kinks where g_k
        # crosses the floor added to the breakpoints
        def g1(y):
            return max(y, (tsum - y) / (pp - 1), floor)

        def g2(y):
            s_ = min(max(star, y), y + q0)
            return max(s_, (total - s_) / (pp - 1), floor)
        cross = [floor, tsum - (pp - 1) * floor, total - (pp - 1) * floor] if floor > 0 else []
        pts1 = kinks + [tsum / pp] + cross
        pts2 = kinks + [star] + ([star - q0] if q0 != float("inf") else []) + cross
        if floor > 0 and q0 != float("inf"):
            pts2.append(total - q0 - (pp - 1) * floor)
        clamp = lambda ys: [min(max(y, lo), tsum) for y in ys]  # noqa: E731
        b1 = min(a * g1(y) + D(y) for y in clamp(pts1))
        b2 = min(a * g2(y) + D(y) for y in clamp(pts2))
        b3 = a * max(tstar, floor) + min(D(lo), D(tsum))
        return max(b1, b2, b3)

    def rank_time_bound(self) -> float:
        """Integer bound on the slowest rank's time ``T`` (seconds) that every split respects.

        Rows with the most common time ``b`` (the repeated blocks, ``L`` of them) are indivisible
        units; row 0 always sits on rank 0 and row n−1 on rank pp−1 (``e``, ``h``); every other
        row is treated as divisible (fluid). ``T`` is feasible only if the ranks can hold the
        ``L`` blocks, ``Σ_r ⌊(T − pinned_r)/b⌋ ≥ L``, and the total fits, ``pp·T ≥ Στ``; the
        smallest such ``T`` is found among the candidates ``k·b + pinned_r``."""
        tau = self.coef.row_s
        n, pp = self.n, self.pp
        total = float(tau.sum())
        base = max(total / pp, float(tau.max()))
        if pp < 2 or n < 3:
            return base
        vals, counts = np.unique(np.round(tau[1:-1], 15), return_counts=True)
        b = float(vals[np.argmax(counts)])
        L = int(counts.max())
        if b <= 0 or L < 2:
            return base
        pinned = np.zeros(pp)
        pinned[0] += float(tau[0])
        pinned[0 if self.v_placement else pp - 1] += float(tau[-1])   # V: the last stage is rank 0's

        def ok(T):
            room = np.floor((T - pinned) / b + 1e-9)
            return np.all(room >= 0) and room.sum() >= L and pp * T >= total - 1e-12
        cands = sorted({k * b + p for p in set(pinned.tolist()) for k in range(0, L + 1)})
        cands = [c for c in cands if c >= base - 1e-12] + [base]
        best = None
        for c in sorted(cands):
            if ok(c):
                best = c
                break
        return max(base, best) if best is not None else base

    def column_sum_bound(self) -> float:
        """Integer bound on ``Σ_c C_c`` (interleaved: the sum over chunk columns of the slowest
        chunk in each) that every split respects.

        As in ``rank_time_bound``, the ``L`` rows of the most common time ``b`` are indivisible,
        row 0 sits in chunk (column 0, rank 0) and row n−1 in (column vpp−1, rank pp−1), other
        rows are dropped (they only add time; with none, every chunk holds a block); every chunk
        also pays its cheapest p2p sends (``q``: activation out and gradient in; the first chunk
        only the first, the last only the second). A column whose slowest chunk takes ``C`` holds
        at most ``⌊(C − q)/b⌋`` blocks per chunk (``⌊(C − pinned)/b⌋`` in a pinned one).
        The least ``C_first + C_last + (vpp − 2)·q + b·max(vpp − 2, ⌈rest/pp⌉)`` over the
        candidates ``k·b + q`` and ``k·b + pinned`` of the two pinned columns that still hold
        all ``L`` blocks is the bound."""
        tau, n, pp, v = self.coef.row_s, self.n, self.pp, self.vpp
        if pp < 2 or v < 2 or n < 3:
            return 0.0
        vals, counts = np.unique(np.round(tau[1:-1], 15), return_counts=True)
        b = float(vals[np.argmax(counts)])
        L = int(counts.max())
        if b <= 0 or L < 2:
            return 0.0
        send = grad = float(self.coef.cut_p2p_s[1:n].min())   # activation out, gradient in
        q = send + grad
        ks = np.arange(0, L + 1, dtype=float)

        def options(e):
            """(column maximum, blocks it holds) for a column with one pinned chunk whose fixed
            time (pinned row + its one p2p send) is e."""
            c = np.concatenate([ks * b + e, ks * b + q])
            c = c[c >= max(e, q) - 1e-15]
            cap = np.floor((c - e) / b + 1e-9) + (pp - 1) * np.floor((c - q) / b + 1e-9)
            return c, cap
        c0, k0 = options(float(tau[0]) + send)
        c1, k1 = options(float(tau[-1]) + grad)
        rest = L - (k0[:, None] + k1[None, :])
        every = v - 2 if L == n - 2 else 0   # every middle chunk holds a block (no other rows)
        mid = (v - 2) * q + b * np.maximum(every, np.ceil(np.maximum(rest, 0) / pp))
        # dsk (issue 27): the least column sum with every row, in order (column_sums; memoised);
        # not where every middle row is the block (L == n - 2): the bound above already sees
        # every row there, and the products cost gpt3-175b's search 0.5 s of its 2 s
        if L == n - 2:
            return float(np.min(c0[:, None] + c1[None, :] + mid))
        if "ordered_cols" not in self._bounds:
            from autopar.search.column_sums import ordered_column_sum
            self._bounds["ordered_cols"] = ordered_column_sum(self)
        return max(float(np.min(c0[:, None] + c1[None, :] + mid)), self._bounds["ordered_cols"])

    def memory_lower_bound(self) -> float:
        """A bound on the most loaded GPU's memory that holds for every split.

        LP relaxation of assigning rows to ranks (a row may be cut in pieces): for any weights
        ``λ_r ≥ 0`` with ``Σλ_r = 1``, ``M ≥ R + Σ_i min_r λ_r (σ_i + φ̂_r α_i)``, where ``φ̂_r`` is
        the smallest in-flight count among rank ``r``'s stages. The ZeRO-3 buffer (two largest
        rows of a rank) and the recompute working set are ≥ 0 and left out. The weights are the
        homogeneous optimum ``λ_r ∝ 1 / (Σσ + φ̂_r Σα)``.
        """
        pp = self.pp
        static, act = self.coef.state_bytes, self.coef.act_bytes
        phi = np.array([min(self.inflight[v] for v in self.stages_of(r)) for r in range(pp)], dtype=float)
        tot_s, tot_a = float(static.sum()), float(act.sum())
        denom = tot_s + phi * tot_a
        if np.any(denom <= 0):
            return self.reserve
        lam = 1.0 / denom
        lam /= lam.sum()
        per_row = np.min(lam[None, :] * (static[:, None] + phi[None, :] * act[:, None]), axis=1)
        return self.reserve + float(per_row.sum())


def time_unit(step_bound_s: float) -> float:
    """Seconds per integer time unit for a configuration: a power of ten that keeps the step near
    1e10 units (1 ns for steps of seconds, finer for small models), at most ``TIME_UNIT``."""
    if not step_bound_s > 0:
        return TIME_UNIT
    return min(TIME_UNIT, max(1e-13, 10.0 ** math.floor(math.log10(step_bound_s / 1e10))))
