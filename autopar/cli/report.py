"""``autopar report``: compare the plans of one or more plans files as HTML, Markdown or CSV."""
from __future__ import annotations

import sys


def register(sub) -> None:
    from autopar.cli.common import add_progress_arg, int_arg
    p = sub.add_parser(
        "report", help="compare plans side by side: HTML with charts, Markdown or CSV",
        description="Compare every plan of the given plans files (autopar search -o) or estimate JSON "
                    "(autopar estimate --json): ranked table, step-time breakdown, memory per stage, "
                    "pipeline timelines, communication, scaling, why the best wins and a diff.")
    p.add_argument("inputs", nargs="*", metavar="PLANS.json", help="plans files or estimate JSON")
    p.add_argument("-o", "--output", default=None,
                   help="output file; its extension picks the format (.html/.htm, .md/.markdown, "
                        ".csv) and must agree with --format; a name without one needs --format; "
                        "'-' is standard output (default: report.html for HTML, standard output "
                        "for md / csv)")
    p.add_argument("--format", choices=("html", "md", "csv"), default=None,
                   help="default: from the -o extension, else html")
    p.add_argument("--diff", default=None, metavar="I,J",
                   help="diff plans I and J (row numbers of the ranked table); default: the best and "
                        "the runner-up of the first search")
    p.add_argument("--detail", default="3", metavar="K|all",
                   help="memory and timeline charts for the best K plans of each search (default 3)")
    p.add_argument("--scale", default=None, metavar="N,N,...",
                   help="run the search at each GPU count and add the results (model, hardware and "
                        "batch from the inputs, or --model/--hardware/--global-batch)")
    p.add_argument("--model", default=None, help="model for --scale without input files")
    p.add_argument("--hardware", default=None, help="hardware profile for --scale without input files")
    p.add_argument("--global-batch", type=int_arg(limit="global_batch"), default=None,
                   help="global batch for --scale without inputs")
    p.add_argument("--seq", type=int_arg(limit="seq"), default=None, help="sequence length for --scale")
    p.add_argument("--top", type=int_arg(high=1000), default=3, help="plans kept per --scale search (default 3)")
    p.add_argument("--allow-mixed", action="store_true", help="allow plans of different models in one report")
    add_progress_arg(p)
    p.set_defaults(run=run)


def _ints(text: str, what: str, n: int | None = None, high: int | None = None) -> list[int]:
    from costmodels.contracts.checks import quote
    from costmodels.contracts.errors import PlanError
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        vals = []
    if not vals or any(v < 1 or (high and v > high) for v in vals) or (n is not None and len(vals) != n):
        want = f"{n} positive integers" if n else "positive integers"
        want += f" of at most {high:,}" if high else ""
        raise PlanError(f"{what} {quote(text)} must be {want} separated by commas, e.g. "
                        + ("--diff 1,3" if what == "--diff" else "--scale 64,128,256"))
    return vals


def run(args) -> int:
    from autopar.cli.common import progress
    from autopar.report import scale_search
    from autopar.report.core import make_report, output_target, write_atomic
    from autopar.report.load import read_inputs
    from costmodels.contracts.checks import LIMITS, quote
    from costmodels.contracts.errors import NoFeasiblePlanError, PlanError

    path, fmt = output_target(args.output, args.format)     # before any work
    diff = tuple(_ints(args.diff, "--diff", 2)) if args.diff else None
    if args.detail == "all":
        detail = None
    else:
        try:
            detail = int(args.detail)
        except ValueError:
            detail = -1
        if detail < 0:
            raise PlanError(f"--detail {quote(args.detail)} must be a number >= 0 or 'all'")
    extra, notes = [], []
    if args.scale:
        counts = _ints(args.scale, "--scale", high=LIMITS["gpus"])
        ctx = {"model": args.model, "hardware": args.hardware, "global_batch": args.global_batch,
               "seq": args.seq}
        if args.inputs:
            first = read_inputs(args.inputs, allow_mixed=args.allow_mixed)[0]
            for k in ctx:
                if ctx[k] is None:
                    ctx[k] = first.get(k)
        missing = [k for k in ("model", "hardware", "global_batch") if ctx[k] is None]
        if missing:
            raise PlanError("--scale needs a model, hardware and global batch: give plans files or "
                            + ", ".join("--" + k.replace("_", "-") for k in missing))
        have = set()
        if args.inputs:
            have = {r.gpus for r in read_inputs(args.inputs, allow_mixed=args.allow_mixed)}
        for n in counts:
            if n in have:
                continue
            print(f"autopar report: searching {ctx['model']} on {n} × {ctx['hardware']} ...", file=sys.stderr)
            try:
                extra.append(scale_search(ctx["model"], ctx["hardware"], n, ctx["global_batch"],
                                          ctx["seq"], top=args.top))
            except NoFeasiblePlanError as e:
                notes.append(f"--scale: no plan fits on {n} GPUs ({e})")
    with progress(args, f"building the {fmt} report"):
        text = make_report(args.inputs, fmt=fmt, diff=diff, detail=detail, allow_mixed=args.allow_mixed,
                           extra=extra, notes=notes)
    if path is None:
        sys.stdout.write(text)
    else:
        write_atomic(path, text)
        print(f"autopar report: wrote {path} ({fmt}, {len(text) / 1024:.0f} KiB)", file=sys.stderr)
    return 0
