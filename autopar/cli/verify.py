"""``autopar verify MODEL --plan P [--steps K] [--nproc N]``: the parallel runner against the
single-process model, same seed, same data; non-zero exit on a mismatch.

Spawns the ranks itself (gloo on CPU; NCCL when every rank has a GPU), disables dropout so both
sides are deterministic, runs K optimizer steps on both and prints the two losses per step and
the largest relative difference. The work is ``autopar.runtime.verify.serial.verify``.
"""
from __future__ import annotations

from autopar.cli.common import add_model_args, add_progress_arg, float_arg, int_arg, print_json


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "verify", help="check that a plan trains exactly like the serial model",
        description="Run K optimizer steps of MODEL under PLAN on N local ranks (gloo on CPU, "
                    "NCCL on GPUs) and with the single-process model from the same seed on the "
                    "same data; print both losses per step and exit 1 when they differ by more "
                    "than --rtol (relative).")
    add_model_args(p)
    p.add_argument("--plan", required=True,
                   help="plan: JSON text, a plan file, or a plans file from 'autopar search' "
                        "(its first plan, or --index)")
    from autopar.cli.plan_index import add_index_arg
    add_index_arg(p)
    p.add_argument("--steps", type=int_arg(high=100_000), default=5, help="optimizer steps (default 5)")
    p.add_argument("--nproc", type=int_arg(high=1024), default=None, help="ranks to spawn (default dp·cp·tp·pp)")
    p.add_argument("--global-batch", type=int_arg(limit="global_batch"), default=None,
                   help="samples per step (default: the plans file's global_batch, else "
                        "dp·micro_batch_size·(2·pp, or 2 when pp=1))")
    p.add_argument("--lr", type=float_arg(high=1e6), default=None,
                   help="learning rate (default 0.1 for sgd, 1e-3 for adamw: at 0.1 Adam's first, sign-like "
                        "updates turn the reduction-order rounding of near-zero gradients into lr-sized "
                        "parameter differences, and a correct plan reads as a mismatch)")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    p.add_argument("--rtol", type=float_arg(open_low=False), default=1e-5,
                   help="relative tolerance (default 1e-5)")
    p.add_argument("--seed", type=int_arg(low=0, high=2 ** 63 - 1), default=0)
    p.add_argument("--leaf", action="append", default=[], metavar="CLASS",
                   help="trace submodules of this class whole, FLOPs measured (repeatable); MoE experts: priced as run,"
                        " k of E per token, and planned as dense layers (no expert parallelism)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each row of the parallel side (apply(..., compile=True)); "
                        "the serial side stays eager (CPU: needs a C compiler)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--allow-batch-statistics", action="store_true",
                   help="run a BatchNorm model micro-batched (pipeline, accumulation): each micro-batch "
                        "normalised alone, which differs from serial (refused without this)")
    add_progress_arg(p)
    p.set_defaults(run=run)


def run(args) -> int:
    from autopar.cli.common import progress
    from autopar.runtime.verify.serial import compare, verify
    from costmodels.contracts.errors import PlanError
    from costmodels.contracts.plans_file import PlansFile

    if args.lr is None:
        args.lr = 1e-3 if args.optimizer == "adamw" else 0.1
    given = PlansFile.read(args.plan)
    plans = given.plans
    from autopar.cli.plan_index import pick
    plan = plans[pick(len(plans), args.index, "the plan file")]
    if args.steps < 1:
        raise PlanError("--steps must be at least 1")
    seq, global_batch = args.seq, args.global_batch
    if seq is None and given.seq and given.model == args.model:   # a search's plans file
        seq = given.seq
    if global_batch is None and given.global_batch:
        global_batch = given.global_batch
    with progress(args, f"{args.steps} steps on {plan.world_size} rank(s) and the serial model"):
        check_serial_memory(args.model, seq, plan, global_batch, leaf_modules=tuple(args.leaf))
        par, ser, gb = verify(args.model, plan, steps=args.steps, nproc=args.nproc, seq=seq,
                              global_batch=global_batch, lr=args.lr, optimizer=args.optimizer,
                              seed=args.seed, leaf_modules=tuple(args.leaf),
                              compile=args.compile,
                              allow_batch_statistics=args.allow_batch_statistics)
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(par, ser)]
    worst = compare(par, ser)          # inf when a loss is NaN or inf: never OK
    ok = worst <= args.rtol
    if args.json:
        print_json({"model": args.model, "plan": plan.to_dict(), "global_batch": gb,
                    "parallel": par, "serial": ser, "max_rel_diff": worst, "rtol": args.rtol,
                    "ok": ok})
        return 0 if ok else 1
    print(f"model {args.model}   plan {plan.label()}   global batch {gb}, {args.optimizer} lr {args.lr}, "
          f"dropout off{', compiled' if args.compile else ''}")
    print(f"{'step':>4}  {'parallel':>14}  {'serial':>14}  {'rel diff':>9}")
    for i, (a, b, d) in enumerate(zip(par, ser, diffs)):
        print(f"{i + 1:>4}  {a:14.8f}  {b:14.8f}  {d:9.2e}")
    verdict = "OK" if ok else "MISMATCH"
    print(f"largest relative difference {worst:.3g} (tolerance {args.rtol:g}): {verdict}")
    return 0 if ok else 1


def check_serial_memory(model: str, seq, plan, global_batch, leaf_modules=()) -> None:
    """Refuse a run that cannot fit this machine's memory before spawning anything: verify runs
    the serial model on the whole global batch in fp32, so its activations alone (the layer
    table's saved bytes, at fp32, for the batch; the attention core only with math attention)
    are a lower bound of what it needs. ``--seq 100000`` used to swap for minutes instead."""
    import os

    from autopar.trace import table_for
    from costmodels.contracts.errors import PlanError
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    table = table_for(model, 1, seq, tuple(leaf_modules))   # the --leaf given: the one rule verify traces by
    batch = global_batch or plan.dp * plan.micro_batch_size * (2 * plan.pp if plan.pp > 1 else 2)
    per_sample = sum(r.saved_activation_bytes - (r.act_attention_core_bytes if plan.attention == "flash" else 0)
                     for r in table.rows) / table.micro_batch
    need = per_sample * batch * 4 / table.act_dtype_bytes + 8 * table.total_params
    if need > ram:
        raise PlanError(f"verify runs the serial model for real: {batch} sequences of {table.seq} tokens "
                        f"need at least {need / 2 ** 30:,.0f} GiB (fp32 activations and weights) but this "
                        f"machine has {ram / 2 ** 30:,.0f} GiB; use a smaller --seq or --global-batch")
