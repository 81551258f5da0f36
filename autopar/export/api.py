"""Export a plan to a launcher, and import a launcher's configuration as a plan.

    from autopar.export import context_for, export_plan, import_config
    ctx = context_for("llama3-8b", gpus=64, global_batch=256, hardware="h100-80g-sxm")
    exported = export_plan(plan, "megatron", ctx)       # .files {name: text}, .runtime
    imported = import_config("megatron", exported.text, ctx)
    imported.plan == plan                               # the round trip is the identity

Targets: "megatron" (Megatron-LM arguments), "torchtitan" (a job TOML), "deepspeed" (a DeepSpeed
JSON plus Megatron-DeepSpeed arguments), "torchrun" (launch lines for autopar's own runtime).
A plan a target cannot express is refused with one PlanError line naming the field and the
nearest plan it can; a configuration autopar cannot model likewise names the setting.
"""
from __future__ import annotations

from autopar.export import deepspeed, megatron, torchrun, torchtitan
from autopar.export.common import Exported, Imported
from autopar.export.context import TrainingContext
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

TARGETS = {"megatron": megatron, "torchtitan": torchtitan, "deepspeed": deepspeed, "torchrun": torchrun}


def _target(name: str):
    if name not in TARGETS:
        raise PlanError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    return TARGETS[name]


def problems(plan: Plan, target: str, ctx: TrainingContext) -> list:
    """What ``target`` cannot state about ``plan`` (empty: it exports)."""
    return _target(target).problems(plan, ctx)


def export_plan(plan: Plan, target: str, ctx: TrainingContext) -> Exported:
    """The plan in ``target``'s own configuration format (PlanError when it cannot say it)."""
    return _target(target).export(plan, ctx)


def import_config(target: str, source: str, ctx: TrainingContext, *,
                  megatron_args: str | None = None) -> Imported:
    """A user's configuration (text or a file path) as an ``Imported`` plan. ``ctx`` gives MODEL
    (for the layer count and a shape check) and, where the configuration does not say, the GPU
    count and global batch; where both say, they must agree."""
    module = _target(target)
    if megatron_args is not None and target != "deepspeed":
        raise PlanError("--megatron-args goes with --from deepspeed (the Megatron-DeepSpeed command line)")
    imported = (module.parse(source, ctx, megatron_args) if target == "deepspeed"
                else module.parse(source, ctx))
    for name, flag in (("gpus", "--gpus"), ("global_batch", "--global-batch")):
        mine, theirs = getattr(ctx, name), getattr(imported, name)
        if mine is not None and theirs is not None and mine != theirs:
            raise PlanError(f"the {target} configuration means {name.replace('_', ' ')} {theirs} but "
                            f"{flag} is {mine}; drop {flag} or make them agree")
    return imported
