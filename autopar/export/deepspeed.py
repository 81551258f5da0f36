"""DeepSpeed: a plan as a DeepSpeed config JSON plus the Megatron-DeepSpeed arguments for tp / pp,
and the two back as a plan.

The JSON is checked in the tests by ``deepspeed.runtime.config.DeepSpeedConfig`` (the deepspeed
package, 0.19.8); the arguments are spelled as Megatron-DeepSpeed's ``megatron/arguments.py``
(commit 4efb479, ``tests/data/megatron_deepspeed_4efb479_flags.txt``).

    dp                  train_batch_size / (train_micro_batch_size_per_gpu · gradient_accumulation_steps)
    micro_batch_size    train_micro_batch_size_per_gpu (and --micro-batch-size)
    zero                zero_optimization.stage (and --zero-stage), with overlap_comm,
                        contiguous_gradients and 500 MB buckets
    tp, pp              --tensor-model-parallel-size, --pipeline-model-parallel-size
                        (--no-pipeline-parallel for pp = 1)
    sequence_parallel   --sequence-parallel
    recompute           --recompute-granularity selective | full (+ --recompute-method uniform
                        --recompute-num-layers 1 and --deepspeed-activation-checkpointing)
    attention           flash: --use-flash-attn-v2; math: no flash flag
    stages              DeepSpeed's PipelineModule splits the transformer layers evenly
                        (partition_method type:transformer), embedding first, head last

DeepSpeed's pipeline engine runs one 1F1B schedule (no GPipe, no virtual stages), ZeRO-0/1 only,
even splits only, ranks ordered tp-dp-pp: other plans are refused, naming the nearest.
"""
from __future__ import annotations

import json

from autopar.export import precision_flags
from autopar.export.command_line import flag_list, format_args, read_flags
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
from autopar.export.launch import launch_line, nodes_for, pool_lines
from autopar.export.megatron import check_shape, int_flag, recompute_of
from autopar.export.stages import block_counts, even_counts, stages_from_counts
from costmodels.contracts.errors import PlanError
from costmodels.contracts.plan import Plan

RELEASE = "0.19.8"
MEGATRON_DEEPSPEED_COMMIT = "4efb479d5317ce9b86096b9d8e3e8030b0b5263b"
BUCKET_BYTES = 500_000_000
FLASH_FLAGS = ("use_flash_attn_v2", "use_flash_attn", "use_flash_attn_v1")


def problems(plan: Plan, ctx: TrainingContext) -> list[Problem]:
    out = []
    if plan.placement != "tp,dp,pp":
        out.append(Problem("placement", plan.placement, "Megatron-DeepSpeed orders ranks tp-dp-pp",
                           {"placement": "tp,dp,pp"}))
    if plan.cp > 1:   # Ulysses (--ds-sequence-parallel-size) splits heads by all-to-all: not a cp ring
        out.append(Problem("cp", plan.cp, "DeepSpeed has no ring context parallelism (its Ulysses "
                           "sequence parallelism exchanges heads by all-to-all, which autopar does not "
                           "price)", {"cp": 1, "dp": plan.dp * plan.cp}))
    if plan.dp_shard is not None:
        out.append(Problem("dp_shard", plan.dp_shard, "DeepSpeed has no HSDP (ZeRO++'s hpZ keeps a "
                           "secondary weight copy per node, not replicated shard groups)", {"dp_shard": None}))
    if plan.pp > 1 and plan.zero >= 2:
        out.append(Problem("zero", plan.zero, "DeepSpeed's pipeline engine runs ZeRO-0 or 1 only",
                           {"zero": 1}))
    if plan.ep > 1 or plan.etp > 1:
        out.append(Problem("ep", plan.ep, "autopar does not write DeepSpeed-MoE's expert groups "
                           "(Megatron-DeepSpeed --num-experts / --moe-expert-parallel-size); export "
                           "this plan to megatron or torchtitan", {"ep": 1, "etp": 1}))
    even = even_counts(ctx.n_blocks, plan.pp) if ctx.n_rows is not None else None
    even_stages = None if even is None else stages_from_counts(even, ctx.n_rows, "deepspeed")
    if plan.vpp > 1 or plan.schedule == "gpipe":
        field, value = ("vpp", plan.vpp) if plan.vpp > 1 else ("schedule", plan.schedule)
        out.append(Problem(field, value, "DeepSpeed's pipeline engine runs one 1F1B schedule, one "
                           "stage per rank", {"vpp": 1, "schedule": "1f1b", "stages": even_stages}))
    elif plan.pp > 1 and ctx.n_rows is not None:
        if even is None:
            out.append(Problem("pp", plan.pp, f"DeepSpeed splits the {ctx.n_blocks} transformer layers "
                               f"evenly and pp={plan.pp} does not divide them", {}))
        elif block_counts(resolve_stages(plan, ctx), ctx.n_rows) != even:
            out.append(Problem("stages", plan.stages, "DeepSpeed splits the transformer layers evenly "
                               "(embedding first, head last)", {"stages": even_stages}))
    out += precision_flags.problems(plan, "deepspeed")
    return out + pool_problems(plan, ctx)


def ds_config(plan: Plan, ctx: TrainingContext) -> dict:
    """The DeepSpeed config dict (``DeepSpeedConfig`` reads it with the data-parallel size dp)."""
    global_batch = ctx.need("global_batch", "--global-batch or a plans file")
    zero = {"stage": plan.zero, "overlap_comm": True, "contiguous_gradients": True,
            "reduce_scatter": True, "reduce_bucket_size": BUCKET_BYTES}
    if plan.zero == 3:
        zero.update(stage3_prefetch_bucket_size=BUCKET_BYTES // 10, stage3_param_persistence_threshold=100_000)
    else:
        zero["allgather_bucket_size"] = BUCKET_BYTES
    config = {"train_batch_size": global_batch, "train_micro_batch_size_per_gpu": plan.micro_batch_size,
              "gradient_accumulation_steps": plan.num_micro_batches(global_batch),
              "zero_optimization": zero, "bf16": {"enabled": True}, "gradient_clipping": 1.0}
    if plan.recompute != "none":
        config["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                              "contiguous_memory_optimization": False}
    return config


def megatron_deepspeed_args(plan: Plan, ctx: TrainingContext, config_path: str) -> list:
    cfg = ctx.config
    if cfg is None or cfg.family not in ("gpt", "llama"):
        out = [("--num-layers", ctx.n_blocks), f"# {ctx.model}: give its shape flags yourself"]
    else:
        out = [("--num-layers", cfg.layers), ("--hidden-size", cfg.hidden),
               ("--num-attention-heads", cfg.heads), ("--ffn-hidden-size", cfg.ffn_dim),
               ("--seq-length", cfg.seq), ("--max-position-embeddings", cfg.seq)]
        if cfg.family == "llama":
            out += ["--swiglu", ("--normalization", "rmsnorm"), ("--layernorm-epsilon", cfg.norm_eps),
                    "--use-rotary-position-embeddings", "--disable-bias-linear"]
            if cfg.n_kv_heads != cfg.heads:
                out.append(("--num-key-value-heads", cfg.n_kv_heads))
        out += [("--hidden-dropout", cfg.dropout), ("--attention-dropout", cfg.dropout)]
        if not cfg.tied:
            out.append("--untie-embeddings-and-output-weights")
    out += [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp)]
    if plan.pp == 1:
        out.append("--no-pipeline-parallel")
    if plan.sequence_parallel:
        out.append("--sequence-parallel")
    out += [("--micro-batch-size", plan.micro_batch_size), ("--global-batch-size", ctx.global_batch),
            ("--zero-stage", plan.zero)]
    if plan.recompute == "selective":
        out.append(("--recompute-granularity", "selective"))
    elif plan.recompute == "full":
        out += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", 1), "--deepspeed-activation-checkpointing"]
    if plan.attention == "flash":
        out.append("--use-flash-attn-v2")
    out += ["--bf16", "--deepspeed", ("--deepspeed_config", config_path)]
    return out


def export(plan: Plan, ctx: TrainingContext, config_name: str = "ds_config.json") -> Exported:
    refuse_if_needed("deepspeed", plan, lambda p: problems(p, ctx))
    config = json.dumps(ds_config(plan, ctx), indent=2) + "\n"
    pairs = megatron_deepspeed_args(plan, ctx, config_name)
    nnodes, nproc = nodes_for(plan.world_size, ctx.gpus_per_node)
    script = "\n".join([
        "#!/bin/bash",
        f"# autopar plan {plan.label()}, for Megatron-DeepSpeed pretrain_gpt.py with {config_name}",
        f"# model {ctx.model}, {plan.world_size} GPUs = dp {plan.dp} x tp {plan.tp} x pp {plan.pp}",
        "AUTOPAR_ARGS=(", format_args(pairs), ")", *pool_lines(plan, nproc),
        f"# on each of the {nnodes} node(s); add your data, tokenizer, optimizer and logging flags",
        launch_line(nnodes, nproc, 'pretrain_gpt.py "${AUTOPAR_ARGS[@]}" "$@"'), ""])
    return Exported("deepspeed", {config_name: config, "megatron-deepspeed.sh": script},
                    RUNTIMES["deepspeed"])


def argv(plan: Plan, ctx: TrainingContext, config_path: str = "ds_config.json") -> list[str]:
    refuse_if_needed("deepspeed", plan, lambda p: problems(p, ctx))
    return flag_list(megatron_deepspeed_args(plan, ctx, config_path))


# ---- import -----------------------------------------------------------------------------------
def parse(source: str, ctx: TrainingContext, megatron_args: str | None = None) -> Imported:
    """A DeepSpeed config (JSON text or file) and, for tp / pp / sequence parallel / recompute,
    the Megatron-DeepSpeed command line (``megatron_args``)."""
    try:
        config = json.loads(read_text(source))
    except json.JSONDecodeError as e:
        raise PlanError(f"the DeepSpeed config is not JSON ({e}); give the ds_config.json file") from None
    if not isinstance(config, dict):
        raise PlanError("the DeepSpeed config must be a JSON object")
    flags = read_flags(read_text(megatron_args)) if megatron_args else {}
    check_shape(flags, ctx, "megatron-deepspeed")
    tp, pp = int_flag(flags, "tensor_model_parallel_size", 1), int_flag(flags, "pipeline_model_parallel_size", 1)
    if flags.get("no_pipeline_parallel") and pp != 1:
        raise PlanError(f"megatron-deepspeed --no-pipeline-parallel with --pipeline-model-parallel-size {pp}")
    zero = config.get("zero_optimization", {}).get("stage", 0)
    if zero not in (0, 1, 2, 3):
        raise PlanError(f"DeepSpeed zero_optimization.stage = {zero!r} must be 0, 1, 2 or 3")
    if flags.get("zero_stage") is not None and int(float(flags["zero_stage"])) != zero:
        raise PlanError(f"megatron-deepspeed --zero-stage {flags['zero_stage']} but the DeepSpeed config "
                        f"says zero_optimization.stage {zero}; make them agree")
    mb, dp, global_batch = _batch(config, ctx.gpus, tp * pp)
    n_blocks = int_flag(flags, "num_layers") or ctx.n_blocks
    counts = even_counts(n_blocks, pp)
    if counts is None:
        raise PlanError(f"DeepSpeed splits {n_blocks} layers evenly, which pp={pp} cannot")
    plan = Plan(dp=dp, tp=tp, pp=pp, micro_batch_size=mb, zero=zero,
                recompute=recompute_of(flags, counts, "megatron-deepspeed"),
                sequence_parallel=bool(flags.get("sequence_parallel")) and tp > 1,
                attention="flash" if any(flags.get(f) for f in FLASH_FLAGS) else "math",
                stages=stages_from_counts(counts, n_blocks + 2, "deepspeed"))
    seq = int_flag(flags, "seq_length")
    return Imported(with_runtime(plan, RUNTIMES["deepspeed"]), RUNTIMES["deepspeed"], "deepspeed",
                    gpus=plan.world_size, global_batch=global_batch, seq=seq)


def _batch(config: dict, gpus: int | None, model_parallel: int) -> tuple[int, int, int]:
    """(micro-batch, dp, global batch) from any two of DeepSpeed's three batch keys (and the GPUs)."""
    def key(name):
        value = config.get(name)
        return None if value is None else positive_int(value, f"DeepSpeed {name}")
    batch, micro = key("train_batch_size"), key("train_micro_batch_size_per_gpu")
    accumulation = key("gradient_accumulation_steps")
    dp = None if gpus is None else gpus // model_parallel
    if gpus is not None and gpus % model_parallel:
        raise PlanError(f"{gpus} GPUs is not a multiple of tp·pp = {model_parallel}")
    if batch and micro and accumulation:
        if batch % (micro * accumulation):
            raise PlanError(f"DeepSpeed train_batch_size {batch} is not train_micro_batch_size_per_gpu "
                            f"{micro} x gradient_accumulation_steps {accumulation} x dp")
        found = batch // (micro * accumulation)
        if dp is not None and found != dp:
            raise PlanError(f"the DeepSpeed config means dp={found} but {gpus} GPUs / (tp·pp) = {dp}")
        return micro, found, batch
    if dp is None:
        raise PlanError("the DeepSpeed config gives fewer than all three batch keys: give --gpus N")
    if batch and micro:
        return micro, dp, batch
    if micro and accumulation:
        return micro, dp, micro * accumulation * dp
    if batch and accumulation and batch % (accumulation * dp) == 0:
        return batch // (accumulation * dp), dp, batch
    raise PlanError("the DeepSpeed config needs two of train_batch_size, train_micro_batch_size_per_gpu "
                    "and gradient_accumulation_steps")
