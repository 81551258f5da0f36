"""``autopar profile``: measure this machine (matmul, memory bandwidth, collectives) and write a
hardware profile; the work is in ``autopar.profile``."""
from __future__ import annotations


def register(subparsers) -> None:
    from autopar.cli.common import int_arg
    p = subparsers.add_parser(
        "profile", help="measure this machine and write a hardware profile",
        description="Measure matmul throughput by dtype and size, memory bandwidth, and all-reduce / "
                    "all-gather / reduce-scatter / p2p time across N local ranks (gloo on CPU, NCCL on "
                    "GPU), back to back and between compute as a training step issues them; fit "
                    "alpha-beta; write a hardware profile (costmodels format).")
    p.add_argument("-o", "--output", metavar="PATH", default=None,
                   help="profile file to write (default ./<name>.toml, in the current directory)")
    p.add_argument("--name", default=None, help="profile name (default: the output file's stem)")
    p.add_argument("--nproc", type=int_arg(high=1024), default=None,
                   help="local ranks (default: GPUs, or CPU cores)")
    p.add_argument("--quick", action="store_true", help="fewer sizes, shorter timings (seconds, not minutes)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="CPU only: time matmul and copy by wall clock (default) or by the rank's CPU "
                        "time (a host shared with other work)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args) -> int:
    import os

    from autopar.cli.common import check_output, console, human, print_json
    from autopar.profile import build_profile, output_path, profile_machine, write_profile
    # an unwritable output must fail now, not after minutes of measuring (the default name
    # depends on the rank count, so without -o the current directory is what is checked)
    default = os.path.join(os.getcwd(), f"{args.name or 'profile'}.toml")
    check_output(default if args.output is None else args.output)     # -o '' is refused, not ignored
    raw = profile_machine(args.nproc, quick=args.quick, progress=not args.no_progress,
                          clock=args.clock)
    raw["quick"] = args.quick
    out, name = output_path(args.output, args.name, raw["nproc"])
    text, summary = build_profile(raw, name)
    write_profile(out, text)
    summary["path"] = str(out)
    if args.json:
        print_json(summary)
        return 0
    c = console()
    pk = summary["peak_flops_per_s"]
    c.print(f"wrote [bold]{out}[/bold] (profile '{name}')")
    c.print("peak matmul per rank: " + ", ".join(f"{d} {human(v, 'FLOP/s')}" for d, v in pk.items()))
    c.print(f"memory bandwidth per rank: {human(summary['hbm_bandwidth_bytes_per_s'], 'B/s')}; "
            f"rank footprint {human(summary['memory_reserve_bytes'], 'B')}")
    if not summary["collectives"]:
        c.print("collectives: none measured (one rank); the link tiers are set to the copy "
                "bandwidth, an assumption the file says; profile with --nproc 2 or more to measure them")
        return 0
    c.print("collectives, back to back  |  between compute (what the cost model uses):")
    for k, f in summary["collectives"].items():
        g = summary.get("in_step", {}).get(k)
        tail = (f"  |  alpha {g['alpha_s'] * 1e6:8.1f} us  beta {human(g['beta_bytes_per_s'], 'B/s'):>10}"
                if g else "")
        c.print(f"{k:>22}: alpha {f['alpha_s'] * 1e6:8.1f} us  beta {human(f['beta_bytes_per_s'], 'B/s'):>10}  "
                f"fit error median {f['median_rel_error']:.0%} max {f['max_rel_error']:.0%}{tail}")
    return 0
