"""costmodels: pure-Python (numpy / pandas, never torch) models of training cost.

Layer table and Plan schemas, hardware profiles, and models of compute, memory,
communication and pipeline time. Used by ``autopar estimate`` and the search.
"""
from costmodels.errors import AutoparError, PlanError, ProfileError, SpecError
from costmodels.layer_table import LayerRow, LayerTable, TPPair
from costmodels.plan import Plan, load_plans

__all__ = ["AutoparError", "PlanError", "ProfileError", "SpecError", "LayerRow", "LayerTable",
           "TPPair", "Plan", "load_plans"]
