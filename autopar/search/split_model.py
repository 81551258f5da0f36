"""The CP-SAT model of a plan's split points, and the integer program the search solves.

The whole integer program
=========================

Data: a layer table with rows ``i = 0 … n-1`` (embedding, blocks, head, or a user's rows), a
hardware profile (HBM per GPU, link tiers, GPUs per node), ``G`` GPUs, a global batch ``B``.

Decision variables

* the configuration ``c = (dp, tp, pp, vpp, b, zero, recompute, sp, schedule)``: integer degrees
  and switches (``autopar.search.space``) with ``dp·tp·pp = G``; ``tp | heads``, ``tp | kv_heads``,
  ``tp ≤ gpus_per_node`` unless cross-node tp is allowed; ``dp·b | B``, ``m = B/(dp·b)``
  micro-batches; ``vpp > 1`` only with the interleaved schedule, ``pp ≥ 2``,
  ``layers % (pp·vpp) = 0`` and ``m % pp = 0``; ``pp·vpp ≤ n``;
* the split points ``0 = x_0 < x_1 < … < x_S = n``, ``S = pp·vpp``: virtual stage ``v`` runs rows
  ``[x_v, x_{v+1})`` on pipeline rank ``v mod pp`` (V schedules: ranks ``v`` and ``2·pp − 1 − v``,
  ``costmodels.contracts.plan.stages_of_rank``; the V's turn sends nothing).

Coefficients: each is a field of the cost model's ``RowCoefficients``
(``costmodels.model.coefficients.row_coefficients``, whose arrays ``estimate.chunk_cost`` reads too)
for configuration ``c``, per micro-batch and GPU; ``Terms`` adds the schedule's and the GPU's:

* ``τ_i`` ``row_s``: forward + backward + recompute + TP collectives of row ``i``
  (``compute.RowTimes.row_total_s``);
* ``f_i`` ``fwd_window_s``, ``β_i`` ``bwd_window_s``: forward, and backward + recompute, compute
  time × the profile's ``overlap(zero)``, the windows ZeRO-3's gathers and the dp sync hide in;
* ``SEND[x]`` = ``GRAD[x]`` ``cut_p2p_s[x]``: the p2p of the activation leaving / the gradient
  entering a stage cut at ``x`` (``coefficients.cut_p2p``: ``boundary[x-1]·b/b0/tp``);
* ``g_i`` ``zero3_gather_s``: the ZeRO-3 all-gather of row ``i``'s weights (one per row and pass);
* ``π_i`` ``params``: parameters of row ``i`` on one GPU (``params / tp``); ``2·π_i``
  ``weight_bytes`` its weights gathered whole (ZeRO-3's buffer holds a rank's two largest rows);
* ``σ_i`` ``state_bytes``: model-state bytes (``memory.model_state_bytes``, ZeRO Table 1);
* ``α_i`` ``act_bytes``: activation bytes saved per micro-batch (``memory.activation_bytes``);
  ``w`` the full-recompute working set, the largest block's ``act_none_bytes``;
* ``λ_d`` ``dp_latency_s``, ``γ_d`` ``dp_per_param_s``: the data-parallel gradient sync's latency
  and time per parameter (``coefficients.dp_sync_line``, ``dp_sync``'s α-β line);
  ``γ_o`` ``optimizer_per_param_s``: the Adam step's (``compute.optimizer_step_s``);
* ``φ_v`` ``Terms.inflight``: micro-batches in flight in virtual stage ``v`` (``memory.in_flight``:
  GPipe ``m``, 1F1B ``pp − r``, interleaved Megatron's warm-up count); ``R`` ``Terms.reserve``
  the memory reserve; ``Terms.hbm`` the GPU's memory.

Constraints (one method of ``SplitModel`` per family; 1 and 2 in ``split_sums``, the solve in
``split_solve``):

1. ``_split_points``  ordering: ``x_v + 1 ≤ x_{v+1}``, ``x_0 = 0``, ``x_S = n`` (pinned stages fix them);
2. ``_stage_sums``    prefix sums joined to the cut variables by element constraints:
   ``A_v = Pτ[x_{v+1}] − Pτ[x_v]`` and likewise ``F_v`` (Σf), ``Bk_v`` (Σβ), ``Π_v`` (Σπ),
   ``Σ_v`` (Σσ), ``U_v`` (Σα), ``K_v`` (blocks in the stage);
3. ``_communication`` (``split_comm``)  per stage: ``Q_v = SEND[x_{v+1}]·[v < S−1] + GRAD[x_v]·[v > 0]`` (element
   constraints), ZeRO-3 exposure ``Z_v = max(0, G_v − F_v) + max(0, G_v − Bk_v)`` with ``G_v = Σg``;
4. ``_rank_time``      ``t_v = A_v + Q_v + Z_v`` (chunk time), ``T_r = Σ_{v ≡ r} t_v``, ``T = max_r T_r``;
   interleaved: ``C_c = max_r t_{c·pp+r}`` (the slowest chunk of column c), ``Ĉ = max_c C_c``;
5. ``_data_parallel`` (``split_comm``) ``D = max_r max(0, λ_d + γ_d Π_r − Σ_{r' ≤ r} Bk_{r'})`` (the sync of rank
   ``r`` hides behind its own backward and those of the ranks before it) and the optimizer step
   ``O = max_r γ_o Π_r``, where ``Π_r``, ``Bk_r`` sum over rank ``r``'s stages;
6. ``add_memory``       every GPU fits its HBM: for every rank ``r``
   ``R + Σ_{v ≡ r} (Σ_v + φ_v U_v) + 2·(two largest π_i on r, ZeRO-3 only) + w·[r holds a block]
   ≤ HBM`` — a stage's memory depends on its position through ``φ_v``; the two largest rows
   are counted exactly through per-size prefix counts (``split_memory.top2_rows``);
7. ``_objective``      minimise the step time ``P + D + O`` with the pipeline time ``P``
   (``pipeline.pipeline_time``) ``m·T + (Σ_r T_r − T)`` for vpp = 1 and ``m·Σ_c C_c + (pp − 1)·Ĉ``
   interleaved, or, for the explanation of infeasibility, the most loaded GPU's memory. The
   zero-bubble schedules (interleaved-zb, zb-v, dualpipe-v) take their pipeline time from the
   simulator's op graph instead (``autopar.search.split_schedules``) and their memory at every
   moment that may be a rank's peak (``split_memory``).

Every coefficient is rounded per row to an integer (times in units of ``time_unit``: 1 ns for
steps of seconds, finer for small models; bytes
rounded up, so a split CP-SAT accepts also fits in the evaluator). The objective CP-SAT proves optimal therefore equals
``costmodels.model.estimate`` on the returned plan up to that rounding (at most ``n/2`` units per time
term, times ``m + pp``), which the tests assert.

Why the search's result is still optimal under the model although CP-SAT sees one
configuration at a time: ``autopar.search.engine``'s docstring ("Decomposition").
"""
from __future__ import annotations

import math

from autopar.search.split_comm import add_communication, add_data_parallel, dp_rank_cost
from autopar.search.split_memory import add_memory
from autopar.search.split_result import SplitResult  # noqa: F401  (re-exported)
from autopar.search.split_schedules import SplitScheduleTime, is_split, rank_stages
from autopar.search.split_solve import SplitSolve
from autopar.search.split_stop import add_stop_cut
from autopar.search.split_sums import SplitSums, _kink_counts  # noqa: F401  (re-exported)
from autopar.search.terms import TIME_UNIT, Terms, time_unit  # noqa: F401  (re-exported)


class SplitModel(SplitSums, SplitSolve):
    """CP-SAT over the split points of one configuration (the module docstring's program)."""

    def __init__(self, terms: Terms, objective: str = "time", time_limit_s: float = 10.0,
                 workers: int = 1, fixed_stages=None, upper_bound_s: float | None = None,
                 exact: bool = False, stop_above_s: float | None = None, fits_only: bool = False,
                 wall_limit_s: float | None = None):
        from ortools.sat.python import cp_model
        self.cp = cp_model
        self.t = terms
        self.co = terms.coef      # costmodels.model.coefficients.RowCoefficients
        self.objective = objective
        # the solve's budget is CP-SAT's deterministic time (solver_limits: the same proofs on a
        # busy machine as on a quiet one); ``wall_limit_s`` caps its wall time (the deadline)
        self.time_limit_s = time_limit_s
        self.wall_limit_s = wall_limit_s
        self.workers = workers
        self.fixed_stages = fixed_stages
        self.upper_bound_s = upper_bound_s
        # stop as soon as CP-SAT proves no split does better than this (the search's next entry):
        # a valid bound is all the search needs then (``SplitResult.stopped``)
        self.stop_above_s = stop_above_s
        self.stop_lit = None        # the stop cut's assumption where it binds (split_stop)
        self.fits_only = fits_only  # objective "memory": any split under HBM, no minimum
        self.model = cp_model.CpModel()
        self.n, self.S, self.pp, self.vpp = terms.n, terms.n_virtual, terms.pp, terms.vpp
        self.unit = time_unit(terms.time_lower_bound())
        # virtual stages of each rank (V placement for zb-v / dualpipe-v: costmodels.contracts.plan)
        self.rank_stages = rank_stages(terms.config)
        # the split-backward schedules' pipeline time (autopar.search.split_schedules); the
        # objective then counts in 1/scale units
        self.sched = SplitScheduleTime(self, exact) if is_split(terms.config) else None
        self.scale = self.sched.scale if self.sched else 1

    def _ns(self, x) -> list[int]:
        u = self.unit
        return [int(round(float(v) / u)) for v in x]

    # 3., 5. communication, data parallel, optimizer: autopar.search.split_comm ------------------
    # (methods, so that pool_split's per-pool model can override them)
    def _communication(self):
        add_communication(self)

    def _data_parallel(self):
        add_data_parallel(self)

    def _dp_rank_cost(self, r: int, tail, ub: int):
        return dp_rank_cost(self, r, tail, ub)

    def _rank(self, per_stage, r):
        return sum(per_stage[v] for v in self.rank_stages[r])

    # 4. -------------------------------------------------------------------------------------
    def _rank_time(self):
        md = self.model
        co = self.co
        ub = 2 * (sum(self._ns(co.row_s)) + 2 * sum(self._ns(co.cut_p2p_s))) + 10 ** 6
        if self.t.zero3_gathers:
            ub += sum(self._ns(co.zero_fwd_s)) + sum(self._ns(co.zero_bwd_s))
        self.Tr = []
        for r in range(self.pp):
            e = md.NewIntVar(0, ub, f"T{r}")
            md.Add(e == self._rank(self.A, r) + self._rank(self.Q, r) + self._rank(self.Z, r))
            self.Tr.append(e)
        self.T = md.NewIntVar(0, ub, "T")
        md.AddMaxEquality(self.T, self.Tr)
        # redundant cut (the integer bound of Terms.rank_time_bound, in rounded units): it does not
        # change the optimum, it closes the LP gap that identical blocks leave
        cut = max(0, int(math.floor(self.t.rank_time_bound() / self.unit - self.n)))
        md.Add(self.T >= cut)
        if self.vpp > 1 and self.sched is None:
            # interleaved: C_c = max_r t_{r,c}, the slowest chunk of column c; Cmax = max_c C_c
            chunk = [self.A[s] + self.Q[s] + self.Z[s] for s in range(self.S)]
            self.C = []
            # ≥ rather than = max: the objective grows with every C_c and Ĉ, so at the optimum
            # each equals its maximum, and the LP of plain inequalities is tighter
            for c in range(self.vpp):
                cc = md.NewIntVar(0, ub, f"C{c}")
                for e in chunk[c * self.pp:(c + 1) * self.pp]:
                    md.Add(cc >= e)
                self.C.append(cc)
            self.Cmax = md.NewIntVar(0, ub, "Cmax")
            for cc in self.C:
                md.Add(self.Cmax >= cc)
            # redundant cuts (they do not change the optimum; they close the LP gap of integral
            # blocks): each rank's chunks sit in the columns, the columns hold every block
            md.Add(sum(self.C) >= self.T)
            md.Add(self.vpp * self.Cmax >= sum(self.C))
            # (not memory_blocks' floor: as a cut it made CP-SAT's proofs stall — GPT 1T,
            # dp32·pp12 vpp 6 under the k-th plan's cut: infeasible in 0.76 units without it,
            # unproved in 1.0 with it)
            col = int(math.floor(self.t.column_sum_bound() / self.unit - self.n))
            md.Add(sum(self.C) >= max(0, col))

    # 6. memory: autopar.search.split_memory -----------------------------------------------
    # 7. -------------------------------------------------------------------------------------
    def _objective(self):
        if self.objective == "memory":
            if self.fits_only:   # any split under the GPU's memory will do (``split_stop.some_split_fits``)
                self.model.Add(self.M <= int(math.floor(self.t.hbm)))
                return
            self.model.Minimize(self.M)
            return
        m, p = self.t.m, self.pp
        if self.sched is not None:   # split_schedules: the simulator's graph, × scale
            self.obj = self.sched.pipeline() + self.scale * (self.D + self.O)
        elif self.vpp == 1:   # m·T + (Σ_r T_r − T) + D + O
            self.obj = (m - 1) * self.T + sum(self.Tr) + self.D + self.O
        else:                 # m·Σ_c C_c + (pp − 1)·max_c C_c + D + O
            self.obj = m * sum(self.C) + (p - 1) * self.Cmax + self.D + self.O
        if self.upper_bound_s is not None:
            # only splits that could still enter the top k matter (the search's incumbent): with
            # this cut CP-SAT either finds one or proves none exists, usually far sooner than it
            # proves the optimum; the slack covers the integer rounding, so nothing is lost
            self.model.Add(self.obj <= int(math.floor(self.upper_bound_s * self.scale / self.unit)) + self.slack())
        add_stop_cut(self)   # the next entry as a cut too (split_stop)
        self.model.Minimize(self.obj)

    def fit_check(self) -> SplitModel:
        """The memory program of the same configuration and fixed split, stopped at its first
        split under HBM (``split_stop.some_split_fits``)."""
        return SplitModel(self.t, objective="memory", time_limit_s=min(2.0, self.time_limit_s),
                          fixed_stages=self.fixed_stages, fits_only=True)

    def slack(self) -> int:
        """Integer units by which the rounded objective may differ from the exact one (each row
        rounds by ≤ ½ unit; m steady-state terms plus pp − 1 fill terms, with room to spare; the
        split-backward schedules: ``SplitScheduleTime.slack_units``)."""
        if self.sched is not None:
            return self.sched.slack_units()
        return 4 * self.n * (self.t.m + self.pp + 2)

    def _hint(self):
        """Start from the min-max split of the row times (``costmodels.contracts.split.partition``)."""
        if self.fixed_stages is not None or self.S < 2:
            return
        from costmodels.contracts.split import partition
        try:
            st = partition([float(x) for x in self.co.row_s], self.S)
        except Exception:  # a hint only
            return
        for v in range(1, self.S):
            self.model.AddHint(self.x[v], st[v][0])

    def build(self) -> SplitModel:
        self._split_points()
        self._hint()
        self._stage_sums()
        self._communication()
        if self.objective != "memory":
            self._rank_time()
            self._data_parallel()
            from autopar.search.busiest_rank import add_floor_cuts
            add_floor_cuts(self)   # issue 30: the busiest rank's dp sync, the busiest column
        add_memory(self)
        self._objective()
        return self
