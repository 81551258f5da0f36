"""costmodels: pure-Python (numpy / pandas, never torch) models of training cost.

Layer table and Plan schemas, hardware profiles, and models of compute, memory,
communication and pipeline time. Used by ``autopar estimate`` and the search.
"""
from costmodels.contracts.errors import AutoparError, PlanError, ProfileError, SpecError
from costmodels.contracts.layer_table import LayerRow, LayerTable, TPPair
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_file import PlanResult, PlansFile, load_plan, load_plans


def __getattr__(name):  # numpy-using parts load on first use
    if name in ("check_plan", "Estimate"):  # the function: costmodels.model.estimate.estimate
        import costmodels.model.estimate as _e
        return getattr(_e, name)
    if name == "HardwareProfile":
        from costmodels.profiles.hardware import HardwareProfile
        return HardwareProfile
    if name in ("load_profile", "list_profiles"):
        import costmodels.profiles.hardware_files as _hf
        return getattr(_hf, name)
    raise AttributeError(f"module 'costmodels' has no attribute {name!r}")


__all__ = ["AutoparError", "PlanError", "ProfileError", "SpecError", "LayerRow", "LayerTable",
           "TPPair", "Plan", "load_plan", "load_plans", "PlansFile", "PlanResult", "check_plan", "Estimate",
           "load_profile", "list_profiles", "HardwareProfile"]
