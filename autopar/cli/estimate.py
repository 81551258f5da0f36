"""``autopar estimate MODEL --hardware H --gpus N --global-batch B --plan PLAN [--seq S] [--json]``:
score one plan or several (PLAN is JSON text or a file: a plan object, an array, or a plans
file). A table for people; with --json one object per plan (an array for an array)."""
from __future__ import annotations


def register(sub) -> None:
    from autopar.cli.common import add_model_args
    p = sub.add_parser("estimate", help="predict step time, memory and communication of a plan")
    add_model_args(p)
    p.add_argument("--hardware", required=True, metavar="H",
                   help="hardware profile name (autopar hardware) or path to a .toml profile")
    p.add_argument("--gpus", type=int, required=True, metavar="N", help="number of GPUs (= dp·tp·pp)")
    p.add_argument("--global-batch", type=int, required=True, metavar="B",
                   help="sequences per optimizer step")
    p.add_argument("--plan", required=True, metavar="PLAN",
                   help="plan JSON text or file: one object, an array, or a plans file "
                        "(fields: dp, tp, pp, vpp, micro_batch_size, zero, recompute, "
                        "sequence_parallel, schedule, attention, stages, placement, runtime)")
    p.add_argument("--runtime", default=None, metavar="NAME",
                   help="score the plans as this runtime runs them: autopar (default), megatron, "
                        "deepspeed, fsdp, options after a colon (megatron:overlap_grad_reduce) or a "
                        ".toml runtime profile (overrides the plans' own 'runtime')")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)


def run(args) -> int:
    from autopar.cli.common import print_json
    from autopar.scoring import estimate_plans
    from costmodels.plans_file import PlansFile
    given = PlansFile.read(args.plan)
    results = estimate_plans(args.model, args.hardware, args.gpus, args.global_batch, given.plans,
                             seq=args.seq, runtime=args.runtime)
    if args.json:   # one object in, one object out
        print_json(results[0] if given.form == "object" else results)
        return 0
    render(results)
    return 0


def render(results) -> None:
    from rich.table import Table

    from autopar.cli.common import console, human
    from costmodels.breakdown import BREAKDOWN_KEYS, COMM_KIND_LABELS, term_label
    from costmodels.error_bands import format_band
    from costmodels.plans_file import PlanResult
    first = results[0]
    t = Table(title=f"{first['model']} on {first['gpus']} × {first['hardware']}, global batch "
                    f"{first['global_batch']}, seq {first['seq']}")
    t.add_column("")
    for i, d in enumerate(results):
        t.add_column(f"plan {i + 1}\n{PlanResult.from_dict(d).plan.label()}", justify="right")

    def row(label, fn):
        t.add_row(label, *[fn(d) for d in results])

    gb = lambda x: f"{x / 1e9:.2f} GB"  # noqa: E731
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
    console().print(t)
