"""autopar.search: the planner behind ``autopar search`` / ``autopar explain``.

``search(model, hardware, gpus, global_batch, ...) -> SearchResult`` finds the top-k plans (the
best proved optimal under the cost model); ``SearchResult.plans_file()`` is the plans file of
docs/CONTRACTS.md as a dict (``costmodels.contracts.plans_file.PlansFile`` reads and writes such files).
The integer program is written out in ``autopar.search.split_model``; the driver is
``autopar.search.engine``; ``enumerate_plans`` is the solver-free path used by the tests.
"""
from __future__ import annotations

from autopar.search.api import search
from autopar.search.engine import OBJECTIVES, SearchResult, enumerate_plans, run_search
from autopar.search.explain import explain_plans, render_explanation
from autopar.search.space import parse_fix

__all__ = ["search", "run_search", "enumerate_plans", "SearchResult", "OBJECTIVES", "parse_fix",
           "explain_plans", "render_explanation"]
