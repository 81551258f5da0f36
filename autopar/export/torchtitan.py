"""torchtitan: a plan as a job TOML, and a job TOML as a plan.

The layout is torchtitan 0.2.2's ``JobConfig`` (``torchtitan/config/job_config.py``; ``train.py
--job.config_file job.toml``), checked in the tests by that release's ``ConfigManager``.
torchtitan 0.3 reads no TOML (Python config registries plus ``--section.key`` flags of the same
names), so the same keys are passed there as flags.

    dp, zero            zero 0: data_parallel_replicate_degree = dp (DDP; torchtitan runs it only
                        alone); zero 2 / 3: data_parallel_shard_degree = dp (FSDP2) with
                        fsdp_reshard_after_forward = "never" / "always"
    tp, sp              tensor_parallel_degree (torchtitan's tp always shards the sequence too);
                        enable_async_tensor_parallel under fsdp:async_tp (needs compile)
    pp, schedule        pipeline_parallel_degree, pipeline_parallel_schedule (GPipe, 1F1B,
                        Interleaved1F1B)
    vpp, stages         module_fqns_per_model_part: one list of module names per virtual stage
                        (tok_embeddings, layers.i, norm + output), stage v on pp rank v % pp
    micro_batch_size    pipeline_parallel_microbatch_size, training.local_batch_size = global
                        batch / dp (pp > 1); training.local_batch_size = micro-batch (pp = 1,
                        torchtitan accumulates gradients up to training.global_batch_size)
    recompute           activation_checkpoint.mode: none / selective (op-level SAC) / full;
                        full with early_stop = true where the runtime prices it so
    cp                  context_parallel_degree, context_parallel_rotate_method "allgather"
                        (runtime fsdp, torchtitan's default) or "alltoall" (fsdp:cp_alltoall)
    dp_shard            HSDP: data_parallel_replicate_degree = dp / dp_shard,
                        data_parallel_shard_degree = dp_shard (FSDP2's 2-D mesh; ZeRO 2 / 3)
    ep, etp             expert_parallel_degree, expert_tensor_parallel_degree (etp 1 or tp:
                        torchtitan's expert mesh, ``expert_mesh_problems``)

torchtitan has no ZeRO-1, no DDP beside tp / pp, no tp without sequence parallel, only SDPA
attention and the tp-dp-pp order: such plans are refused, naming the nearest.
"""
from __future__ import annotations

import json
import math

from autopar.export import precision_flags
from autopar.export.common import (
    RUNTIMES,
    Exported,
    Imported,
    Problem,
    pool_problems,
    positive_int,
    read_text,
    refuse_if_needed,
    with_runtime,
)
from autopar.export.context import TrainingContext, resolve_stages
from autopar.export.launch import nodes_for, pool_lines
from autopar.export.stages import (
    stages_from_counts,
    stages_from_torchtitan_fqns,
    torchtitan_default_counts,
    torchtitan_fqns,
)
from autopar.export.torchtitan_experts import expert_mesh_problems
from autopar.export.tp_overlap_switches import has_overlap, with_overlap
from costmodels.contracts.errors import PlanError, SpecError
from costmodels.contracts.files import tomllib
from costmodels.contracts.plan import Plan

RELEASE = "0.2.2"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B"}
FLAVORS = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B"}


def problems(plan: Plan, ctx: TrainingContext | None = None) -> list[Problem]:
    out = []
    if plan.zero == 1:
        out.append(Problem("zero", 1, "torchtitan has no ZeRO-1; it shards with FSDP2 (ZeRO-2: "
                           "reshard never, ZeRO-3: reshard always)", {"zero": 2}))
    from costmodels.profiles.runtime import load_runtime
    from costmodels.profiles.runtime_rules import ddp_rule
    if ddp_rule(load_runtime(RUNTIMES["torchtitan"]), plan):   # the fsdp profile owns the rule
        out.append(Problem("zero", 0, "torchtitan runs DDP only as the sole parallelism, not beside "
                           "tp or pp", {"zero": 2}))
    if plan.pp > 1 and plan.schedule not in SCHEDULES:   # the zero-bubble schedules
        out.append(Problem("schedule", plan.schedule, "this exporter writes torchtitan's GPipe, 1F1B and "
                           "Interleaved1F1B schedules", {"schedule": "interleaved-1f1b" if plan.vpp > 1 else "1f1b"}))
    if plan.tp > 1 and not plan.sequence_parallel:
        out.append(Problem("sequence_parallel", False, "torchtitan's tensor parallel always shards "
                           "the sequence", {"sequence_parallel": True}))
    if plan.attention != "flash":
        out.append(Problem("attention", plan.attention, "torchtitan's models run SDPA (fused) attention",
                           {"attention": "flash"}))
    if plan.placement != "tp,dp,pp":
        out.append(Problem("placement", plan.placement, "torchtitan's mesh is pp, dp, tp (tp innermost)",
                           {"placement": "tp,dp,pp"}))
    out += precision_flags.problems(plan, "torchtitan")
    out += expert_mesh_problems(plan)
    return out + pool_problems(plan, ctx)


def job_config(plan: Plan, ctx: TrainingContext) -> dict:
    """The job config as nested dicts (section → key → value)."""
    refuse_if_needed("torchtitan", plan, lambda p: problems(p, ctx))
    global_batch = ctx.need("global_batch", "--global-batch or a plans file")
    policy = {0: "default", 2: "never", 3: "always"}[plan.zero]
    ddp = plan.zero == 0 and plan.dp > 1
    parallelism = {"data_parallel_replicate_degree": plan.dp if ddp else plan.replicas,
                   "data_parallel_shard_degree": 1 if ddp else plan.shard_size,
                   "fsdp_reshard_after_forward": policy, "tensor_parallel_degree": plan.tp,
                   "pipeline_parallel_degree": plan.pp,
                   "pipeline_parallel_schedule": SCHEDULES[plan.schedule]}
    if plan.tp > 1 and has_overlap(plan.runtime):   # fsdp:async_tp (tp_overlap_switches.py)
        parallelism["enable_async_tensor_parallel"] = True
    if plan.cp > 1:   # torch's context_parallel over SDPA: the K/V exchange the runtime profile prices
        from costmodels.profiles.runtime import load_runtime
        parallelism.update(context_parallel_degree=plan.cp, context_parallel_rotate_method=(
            "allgather" if load_runtime(plan.runtime).cp_all_gather else "alltoall"))
    if plan.ep > 1 or plan.etp > 1:
        parallelism.update(expert_parallel_degree=plan.ep, expert_tensor_parallel_degree=plan.etp)
    local = plan.micro_batch_size
    if plan.pp > 1:
        local = global_batch // plan.dp
        parallelism.update(pipeline_parallel_microbatch_size=plan.micro_batch_size,
                           module_fqns_per_model_part=torchtitan_fqns(resolve_stages(plan, ctx), ctx.n_rows))
    mode = {"none": "none", "selective": "selective", "full": "full"}[plan.recompute]
    ac = {"mode": mode, "selective_ac_option": "op"} if mode == "selective" else {"mode": mode}
    if mode == "full":   # stop at the last saved tensor, as the fsdp profile prices it (recompute_early_stop.py)
        from costmodels.profiles.runtime import load_runtime
        if load_runtime(plan.runtime).recompute_early_stop:
            ac["early_stop"] = True
    model = {"name": "llama3"}
    base = (ctx.model or "").split(":")[0]
    if base in FLAVORS and ctx.config is not None and ctx.config.layers == _preset_layers(base):
        model["flavor"] = FLAVORS[base]
    fp8 = precision_flags.torchtitan_sections(plan)   # FP8: the float8 / mx converter
    if fp8:
        model["converters"] = fp8.pop("converters")
    return {"job": {"description": f"autopar plan {plan.label()}"}, "model": model,
            "training": {"local_batch_size": local, "global_batch_size": global_batch,
                         "seq_len": ctx.need("seq", "--seq or a plans file"),
                         "mixed_precision_param": "bfloat16"},
            "parallelism": parallelism, "activation_checkpoint": ac, **fp8}


def export(plan: Plan, ctx: TrainingContext) -> Exported:
    config = job_config(plan, ctx)
    lines = [f"# autopar plan {plan.label()}, for torchtitan (job config layout of torchtitan "
             f"{RELEASE}: train.py --job.config_file THIS_FILE)",
             f"# model {ctx.model}, {plan.world_size} GPUs; torchtitan >= 0.3 reads no TOML: pass these "
             "keys as --section.key flags"]
    lines += pool_lines(plan, nodes_for(plan.world_size, ctx.gpus_per_node)[1])
    if "flavor" not in config["model"]:
        lines.append(f"# no torchtitan flavor is {ctx.model}: register one with its shape, set [model] "
                     "flavor, and keep the module names below (llama3's)")
    for section, values in config.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return Exported("torchtitan", {"torchtitan.toml": "\n".join(lines) + "\n"}, RUNTIMES["torchtitan"])


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v, ensure_ascii=False)   # ints, strings, lists of strings: the same in TOML


def _preset_layers(name: str) -> int:
    from autopar.models.presets import PRESETS
    return PRESETS[name].layers


# ---- import -----------------------------------------------------------------------------------
def parse(source: str, ctx: TrainingContext) -> Imported:
    text = read_text(source)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlanError(f"torchtitan job config is not TOML ({e}); give the job .toml file") from None
    par, train = doc.get("parallelism", {}), doc.get("training", {})
    ac = doc.get("activation_checkpoint", {})
    _check_model(doc.get("model", {}), ctx)

    cp = _int(par, "context_parallel_degree", 1)
    rotate = str(par.get("context_parallel_rotate_method", "allgather"))
    if rotate not in ("allgather", "alltoall"):
        raise PlanError(f"torchtitan context_parallel_rotate_method = {rotate!r}: autopar prices "
                        "'allgather' and 'alltoall'")
    ep, etp = _int(par, "expert_parallel_degree", 1), _int(par, "expert_tensor_parallel_degree", 1)
    if par.get("pipeline_parallel_schedule_csv"):
        raise PlanError("torchtitan parallelism.pipeline_parallel_schedule_csv: autopar cannot read a "
                        "custom schedule; use GPipe, 1F1B or Interleaved1F1B")
    replicate, shard = _int(par, "data_parallel_replicate_degree", 1), _int(par, "data_parallel_shard_degree", -1)
    tp, pp = _int(par, "tensor_parallel_degree", 1), _int(par, "pipeline_parallel_degree", 1)
    if shard == -1:
        if ctx.gpus is None:
            raise PlanError("torchtitan data_parallel_shard_degree = -1 (the leftover GPUs): give --gpus N")
        if ctx.gpus % (replicate * tp * pp * cp):
            raise PlanError(f"{ctx.gpus} GPUs is not a multiple of replicate·cp·tp·pp = {replicate * tp * pp * cp}")
        shard = ctx.gpus // (replicate * tp * pp * cp)
    dp = replicate * shard
    policy = par.get("fsdp_reshard_after_forward", "default")
    if replicate > 1 and shard > 1:   # HSDP: FSDP2's 2-D mesh
        zero = {"always": 3, "never": 2}.get(policy, 3 if pp == 1 else 2)
    elif replicate > 1:
        zero = 0
    else:
        zero = {"always": 3, "never": 2}.get(policy, (3 if pp == 1 else 2) if shard > 1 else 0)
    schedule, vpp, stages = _pipeline(par, pp, ctx)
    local = _int(train, "local_batch_size", 8)
    global_batch = _int(train, "global_batch_size", -1)
    global_batch = local * dp if global_batch == -1 else global_batch
    if pp > 1:
        mb = _int(par, "pipeline_parallel_microbatch_size", 1)
        if local % mb:
            raise PlanError(f"torchtitan local_batch_size {local} is not a multiple of "
                            f"pipeline_parallel_microbatch_size {mb}")
        if global_batch != local * dp:
            raise PlanError(f"torchtitan global_batch_size {global_batch} > local_batch_size·dp = "
                            f"{local * dp}: torchtitan runs several pipeline rounds per step, autopar "
                            f"one; set local_batch_size = {global_batch // dp}")
    else:
        mb = local
    plan = Plan(dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch_size=mb, zero=zero, recompute=_recompute(ac),
                sequence_parallel=tp > 1, schedule=schedule, stages=stages, cp=cp,
                dp_shard=shard if replicate > 1 and shard > 1 else None,
                precision=precision_flags.torchtitan_precision(doc), ep=ep, etp=etp)
    for bad in expert_mesh_problems(plan):   # a mesh torchtitan itself would refuse (torchtitan_experts.py)
        raise PlanError(f"torchtitan expert_parallel_degree = {ep}, expert_tensor_parallel_degree = "
                        f"{etp}: {bad.why}")
    seq = train.get("seq_len")
    runtime = RUNTIMES["torchtitan"] + (":cp_alltoall" if cp > 1 and rotate == "alltoall" else "")
    if par.get("enable_async_tensor_parallel"):   # fsdp:async_tp (tp_overlap_switches.py)
        runtime = with_overlap(runtime)
    return Imported(with_runtime(plan, runtime), runtime, "torchtitan",
                    gpus=plan.world_size, global_batch=global_batch,
                    seq=None if seq is None else positive_int(seq, "torchtitan seq_len"))


def _int(section: dict, key: str, default: int) -> int:
    """An integer key of the job config: positive, or -1 / 0 where torchtitan gives those a meaning
    (shard degree -1: the leftover GPUs; global batch -1: local·dp; first/last less layers 0)."""
    value = section.get(key, default)
    allowed = {"data_parallel_shard_degree": -1, "global_batch_size": -1,
               "pipeline_parallel_first_stage_less_layers": 0, "pipeline_parallel_last_stage_less_layers": 0}
    if isinstance(value, int) and not isinstance(value, bool) and (value >= 1 or value == allowed.get(key)):
        return value
    return positive_int(value, f"torchtitan {key}")


def _check_model(model: dict, ctx: TrainingContext) -> None:
    flavor = model.get("flavor")
    preset = {v: k for k, v in FLAVORS.items()}.get(flavor)
    base = (ctx.model or "").split(":")[0]
    if preset and base in FLAVORS and base != preset:
        raise SpecError(f"torchtitan [model] flavor = {flavor!r} is {preset}, but MODEL is {ctx.model}; "
                        f"pass MODEL {preset} or change the flavor")


def _pipeline(par: dict, pp: int, ctx: TrainingContext):
    n_rows = ctx.n_blocks + 2
    name = str(par.get("pipeline_parallel_schedule", "1F1B"))
    schedule = {v.lower(): k for k, v in SCHEDULES.items()}.get(name.lower())
    if schedule is None:
        raise PlanError(f"torchtitan pipeline_parallel_schedule = {name!r}: autopar models GPipe, 1F1B "
                        "and Interleaved1F1B")
    if pp == 1:
        if schedule == "interleaved-1f1b":
            raise PlanError("torchtitan Interleaved1F1B needs pipeline_parallel_degree > 1")
        return schedule, 1, ((0, n_rows),)
    fqns = par.get("module_fqns_per_model_part")
    if fqns:
        stages = stages_from_torchtitan_fqns(fqns, n_rows)
    else:
        first = _int(par, "pipeline_parallel_first_stage_less_layers", 1)
        last = _int(par, "pipeline_parallel_last_stage_less_layers", 1)
        per_stage = par.get("pipeline_parallel_layers_per_stage")
        if per_stage is not None:
            per_stage = positive_int(per_stage, "torchtitan pipeline_parallel_layers_per_stage")
            n_stages = math.ceil((ctx.n_blocks + first + last) / per_stage)
        else:
            n_stages = pp * (2 if schedule == "interleaved-1f1b" else 1)
        counts = torchtitan_default_counts(ctx.n_blocks, n_stages, first, last)
        stages = stages_from_counts(counts, n_rows, "torchtitan's derived pipeline split")
    if len(stages) % pp:
        raise PlanError(f"torchtitan: {len(stages)} model chunks do not divide over "
                        f"pipeline_parallel_degree {pp}")
    vpp = len(stages) // pp
    if (vpp > 1) != (schedule == "interleaved-1f1b"):
        raise PlanError(f"torchtitan schedule {name} with {vpp} stage(s) per rank: GPipe / 1F1B run one "
                        "chunk per rank, Interleaved1F1B two or more")
    return schedule, vpp, stages


def _recompute(ac: dict) -> str:
    mode = ac.get("mode", "selective")
    if mode in ("none", "full"):
        return mode
    if mode != "selective":
        raise PlanError(f"torchtitan activation_checkpoint.mode = {mode!r}: autopar models none, "
                        "selective and full")
    option = str(ac.get("selective_ac_option", "2"))
    if option == "op":
        return "selective"
    if option == "1":
        return "full"
    raise PlanError(f"torchtitan activation_checkpoint.selective_ac_option = {option!r} checkpoints "
                    "every n-th layer; autopar recomputes every layer or none: use 'op' (selective) "
                    "or mode = 'full'")
