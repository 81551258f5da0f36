"""The solve of a split program (``autopar.search.split_model``): CP-SAT's parameters, the stop
at the search's next entry, and the answer as a ``SplitResult`` with its proved bound.

Why a module of its own: how CP-SAT is run and how its status becomes a bound the search can
trust (less the rounding slack) is separate from what the program states.
"""
from __future__ import annotations

import time

from autopar.search.solver_limits import set_limits
from autopar.search.split_result import SplitResult
from autopar.search.split_stop import cut_bound, stop_limit, stop_when_bound_passes, stopped_by_cut


class SplitSolve:
    """``SplitModel.solve`` and the reading of its answer."""


    def solve(self) -> SplitResult:
        t0 = time.perf_counter()
        self.build()
        solver = self.cp.CpSolver()
        set_limits(solver, self.time_limit_s, self.wall_limit_s)
        from autopar.search.probing_budget import allow_load_probing
        allow_load_probing(solver)   # moespeed: the budget counts search, not load-time probing
        from autopar.search.probing_budget import skip_load_probing
        skip_load_probing(self, solver)   # hint: and the dense programs skip that probing
        solver.parameters.num_workers = self.workers
        # CP-SAT's presolve expands the exact domains of the large-coefficient linear expressions
        # (nanoseconds, bytes) into thousands of intervals and can spend seconds there; the model
        # is small and linear, so search it directly (milliseconds).
        solver.parameters.cp_model_presolve = False
        # full linearisation of the max constraints: a tighter LP bound proves the split optimal
        # several times faster on the memory-bound interleaved configurations
        solver.parameters.linearization_level = 2
        if self.sched is not None:
            # the zero-bubble op graphs: thousands of max-plus rows; level 1 proves "no split
            # beats the k-th plan" 3-6× faster there (gpt3-175b, pp 16, m 24: 0.8 s vs 2.4-4.5 s)
            solver.parameters.linearization_level = 1
        # CP-SAT's own SIGINT handler would end this solve early and let the search go on and
        # write its file; leave Ctrl-C to Python, which stops the whole command (autopar.cli.main)
        solver.parameters.catch_sigint_signal = False
        stopped = stop_when_bound_passes(self, solver)
        from autopar.search.reached_bound import callback  # issue 30: a split at the level-1 bound
        reach = callback(self)
        code = solver.Solve(self.model, reach) if reach is not None else solver.Solve(self.model)
        wall = time.perf_counter() - t0
        res = self._result(solver, code, stopped, wall, t0)
        if reach is not None and self.reached is not None:   # optimal: no split beats the bound
            res = SplitResult("optimal", self.reached[0], self.reached[1], wall, self.reach[1],
                              slack_s=self.slack() * self.unit / self.scale)
        res.det_s = float(solver.response_proto.deterministic_time)
        return res

    def _result(self, solver, code, stopped: list, wall: float, t0: float) -> SplitResult:
        cp = self.cp
        if code in (cp.OPTIMAL, cp.FEASIBLE):
            xs = [int(solver.Value(x)) for x in self.x]
            stages = tuple((xs[v], xs[v + 1]) for v in range(self.S))
            bound = None
            if self.objective == "memory":
                obj = float(solver.Value(self.M))
            else:
                obj = solver.ObjectiveValue() * self.unit / self.scale
                # CP-SAT's proved bound, less the rounding slack: no split does better than this
                best = cut_bound(self, max([solver.BestObjectiveBound()] + stopped))
                bound = (best - self.slack()) * self.unit / self.scale
            return SplitResult("optimal" if code == cp.OPTIMAL else "feasible", stages, obj, wall, bound,
                               bound_only=self.sched is not None and self.sched.bound_only,
                               slack_s=self.slack() * self.unit / self.scale,
                               stopped=code != cp.OPTIMAL and bool(stopped))
        if code == cp.INFEASIBLE:
            if stopped_by_cut(self, solver):   # every split is above the cut: after the next entry
                bound = (stop_limit(self) + 1 - self.slack()) * self.unit / self.scale
                return SplitResult("unknown", None, None, time.perf_counter() - t0, bound, stopped=True)
            return SplitResult("infeasible", None, None, time.perf_counter() - t0)
        bound = None
        if self.objective != "memory":
            bound = (cut_bound(self, solver.BestObjectiveBound()) - self.slack()) * self.unit / self.scale
        if stopped and bound is not None:   # the bound that stopped it, should the final one lag
            bound = max(bound, (cut_bound(self, stopped[0]) - self.slack()) * self.unit / self.scale)
        return SplitResult("unknown", None, None, wall, bound, stopped=bool(stopped))
