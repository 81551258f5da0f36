"""autopar: automatic parallelism planner and cost-model compiler for PyTorch training.

Pipeline: trace (autopar.trace) → cost models (costmodels) → search (autopar.search) →
Plan (costmodels.contracts.plan, re-exported here) → rewrite + runtime (autopar.rewrite, autopar.runtime)
→ report (autopar.report). Torch-heavy pieces are imported lazily.
"""
from costmodels.contracts.errors import AutoparError
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_file import PlansFile, load_plan, load_plans

__version__ = "0.1.0"
__all__ = ["AutoparError", "Plan", "PlansFile", "load_plan", "load_plans", "load_model", "apply",
           "init_serial",
           "estimate_plans", "__version__"]


def __getattr__(name):  # lazy: keep `import autopar` free of torch until needed
    if name == "load_model":
        from autopar.models import load_model
        return load_model
    if name == "estimate_plans":
        from autopar.scoring import estimate_plans
        return estimate_plans
    if name == "apply":
        from autopar.runtime import apply
        return apply
    if name == "init_serial":
        from autopar.runtime.assemble.materialize import init_serial
        return init_serial
    raise AttributeError(f"module 'autopar' has no attribute {name!r}")
