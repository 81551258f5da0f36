"""The frontier's seeds (issue 30): before a configuration's first CP-SAT solve, the evaluator
scores a cheap split of it, a real plan whose key bounds the k-th plan early. Kept apart from
``frontier.py`` (the heap and the solve loop) as a mixin of ``Frontier``: it reads the frontier's
``seeded``, ``heap``, ``exact_keys``, ``top``, ``objective`` and calls ``_evaluate`` / ``_know``."""
from __future__ import annotations

import heapq

from autopar.search.frontier_keys import objective_key
from autopar.search.space import Config
from costmodels.contracts.errors import AutoparError


class SeedingMixin:
    def _seed(self, c: Config, terms) -> None:
        """Before ``c``'s first CP-SAT solve, the evaluator scores its min-max split of the row
        times (the solver's hint, ``SplitModel._hint``): a real plan of ``c`` whose key bounds
        the k-th plan from the first solves on, so that configurations whose bound is above it
        are never solved and the rest are solved under that cut (``incumbent_split``)."""
        if c in self.seeded or self.fixed_stages is not None or terms.split_backward:
            # not the zero-bubble schedules: under a cut from a seed their op-graph programs can
            # lose CP-SAT's proof (interleaved-zb, pp 2, vpp 5: 1.4 s uncut, unproved in 12 s cut)
            return
        self.seeded.add(c)
        from autopar.search.incumbents import incumbent_split
        if self._seed_split(c, incumbent_split(terms)):
            # a split that fits is known: a stop-cut infeasibility then means "after the next
            # entry", with no memory program to tell it from "no split fits" (split_stop)
            terms.fits_memory.setdefault(None, True)

    def _seed_ahead(self, ahead: int = 64) -> None:
        """Score the min-max splits of the next ``ahead`` configurations on the heap that have
        terms (``_seed``) until ``top`` plans are known: real plans, so a valid k-th plan's cut."""
        for _, _, level, c2, payload in heapq.nsmallest(ahead, self.heap):
            if len(self.exact_keys) >= self.top:
                return
            if level == 1:
                self._seed(c2, payload)

    def _seed_split(self, c: Config, stages) -> bool:
        """The evaluator's score of ``stages`` on ``c``, known as a real plan where it fits;
        whether it fits."""
        if stages is None:
            return False
        try:
            pred = self._evaluate(c.plan(stages))
        except AutoparError:
            return False
        if pred.get("fits", True):
            self._know(c, objective_key(self.objective, c, pred["step_time_s"]), stages)
            return True
        return False
