"""End a split solve at the first split whose step time reaches the configuration's level-1 bound.

Why: with the whole-block floors (``busiest_rank``) the split-independent bound of a dense
configuration often equals its optimum (GPT 1T dp32·tp8·pp12 vpp 3 / 4 / 6: 71.288, 70.7077,
70.2437 s, bound and optimum alike), but CP-SAT does not know that bound exactly (its cut is
rounded down past the program's rounding, ``add_floor_cuts``), so after finding the optimal split
it went on proving it (0.4–0.9 units each).

Exact: the bound (``Terms.time_lower_bound``) holds for the estimate of every split, so a split
whose estimate (``costmodels.model.estimate``, the search's evaluator) is at or under it (to the
search's tie tolerance, ``TIE``) is optimal; ties stay ties. The frontier hands the evaluator and
the bound to the program (``watch``); ``callback`` is the solution callback ``SplitSolve.solve``
passes to CP-SAT.
"""
from __future__ import annotations

# the floors sit 1e-9 under their exact values (busiest_rank.FLOAT_MARGIN), so a split at the
# bound prices up to this much above it; the search ranks keys this close as ties
# (frontier_keys._ties), and CP-SAT's own "optimal" is exact only to its rounding slack
# (4·n·(m + pp + 2) units: 57 µs on GPT 1T against 1e-9 · 70 s = 70 ns here)
TIE = 1e-9


def watch(model, c, terms, evaluate) -> None:
    """Let ``model`` (a dense ``SplitModel`` of configuration ``c``) stop at a split whose
    evaluated step time is at or under ``terms.time_lower_bound()``."""
    if terms.split_backward or model.fixed_stages is not None or model.objective != "time":
        return
    model.reach = (c, terms.time_lower_bound(), evaluate)


def callback(sm):
    """A CP-SAT solution callback for ``sm`` (None where it does not watch): it records the
    first split that reaches the bound in ``sm.reached`` and stops the search."""
    reach = getattr(sm, "reach", None)
    if reach is None:
        return None
    c, bound, evaluate = reach
    sm.reached = None

    class Reach(sm.cp.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if sm.reached is not None:
                return
            xs = [int(self.Value(x)) for x in sm.x]
            stages = tuple((xs[v], xs[v + 1]) for v in range(sm.S))
            try:
                pred = evaluate(c.plan(stages))
            except Exception:   # noqa: BLE001  (a split the evaluator refuses: not this one)
                return
            if pred.get("fits", True) and pred["step_time_s"] <= bound * (1 + TIE):
                sm.reached = (stages, float(self.ObjectiveValue()) * sm.unit / sm.scale)
                self.StopSearch()
    return Reach()
