"""``autopar search``: the top-k plans for a model on a cluster, the best proved optimal."""
from __future__ import annotations


def register(sub) -> None:
    from autopar.cli.common import add_model_args
    p = sub.add_parser("search", help="find the best parallel plans (CP-SAT over the cost model)",
                       description="Search dp, tp, pp, vpp, micro-batch, ZeRO, recompute, sequence "
                                   "parallel, schedule and split points; print the top plans.")
    add_model_args(p)
    p.add_argument("--hardware", required=True, help="hardware profile name or path (autopar hardware)")
    p.add_argument("--gpus", type=int, required=True, help="GPU count (the most for the GPU-count objectives)")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--fix", default=None, metavar="K=V,...",
                   help="pin plan fields, e.g. tp=8,schedule=1f1b (stages=0:49;49:98)")
    p.add_argument("--top", type=int, default=5, help="how many distinct plans (default 5)")
    p.add_argument("--objective", default="step_time",
                   choices=["step_time", "throughput_per_gpu", "fewest_gpus"],
                   help="step_time: fastest step on --gpus; throughput_per_gpu: best tokens/s per GPU "
                        "on up to --gpus; fewest_gpus: fewest GPUs reaching --target-*")
    p.add_argument("--target-step-time", type=float, default=None, metavar="S",
                   help="for fewest_gpus: step time to reach, seconds")
    p.add_argument("--target-tokens-per-s", type=float, default=None, metavar="N",
                   help="for fewest_gpus: throughput to reach, tokens per second")
    p.add_argument("--allow-cross-node-tp", action="store_true", help="let tensor parallel span nodes")
    p.add_argument("--max-micro-batch", type=int, default=None, help="cap the micro-batch size")
    p.add_argument("--time-limit", type=float, default=600.0, help="seconds before giving up proving")
    p.add_argument("--leaf", action="append", default=[], metavar="CLASS",
                   help="trace submodules of this class whole, FLOPs measured (repeatable); MoE experts: priced as run,"
                        " k of E per token, and planned as dense layers (no expert parallelism)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-o", "--output", default=None, metavar="plans.json",
                   help="write the plans file that autopar report, explain and the runtime read")
    p.add_argument("--explain", action="store_true", help="also print why the best plan wins")
    from autopar.cli.export import add_current_args
    add_current_args(p, "--compare-with-current", "score the configuration you run today (megatron \"ARGS\", "
                     "torchtitan job.toml, deepspeed ds.json, torchrun LINES) and show it next to the best plan")
    p.set_defaults(run=run)


def _leaf_table(args):
    """The layer table traced with --leaf classes (None: the search traces it itself)."""
    if not args.leaf:
        return None
    from autopar.trace import table_for
    return table_for(args.model, 1, args.seq, tuple(args.leaf))


def run(args) -> int:
    import sys

    from autopar.search import parse_fix, search
    from costmodels.plans_file import PlansFile
    fix = parse_fix(args.fix)
    result = search(args.model, args.hardware, args.gpus, args.global_batch, seq=args.seq, fix=fix,
                    top=args.top, objective=args.objective, target_step_time_s=args.target_step_time,
                    target_tokens_per_s=args.target_tokens_per_s,
                    allow_cross_node_tp=args.allow_cross_node_tp, max_micro_batch=args.max_micro_batch,
                    time_limit_s=args.time_limit, progress=sys.stderr.isatty() or not args.json,
                    table=_leaf_table(args))
    data = result.plans_file()
    if args.current:
        add_comparison(data, args)
    if args.output:
        PlansFile.read(data).write(args.output)
    if args.json:
        from autopar.cli.common import print_json
        print_json(data)
        return 0
    print_table(data)
    if args.current:
        print(data["comparison"]["text"])
    if args.explain:
        from autopar.search import explain_plans, render_explanation
        print()
        print(render_explanation(explain_plans(data)))
    if args.output:
        print(f"wrote {args.output}")
    return 0


def add_comparison(data: dict, args) -> None:
    """The user's configuration (``--compare-with-current``) scored on the search's model, hardware,
    GPUs and batch, as ``data["current"]``, and ``data["comparison"]`` against the best plan."""
    from autopar.cli.export import import_current, score_imported
    from autopar.export import compare_estimates
    imported = import_current(data["model"], args.current, gpus=args.gpus, global_batch=data["global_batch"],
                              seq=data["seq"], hardware=data["hardware"], megatron_args=args.megatron_args)
    current = score_imported(data["model"], data["hardware"], imported, seq=data["seq"],
                             global_batch=data["global_batch"])
    data["current"] = current
    data["comparison"] = compare_estimates(current, data["plans"][0])


def print_table(data: dict) -> None:
    from rich.table import Table
    GiB = 1024 ** 3
    t = Table(title=f"autopar search: {data['model']} on {data['gpus']} × {data['hardware']}, "
                    f"global batch {data['global_batch']}, seq {data['seq']}")
    for col in ("#", "dp", "tp", "pp", "vpp", "mbs", "zero", "recompute", "sp", "schedule",
                "step s", "tokens/s", "TFLOP/s/GPU", "MFU", "bubble", "mem GiB", "stages"):
        t.add_column(col, justify="left" if col in ("recompute", "schedule", "stages") else "right")
    for p in data["plans"]:
        st = p.get("stages") or []
        sizes = [b - a for a, b in st]
        stages = ("balanced" if not st else f"all {sizes[0]} rows" if len(st) == 1 else
                  f"{len(st)} × {min(sizes)}–{max(sizes)} rows")
        t.add_row(str(p["rank"]), str(p["dp"]), str(p["tp"]), str(p["pp"]), str(p["vpp"]),
                  str(p["micro_batch_size"]), str(p["zero"]), p["recompute"],
                  "yes" if p["sequence_parallel"] else "no", p["schedule"],
                  f"{p['step_time_s']:.4g}", f"{p['tokens_per_s']:,.0f}", f"{p['tflops_per_gpu']:.1f}",
                  f"{p['mfu']:.1%}", f"{p['bubble_fraction']:.1%}",
                  f"{p['memory_bytes']['total'] / GiB:.1f}/{p['hbm_bytes'] / GiB:.0f}", stages)
    import shutil

    from rich.console import Console
    c = Console(width=max(shutil.get_terminal_size((160, 24)).columns, 150))
    c.print(t)
    s = data.get("search", {})
    c.print(f"{'proved optimal under the cost model' if data['optimal'] else 'NOT proved optimal'}; "
            f"objective {data['objective']}; search {data['search_time_s']:.2f} s "
            f"({s.get('configurations', '?')} configurations, {s.get('bounded', '?')} bounded, "
            f"{s.get('solved_cp_sat', '?')} split by CP-SAT)")
