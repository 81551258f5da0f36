"""``autopar explain plans.json``: why the best plan wins, what each runner-up loses on."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("explain", help="why the best plan in a plans file wins",
                       description="Read a plans file (autopar search -o) and say why the best plan "
                                   "wins: its bottleneck, and what each runner-up loses on.")
    p.add_argument("plans", metavar="plans.json", help="a plans file (or estimate --json output)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)


def run(args) -> int:
    from autopar.search import explain_plans, render_explanation
    from costmodels.contracts.plans_file import PlansFile
    ex = explain_plans(PlansFile.read(args.plans).check_estimates().to_dict(filled=True))
    if args.json:
        from autopar.cli.common import print_json
        print_json(ex)
    else:
        print(render_explanation(ex))
    return 0
