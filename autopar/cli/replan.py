"""``autopar replan CKPT --gpus N --hardware H [--global-batch B] [-o plans.json]``: after a
failure (or to grow), the best plan of the checkpoint's model on N GPUs, as a plans file the
checkpoint loads under (``runner.load`` reshards any plan into any other).

The model and the global batch come from the checkpoint. When no plan of N GPUs can split that
batch (dp · micro-batch must divide it), the nearest batch that one can is searched instead and
said plainly, so that the learning-rate schedule can be adjusted.
"""
from __future__ import annotations

from autopar.cli.common import float_arg, int_arg, print_json


def register(subparsers) -> None:
    p = subparsers.add_parser("replan", help="best plan for a checkpoint on another GPU count",
                              description="Search the best plan of a checkpoint's model for "
                                          "--gpus GPUs and write a plans file it resumes under.")
    p.add_argument("ckpt", metavar="CKPT", help="the directory runner.save wrote")
    p.add_argument("--gpus", type=int_arg(limit="gpus"), required=True, help="GPUs to resume on")
    p.add_argument("--hardware", required=True, help="hardware profile (autopar hardware)")
    p.add_argument("--global-batch", type=int_arg(limit="global_batch"), default=None,
                   help="samples per step (default: the checkpoint's)")
    p.add_argument("--model", default=None,
                   help="model spec, when the checkpoint does not name it (apply without spec=)")
    p.add_argument("-o", "--output", default="replan.json", help="plans file (default replan.json)")
    p.add_argument("--top", type=int_arg(high=1000), default=3, help="plans to keep (default 3)")
    p.add_argument("--time-limit", type=float_arg(high=7 * 24 * 3600.0), default=120.0,
                   help="search seconds (default 120)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(run=run)


def replan_checkpoint(ckpt: str, gpus: int, hardware: str, *, global_batch: int | None = None,
                      model: str | None = None, top: int = 3, time_limit_s: float = 120.0):
    """(SearchResult, model spec, global batch searched, note or None)."""
    from autopar.runtime.checkpoints.dcp_files import checkpoint_dir, read_object
    from autopar.search import search
    from costmodels.contracts.errors import NoFeasiblePlanError, PlanError
    info = read_object(checkpoint_dir(ckpt))
    spec = model or info.get("spec")
    if not spec:
        raise PlanError(f"checkpoint '{ckpt}' does not name its model (it was saved by a runner "
                        "applied without spec=); pass --model SPEC")
    batch = global_batch or info.get("global_batch")
    if not batch:
        raise PlanError(f"checkpoint '{ckpt}' does not record its global batch; pass --global-batch")
    if gpus < 1:
        raise PlanError(f"--gpus {gpus} must be at least 1")
    seq = None if model else info.get("seq")
    try:
        return search(spec, hardware, gpus, batch, seq=seq, top=top,
                      time_limit_s=time_limit_s), spec, batch, None
    except NoFeasiblePlanError as first:
        for other in _nearby_batches(batch, gpus):
            try:
                result = search(spec, hardware, gpus, other, seq=seq, top=top,
                                time_limit_s=time_limit_s)
            except NoFeasiblePlanError:
                continue
            note = (f"no plan of {gpus} GPUs trains the checkpoint's global batch of {batch} "
                    f"({first}); searched the nearest batch that one can: {other}")
            return result, spec, other, note
        raise


def _nearby_batches(batch: int, gpus: int) -> list[int]:
    """Batches near ``batch`` that some dp dividing ``gpus`` splits evenly, nearest first."""
    out = set()
    for dp in (d for d in range(1, gpus + 1) if gpus % d == 0):
        for b in ((batch // dp) * dp, -(-batch // dp) * dp):
            if b > 0 and b != batch:
                out.add(b)
    return sorted(out, key=lambda b: (abs(b - batch), b))[:4]


def run(args) -> int:
    from autopar.cli.common import check_output
    from costmodels.contracts.plans_file import PlansFile
    check_output(args.output)          # before the search, not after it
    result, spec, batch, note = replan_checkpoint(args.ckpt, args.gpus, args.hardware,
                                                  global_batch=args.global_batch, model=args.model,
                                                  top=args.top, time_limit_s=args.time_limit)
    data = result.plans_file()
    data["replanned_from"] = {"checkpoint": args.ckpt, "global_batch": batch, "note": note}
    PlansFile.read(data).write(args.output)
    best = result.plans[0]
    if args.json:
        print_json({"output": args.output, "model": spec, "global_batch": batch, "note": note,
                    "plan": best.plan.to_dict(), "step_time_s": best.prediction.get("step_time_s")})
        return 0
    if note:
        print(f"note: {note}")
    print(f"best on {args.gpus} GPUs: {best.plan.label()}  "
          f"({best.prediction.get('step_time_s', float('nan')):.3g} s/step predicted)")
    print(f"wrote {args.output}; resume with: runner = autopar.apply(model, "
          f"autopar.load_plan('{args.output}'), spec='{spec}'); runner.load('{args.ckpt}', optimizer=opt)")
    return 0
