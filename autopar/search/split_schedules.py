"""The split program's pipeline time for the split-backward schedules (interleaved-zb, zb-v,
dualpipe-v): the simulator's own op graph, as CP-SAT constraints.

Why a module of its own: the estimate prices these schedules by simulating them
(``costmodels.model.pipeline_split``), not by a formula in rank totals or column maxima::

    m ≤ m1:  P = makespan(m)
    m > m1:  P = makespan(m1) + (m − m1)/p · max(Δ, p·T),   Δ = makespan(m1) − makespan(m0)

(``p`` the schedule's period, ``m0 = 2p``, ``m1 = 3p``, ``T`` the busiest rank's work for one
micro-batch), where ``makespan`` is the longest path through the simulator's op graph
(``costmodels.model.schedule_program.program``: torch's per-rank order, each op waiting for the one
before it on its rank and for the outputs it needs). The graph depends only on (schedule, pp,
vpp, m); its op durations — F, B (input gradient) and W (weight gradient) of each virtual
stage — are sums over the stage's rows, linear in the split points. So each op gets an end time
``e_o ≥ e_prev + d_o``, ``e_o ≥ e_w + d_o`` for every op ``w`` it waits on, and ``M ≥ e_o``:
minimised, ``M`` is exactly the longest path, the simulator's makespan.

Durations mirror ``costmodels.model.estimate`` (``_fwd_total`` / ``_bwd_total`` / ``bwd_w_s``): a
stage's forward is its rows' forward compute plus their share of the TP collectives (½, ⅓ with
full recompute) plus half its p2p sends and half its exposed ZeRO time; its W the rows'
weight-gradient compute; its B the rest of the stage's time. The halves make the program count in
half units (``scale = 2``).

``Δ`` enters with ``makespan(m0)`` negated, which inequalities cannot minimise. The fast program
(``exact=False``) therefore minimises the lower bound ``makespan(m1) + (m − m1)·T``, which is
the estimate wherever the steady state is rank-bound (``Δ ≤ p·T``: the V schedules settle there,
interleaved-zb nearly always); the search evaluates its split and, only when the estimate is
above that bound, solves again with ``exact=True``: ``makespan(m0)`` as equalities
(``AddMaxEquality`` per op) and the ``max`` itself, scaled by ``2p``.
"""
from __future__ import annotations

from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES, stages_of_rank


def is_split(config) -> bool:
    return config.schedule in SPLIT_BACKWARD_SCHEDULES and config.pp > 1


def periods(schedule: str, pp: int, m: int) -> tuple[int, int, int] | None:
    """``(m0, m1, period)`` of ``costmodels.model.pipeline_split``'s extrapolation, or None when it
    simulates all ``m`` micro-batches (``m ≤ m1``). Mirrors ``split_pipeline_time``."""
    from costmodels.model.schedule_program import period
    per = period(schedule, pp, m)
    if m <= 3 * per:
        return None
    return 2 * per, 3 * per, per


def rank_stages(config) -> list[tuple[int, ...]]:
    """The virtual stages of each pipeline rank (``costmodels.contracts.plan.stages_of_rank``)."""
    return [stages_of_rank(config.schedule, config.pp, config.vpp, r) for r in range(config.pp)]


class SplitScheduleTime:
    """Builds the pipeline-time part of the objective on a ``SplitModel`` (``sm``) whose stage
    sums (``A``, ``Q``, ``Z``) and rank times (``Tr``, ``T``) exist."""

    def __init__(self, sm, exact: bool = False):
        self.sm = sm
        self.exact = exact
        c = sm.t.config
        self.schedule, self.pp, self.vpp, self.m = c.schedule, c.pp, c.vpp, sm.t.m
        self.per = periods(self.schedule, self.pp, self.m)
        self.scale = 2 * (self.per[2] if (exact and self.per) else 1)
        self.bound_only = bool(self.per) and not exact   # the objective: a lower bound (docstring)

    # per-stage durations, in half units --------------------------------------------------------
    def _durations(self):
        sm, co = self.sm, self.sm.co
        rt = co.times
        share = 1 / 3 if sm.t.full_recompute else 1 / 2
        tp = rt.tp_fwd_s + rt.tp_bwd_s + rt.tp_recompute_s
        f_rows = sm._sums("pF2", sm._ns(2.0 * (rt.fwd_s + share * tp)))
        w_rows = sm._sums("pW2", sm._ns(2.0 * rt.bwd_w_s))
        self.F, self.B, self.W = [], [], []
        for v in range(sm.S):
            total2 = 2 * (sm.A[v] + sm.Q[v] + sm.Z[v])
            f2 = f_rows[v] + sm.Q[v] + sm.Z[v]
            self.F.append(f2)
            self.W.append(w_rows[v])
            self.B.append(total2 - f2 - w_rows[v])

    def _graph(self, m: int, name: str, exact: bool):
        """The longest path through the op graph of ``m`` micro-batches: an integer variable
        ``M`` equal to the simulator's makespan at the optimum (``exact``: always).

        An op only gets a variable where it waits for another rank: a wait on its own rank is
        implied by the rank's order, and an op that waits for nothing else ends ``d`` after the
        one before it (an expression, no variable) — W passes always, most of the V's turn."""
        from costmodels.model.schedule_program import program
        md = self.sm.model
        stages = rank_stages(self.sm.t.config)
        ops = program(self.schedule, self.pp, self.vpp, m)
        ub = self.ub * m
        kinds = {"F": self.F, "B": self.B, "W": self.W}
        ends, last = [], [0] * self.pp
        for i, o in enumerate(ops):
            d = kinds[o.kind][stages[o.rank][o.chunk]]
            waits = [ends[w] for w in o.waits if ops[w].rank != o.rank]
            if not waits:
                e = last[o.rank] + d
            elif exact:
                s = md.NewIntVar(0, ub, f"{name}s{i}")
                md.AddMaxEquality(s, waits + [last[o.rank]])
                e = md.NewIntVar(0, ub, f"{name}e{i}")
                md.Add(e == s + d)
            else:
                e = md.NewIntVar(0, ub, f"{name}e{i}")
                md.Add(e >= last[o.rank] + d)
                for w in waits:
                    md.Add(e >= w + d)
            ends.append(e)
            last[o.rank] = e
        M = md.NewIntVar(0, ub, f"{name}M")
        # redundant cut (the busiest rank works m·T however its ops interleave): it ties the LP
        # bound to the integral rank-time cut of SplitModel._rank_time
        md.Add(M >= 2 * m * self.sm.T)
        if exact:
            md.AddMaxEquality(M, last)
        else:
            for x in last:
                md.Add(M >= x)
        return M

    def pipeline(self):
        """The pipeline time × ``scale`` as a CP-SAT expression (module docstring)."""
        sm = self.sm
        self._durations()
        self.ub = 2 * (sum(sm._ns(sm.co.row_s)) + 2 * sum(sm._ns(sm.co.cut_p2p_s)) + sm.n) + 10 ** 6
        if sm.t.zero3_gathers:
            self.ub += 2 * (sum(sm._ns(sm.co.zero_fwd_s)) + sum(sm._ns(sm.co.zero_bwd_s)))
        self.ub *= self.vpp
        if self.per is None:
            return self._graph(self.m, "g", False)
        m0, m1, p = self.per
        M1 = self._graph(m1, "g1", False)
        rest = (self.m - m1) * 2 * sm.T
        if not self.exact:
            return M1 + rest
        M0 = self._graph(m0, "g0", True)
        X = sm.model.NewIntVar(0, self.ub * m1 * p, "zbX")
        sm.model.AddMaxEquality(X, [M1 - M0, p * 2 * sm.T])
        return p * M1 + (self.m - m1) * X

    def slack_units(self) -> int:
        """Units of ``scale`` by which the rounded objective may differ from the exact one: every
        row of every op's stage rounds by ≤ ½ unit (three coefficients a row), along a path of at
        most every op of the graph."""
        m_sim = self.per[1] if self.per else self.m
        ops = 3 * self.pp * self.vpp * m_sim
        return self.scale * (2 * self.sm.n * (ops + self.m + self.pp + 2))
