"""``estimate`` of a plan with context parallelism: the merged plan on the per-rank table.

``costmodels.model.context_parallel`` says why a cp plan on a table of ``S`` tokens costs what
the plan with ``dp·cp`` data-parallel ranks and ``cp = 1`` costs on the rank's share of the
table at ``cp`` times the global batch, plus attention's K/V traffic (added to the block rows
by ``coefficients``). This module checks the cp rules first (the runtime's and the model's,
one line each), prices that, and hands back the estimate in the plan's own terms: the plan,
the global batch, the sequence, the cp group in ``comm``.
"""
from __future__ import annotations

from dataclasses import replace

from costmodels.contracts.runnable import ModelDims, check_context_parallel
from costmodels.model.context_parallel import cp_comm, cp_row_link, local_table, merged
from costmodels.model.table_arrays import table_arrays
from costmodels.profiles.runtime import load_runtime
from costmodels.profiles.runtime_rules import check_runtime


def cp_estimate(estimate, table, profile, plan, gpus: int, global_batch: int, precision: str):
    """``estimate(table, profile, plan, gpus, global_batch)`` for ``plan.cp > 1`` (module
    docstring); ``estimate`` is the function itself (this module sits beside it, not under it)."""
    runtime = load_runtime(plan.runtime)
    check_runtime(runtime, plan, table.layers, precision)
    check_context_parallel(plan, ModelDims(seq=table.seq, heads=table.heads))
    if isinstance(global_batch, int) and not isinstance(global_batch, bool):
        plan.num_micro_batches(global_batch)         # the plan's own batch rule, in its own words
    local, flat = local_table(table, plan.cp), merged(plan)
    est = estimate(local, profile, flat, gpus, global_batch * plan.cp, precision=precision)
    prof = getattr(profile, "profiles", None)
    prof = prof[0] if prof else profile
    if hasattr(prof, "gpus_per_node") and hasattr(prof, "intra_node"):
        arr = table_arrays(local)
        busiest = max(est.stages_detail, key=lambda d: sum(d["fwd_s"]) + sum(d["bwd_s"]))
        blocks = sum(int(arr.is_block[s:e].sum()) for s, e in busiest["rows"])
        entry = cp_comm(arr, prof, plan.tp, plan.micro_batch_size, runtime, est.num_micro_batches,
                        blocks, cp_row_link(prof, flat, arr))
        entry["tier"] = "intra_node" if cp_row_link(prof, flat, arr) is prof.intra_node else "inter_node"
        comm = [dict(c, group_size=c["group_size"]) for c in est.comm] + [entry]
        comm_bytes = dict(est.comm_bytes, cp=entry["bytes_per_gpu"])   # report: COMM_KINDS
    else:   # pooled clusters: the estimate as priced, no cp entry
        comm, comm_bytes = est.comm, est.comm_bytes
    return replace(est, plan=plan, global_batch=int(global_batch), seq=table.seq, comm=comm,
                   comm_bytes=comm_bytes)
