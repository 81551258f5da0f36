"""``autopar.export``: take a plan to Megatron-LM, torchtitan, DeepSpeed or torchrun, and read the
configuration a user runs today back as a plan (to score it, or to compare it with the best).
See ``autopar.export.api`` and docs/CONTRACTS.md, "Export / import"."""
from autopar.export.api import TARGETS, export_plan, import_config, problems
from autopar.export.common import RUNTIMES, Exported, Imported, plan_runtime, with_runtime
from autopar.export.compare import compare_estimates
from autopar.export.context import TrainingContext, context_for, context_from_plans_file, resolve_stages

__all__ = ["RUNTIMES", "TARGETS", "Exported", "Imported", "TrainingContext", "compare_estimates",
           "context_for", "context_from_plans_file", "export_plan", "import_config", "plan_runtime",
           "problems", "resolve_stages", "with_runtime"]
