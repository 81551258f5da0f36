"""``autopar export PLANS [--index K] --to megatron|torchtitan|deepspeed|torchrun [-o FILE]``: the
plan in the configuration format of the launcher the user trains with (``autopar.export``).

Also the shared piece of ``estimate --from`` and ``search --compare-with-current``: reading the
configuration a user runs today (``import_current``) and scoring it under the runtime it runs on
(``score_imported``)."""
from __future__ import annotations

TARGET_HELP = ("megatron: Megatron-LM pretrain_gpt.py arguments; torchtitan: a job TOML; deepspeed: a "
               "DeepSpeed JSON plus Megatron-DeepSpeed arguments; torchrun: launch lines for autopar's runtime")


def register(sub) -> None:
    p = sub.add_parser("export", help="write a plan as Megatron-LM / torchtitan / DeepSpeed / torchrun "
                                      "configuration",
                       description="Write plan K of PLANS in the configuration format of your launcher. "
                                   "A plan the launcher cannot express is refused, naming the field and "
                                   "the nearest plan it can.")
    p.add_argument("plans", metavar="PLANS", help="a plans file from 'autopar search -o', a plan file, or JSON text")
    from autopar.cli.common import int_arg
    from autopar.cli.plan_index import add_index_arg
    add_index_arg(p)
    p.add_argument("--to", required=True, choices=("megatron", "torchtitan", "deepspeed", "torchrun"),
                   help=TARGET_HELP)
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="write here (deepspeed: the JSON; its Megatron-DeepSpeed script goes beside it)")
    p.add_argument("--model", default=None, help="MODEL, when PLANS does not say it")
    p.add_argument("--global-batch", type=int_arg(limit="global_batch"), default=None,
                   help="when PLANS does not say it")
    p.add_argument("--seq", type=int_arg(limit="seq"), default=None,
                   help="sequence length, when PLANS does not say it")
    p.add_argument("--gpus-per-node", type=int_arg(high=1024), default=None,
                   help="GPUs per node for the launch lines (default: the hardware profile's, else 8)")
    p.add_argument("--script", default=None,
                   help="torchrun: the training script (default: -m autopar.train, the packaged loop)")
    p.set_defaults(run=run)


def run(args) -> int:
    import os
    import sys

    from autopar.cli.model_check import check_against_model, check_same_model
    from autopar.cli.plan_index import pick
    from autopar.export import context_from_plans_file, export_plan
    from autopar.export import torchrun as torchrun_target
    from costmodels.contracts.errors import PlanError
    from costmodels.contracts.plans_file import PlansFile
    if args.output is not None:        # -o '' names no file: refused, not printed to stdout
        from autopar.cli.common import check_output
        check_output(args.output)      # before the model is built
    given = PlansFile.read(args.plans)
    args.index = pick(len(given.results), args.index, given.source)
    check_same_model(given.model, args.model, given.source)
    _check_whole_nodes(given.results[args.index].plan.world_size, args.gpus_per_node)
    ctx = context_from_plans_file(given, args.index, model=args.model, gpus_per_node=args.gpus_per_node)
    ctx = ctx.with_(global_batch=args.global_batch or ctx.global_batch,
                    seq=args.seq if args.seq is not None else ctx.seq)
    if ctx.model is None:
        raise PlanError(f"{given.source} does not say the model: give --model MODEL")
    plan = given.results[args.index].plan
    check_against_model(plan, ctx, probe=args.to == "torchrun")
    if args.to == "torchrun" and args.script:
        exported = torchrun_target.export(plan, ctx, script=args.script)
    elif args.to == "deepspeed" and args.output:
        from autopar.export import deepspeed
        exported = deepspeed.export(plan, ctx, config_name=os.path.basename(args.output))
    else:
        exported = export_plan(plan, args.to, ctx)
    from autopar.export.prediction import export_notes
    notes = export_notes(given, args.index, args.to, ctx)   # predicted step time under the target
    if not args.output:
        for line in notes:   # stdout is the file itself: the notes go to stderr
            print(line, file=sys.stderr)
        names = list(exported.files)
        for name, text in exported.files.items():
            if len(names) > 1:
                print(f"# ==> {name} <==")
            sys.stdout.write(text)
        return 0
    from costmodels.contracts.files import write_text_atomic
    written = []
    for i, (name, text) in enumerate(exported.files.items()):
        path = args.output if i == 0 else _beside(args.output, name)
        write_text_atomic(path, text)
        written.append(path)
    print(f"wrote {', '.join(written)} ({args.to}; runs under the {exported.runtime} runtime)")
    for line in notes:
        print(line)
    return 0


def _check_whole_nodes(world: int, gpus_per_node: int | None) -> None:
    """A --gpus-per-node that does not cut the plan's GPUs into whole nodes is refused (torchrun
    starts the same count on every node), not silently replaced by another count."""
    from costmodels.contracts.errors import PlanError
    if gpus_per_node is not None and world > gpus_per_node and world % gpus_per_node:
        raise PlanError(f"--gpus-per-node {gpus_per_node} does not cut the plan's {world} GPUs into "
                        "whole nodes (torchrun starts the same count on every node); give a count "
                        f"that divides {world}")


def _beside(path: str, name: str) -> str:
    import os
    stem = os.path.splitext(path)[0]
    return f"{stem}.{name}"


def add_current_args(p, option: str, help_text: str) -> None:
    """``OPTION TARGET CONFIG`` and ``--megatron-args`` (estimate's --from, search's
    --compare-with-current), both read into ``args.current``."""
    p.add_argument(option, nargs=2, default=None, dest="current", metavar=("TARGET", "CONFIG"), help=help_text)
    p.add_argument("--megatron-args", default=None, metavar="ARGS",
                   help="with deepspeed: the Megatron-DeepSpeed command line (text or a file) for tp, "
                        "pp, sequence parallel and recompute")


def import_current(model: str, current: list[str], *, gpus=None, global_batch=None, seq=None,
                   hardware=None, megatron_args=None):
    """The user's configuration ``[TARGET, CONFIG]`` read as an ``Imported`` plan for MODEL."""
    from autopar.export import context_for, import_config
    from costmodels.contracts.errors import PlanError
    target, source = current
    from autopar.export import TARGETS
    if target not in TARGETS:
        raise PlanError(f"unknown configuration kind {target!r}; choose one of {', '.join(TARGETS)}")
    ctx = context_for(model, seq=seq, gpus=gpus, global_batch=global_batch, hardware=hardware)
    return import_config(target, source, ctx, megatron_args=megatron_args)


def score_imported(model: str, hardware: str, imported, *, seq=None, global_batch=None) -> dict:
    """The estimate of an imported plan, scored under the runtime it runs on (the plan carries its
    runtime once plans have that field: ``autopar.export.with_runtime``)."""
    from autopar.scoring import estimate_plans
    from costmodels.contracts.errors import PlanError
    batch = imported.global_batch or global_batch
    if batch is None:
        raise PlanError(f"the {imported.source} configuration does not say the global batch: give --global-batch")
    [result] = estimate_plans(model, hardware, imported.plan.world_size, batch, [imported.plan],
                              seq=seq if seq is not None else imported.seq)
    result.setdefault("runtime", imported.runtime)
    result["imported_from"] = imported.source
    return result
