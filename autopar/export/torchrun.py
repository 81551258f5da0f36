"""torchrun: launch lines that run a plan on autopar's own runtime (``autopar.apply``).

The plan travels inline as JSON (``--plan '{...}'``) to ``-m autopar.train MODEL`` (the package's
training entry point, so a pip-installed autopar runs it; or the training script given), so the
file says everything; importing it reads that JSON back, and the GPU count from ``--nnodes`` x
``--nproc-per-node``. The data and the step count are shell variables with defaults (``DATA``,
``STEPS``): the plan does not know them.
"""
from __future__ import annotations

import json
import re
import shlex

from autopar.export.command_line import read_flags, torchrun_gpus
from autopar.export.common import (
    RUNTIMES,
    Exported,
    Imported,
    pool_problems,
    positive_int,
    read_text,
    refuse_if_needed,
    with_runtime,
)
from autopar.export.context import TrainingContext, resolve_stages
from autopar.export.launch import launch_line, nodes_for, pool_lines
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

DEFAULT_SCRIPT = "-m autopar.train"


def problems(plan: Plan, ctx: TrainingContext | None = None) -> list:
    return pool_problems(plan, ctx)   # autopar's runtime runs every plan a launch can place


def export(plan: Plan, ctx: TrainingContext, script: str = DEFAULT_SCRIPT) -> Exported:
    refuse_if_needed("torchrun", plan, lambda p: problems(p, ctx))
    if plan.pp > 1 and plan.stages is None and ctx.model:
        plan = plan.with_(stages=resolve_stages(plan, ctx))
    nnodes, nproc = nodes_for(plan.world_size, ctx.gpus_per_node)
    body = plan.to_dict()
    body.pop("version", None)
    packaged = script == DEFAULT_SCRIPT   # autopar train: MODEL positional, data and steps needed
    model = shlex.quote(ctx.model) if ctx.model else '"${MODEL:?set MODEL=the model spec}"'
    launched = script if packaged else shlex.quote(script)   # a user's script: quoted as pasted
    command = f"{launched} {model}" + (f" --seq {ctx.seq}" if ctx.seq else "") if packaged else launched
    command += f" --plan {shlex.quote(json.dumps(body, separators=(',', ':')))}"
    if ctx.model and not packaged:
        command += f" --model {shlex.quote(_spec_with_seq(ctx))}"
    if ctx.global_batch:
        command += f" --global-batch {ctx.global_batch}"
    if packaged:
        command += ' --data "${DATA:-random}" --steps "${STEPS:-1000}"'
        if ctx.hardware and "," not in ctx.hardware:
            command += f" --hardware {shlex.quote(ctx.hardware)}"
    command += ' "$@"'    # the script's own flags (--steps, --save ...) after the file's name
    text = "\n".join([
        "#!/bin/bash",
        f"# autopar plan {plan.label()} on autopar's own runtime: {plan.world_size} GPUs as {nnodes} "
        f"node(s) x {nproc}",
        "# run on every node: MASTER_ADDR / MASTER_PORT = the first node's address and a free port, "
        "JOB_ID = any id the nodes share",
        *(["# DATA = a token file (flat uint16 ids, nanoGPT's prepare.py; default random), STEPS = "
           "optimizer steps; more flags: python -m autopar.train --help"] if packaged else []),
        *pool_lines(plan, nproc),
        launch_line(nnodes, nproc, command), ""])
    return Exported("torchrun", {"torchrun.sh": text}, RUNTIMES["torchrun"])


def _spec_with_seq(ctx: TrainingContext) -> str:
    """MODEL with the job's sequence length written into it (the script takes no --seq)."""
    from autopar.models.config import FAMILY_KEYS
    spec = ctx.model
    if ctx.seq is None or ctx.config is None or "seq" not in FAMILY_KEYS[ctx.config.family]:
        return spec
    if re.search(r"[:,]seq=", spec):   # the spec says it already: say it once, as the job's
        return re.sub(r"([:,])seq=[^,]*", lambda m: f"{m.group(1)}seq={ctx.seq}", spec)
    return f"{spec},seq={ctx.seq}" if ":" in spec else f"{spec}:seq={ctx.seq}"


def parse(source: str, ctx: TrainingContext) -> Imported:
    text = read_text(source)
    flags = read_flags(text)
    raw = flags.get("plan")
    if raw is None:
        raise PlanError("the torchrun line has no --plan '{...}': export it with 'autopar export --to torchrun'")
    plan = Plan.from_dict(json.loads(raw)) if raw.lstrip().startswith("{") else None
    if plan is None:
        from costmodels.contracts.plans_file import load_plan
        plan = load_plan(raw)
    gpus = torchrun_gpus(flags)
    if gpus is not None and gpus != plan.world_size:
        raise PlanError(f"torchrun starts {gpus} processes but the plan needs dp·cp·tp·pp = {plan.world_size}")
    batch = flags.get("global_batch")
    batch = None if batch is None else positive_int(batch, "--global-batch")
    return Imported(with_runtime(plan, RUNTIMES["torchrun"]), RUNTIMES["torchrun"], "torchrun",
                    gpus=plan.world_size, global_batch=batch)
