"""``autopar search``: the top-k plans for a model on a cluster, the best proved optimal."""
from __future__ import annotations


def register(sub) -> None:
    from autopar.cli.common import add_model_args, add_progress_arg, float_arg, int_arg
    p = sub.add_parser("search", help="find the best parallel plans (CP-SAT over the cost model)",
                       description="Search dp, tp, pp, vpp, micro-batch, ZeRO, recompute, sequence "
                                   "parallel, schedule and split points; print the top plans.")
    add_model_args(p)
    from autopar.cli.cluster_args import add_hardware_args
    add_hardware_args(p, "GPU count (the most for the GPU-count objectives; with pools, their sum)")
    p.add_argument("--global-batch", type=int_arg(limit="global_batch"), required=True,
                   help="sequences per optimizer step")
    p.add_argument("--fix", default=None, metavar="K=V,...",
                   help="pin plan fields, e.g. tp=8,schedule=1f1b (stages=0:49;49:98)")
    p.add_argument("--top", type=int_arg(high=1000), default=5, help="how many distinct plans (default 5)")
    p.add_argument("--objective", default="step_time",
                   choices=["step_time", "throughput_per_gpu", "fewest_gpus"],
                   help="step_time: fastest step on --gpus; throughput_per_gpu: best tokens/s per GPU "
                        "on up to --gpus; fewest_gpus: fewest GPUs reaching --target-*")
    p.add_argument("--target-step-time", type=float_arg(), default=None, metavar="S",
                   help="for fewest_gpus: step time to reach, seconds")
    p.add_argument("--target-tokens-per-s", type=float_arg(), default=None, metavar="N",
                   help="for fewest_gpus: throughput to reach, tokens per second")
    p.add_argument("--runtime", default=None, metavar="NAME",
                   help="the software that will run the plans: autopar (default), megatron, deepspeed, "
                        "fsdp, with options after a colon (megatron:overlap_grad_reduce) or a .toml "
                        "runtime profile; the search proposes only what it can run")
    p.add_argument("--for", dest="trainer", default=None, choices=("megatron", "torchtitan", "deepspeed", "torchrun"),
                   help="the trainer you will export to (autopar export --to): a synonym of --runtime "
                        "with that trainer's runtime profile (torchtitan: fsdp; torchrun: autopar)")
    p.add_argument("--allow-cross-node-tp", action="store_true", help="let tensor parallel span nodes")
    p.add_argument("--zero-bubble", action="store_true",
                   help="also search the zero-bubble schedules interleaved-zb, zb-v and dualpipe-v "
                        "(minutes rather than seconds at 1000+ GPUs; --fix schedule=zb-v searches one)")
    p.add_argument("--max-micro-batch", type=int_arg(limit="micro_batch"), default=None,
                   help="cap the micro-batch size")
    p.add_argument("--time-limit", type=float_arg(high=7 * 24 * 3600.0), default=600.0,
                   help="seconds before giving up proving")
    p.add_argument("--leaf", action="append", default=[], metavar="CLASS",
                   help="trace submodules of this class whole, FLOPs measured (repeatable); MoE experts: priced as run,"
                        " k of E per token, and planned as dense layers (no expert parallelism)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--wide", action="store_true",
                   help="print every column of the table (default: columns are left out to fit the terminal)")
    p.add_argument("-o", "--output", default=None, metavar="plans.json",
                   help="write the plans file that autopar report, explain and the runtime read")
    p.add_argument("--explain", action="store_true", help="also print why the best plan wins")
    from autopar.cli.export import add_current_args
    add_current_args(p, "--compare-with-current", "score the configuration you run today (megatron \"ARGS\", "
                     "torchtitan job.toml, deepspeed ds.json, torchrun LINES) and show it next to the best plan")
    add_progress_arg(p)
    p.set_defaults(run=run)


def _leaf_table(args):
    """The layer table traced with --leaf classes (None: the search traces it itself)."""
    if not args.leaf:
        return None
    from autopar.trace import table_for
    return table_for(args.model, 1, args.seq, tuple(args.leaf))


def run(args) -> int:
    from autopar.cli.common import check_output, progress, wants_progress
    from autopar.search import parse_fix, search
    from autopar.trace import table_for
    from costmodels.contracts.plans_file import PlansFile
    check_output(args.output)          # before the search, not after it
    from autopar.cli.cluster_args import hardware_of
    from costmodels.contracts.errors import PlanError
    from costmodels.profiles.cluster import Cluster
    fix = parse_fix(args.fix)
    args.runtime = runtime_for_trainer(args.trainer, args.runtime)
    hardware, args.gpus = hardware_of(args)   # a bad profile or pool fails before the trace
    if args.gpus is None:
        raise PlanError("--gpus N is needed with a single hardware profile")
    if isinstance(hardware, Cluster) and args.current:
        raise PlanError("--compare-with-current scores a uniform configuration; run it without pools")
    from autopar.search.request_checks import check_targets
    check_targets(args.objective, args.target_step_time, args.target_tokens_per_s)   # before the trace
    with progress(args, f"tracing {args.model}"):
        table = table_for(args.model, 1, args.seq, tuple(args.leaf))
        if fix.get("tp", 2) != 1:   # the runtime's answer on tp (model_verdict), heads seen or not
            from autopar.runtime.assemble.model_verdict import refuse_tp, tp_refusal
            refuse_tp(args.model, int(fix.get("tp", 1)), args.seq, tuple(args.leaf))
            if "tp" not in fix and tp_refusal(args.model, args.seq, tuple(args.leaf)):
                fix = {**fix, "tp": 1}
    imported, runtime = None, args.runtime
    if args.current:   # your configuration first: the search then plans for the runtime you use
        from autopar.cli.export import import_current
        imported = import_current(args.model, args.current, gpus=args.gpus, global_batch=args.global_batch,
                                  seq=args.seq, hardware=args.hardware, megatron_args=args.megatron_args)
        runtime = runtime or imported.runtime
    result = search(args.model, hardware, args.gpus, args.global_batch, seq=args.seq, fix=fix,
                    top=args.top, objective=args.objective, target_step_time_s=args.target_step_time,
                    target_tokens_per_s=args.target_tokens_per_s,
                    allow_cross_node_tp=args.allow_cross_node_tp, max_micro_batch=args.max_micro_batch,
                    time_limit_s=args.time_limit, progress=wants_progress(args), table=table,
                    runtime=runtime, zero_bubble=args.zero_bubble)
    data = result.plans_file()
    if data["plans"] and data["plans"][0].get("precision", "bf16") != "bf16" and "precision" not in fix:
        # what FP8 bought: the same search with precision=bf16 pinned (autopar.search.precision_gain)
        from autopar.search.precision_gain import compare_precisions
        with progress(args, "searching the best bf16 plan to compare"):
            bf16 = search(args.model, hardware, args.gpus, args.global_batch, seq=args.seq,
                          fix={**fix, "precision": "bf16"}, top=1, objective=args.objective,
                          target_step_time_s=args.target_step_time, target_tokens_per_s=args.target_tokens_per_s,
                          allow_cross_node_tp=args.allow_cross_node_tp, max_micro_batch=args.max_micro_batch,
                          time_limit_s=args.time_limit, table=table, runtime=runtime,
                          zero_bubble=args.zero_bubble).plans_file()
        if bf16["plans"]:
            data["precision_gain"] = compare_precisions(data["plans"][0], bf16["plans"][0])
    if imported is not None:
        add_comparison(data, imported)
    if args.output:
        PlansFile.read(data).write(args.output)
    if args.json:
        from autopar.cli.common import print_json
        print_json(data)
        return 0
    print_table(data, wide=args.wide)
    if data.get("precision_gain"):
        print(data["precision_gain"]["text"])
    if args.current:
        print(data["comparison"]["text"])
    if args.explain:
        from autopar.search import explain_plans, render_explanation
        print()
        print(render_explanation(explain_plans(data)))
    if args.output:
        print(f"wrote {args.output}")
    return 0


def runtime_for_trainer(trainer: str | None, runtime: str | None) -> str | None:
    """``--for TRAINER``: the runtime profile of the trainer ``autopar export --to`` writes for
    (``autopar.export.common.RUNTIMES``); refused beside a --runtime that says otherwise."""
    if trainer is None:
        return runtime
    from autopar.export.common import RUNTIMES
    from costmodels.contracts.errors import PlanError
    wanted = RUNTIMES[trainer]
    if runtime is not None and runtime.split(":")[0] != wanted:
        raise PlanError(f"--for {trainer} searches under the {wanted} runtime, but --runtime says "
                        f"{runtime}; give one of them")
    return runtime or wanted


def add_comparison(data: dict, imported) -> None:
    """The user's configuration (``--compare-with-current``, imported) scored on the search's model,
    hardware, GPUs and batch, as ``data["current"]``, and ``data["comparison"]`` against the best
    plan; the search ran under the configuration's runtime unless ``--runtime`` said otherwise."""
    from autopar.cli.export import score_imported
    from autopar.export import compare_estimates
    current = score_imported(data["model"], data["hardware"], imported, seq=data["seq"],
                             global_batch=data["global_batch"])
    data["current"] = current
    data["comparison"] = compare_estimates(current, data["plans"][0])


# columns the table leaves out, first to last, while it is wider than the terminal (--wide: none)
DROPPABLE = ("TFLOP/s/GPU", "tokens/s", "bubble", "sp", "vpp", "stages", "recompute")


def print_table(data: dict, wide: bool = False) -> None:
    """The ranked plans. A GPU-count objective may pick a different count per plan: the title
    then says "up to" the allowed count and a GPUs column gives each plan's own."""
    from rich.table import Table

    from autopar.cli.common import print_table as print_whole
    from costmodels.profiles.error_bands import format_band
    GiB = 1024 ** 3
    plans = data["plans"]
    counts = sorted({p.get("gpus", data["gpus"]) for p in plans})
    if len(counts) == 1:
        on = f"{counts[0]} ×" if counts[0] == data["gpus"] else f"{counts[0]} (of up to {data['gpus']}) ×"
    else:
        on = f"{counts[0]}–{counts[-1]} (up to {data['gpus']}) ×"
    t = Table(title=f"autopar search: {data['model']} on {on} {data['hardware']}, "
                    f"global batch {data['global_batch']}, seq {data['seq']}")
    experts = any(p.get("ep", 1) > 1 or p.get("etp", 1) > 1 for p in plans)   # a MoE's columns
    cols = ["#"] + (["GPUs"] if len(counts) > 1 else []) + [
        "dp", "tp", "pp", "vpp", "mbs", "zero", "recompute", "sp", "schedule", "step s", "tokens/s",
        "TFLOP/s/GPU", "MFU", "bubble", "mem GiB", "stages"]
    precision = any(p.get("precision", "bf16") != "bf16" for p in plans)   # FP8 plans: say which
    if precision:
        cols.insert(cols.index("schedule") + 1, "precision")
    if experts:
        cols[cols.index("pp") + 1:cols.index("pp") + 1] = ["ep", "etp"]
    for col in cols:
        left = col in ("recompute", "schedule", "stages")
        t.add_column(col, justify="left" if left else "right", overflow="fold")
    for p in plans:
        st = p.get("stages") or []
        sizes = [b - a for a, b in st]
        stages = ("balanced" if not st else f"all {sizes[0]} rows" if len(st) == 1 else
                  f"{len(st)} × {min(sizes)}–{max(sizes)} rows")
        if p.get("pools"):   # a pooled plan: its pools along the pipeline
            from costmodels.contracts.plan_pools import pools_label
            from costmodels.contracts.plans_file import PlanResult
            stages += " " + pools_label(PlanResult.from_dict(p).plan)
        gpus = [str(p.get("gpus", data["gpus"]))] if len(counts) > 1 else []
        ep = [str(p.get("ep", 1)), str(p.get("etp", 1))] if experts else []
        t.add_row(str(p["rank"]), *gpus, _dp_cell(p), str(p["tp"]), str(p["pp"]), *ep, str(p["vpp"]),
                  str(p["micro_batch_size"]), str(p["zero"]), p["recompute"],
                  "yes" if p["sequence_parallel"] else "no", p["schedule"],
                  *([p.get("precision", "bf16")] if precision else []),
                  format_band(p["step_time_s"], p.get("error_band"), short=True),
                f"{p['tokens_per_s']:,.0f}", f"{p['tflops_per_gpu']:.1f}",
                  f"{p['mfu']:.1%}", f"{p['bubble_fraction']:.1%}",
                  f"{p['memory_bytes']['total'] / GiB:.1f}/{p['hbm_bytes'] / GiB:.0f}", stages)
    c = print_whole(t, drop=DROPPABLE, wide=wide)
    s = data.get("search", {})
    c.print(f"runtime {s.get('runtime', 'autopar')}; "
            f"{'proved optimal under the cost model' if data['optimal'] else 'NOT proved optimal'}; "
            f"objective {data['objective']}; search {data['search_time_s']:.2f} s "
            f"({s.get('configurations', '?')} configurations, {s.get('bounded', '?')} bounded, "
            f"{s.get('solved_cp_sat', '?')} split by CP-SAT)")
    if s.get("gpu_count_note"):
        c.print(s["gpu_count_note"])
    if s.get("balanced_fallback"):
        c.print("the time limit came before CP-SAT had a split to return: these plans use estimate's "
                "balanced split, scored exactly but not split-optimised (raise --time-limit to search the splits)")
    from autopar.search.schedule_gain import gain_text
    gain = gain_text(plans[0]) if plans else None
    if gain:
        c.print(f"#1 {gain}")
    if s.get("optimal_over"):
        c.print(f"optimal over {s['optimal_over']}")
    for line in (plans[0].get("cluster") or {}).get("why", []):   # pooled: why this split
        c.print(f"plan 1 on {line}")
    c.print("step s ± : the 90th percentile of the cost model's error on published runs of the "
            "plan's regime (~: borrowed from another regime; docs/validation.md)")


def _dp_cell(p: dict) -> str:
    """The dp column: dp, with the cp degree and HSDP's replicas × shard group where the plan has them."""
    cell = str(p["dp"]) + (f" ·cp{p['cp']}" if p.get("cp", 1) > 1 else "")
    if p.get("dp_shard"):
        cell += f" (hsdp {p['dp'] // p['dp_shard']}×{p['dp_shard']})"
    return cell
