"""The search request's own consistency, checked before any tracing (``autopar search`` traces
the model first: 20-30 s for a large one): the objective's target, given once."""
from __future__ import annotations

from costmodels.contracts.errors import PlanError


def check_targets(objective: str, target_step_time_s, target_tokens_per_s) -> None:
    if target_tokens_per_s is not None and target_step_time_s is not None:
        raise PlanError("give one target: --target-step-time or --target-tokens-per-s, not both "
                        "(each sets the step time the other would)")
    if objective == "fewest_gpus" and target_step_time_s is None and target_tokens_per_s is None:
        raise PlanError("--objective fewest_gpus needs a target: --target-step-time SECONDS or "
                        "--target-tokens-per-s N")
