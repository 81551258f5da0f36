"""``autopar.scoring``: score plans for a model spec on a hardware profile (traces, then
``costmodels.model.estimate.estimate``). The Python face of ``autopar estimate``.

    from autopar.scoring import estimate_plans
    [result] = estimate_plans("gpt3-175b", "a100-80g-sxm", gpus=1024, global_batch=1536,
                              plans={"dp": 16, "tp": 8, "pp": 8, "vpp": 3,
                                     "schedule": "interleaved-1f1b", "recompute": "selective",
                                     "sequence_parallel": True})
    result["step_time_s"], result["memory_bytes"]["total"], result["fits"]

Each result is the "Estimate result" dict of docs/CONTRACTS.md.
"""
from __future__ import annotations

from typing import Any

from costmodels.contracts.plans_file import PlansFile


def estimate_plans(model_spec: str, hardware, gpus: int, global_batch: int, plans: Any,
                   seq: int | None = None, table=None, *,
                   precision: str = "bf16-mixed", runtime: str | None = None) -> list[dict[str, Any]]:
    """Estimate dicts, one per plan of ``plans`` (anything ``PlansFile.read`` accepts: a Plan, a
    dict, a list, a plans file, JSON text or a path). ``table`` skips the trace (a LayerTable for
    the spec).
    ``precision``: the memory model's recipe (``costmodels.model.memory``): "bf16-mixed" (Megatron, the
    default), "amp" (autopar's runtime under autocast), "fp32". ``runtime``: score every plan as
    that runtime runs it (``costmodels.profiles.runtime``: "autopar", "megatron", "deepspeed", "fsdp", with
    options after a colon); None keeps each plan's own ``runtime`` field."""
    from costmodels.model.estimate import estimate
    from costmodels.profiles.cluster import resolve_hardware
    profile, _ = resolve_hardware(hardware)   # a profile, or a Cluster for pooled plans
    plan_list = PlansFile.read(plans).plans
    if runtime is not None:
        from costmodels.profiles.runtime import load_runtime
        name = load_runtime(runtime).name
        plan_list = [p.with_(runtime=name) for p in plan_list]
    if table is None:
        from autopar.trace import table_for
        table = table_for(model_spec, micro_batch=1, seq=seq)
    out = []
    for plan in plan_list:
        d = estimate(table, profile, plan, gpus, global_batch, precision=precision).to_dict()
        d["model"] = model_spec
        out.append(d)
    return out


__all__ = ["estimate_plans"]
