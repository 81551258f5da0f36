"""``autopar hardware [NAME|PATH] [--json]``: list the shipped hardware profiles, or show one
with every figure's source."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("hardware", help="list hardware profiles (or show one, with sources)")
    p.add_argument("profile", nargs="?", metavar="NAME|PATH",
                   help="a profile name or .toml path to show in full (default: list all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)


def run(args) -> int:
    from autopar.cli.common import human, print_json, print_table
    from costmodels.profiles.hardware_files import PROFILES_DIR, list_profiles, load_profile
    if args.profile:
        prof = load_profile(args.profile)
        if args.json:
            d = prof.summary()
            d["peak_flops_per_s"] = prof.peak_flops
            d["matmul_efficiency"] = {"flops": list(prof.eff_flops), "efficiency": list(prof.eff_values)}
            d["latency_s"] = {"intra_node": prof.intra_node.latency_s, "inter_node": prof.inter_node.latency_s}
            d["sources"] = prof.sources
            print_json(d)
            return 0
        from rich.table import Table
        t = Table(title=f"{prof.name}: {prof.description}")
        t.add_column("field")
        t.add_column("value", justify="right")
        t.add_column("source", overflow="fold")
        vals = {
            "gpu.peak_bf16_flops_per_s": human(prof.peak_flops["bf16"], "FLOP/s"),
            "gpu.peak_fp16_flops_per_s": human(prof.peak_flops["fp16"], "FLOP/s"),
            "gpu.peak_tf32_flops_per_s": human(prof.peak_flops["tf32"], "FLOP/s"),
            "gpu.peak_fp32_flops_per_s": human(prof.peak_flops["fp32"], "FLOP/s"),
            "gpu.hbm_bytes": f"{prof.hbm_bytes / 2 ** 30:.4g} GiB",
            "gpu.hbm_bandwidth_bytes_per_s": human(prof.hbm_bandwidth_bytes_per_s, "B/s"),
            "gpu.memory_reserve_bytes": f"{prof.memory_reserve_bytes / 2 ** 30:.3g} GiB",
            "gpu.matmul_efficiency": ", ".join(f"{f:.0e}:{e:.2f}" for f, e in zip(prof.eff_flops, prof.eff_values)),
            "node.gpus_per_node": str(prof.gpus_per_node),
            "intra_node.bandwidth_bytes_per_s": human(prof.intra_node.bandwidth_bytes_per_s, "B/s"),
            "intra_node.latency_s": f"{prof.intra_node.latency_s:.2g} s",
            "inter_node.bandwidth_bytes_per_s": human(prof.inter_node.bandwidth_bytes_per_s, "B/s"),
            "inter_node.latency_s": f"{prof.inter_node.latency_s:.2g} s",
        }
        for k, v in (("gpu.attention_efficiency", prof.attention_efficiency),   # optional figures, when set
                     ("gpu.collective_slowdown", prof.collective_slowdown),
                     ("gpu.fsdp_overlap", prof.fsdp_overlap)):
            if v is not None:
                vals[k] = f"{v:.3g}"
        for k, v in vals.items():
            t.add_row(k, v, prof.sources.get(k, ""))
        c = print_table(t)
        c.print(f"file: {prof.path}")
        return 0
    profs = [load_profile(n) for n in list_profiles()]
    if args.json:
        print_json({"directory": str(PROFILES_DIR), "profiles": [p.summary() for p in profs]})
        return 0
    from rich.table import Table
    t = Table(title=f"hardware profiles ({PROFILES_DIR})")
    for col in ("name", "gpu", "bf16 peak", "HBM", "HBM bw", "GPUs/node", "intra-node", "inter-node/GPU"):
        t.add_column(col, justify="left" if col in ("name", "gpu") else "right")
    for p in profs:
        t.add_row(p.name, p.gpu_model, human(p.peak_flops["bf16"], "FLOP/s"), f"{p.hbm_bytes / 2 ** 30:.3g} GiB",
                  human(p.hbm_bandwidth_bytes_per_s, "B/s"), str(p.gpus_per_node),
                  human(p.intra_node.bandwidth_bytes_per_s, "B/s"),
                  human(p.inter_node.bandwidth_bytes_per_s, "B/s"))
    c = print_table(t)
    c.print("Use --hardware NAME or --hardware path/to/profile.toml; 'autopar hardware NAME' shows sources.")
    return 0
