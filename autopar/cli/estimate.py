"""``autopar estimate MODEL --hardware H --gpus N --global-batch B --plan PLAN [--seq S] [--json]
[-o FILE]``: score one plan or several (PLAN is JSON text or a file: a plan object, an array, or a
plans file). A table for people; with --json one object per plan (an array for an array); -o
writes that JSON to a file (what ``autopar report`` and ``explain`` read).

``--from megatron|torchtitan|deepspeed|torchrun CONFIG`` instead of ``--plan`` scores the
configuration a user runs today (``autopar.export.import_config``); --gpus and --global-batch are
then needed only where CONFIG does not say them."""
from __future__ import annotations


def register(sub) -> None:
    from autopar.cli.common import add_model_args, add_progress_arg, int_arg
    p = sub.add_parser("estimate", help="predict step time, memory and communication of a plan")
    add_model_args(p)
    from autopar.cli.cluster_args import add_hardware_args
    add_hardware_args(p, "number of GPUs (= dp·tp·pp; with pools, their sum)")
    p.add_argument("--global-batch", type=int_arg(limit="global_batch"), default=None, metavar="B",
                   help="sequences per optimizer step")
    p.add_argument("--plan", default=None, metavar="PLAN",
                   help="plan JSON text or file: one object, an array, or a plans file "
                        "(fields: dp, tp, pp, vpp, micro_batch_size, zero, recompute, "
                        "sequence_parallel, schedule, attention, stages, placement, runtime)")
    p.add_argument("--runtime", default=None, metavar="NAME",
                   help="score the plans as this runtime runs them: autopar (default), megatron, "
                        "deepspeed, fsdp, options after a colon (megatron:overlap_grad_reduce) or a "
                        ".toml runtime profile (overrides the plans' own 'runtime')")
    from autopar.cli.export import add_current_args
    add_current_args(p, "--from", "score your own configuration instead of --plan: megatron \"ARGS\" (a "
                                  "command line or launch script), torchtitan job.toml, deepspeed ds.json "
                                  "(with --megatron-args), torchrun LINES")
    p.add_argument("--leaf", action="append", default=[], metavar="CLASS",
                   help="trace submodules of this class whole, FLOPs measured (repeatable); MoE experts: priced as run,"
                        " k of E per token, and planned as dense layers (no expert parallelism)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--wide", action="store_true",
                   help="every plan in one table, however wide (else as many tables as fit the terminal)")
    p.add_argument("-o", "--output", default=None, metavar="FILE.json",
                   help="also write the --json output to this file (for autopar report / explain)")
    add_progress_arg(p)
    p.set_defaults(run=run)


def run(args) -> int:
    import json

    from autopar.cli.common import check_output, print_json, progress
    from autopar.scoring import estimate_plans
    from costmodels.contracts.errors import PlanError
    from costmodels.contracts.files import write_text_atomic
    from costmodels.contracts.plans_file import PlansFile
    check_output(args.output)          # before the trace, not after it
    if (args.plan is None) == (args.current is None):
        raise PlanError("give either --plan PLAN or --from TARGET CONFIG (one of them)")
    if args.current is not None:
        if args.cluster or (args.hardware and "," in args.hardware):
            raise PlanError("--from scores a uniform configuration; give one --hardware profile")
        return run_imported(args)
    from autopar.cli.cluster_args import hardware_of
    hardware, args.gpus = hardware_of(args)
    for name, flag in (("gpus", "--gpus"), ("global_batch", "--global-batch")):
        if getattr(args, name) is None:
            raise PlanError(f"{flag} is needed with --plan")
    given = PlansFile.read(args.plan)
    from autopar.cli.early_checks import check_plans_before_trace
    check_plans_before_trace(given, args.model, args.gpus, args.global_batch, hardware)   # no trace yet
    from autopar.cli.search import _leaf_table
    from autopar.runtime.assemble.model_verdict import refuse_tp
    for p in given.plans:   # what the runtime refuses is not priced (model_verdict)
        refuse_tp(args.model, p.tp, args.seq, tuple(args.leaf))
    with progress(args, f"tracing {args.model} and estimating"):
        results = estimate_plans(args.model, hardware, args.gpus, args.global_batch, given.plans,
                                 seq=args.seq, runtime=args.runtime, table=_leaf_table(args))
    out = results[0] if given.form == "object" else results    # one object in, one object out
    if args.output:
        write_text_atomic(args.output, json.dumps(out, indent=2) + "\n")
    if args.json:
        print_json(out)
        return 0
    render(results, wide=args.wide)
    if args.output:
        print(f"wrote {args.output}")
    return 0


def run_imported(args) -> int:
    """``--from``: read the user's configuration, score it under its runtime, print as for --plan."""
    from autopar.cli.common import print_json
    from autopar.cli.export import import_current, score_imported
    imported = import_current(args.model, args.current, gpus=args.gpus,
                              global_batch=args.global_batch, seq=args.seq, hardware=args.hardware,
                              megatron_args=args.megatron_args)
    result = score_imported(args.model, args.hardware, imported, seq=args.seq,
                            global_batch=args.global_batch)
    if args.output:
        import json

        from costmodels.contracts.files import write_text_atomic
        write_text_atomic(args.output, json.dumps(result, indent=2) + "\n")
    if args.json:
        print_json(result)
        return 0
    print(f"your {imported.source} configuration is the plan {imported.plan.label()} "
          f"(runtime {imported.runtime})")
    render([result])
    return 0


def render(results, wide: bool = False) -> None:
    from autopar.cli.common import human
    from autopar.cli.plan_columns import PlanColumns
    from costmodels.contracts.breakdown import BREAKDOWN_KEYS, COMM_KIND_LABELS, term_label
    from costmodels.contracts.plans_file import PlanResult
    from costmodels.profiles.error_bands import format_band
    first = results[0]
    t = PlanColumns(title=f"{first['model']} on {first['gpus']} × {first['hardware']}, global batch "
                    f"{first['global_batch']}, seq {first['seq']}")
    t.add_column("")
    for i, d in enumerate(results):
        t.add_column(f"plan {i + 1}\n{PlanResult.from_dict(d).plan.label()}", justify="right")

    def row(label, fn):
        t.add_row(label, *[fn(d) for d in results])

    gb = lambda x: f"{x / 2 ** 30:.2f} GiB"  # noqa: E731  (GiB everywhere, as search and inspect)
    row("micro-batches", lambda d: str(d["num_micro_batches"]))
    row("step time (± check error)", lambda d: format_band(d["step_time_s"], d.get("error_band")))
    row("tokens/s", lambda d: human(d["tokens_per_s"]))
    row("TFLOP/s per GPU", lambda d: f"{d['tflops_per_gpu']:.1f}")
    row("MFU", lambda d: f"{100 * d['mfu']:.1f} %")
    row("bubble", lambda d: f"{100 * d['bubble_fraction']:.1f} %")
    for k in BREAKDOWN_KEYS:
        row(f"  {term_label(k)}", lambda d, k=k: f"{d['breakdown_s'][k]:.4g} s")
    row("memory (most loaded GPU)", lambda d: gb(d["memory_bytes"]["total"]))
    for k in ("params", "grads", "optimizer", "gathered", "activations", "reserve"):
        row(f"  {k}", lambda d, k=k: gb(d["memory_bytes"].get(k, 0.0)))
    row("HBM", lambda d: gb(d["hbm_bytes"]))
    row("runtime", lambda d: d.get("runtime", "autopar"))
    row("fits", lambda d: "[green]yes[/green]" if d["fits"] else "[red]NO[/red]")
    for k in ("dp", "tp", "pp", "zero"):
        row(f"sent per GPU: {COMM_KIND_LABELS[k]}", lambda d, k=k: gb(d["comm_bytes"][k]))
    if any("cp" in d["comm_bytes"] for d in results):   # context parallelism's ring
        row(f"sent per GPU: {COMM_KIND_LABELS['cp']}", lambda d: gb(d["comm_bytes"].get("cp", 0.0)))
    if any(d.get("cluster") for d in results):   # pooled plans: GPUs used and left idle per pool
        row("pools: used / idle GPUs", lambda d: ", ".join(
            f"{u['name']} {u['used']}/{u['idle']}" for u in (d.get("cluster") or {}).get("pools", [])) or "–")
    t.print(wide=wide)   # folded to the terminal: plans in as many tables as fit (autopar.cli.plan_columns)
