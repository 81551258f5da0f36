"""Pieces every target shares: the runtime a plan runs under, refusals, what an import returns.

Runtime: each target runs the plan on a different runtime ("megatron", "fsdp" for torchtitan,
"deepspeed", "autopar" for torchrun), and an exported or imported plan is scored with that
runtime's profile. ``with_runtime`` is the one place a plan gets its runtime: while ``Plan`` has
no ``runtime`` field it leaves the plan as it is and the runtime travels beside it
(``Imported.runtime``); once it has one, the plan carries it.

Refusals: a plan a target cannot express is refused with one line naming the field, why, and the
nearest plan the target can express (each target lists its ``Problem``s; their repairs applied
together give that plan).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from autopar.export.launch import nodes_for, pool_nodes
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

RUNTIMES = {"megatron": "megatron", "torchtitan": "fsdp", "deepspeed": "deepspeed", "torchrun": "autopar"}


def plan_runtime(plan: Plan) -> str:
    """The runtime a plan says it runs under ("autopar" until plans carry one)."""
    return getattr(plan, "runtime", "autopar")


def with_runtime(plan: Plan, runtime: str) -> Plan:
    """``plan`` set to run under ``runtime`` where ``Plan`` has that field; unchanged otherwise."""
    if "runtime" in {f.name for f in fields(Plan)}:
        return plan.with_(runtime=runtime)
    return plan


@dataclass(frozen=True)
class Problem:
    """Something a target cannot state: the plan field, its value, why, and the change that
    makes the plan exportable (plan fields → new values)."""
    field: str
    value: Any
    why: str
    repair: dict[str, Any]


@dataclass(frozen=True)
class Exported:
    """``files``: name → text, the main file first; ``runtime``: what the plan runs under there."""
    target: str
    files: dict[str, str]
    runtime: str

    @property
    def text(self) -> str:
        return next(iter(self.files.values()))


@dataclass(frozen=True)
class Imported:
    """A user's configuration read back as a plan, with what it says of the job (None where it
    does not say): GPUs, global batch, sequence length, and the runtime it runs under."""
    plan: Plan
    runtime: str
    source: str
    gpus: int | None = None
    global_batch: int | None = None
    seq: int | None = None
    notes: list[str] = field(default_factory=list)


def pool_problems(plan: Plan, ctx) -> list[Problem]:
    """A pooled plan whose nodes would each need two GPU types (``launch.pool_nodes``): no target
    can launch it. Empty for a uniform plan or without a context."""
    if plan.pools is None or ctx is None:
        return []
    _, nproc = nodes_for(plan.world_size, ctx.gpus_per_node)
    if pool_nodes(plan, nproc) is not None:
        return []
    return [Problem("stage_pools", list(plan.stage_pools),
                    f"torchrun starts {nproc} ranks a node, and a node would hold ranks of two pools "
                    f"(each stage's tp·dp is {plan.tp * plan.dp} GPUs, not whole nodes of one pool); "
                    "a node has one GPU type", {})]


def refuse_if_needed(target: str, plan: Plan, problems_of: Callable[[Plan], list[Problem]]) -> None:
    """PlanError (one line) naming the first problem and the nearest plan without any."""
    problems = problems_of(plan)
    if not problems:
        return
    first = problems[0]
    nearest, changes = plan, {}
    for _ in range(6):                       # repairs can expose others (tp=1 turns sp off, ...)
        found = problems_of(nearest)
        if not found:
            break
        repair = {}
        for p in found:
            repair.update(p.repair)
        changes.update(repair)
        try:
            nearest = nearest.with_(**repair)
        except PlanError:
            nearest = None
            break
    else:
        nearest = None
    value = first.value if not isinstance(first.value, tuple) else [list(s) for s in first.value]
    msg = f"cannot export to {target}: plan field '{first.field}'={value!r}: {first.why}"
    if nearest is not None and not problems_of(nearest):
        shown = ", ".join(f"{k}={_show(v)}" for k, v in changes.items())
        msg += f"; nearest exportable plan: {nearest.label()} ({shown})"
    else:
        msg += "; no nearby plan is exportable: search again with 'autopar search --fix' for this target"
    raise PlanError(msg)


def _show(v: Any) -> str:
    if isinstance(v, tuple):
        return ";".join(f"{a}:{b}" for a, b in v)
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def positive_int(value: Any, where: str) -> int:
    """``value`` as a positive integer, or PlanError naming ``where`` (a flag or a key)."""
    if isinstance(value, bool):
        raise PlanError(f"{where}={value!r} must be a positive integer")
    try:
        n = int(str(value).strip())
    except (TypeError, ValueError):
        raise PlanError(f"{where}={value!r} must be a positive integer (substitute any shell "
                        "variable first)") from None
    if n < 1:
        raise PlanError(f"{where}={n} must be a positive integer")
    return n


def split_dp(gpus: int | None, model_parallel: int, where: str) -> int:
    """dp = GPUs / (tp·pp); PlanError when the GPU count is unknown or not a multiple."""
    if gpus is None:
        raise PlanError(f"{where} does not say how many GPUs it runs on: give --gpus N")
    if gpus % model_parallel:
        raise PlanError(f"{gpus} GPUs is not a multiple of tp·pp = {model_parallel} ({where}); "
                        "change --gpus or the parallel sizes")
    return gpus // model_parallel


def read_text(source: str) -> str:
    """The configuration text: ``source`` itself, or the file it names."""
    import os
    if source and "\n" not in source and len(source) < 4096 and os.path.isfile(source):
        with open(source, "rb") as f:
            raw = f.read()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:   # a binary file, or another encoding
            raise PlanError(f"configuration file '{source}' is not UTF-8 text (byte {e.start} is "
                            f"0x{raw[e.start]:02x}); give the text file your launcher reads") from None
    if source and " " not in source.strip() and source.strip().endswith((".sh", ".json", ".toml", ".txt")):
        raise PlanError(f"configuration file '{source}' not found; give its path or the text itself")
    return source
