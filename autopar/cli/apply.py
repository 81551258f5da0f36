"""``autopar apply MODEL --plan P --emit DIR``: write each rank's rewritten rows as Python.

Running a plan is ``autopar verify`` (or ``autopar.apply`` inside torchrun); ``apply`` shows what
would run: one file per (pipeline stage, tp rank) with the fx code of its rows, and SUMMARY.md
listing which collectives run where.
"""
from __future__ import annotations


def register(sub) -> None:
    from autopar.cli.common import add_model_args
    p = sub.add_parser("apply", help="emit each rank's rewritten rows (tensor/sequence parallel, "
                                     "recompute) as readable Python for a plan")
    add_model_args(p)
    p.add_argument("--plan", required=True, metavar="P",
                   help="plan: a plans file from 'autopar search -o' (first plan), a plan JSON file, or JSON text")
    p.add_argument("--emit", required=True, metavar="DIR",
                   help="directory to write stage{v}_tp{r}.py and SUMMARY.md into")
    p.add_argument("--leaf", action="append", default=[], metavar="CLASS",
                   help="trace submodules of this class whole, FLOPs measured (repeatable); MoE experts: priced as run,"
                        " k of E per token, and planned as dense layers (no expert parallelism)")
    p.set_defaults(run=run)


def run(args) -> int:
    from autopar.runtime.emit.out_dir import check_emit_dir
    from costmodels.contracts.plans_file import load_plan
    check_emit_dir(args.emit)   # before reading the plan and building the model
    plan = load_plan(args.plan)
    from autopar.runtime.emit.dry_run import emit
    res = emit(args.model, plan, args.emit, seq=args.seq, leaf_modules=tuple(args.leaf))
    print(f"wrote {len(res.files)} file(s) for {len(res.stages)} pipeline stage(s) × tp={plan.tp} "
          f"and {res.summary_path}")
    return 0
