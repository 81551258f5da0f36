"""The plan against the model and the cluster before anything is priced: GPU count, heads,
micro-batches per schedule, split points. One PlanError line naming the constraint and the fix.
"""
from __future__ import annotations

import numbers

from costmodels.contracts.errors import PlanError
from costmodels.contracts.layer_table import LayerTable
from costmodels.contracts.plan import SPLIT_BACKWARD_SCHEDULES, Plan
from costmodels.contracts.runnable import check_schedule
from costmodels.contracts.split import balanced_stages, check_stage_rows


def check_plan(table: LayerTable, plan: Plan, gpus: int, global_batch: int) -> tuple[tuple[int, int], ...]:
    """Raise PlanError naming the violated constraint; return the plan's stages (balanced when
    the plan gives none)."""
    if not isinstance(gpus, numbers.Integral) or isinstance(gpus, bool) or gpus < 1:
        raise PlanError(f"gpus={gpus!r} must be a positive integer")
    if not isinstance(global_batch, numbers.Integral) or isinstance(global_batch, bool) or global_batch < 1:
        raise PlanError(f"global batch={global_batch!r} must be a positive integer")
    if plan.world_size != gpus:
        raise PlanError(f"dp·cp·tp·pp = {plan.dp}·{plan.cp}·{plan.tp}·{plan.pp} = {plan.world_size} but --gpus is "
                        f"{gpus}; choose degrees whose product is {gpus}")
    if table.heads and table.heads % plan.tp:
        raise PlanError(f"tp={plan.tp} does not divide heads={table.heads}; choose tp in "
                        f"{_divisors(table.heads)}")
    if table.kv_heads and table.kv_heads % plan.tp:
        raise PlanError(f"tp={plan.tp} does not divide kv_heads={table.kv_heads}; choose tp in "
                        f"{_divisors(table.kv_heads)}")
    m = plan.num_micro_batches(global_batch)
    n_rows = len(table.rows)
    check_stage_rows(plan, n_rows)
    if plan.schedule == "interleaved-1f1b" and m % plan.pp:
        raise PlanError(f"schedule 'interleaved-1f1b' needs the number of micro-batches ({m} = global "
                        f"batch / (dp·micro_batch_size)) to be a multiple of pp={plan.pp}; change the "
                        "batch, micro_batch_size or pp")
    if plan.schedule in SPLIT_BACKWARD_SCHEDULES:
        check_schedule(plan, m)      # torch's micro-batch rules for its zero-bubble schedules
    if plan.stages is not None:
        return plan.stages
    return balanced_stages(table, plan.pp * plan.vpp)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0][:12]
