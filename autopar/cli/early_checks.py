"""The checks of a plans file that need no model, run before the trace (tracing a large model
takes 20-30 s): the file was searched for this model, each plan uses the GPUs given, and
dp · micro-batch divides the global batch. The same errors the cost model raises later, sooner."""
from __future__ import annotations

from costmodels.contracts.errors import PlanError


def check_plans_before_trace(given, model: str, gpus: int | None, global_batch: int | None,
                             hardware) -> None:
    from autopar.cli.model_check import check_same_model
    from costmodels.profiles.cluster import Cluster
    check_same_model(given.model, model, given.source)
    for i, plan in enumerate(given.plans):
        which = f"plan {i + 1} of {given.source}" if len(given.plans) > 1 else "the plan"
        if gpus is not None and not isinstance(hardware, Cluster) and plan.world_size != gpus:
            raise PlanError(f"{which}: dp·cp·tp·pp = {plan.dp}·{plan.cp}·{plan.tp}·{plan.pp} = {plan.world_size} but "
                            f"--gpus is {gpus}; choose degrees whose product is {gpus}")
        if global_batch is not None:
            plan.num_micro_batches(global_batch)
