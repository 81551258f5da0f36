"""``autopar validate``: run plans for real and compare with the cost model's predictions; the
work is in ``autopar.validate``."""
from __future__ import annotations

from autopar.cli.common import add_model_args, int_arg


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "validate", help="run plans for real; predicted vs measured step time and memory",
        description="Run each plan with autopar.apply on N local ranks (warm-up, then timed rounds over all plans), "
                    "measure step time and peak memory per rank, and set them beside the cost "
                    "model's predictions; MAPE and Spearman rank correlation over the plans.")
    add_model_args(p)
    p.add_argument("--hardware", required=True, help="hardware profile name or path (autopar profile)")
    p.add_argument("--nproc", type=int_arg(high=1024), required=True, help="local ranks (= dp·tp·pp of every plan)")
    p.add_argument("--global-batch", type=int_arg(limit="global_batch"), required=True,
                   help="sequences per optimizer step")
    p.add_argument("--plans", default=None, metavar="plans.json",
                   help="plans to run (autopar search -o); default: a spread of the search's plans")
    p.add_argument("--count", type=int_arg(high=1000), default=8, help="how many plans without --plans (default 8)")
    p.add_argument("--steps", type=int_arg(high=100_000), default=10,
                   help="timed steps per plan, run in rounds over the plans (default 10: with 5, two "
                        "runs on a 2-core VM ranked the same plans 0.90-0.98 alike; with 10, identically)")
    p.add_argument("--warmup", type=int_arg(low=0, high=100_000), default=2, help="untimed steps first (default 2)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="measured step time: wall clock (default), or the ranks' CPU time (a host "
                        "shared with other work; both are always in the output)")
    p.add_argument("--fp32", action="store_true", help="run in fp32 instead of bf16 autocast")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("-o", "--output", default=None, metavar="out.json", help="write the result here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args) -> int:
    from autopar.cli.common import check_output, human, print_json, print_table
    from autopar.validate import validate
    from costmodels.contracts.plans_file import PlansFile
    check_output(args.output)      # before minutes of measuring, not after
    res = validate(args.model, args.hardware, args.nproc, args.global_batch, args.plans,
                   steps=args.steps, warmup=args.warmup, seq=args.seq,
                   progress=not args.no_progress, count=args.count, amp=not args.fp32,
                   clock=args.clock)
    if args.output:
        PlansFile.read(res).write(args.output)
    if args.json:
        print_json(res)
        return 0
    from rich.table import Table
    t = Table(title=f"{args.model} on {res['hardware']}, {args.nproc} ranks, global batch {args.global_batch}")
    for h in ("#", "dp", "tp", "pp", "vpp", "mb", "zero", "recompute", "sp", "pred step", "meas step",
              "err", "pred mem", "meas mem", "err"):
        t.add_column(h, justify="right")
    for p in res["plans"]:
        if p.get("measured_step_s") is None:
            t.add_row(str(p["rank"]), str(p["dp"]), str(p["tp"]), str(p["pp"]), str(p["vpp"]),
                      str(p["micro_batch_size"]), str(p["zero"]), p["recompute"],
                      "y" if p["sequence_parallel"] else "n", f"{p['predicted_step_s']:.3f}s",
                      "failed", p.get("error", "")[:40], "", "", "")
            continue
        t.add_row(str(p["rank"]), str(p["dp"]), str(p["tp"]), str(p["pp"]), str(p["vpp"]),
                  str(p["micro_batch_size"]), str(p["zero"]), p["recompute"],
                  "y" if p["sequence_parallel"] else "n",
                  f"{p['predicted_step_s']:.3f}s", f"{p['measured_step_s']:.3f}s",
                  f"{p['step_time_error']:+.0%}", human(p["predicted_memory_bytes"], "B"),
                  human(p["measured_memory_bytes"], "B") if p.get("measured_memory_bytes") else "n/a",
                  f"{p['memory_error']:+.0%}" if p.get("memory_error") is not None else "n/a")
    c = print_table(t)
    s = res["validate"]["summary"]
    c.print(f"step time: MAPE {_f(s.get('step_time_mape'), '.1%')}, Spearman "
            f"{_f(s.get('step_time_spearman'), '.3f')}, worst {_f(s.get('step_time_max_error'), '.0%')}; "
            f"memory: MAPE {_f(s.get('memory_mape'), '.1%')}, worst {_f(s.get('memory_max_error'), '.0%')} "
            f"({s['plans_measured']}/{s['plans']} plans ran)")
    for clock, f in s.get("by_clock", {}).items():
        c.print(f"  step time by {clock} clock: MAPE {_f(f.get('step_time_mape'), '.1%')}, Spearman "
                f"{_f(f.get('step_time_spearman'), '.3f')}, worst {_f(f.get('step_time_max_error'), '.0%')}")
    c.print(f"step time measured by: {res['validate']['method']['clock_meaning']}")
    c.print(f"memory measured as: {res['validate']['method']['memory']}")
    if args.output:
        c.print(f"wrote {args.output}")
    return 0


def _f(x, spec: str) -> str:
    """A summary figure, or n/a where nothing was measured."""
    return "n/a" if x is None else format(x, spec)
