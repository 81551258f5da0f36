"""Megatron-LM ``pretrain_gpt.py``: a plan as its arguments, and its arguments as a plan.

Flags as Megatron-LM spells them at release core_v0.16.1 (``megatron/training/arguments.py``;
``tests/data/megatron_lm_core_v0.16.1_flags.txt`` lists them and the tests check every exported
flag against that list; ``benchmarks/bench_export_parsers.py`` runs Megatron's own parser).

    tp, pp              --tensor-model-parallel-size, --pipeline-model-parallel-size
    vpp, stages         even split: --num-virtual-stages-per-pipeline-rank (vpp > 1);
                        uneven ends (vpp = 1): --decoder-first/last-pipeline-num-layers;
                        any other split: --pipeline-model-parallel-layout "Et*3|t*4|...|t*3L"
    micro_batch_size    --micro-batch-size; the global batch: --global-batch-size
    sequence_parallel   --sequence-parallel (+ --tp-comm-overlap under megatron:tp_comm_overlap)
    recompute           selective: --recompute-granularity selective; full: --recompute-granularity
                        full --recompute-method uniform --recompute-num-layers 1 (every block)
    zero                1: --use-distributed-optimizer; 2 / 3: --use-megatron-fsdp
                        --data-parallel-sharding-strategy optim_grads / optim_grads_params
    overlap             --overlap-grad-reduce (dp > 1), --overlap-param-gather (with ZeRO)
    attention           --attention-backend flash | unfused
    placement           tp,dp,pp: Megatron's default order; tp,pp,dp: --use-tp-pp-dp-mapping
    cp                  --context-parallel-size, --cp-comm-type p2p (runtime megatron) or allgather
                        (megatron:cp_all_gather); a2a / a2a+p2p (Ulysses) are refused on import
    dp_shard            ZeRO-1 only: --num-distributed-optimizer-instances dp / dp_shard (the
                        distributed optimizer sharded in groups, replicated across them)
    dp                  not a flag: the GPUs torchrun starts / (tp·cp·pp)
    ep, etp             --expert-model-parallel-size, --expert-tensor-parallel-size (both written
                        for a MoE model or plan; read back, etp defaulting to tp as in Megatron);
                        a ``moe`` spec's shape: --num-experts, --moe-router-topk,
                        --moe-ffn-hidden-size, --moe-grouped-gemm, --moe-token-dispatcher-type
                        alltoall, --moe-shared-expert-intermediate-size, --moe-layer-freq

Megatron has no GPipe schedule (1F1B, interleaved with vpp > 1), no dp-innermost placement, and
its FSDP does not run with pipeline parallelism: those plans are refused, naming the nearest.
"""
from __future__ import annotations

from autopar.export import precision_flags
from autopar.export.command_line import flag_list, format_args, read_flags, torchrun_gpus
from autopar.export.common import (
    RUNTIMES,
    Exported,
    Imported,
    Problem,
    pool_problems,
    positive_int,
    read_text,
    refuse_if_needed,
    split_dp,
    with_runtime,
)
from autopar.export.context import TrainingContext, resolve_stages
from autopar.export.launch import launch_line, nodes_for, pool_lines
from autopar.export.stages import (
    block_counts,
    even_counts,
    first_last_counts,
    megatron_layout,
    parse_megatron_layout,
    stages_from_counts,
)
from autopar.export.tp_overlap_switches import has_overlap, with_overlap
from costmodels.contracts.errors import PlanError, SpecError
from costmodels.contracts.plan import Plan

RELEASE = "core_v0.16.1"
ZERO_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
STRATEGY_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


def problems(plan: Plan, ctx: TrainingContext | None = None) -> list[Problem]:
    out = []
    if plan.schedule == "gpipe":
        out.append(Problem("schedule", "gpipe", "Megatron-LM runs 1F1B (interleaved with vpp > 1), "
                           "no GPipe", {"schedule": "1f1b"}))
    if plan.placement == "dp,tp,pp":
        out.append(Problem("placement", plan.placement, "Megatron-LM orders ranks tp-dp-pp or, with "
                           "--use-tp-pp-dp-mapping, tp-pp-dp", {"placement": "tp,dp,pp"}))
    if plan.zero >= 2 and plan.pp > 1:
        out.append(Problem("zero", plan.zero, f"ZeRO-{plan.zero} is Megatron-FSDP, which does not run "
                           "with pipeline parallelism", {"zero": 1}))
    out += precision_flags.problems(plan, "megatron")
    if plan.dp_shard is not None and plan.zero != 1:
        out.append(Problem("dp_shard", plan.dp_shard, "Megatron-LM shards in groups only its distributed "
                           "optimizer (--num-distributed-optimizer-instances, ZeRO-1)", {"zero": 1}))
    return out + pool_problems(plan, ctx)


def model_args(ctx: TrainingContext) -> list:
    """The model's shape for gpt / llama specs (the layer count alone for other models)."""
    cfg = ctx.config
    if cfg is not None and cfg.family == "moe":
        return moe_model_args(cfg)
    if cfg is None or cfg.family not in ("gpt", "llama"):
        return [("--num-layers", ctx.n_blocks),
                f"# {ctx.model or 'this model'}: not a gpt/llama spec; give its shape flags yourself"]
    out = [("--num-layers", cfg.layers), ("--hidden-size", cfg.hidden),
           ("--num-attention-heads", cfg.heads), ("--ffn-hidden-size", cfg.ffn_dim),
           ("--seq-length", cfg.seq), ("--max-position-embeddings", cfg.seq)]
    if cfg.family == "llama":
        out += ["--swiglu", ("--normalization", "RMSNorm"), ("--norm-epsilon", cfg.norm_eps),
                ("--position-embedding-type", "rope"), ("--rotary-base", int(cfg.rope_theta)),
                "--disable-bias-linear"]
        if cfg.n_kv_heads != cfg.heads:
            out += ["--group-query-attention", ("--num-query-groups", cfg.n_kv_heads)]
    out += [("--hidden-dropout", cfg.dropout), ("--attention-dropout", cfg.dropout)]
    if not cfg.tied:
        out.append("--untie-embeddings-and-output-weights")
    out.append(f"# vocabulary: {cfg.vocab} tokens, from your tokenizer flags")
    return out


def moe_model_args(cfg) -> list:
    """A ``moe`` spec as Megatron-core's MoE flags (its blocks are llama's with routed experts,
    MLA's where the spec sets ``kv_lora_rank``: ``mla_args``; DeepSeek's router specifics are
    not autopar's model and are not written)."""
    out = [("--num-layers", cfg.layers), ("--hidden-size", cfg.hidden),
           ("--num-attention-heads", cfg.heads), ("--ffn-hidden-size", cfg.ffn_dim),
           ("--seq-length", cfg.seq), ("--max-position-embeddings", cfg.seq),
           "--swiglu", ("--normalization", "RMSNorm"), ("--norm-epsilon", cfg.norm_eps),
           ("--position-embedding-type", "rope"), ("--rotary-base", int(cfg.rope_theta)),
           "--disable-bias-linear"]
    if cfg.n_kv_heads != cfg.heads and not getattr(cfg, "kv_lora_rank", 0):
        out += ["--group-query-attention", ("--num-query-groups", cfg.n_kv_heads)]
    if getattr(cfg, "kv_lora_rank", 0):   # Multi-head Latent Attention (autopar/models/mla.py)
        out += mla_args(cfg)
    out += [("--num-experts", cfg.experts), ("--moe-router-topk", cfg.top_k),
            ("--moe-ffn-hidden-size", cfg.expert_ffn_dim), "--moe-grouped-gemm",
            ("--moe-token-dispatcher-type", "alltoall")]
    if cfg.shared_experts:
        out.append(("--moe-shared-expert-intermediate-size", cfg.shared_experts * cfg.expert_ffn_dim))
    if cfg.dense_layers:
        out.append(("--moe-layer-freq", f"([0]*{cfg.dense_layers}+[1]*{cfg.layers - cfg.dense_layers})"))
    if cfg.capacity_factor:
        out.append(("--moe-expert-capacity-factor", cfg.capacity_factor))
    if not cfg.tied:
        out.append("--untie-embeddings-and-output-weights")
    out.append(f"# vocabulary: {cfg.vocab} tokens, from your tokenizer flags")
    return out


def mla_args(cfg) -> list:
    """A ``moe`` spec's Multi-head Latent Attention as Megatron-LM's flags (megatron/training/
    arguments.py, NVIDIA/Megatron-LM f98b1a008b76: --multi-latent-attention, --q-lora-rank,
    --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim; --qk-layernorm for the
    q / kv RMSNorms autopar's MLA applies to the latents)."""
    out = ["--multi-latent-attention", "--qk-layernorm"]
    if cfg.q_lora_rank:
        out.append(("--q-lora-rank", cfg.q_lora_rank))
    return out + [("--kv-lora-rank", cfg.kv_lora_rank), ("--qk-head-dim", cfg.qk_nope_head_dim),
                  ("--qk-pos-emb-head-dim", cfg.qk_rope_head_dim), ("--v-head-dim", cfg.v_head_dim)]


def expert_args(plan: Plan, ctx: TrainingContext) -> list:
    """ep / etp, written whenever the plan or the model has experts (Megatron's own default
    expert tensor parallel size is tp, not autopar's 1)."""
    moe = ctx.config is not None and ctx.config.family == "moe"
    if plan.ep == 1 and plan.etp == 1 and not moe:
        return []
    return [("--expert-model-parallel-size", plan.ep), ("--expert-tensor-parallel-size", plan.etp)]


def split_args(plan: Plan, ctx: TrainingContext) -> list:
    """The flags that state the plan's split points (none for Megatron's own even split)."""
    if plan.pp == 1:
        return []
    counts = block_counts(resolve_stages(plan, ctx), ctx.n_rows)
    if counts == even_counts(ctx.n_blocks, len(counts)):
        return [("--num-virtual-stages-per-pipeline-rank", plan.vpp)] if plan.vpp > 1 else []
    if plan.vpp == 1 and min(counts) >= 1:
        middle = counts[1:-1]
        if len(set(middle)) <= 1:
            first, last = counts[0], counts[-1]
            if middle and first == middle[0]:
                return [("--decoder-last-pipeline-num-layers", last)]
            if middle and last == middle[0]:
                return [("--decoder-first-pipeline-num-layers", first)]
            return [("--decoder-first-pipeline-num-layers", first),
                    ("--decoder-last-pipeline-num-layers", last)]
    return [("--pipeline-model-parallel-layout", megatron_layout(counts))]


def plan_args(plan: Plan, ctx: TrainingContext) -> list:
    """Every Megatron-LM flag of the plan and its job, in (flag, value) pairs and bare switches."""
    refuse_if_needed("megatron", plan, lambda p: problems(p, ctx))
    out = model_args(ctx)
    out += [("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp)]
    out += split_args(plan, ctx)
    out += expert_args(plan, ctx)
    if plan.sequence_parallel:
        out.append("--sequence-parallel")
        if has_overlap(plan.runtime):   # megatron:tp_comm_overlap (tp_overlap_switches.py)
            out.append("--tp-comm-overlap")
    if plan.cp > 1:   # context parallelism: the K/V exchange the runtime profile prices
        from costmodels.profiles.runtime import load_runtime
        out += [("--context-parallel-size", plan.cp),
                ("--cp-comm-type", "allgather" if load_runtime(plan.runtime).cp_all_gather else "p2p")]
    if plan.placement == "tp,pp,dp":
        out.append("--use-tp-pp-dp-mapping")
    out += [("--micro-batch-size", plan.micro_batch_size),
            ("--global-batch-size", ctx.need("global_batch", "--global-batch or a plans file"))]
    if plan.recompute == "selective":
        out.append(("--recompute-granularity", "selective"))
    elif plan.recompute == "full":
        out += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", 1)]
    if plan.zero == 1:
        out.append("--use-distributed-optimizer")
        if plan.dp_shard is not None:   # HSDP: the optimizer sharded in groups of dp_shard·cp
            out.append(("--num-distributed-optimizer-instances", plan.replicas))
    elif plan.zero >= 2:
        out += ["--use-megatron-fsdp", ("--data-parallel-sharding-strategy", ZERO_STRATEGY[plan.zero]),
                ("--ckpt-format", "fsdp_dtensor")]
    if plan.dp > 1:
        out.append("--overlap-grad-reduce")
        if plan.zero >= 1:
            out.append("--overlap-param-gather")
    out += [("--attention-backend", "flash" if plan.attention == "flash" else "unfused"), "--bf16"]
    out += precision_flags.megatron_args(plan)   # FP8: --fp8-format / --fp8-recipe
    return out


def export(plan: Plan, ctx: TrainingContext) -> Exported:
    pairs = plan_args(plan, ctx)
    nnodes, nproc = nodes_for(plan.world_size, ctx.gpus_per_node)
    text = "\n".join([
        "#!/bin/bash",
        f"# autopar plan {plan.label()}, for Megatron-LM pretrain_gpt.py",
        f"# (flags as Megatron-LM {RELEASE} spells them); model {ctx.model}, {plan.world_size} GPUs = "
        f"dp {plan.dp} x " + (f"cp {plan.cp} x " if plan.cp > 1 else "") + f"tp {plan.tp} x pp {plan.pp}",
        # Megatron wants 1 with tp (one CUDA work queue orders its overlapped collectives), FSDP more
        f"export CUDA_DEVICE_MAX_CONNECTIONS={1 if plan.zero < 2 else 8}",
        "AUTOPAR_ARGS=(",
        format_args(pairs),
        ")",
        *pool_lines(plan, nproc),
        f"# on each of the {nnodes} node(s); add your data, tokenizer, optimizer and logging flags",
        launch_line(nnodes, nproc, 'pretrain_gpt.py "${AUTOPAR_ARGS[@]}" "$@"'),
        ""])
    return Exported("megatron", {"megatron.sh": text}, RUNTIMES["megatron"])


def argv(plan: Plan, ctx: TrainingContext) -> list[str]:
    """The plan's Megatron-LM flags as argv words (what its argument parser receives)."""
    return flag_list(plan_args(plan, ctx))


# ---- import -----------------------------------------------------------------------------------
def parse(source: str, ctx: TrainingContext) -> Imported:
    """A Megatron-LM command line (flags, a torchrun line or a whole launch script) as a plan."""
    flags = read_flags(read_text(source))
    gpus = ctx.gpus or torchrun_gpus(flags)
    plan_fields, global_batch, seq = plan_fields_from_flags(flags, ctx, gpus, "megatron")
    plan = Plan(**plan_fields)
    runtime = RUNTIMES["megatron"] + (":cp_all_gather" if _cp_comm(flags, "megatron") == "allgather"
                                      and plan.cp > 1 else "")
    runtime = with_overlap(runtime) if flags.get("tp_comm_overlap") else runtime
    return Imported(with_runtime(plan, runtime), runtime, "megatron",
                    gpus=plan.world_size, global_batch=global_batch, seq=seq)


def int_flag(flags: dict, name: str, default=None):
    value = flags.get(name)
    if value is None:
        return default
    return positive_int(value, "--" + name.replace("_", "-"))


def check_shape(flags: dict, ctx: TrainingContext, who: str) -> None:
    """The command line's model flags against MODEL: a mismatch is a SpecError naming both."""
    cfg = ctx.config
    if cfg is None:
        return
    kv_flag = "num_query_groups" if flags.get("num_query_groups") else "num_key_value_heads"
    pairs = (("num_layers", cfg.layers, "layers"), ("hidden_size", cfg.hidden, "hidden"),
             ("num_attention_heads", cfg.heads, "heads"), ("ffn_hidden_size", cfg.ffn_dim, "ffn"),
             (kv_flag, cfg.n_kv_heads, "kv_heads"))
    for name, mine, key in pairs:
        theirs = int_flag(flags, name)
        if theirs is not None and theirs != mine:
            raise SpecError(f"{who} --{name.replace('_', '-')} {theirs} but MODEL {ctx.model} has "
                            f"{key}={mine}; pass a MODEL with {key}={theirs} (e.g. '{ctx.model}:{key}="
                            f"{theirs}' or a family spec)")


def recompute_of(flags: dict, counts: list[int], who: str) -> str:
    granularity = flags.get("recompute_granularity")
    if flags.get("recompute_activations") or granularity == "selective":
        return "selective"
    if flags.get("checkpoint_activations") and granularity is None:
        return "full"
    if granularity is None:
        return "none"
    if granularity != "full":
        raise PlanError(f"{who} --recompute-granularity {granularity!r}: autopar knows full and selective")
    method, n = flags.get("recompute_method"), int_flag(flags, "recompute_num_layers", 1)
    if method == "uniform" and n == 1 or method == "block" and n >= max(counts):
        return "full"
    raise PlanError(f"{who} --recompute-granularity full --recompute-method {method} "
                    f"--recompute-num-layers {n} recomputes some layers or groups of layers; autopar's "
                    "full recompute is every layer on its own: use --recompute-method uniform "
                    "--recompute-num-layers 1")


def plan_fields_from_flags(flags: dict, ctx: TrainingContext, gpus: int | None, who: str):
    """(plan fields, global batch, seq) from Megatron-style flags (Megatron-LM and, for tp / pp /
    sequence parallel / recompute, Megatron-DeepSpeed)."""
    for name in ("ds_sequence_parallel_size",):
        if int_flag(flags, name, 1) != 1:
            raise PlanError(f"{who} --{name.replace('_', '-')} {flags[name]}: autopar plans have no "
                            "expert / Ulysses parallelism; set it to 1")
    cp = int_flag(flags, "context_parallel_size", 1)
    if cp > 1:
        _cp_comm(flags, who)
    check_shape(flags, ctx, who)
    n_layers = int_flag(flags, "num_layers") or ctx.n_blocks
    n_rows = n_layers + 2
    tp, pp = int_flag(flags, "tensor_model_parallel_size", 1), int_flag(flags, "pipeline_model_parallel_size", 1)
    counts, vpp = _counts(flags, n_layers, pp, who)
    stages = stages_from_counts(counts, n_rows, f"{who} pipeline split")
    mb = int_flag(flags, "micro_batch_size")
    if mb is None:
        raise PlanError(f"{who} command line has no --micro-batch-size; add it")
    dp = split_dp(gpus, tp * pp * cp, f"the {who} command line")
    global_batch = int_flag(flags, "global_batch_size") or ctx.global_batch or mb * dp
    seq = int_flag(flags, "seq_length")
    attention = "math" if flags.get("attention_backend") in ("unfused", "local") else "flash"
    fields = dict(dp=dp, tp=tp, pp=pp, vpp=vpp, micro_batch_size=mb, zero=_zero(flags, who),
                  recompute=recompute_of(flags, counts, who),
                  sequence_parallel=bool(flags.get("sequence_parallel")) and tp > 1,
                  schedule="interleaved-1f1b" if vpp > 1 else "1f1b", attention=attention,
                  stages=stages, placement="tp,pp,dp" if flags.get("use_tp_pp_dp_mapping") else "tp,dp,pp",
                  precision=precision_flags.megatron_precision(flags, who))
    if cp > 1:
        fields["cp"] = cp
    instances = int_flag(flags, "num_distributed_optimizer_instances", 1)
    if instances > 1:   # HSDP of the distributed optimizer
        if fields["zero"] != 1 or dp % instances:
            raise PlanError(f"{who} --num-distributed-optimizer-instances {instances} needs "
                            f"--use-distributed-optimizer and must divide dp={dp}; fix the command line")
        fields["dp_shard"] = dp // instances
    ep = int_flag(flags, "expert_model_parallel_size", 1)
    if ep > 1 or flags.get("num_experts"):   # Megatron's expert tp defaults to tp
        fields.update(ep=ep, etp=int_flag(flags, "expert_tensor_parallel_size", tp))
    return fields, global_batch, seq


def _cp_comm(flags: dict, who: str) -> str:
    """--cp-comm-type as autopar prices it: p2p (a ring) or allgather; a2a (Ulysses) is refused."""
    kinds = flags.get("cp_comm_type") or "p2p"
    kinds = set(kinds if isinstance(kinds, list) else str(kinds).split())
    if len(kinds) > 1 or not kinds <= {"p2p", "allgather"}:
        raise PlanError(f"{who} --cp-comm-type {' '.join(sorted(kinds))}: autopar prices the p2p ring "
                        "and allgather (one kind for every layer); use --cp-comm-type p2p")
    return kinds.pop()


def _zero(flags: dict, who: str) -> int:
    if flags.get("use_torch_fsdp2"):
        return 3
    if flags.get("use_megatron_fsdp"):
        strategy = flags.get("data_parallel_sharding_strategy") or "no_shard"
        if strategy not in STRATEGY_ZERO:
            raise PlanError(f"{who} --data-parallel-sharding-strategy {strategy!r} is not one of "
                            f"{sorted(STRATEGY_ZERO)}")
        return STRATEGY_ZERO[strategy]
    return 1 if flags.get("use_distributed_optimizer") else 0


def _counts(flags: dict, n_layers: int, pp: int, who: str) -> tuple[list[int], int]:
    """(blocks per virtual stage, vpp) as Megatron-LM derives them from its flags."""
    layout = flags.get("pipeline_model_parallel_layout")
    first = int_flag(flags, "decoder_first_pipeline_num_layers")
    last = int_flag(flags, "decoder_last_pipeline_num_layers")
    if layout:
        counts = parse_megatron_layout(layout)
        if len(counts) % pp:
            raise PlanError(f"{who} --pipeline-model-parallel-layout has {len(counts)} stages, not a "
                            f"multiple of --pipeline-model-parallel-size {pp}")
        return counts, len(counts) // pp
    vpp = int_flag(flags, "num_virtual_stages_per_pipeline_rank")
    per_virtual = int_flag(flags, "num_layers_per_virtual_pipeline_stage")
    if per_virtual is not None:
        if n_layers % (pp * per_virtual):
            raise PlanError(f"{who} --num-layers-per-virtual-pipeline-stage {per_virtual}: {n_layers} "
                            f"layers do not split into pp={pp} ranks of such stages")
        vpp = n_layers // (pp * per_virtual)
    vpp = vpp or 1
    if first is not None or last is not None:
        if vpp > 1:
            raise PlanError(f"{who} uneven first/last stages with virtual stages: state this split as "
                            "--pipeline-model-parallel-layout")
        return first_last_counts(n_layers, pp, first, last), 1
    counts = even_counts(n_layers, pp * vpp)
    if counts is None:
        raise PlanError(f"{who}: {n_layers} layers do not split evenly over pp·vpp = {pp * vpp} stages; "
                        "give --decoder-first/last-pipeline-num-layers or a layout")
    return counts, vpp
