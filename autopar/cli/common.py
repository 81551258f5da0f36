"""Helpers shared by subcommands: the MODEL argument, JSON output, rich tables."""
from __future__ import annotations

import json
import sys


def add_model_args(p, seq: bool = True) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="preset (autopar models), family 'gpt:layers=..', 'file.py:fn' or 'hf:config.json'")
    if seq:
        p.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's own)")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def console():
    from rich.console import Console
    return Console()


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M'; bytes use powers of 1024 when unit == 'B'."""
    base = 1024.0 if unit == "B" else 1000.0
    prefixes = (["", "Ki", "Mi", "Gi", "Ti", "Pi"] if unit == "B" else ["", "K", "M", "G", "T", "P", "E"])
    value = float(n)
    for p in prefixes:
        if abs(value) < base or p == prefixes[-1]:
            return f"{value:.3g} {p}{unit}".rstrip()
        value /= base
    return str(n)
