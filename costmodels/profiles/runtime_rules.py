"""What a runtime can run: one function per rule, read from the runtime profile's
``[capabilities]`` (``costmodels.profiles.runtime``).

``estimate`` refuses a plan its runtime cannot run (one ``PlanError`` line naming the rule and the
fix), and the search's configuration enumeration (``autopar.search.space``) asks the same rules,
so ``autopar search --runtime NAME`` only proposes what that runtime can run. Each rule returns
``None`` when the plan passes, else the reason in words. A rule takes anything with the plan's
fields (a ``Plan`` or the search's ``Config``).
"""
from __future__ import annotations

from costmodels.contracts.errors import PlanError
from costmodels.profiles.runtime import RuntimeProfile


def zero_rule(rt: RuntimeProfile, plan) -> str | None:
    """The ZeRO stage is one the runtime has, and one it combines with a pipeline when pp > 1."""
    if plan.zero not in rt.zero_stages:
        return (f"runtime '{rt.name}' has no ZeRO-{plan.zero} (its stages: "
                f"{', '.join(map(str, rt.zero_stages))})")
    if plan.pp > 1 and plan.zero not in rt.pipeline_zero:
        return (f"runtime '{rt.name}' cannot combine ZeRO-{plan.zero} with a pipeline (with pp > 1: "
                f"ZeRO {', '.join(map(str, rt.pipeline_zero))})")
    return None


def ddp_rule(rt: RuntimeProfile, plan) -> str | None:
    """ZeRO-0 data parallelism (DDP) beside tp or pp, where the runtime runs DDP only alone
    (``ddp_beside_model_parallel = false``: torchtitan). The one owner of that fact: the search,
    ``estimate`` and the torchtitan exporter all ask this rule."""
    model_parallel = getattr(plan, "tp", 1) > 1 or getattr(plan, "pp", 1) > 1
    replicas = getattr(plan, "dp", 1) * getattr(plan, "cp", 1)   # gradients sync over dp·cp
    if (not rt.ddp_beside_model_parallel and getattr(plan, "zero", 0) == 0 and replicas > 1
            and model_parallel):
        return (f"runtime '{rt.name}' runs DDP (ZeRO-0 with dp > 1) only as the sole parallelism, not "
                "beside tp or pp; shard with ZeRO-2 or 3")
    return None


def schedule_rule(rt: RuntimeProfile, plan) -> str | None:
    """A pipelined plan's schedule is one the runtime has (without a pipeline nothing is scheduled)."""
    if plan.pp > 1 and plan.schedule not in rt.schedules:
        return (f"runtime '{rt.name}' has no '{plan.schedule}' schedule (its schedules: "
                f"{', '.join(rt.schedules)})")
    return None


def interleaving_rule(rt: RuntimeProfile, plan, layers: int) -> str | None:
    """Without uneven interleaving (``uneven_interleaving = false``) the blocks must divide
    pp·vpp, every model chunk holding as many (Megatron's old rule)."""
    if plan.vpp > 1 and not rt.uneven_interleaving and layers % (plan.pp * plan.vpp):
        return (f"runtime '{rt.name}' interleaves only when the {layers} blocks divide "
                f"pp·vpp = {plan.pp * plan.vpp}")
    return None


def sequence_parallel_rule(rt: RuntimeProfile, plan) -> str | None:
    if plan.sequence_parallel and not rt.sequence_parallel:
        return f"runtime '{rt.name}' has no sequence parallelism"
    return None


def context_parallel_rule(rt: RuntimeProfile, plan) -> str | None:
    """cp > 1 needs a runtime that runs context parallelism (``[capabilities] context_parallel``)."""
    if getattr(plan, "cp", 1) > 1 and not rt.context_parallel:
        return f"runtime '{rt.name}' has no context parallelism (cp={plan.cp}); use cp=1"
    return None


def hsdp_rule(rt: RuntimeProfile, plan) -> str | None:
    """HSDP (``dp_shard``) with a ZeRO stage the runtime shards in groups (``hsdp_zero``)."""
    if getattr(plan, "dp_shard", None) and plan.zero not in rt.hsdp_zero:
        has = (f"only with ZeRO {', '.join(map(str, rt.hsdp_zero))}" if rt.hsdp_zero else "no HSDP")
        return (f"runtime '{rt.name}' runs {has} (dp_shard={plan.dp_shard}, zero={plan.zero}); "
                "leave dp_shard out or change zero")
    return None


def expert_mesh_rule(rt: RuntimeProfile, plan) -> str | None:
    """An ep not dividing dp·cp takes ranks from tp (the contract allows ep·etp dividing
    dp·cp·tp, Megatron's rule): only a runtime whose expert mesh is built over the tp·cp·dp
    ranks runs it (``[capabilities] expert_mesh_over_tp``: Megatron-core, torchtitan)."""
    ep, ranks = getattr(plan, "ep", 1), getattr(plan, "dp", 1) * getattr(plan, "cp", 1)
    if ep > 1 and ranks % ep and not rt.expert_mesh_over_tp:
        return (f"runtime '{rt.name}' takes the ep ranks from dp·cp only, and ep={ep} does not divide "
                f"dp·cp = {ranks}; use ep dividing dp·cp, or runtime megatron or fsdp, whose expert "
                "mesh also takes the tp ranks an expert is not sharded over (etp < tp)")
    return None


def precision_rule(rt: RuntimeProfile, precision: str) -> str | None:
    """amp / fp32 are autopar's own runtime's recipes; the others train in bf16-mixed."""
    if precision not in rt.precisions:
        return (f"precision '{precision}' is not a recipe of runtime '{rt.name}' (its recipes: "
                f"{', '.join(rt.precisions)})")
    return None


def runtime_violations(rt: RuntimeProfile, plan, layers: int) -> list[str]:
    """Every rule the plan breaks, in words (empty: the runtime can run it)."""
    found = (zero_rule(rt, plan), ddp_rule(rt, plan), schedule_rule(rt, plan),
             interleaving_rule(rt, plan, layers), sequence_parallel_rule(rt, plan),
             context_parallel_rule(rt, plan), hsdp_rule(rt, plan), expert_mesh_rule(rt, plan))
    return [f for f in found if f]


def check_runtime(rt: RuntimeProfile, plan, layers: int, precision: str) -> None:
    """PlanError with the first rule the plan (or the precision) breaks."""
    bad = [m for m in (precision_rule(rt, precision), *runtime_violations(rt, plan, layers)) if m]
    if bad:
        raise PlanError(f"{bad[0]}; change the plan or pick another runtime (--runtime: autopar, "
                        "megatron, deepspeed, fsdp)")
