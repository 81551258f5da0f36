"""``autopar models``: list the built-in presets with their shapes and parameter counts."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("models", help="list built-in model presets and families")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=run)


def run(args) -> int:
    from autopar.cli.common import human, print_json, print_table
    from autopar.models import FAMILIES, PRESETS, load_model
    rows = []
    for name, cfg in PRESETS.items():
        model = load_model(name).build("meta", seed=None)
        params = sum(p.numel() for p in model.parameters())
        rows.append({"name": name, "family": cfg.family, "layers": cfg.layers, "hidden": cfg.hidden,
                     "heads": cfg.heads, "kv_heads": cfg.n_kv_heads, "seq": cfg.tokens_per_sample,
                     "vocab": cfg.vocab, "params": params})
    if args.json:
        print_json({"presets": rows, "families": list(FAMILIES)})
        return 0
    from rich.table import Table
    t = Table(title="autopar model presets")
    for col in ("name", "family", "layers", "hidden", "heads", "kv_heads", "seq", "params"):
        t.add_column(col, justify="left" if col in ("name", "family") else "right")
    for r in rows:
        t.add_row(r["name"], r["family"], str(r["layers"]), str(r["hidden"]), str(r["heads"]),
                  str(r["kv_heads"]), str(r["seq"]), human(r["params"]))
    c = print_table(t)
    c.print("Families with settings: " + ", ".join(f"{f}:k=v,..." for f in FAMILIES))
    return 0
