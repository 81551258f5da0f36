"""The split program's stop cut: the search's next entry as a bound a solve need not beat.

The search (``autopar.search.frontier``) hands each split solve ``stop_above_s``, the step time
of the next entry on its heap: once every split of the configuration is proved slower, the
configuration can wait, at that bound (``SplitResult.stopped``). Two mechanisms end such a solve
early, kept apart from the program's time and memory sections (``split_model``) as the
communication family is (``split_comm``); each function takes the model ``sm``:

* **a cut** (``add_stop_cut``): ``objective ≤ limit`` under an assumption literal. A split at or
  under it has the same optimum; none there is an infeasibility CP-SAT proves far sooner than a
  bound climbing past it (GPT 1T, dp24·tp8·pp16 vpp4: 0.07 s against 13 s). Added only where it
  is tighter than the k-th plan's cut (``upper_bound_s``), so that an infeasibility means "after
  the next entry", not "out of the top k". CP-SAT's core names the literal even when memory alone
  is infeasible (ortools 9.15, with an objective), so ``stopped_by_cut`` also asks whether any
  split fits the GPU (``some_split_fits``): a configuration none fits is dropped, not deferred at
  ever higher bounds;
* **a bound callback** (``stop_when_bound_passes``): the solve ends once CP-SAT's proved bound
  passes the limit.

``limit`` is ``stop_above_s`` in integer units, a whole unit above it once the slack is off, so a
bound reported from it sorts strictly after the next entry.
"""
from __future__ import annotations

import math


def stop_limit(sm) -> int:
    """``stop_above_s`` in the program's integer units (module docstring)."""
    return math.ceil(sm.stop_above_s * sm.scale / sm.unit) + sm.slack() + 1


def add_stop_cut(sm) -> None:
    """The cut on ``sm.obj`` under the assumption ``sm.stop_lit`` where it binds (module
    docstring); ``sm.stop_lit`` stays None where it does not."""
    if sm.stop_above_s is None or sm.objective == "memory":
        return
    limit = stop_limit(sm)
    if sm.upper_bound_s is not None and limit >= math.floor(sm.upper_bound_s * sm.scale / sm.unit) + sm.slack():
        return
    sm.stop_lit = sm.model.NewBoolVar("stop_cut")
    sm.model.Add(sm.obj <= limit).OnlyEnforceIf(sm.stop_lit)
    sm.model.AddAssumptions([sm.stop_lit])


def cut_bound(sm, b: float) -> float:
    """CP-SAT's bound ``b`` (integer units), valid for every split: under the cut it holds for the
    splits inside it, and those outside are above the limit, so it counts only up to limit + 1."""
    return b if sm.stop_lit is None else min(b, stop_limit(sm) + 1)


def stopped_by_cut(sm, solver) -> bool:
    """Whether an INFEASIBLE answer means "every split sorts after the next entry" (module
    docstring) rather than "no split fits" or "none beats the k-th plan"."""
    return (sm.stop_lit is not None and sm.stop_lit.Index() in solver.SufficientAssumptionsForInfeasibility()
            and some_split_fits(sm))


def some_split_fits(sm) -> bool:
    """Whether any split fits the GPU's memory: the memory program stopped at its first split
    under HBM, once per configuration and fixed split (cached on the terms). Not proved in time:
    assumed to fit (deferred, as safe)."""
    cache = sm.t.fits_memory
    if sm.fixed_stages not in cache:
        from autopar.search.split_fits import certified_fit, fits  # dense: a fitting split, no CP-SAT
        uniform = not hasattr(sm, "ts")   # not a pooled program (pool_split: memory per pool)
        if uniform and (fits(sm.t, sm.fixed_stages) if sm.fixed_stages is not None else certified_fit(sm.t)):
            cache[sm.fixed_stages] = True
            return True
        cache[sm.fixed_stages] = sm.fit_check().solve().status != "infeasible"
    return cache[sm.fixed_stages]


def stop_when_bound_passes(sm, solver) -> list:
    """With ``stop_above_s``, end the solve once CP-SAT's proved bound (less the rounding slack,
    as ``SplitResult.bound_s``) exceeds it; the returned list is non-empty then."""
    stopped: list = []
    if sm.stop_above_s is None or sm.objective == "memory":
        return stopped
    limit = stop_limit(sm)

    def on_bound(b: float) -> None:
        if b > limit and not stopped:
            stopped.append(b)
            solver.stop_search()
    solver.best_bound_callback = on_bound
    return stopped
