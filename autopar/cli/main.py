"""``autopar`` command line: a thin layer over the Python API.

Each subcommand lives in its own module ``autopar.cli.<name>`` exposing ``register(subparsers)``;
heavy imports (torch, ortools) happen inside the command's run function, so ``autopar --help``
and the torch-free commands start fast. A user error (``AutoparError``) is printed as one line
``autopar: error: ...`` with exit code 2 — never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from costmodels.errors import AutoparError

COMMANDS = ("models", "inspect", "hardware", "estimate", "search", "explain", "export", "apply",
            "verify", "report", "profile", "validate", "checkpoint", "replan")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line plus the usage hint
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autopar", description="Automatic parallelism planner for PyTorch training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"autopar.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"autopar.cli.{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except AutoparError as e:
        print(f"autopar: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autopar: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # a bug in autopar, not the user's input
        if os.environ.get("AUTOPAR_DEBUG"):
            raise
        print(f"autopar: internal error: {type(e).__name__}: {e} (rerun with AUTOPAR_DEBUG=1 for the "
              "traceback and report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
