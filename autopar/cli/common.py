"""Helpers shared by subcommands: the MODEL argument, checked numeric flags, the output path
check, progress on stderr, JSON output, rich tables."""
from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
import threading
import time
from contextlib import contextmanager

from costmodels.contracts.checks import LIMITS, quote

WIDE = 100_000   # columns of a console that is not a terminal: a table keeps its natural width


def int_arg(low: int = 1, high: int | None = None, limit: str | None = None):
    """An argparse ``type`` for an integer flag in [low, high] (``limit``: ``LIMITS[limit]``),
    so that an absurd value (``--gpus 99999999999999999999``) is one usage line before any work,
    not a search that never ends."""
    top = LIMITS[limit] if limit else high

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            if text.strip().lstrip("+").isdigit() and top is not None:   # thousands of digits
                raise argparse.ArgumentTypeError(f"{quote(text)} is above autopar's limit of {top:,}") from None
            raise argparse.ArgumentTypeError(f"{quote(text)} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        if top is not None and value > top:
            where = f" (LIMITS['{limit}'] in costmodels/contracts/checks.py)" if limit else ""
            raise argparse.ArgumentTypeError(f"{quote(value)} is above autopar's limit of {top:,}{where}")
        return value
    parse.__name__ = "integer"
    return parse


def float_arg(low: float = 0.0, high: float | None = None, open_low: bool = True):
    """An argparse ``type`` for a finite number above ``low`` (or at least it, ``open_low=False``)
    and at most ``high``: ``--lr nan`` or ``--time-limit inf`` is refused at parse time."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{quote(text)} is not a number") from None
        ok = math.isfinite(value) and (value > low if open_low else value >= low) and (high is None or value <= high)
        if not ok:
            span = f"{'above' if open_low else 'at least'} {low:g}" + (f" and at most {high:g}" if high else "")
            raise argparse.ArgumentTypeError(f"{quote(text)} must be a finite number {span}")
        return value
    parse.__name__ = "number"
    return parse


def add_model_args(p, seq: bool = True) -> None:
    p.add_argument("model", metavar="MODEL",
                   help="preset (autopar models), family 'gpt:layers=..', 'file.py:fn' or 'hf:config.json'")
    if seq:
        p.add_argument("--seq", type=int_arg(limit="seq"), default=None,
                       help="sequence length (default: the model's own)")
    p.add_argument("--no-cache", action=_NoCache, nargs=0,   # moespeed: autopar.trace.disk_cache
                   help="trace the model again rather than read its table from the disk cache "
                        "(~/.cache/autopar; AUTOPAR_NO_CACHE=1 does the same)")


class _NoCache(argparse.Action):
    """``--no-cache``: sets AUTOPAR_NO_CACHE=1, which ``autopar.trace.disk_cache`` reads."""

    def __call__(self, parser, namespace, values, option_string=None):
        os.environ["AUTOPAR_NO_CACHE"] = "1"
        setattr(namespace, self.dest, True)


def add_progress_arg(p) -> None:
    p.add_argument("--progress", action="store_true",
                   help="show progress on stderr even when it is not a terminal (it always shows on one)")


def wants_progress(args) -> bool:
    """Progress goes to stderr when it is a terminal, or when asked for with --progress; never to
    stdout, so --json output stays clean."""
    return bool(getattr(args, "progress", False)) or _isatty(sys.stderr)


def check_output(path) -> None:
    """Refuse an unwritable -o before the command's long work (``costmodels.contracts.files``)."""
    from costmodels.contracts.files import check_output_path
    if path is not None:
        check_output_path(path)


@contextmanager
def progress(args, label: str, after_s: float = 1.0):
    """While the block runs, show ``autopar <command>: <label> … N s`` on stderr once it has
    taken more than ``after_s`` seconds (updated in place on a terminal, a line every 5 s
    otherwise); nothing when ``wants_progress(args)`` is false. The line is cleared at the end."""
    if not wants_progress(args):
        yield
        return
    stream, tty = sys.stderr, _isatty(sys.stderr)
    name = f"autopar {getattr(args, 'command', None) or ''}".rstrip()
    stop = threading.Event()
    shown = []

    def tick():
        t0 = time.monotonic()
        if stop.wait(after_s):
            return
        while True:
            line = f"{name}: {label} … {time.monotonic() - t0:.0f} s"
            try:
                stream.write(f"\r\033[K{line}" if tty else line + "\n")
                stream.flush()
            except (OSError, ValueError):
                return
            shown.append(True)
            if stop.wait(0.5 if tty else 5.0):
                return

    thread = threading.Thread(target=tick, name="autopar-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=1.0)
        if shown and tty:
            try:
                stream.write("\r\033[K")
                stream.flush()
            except (OSError, ValueError):
                pass


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def console():
    """A rich Console; when output is not a terminal (a pipe, a file) it is wide enough that no
    table cuts a name to '…' (rich would assume 80 columns). A closed pipe (``| head``) raises
    BrokenPipeError, which ``autopar.cli.main`` ends quietly with exit 0, as for print()."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:    # rich's own: exit 1 from deep inside print
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    c = _Console()
    if not c.is_terminal and not os.environ.get("COLUMNS", "").isdigit():   # COLUMNS: a width asked for
        c = _Console(width=WIDE)
    return c


def print_table(table, c=None, drop=(), wide: bool = False):
    """Print a rich table without cutting any cell to '…'. Numbers (right-aligned columns) never
    wrap; text columns fold (a long name breaks across lines rather than losing its end); and when
    the numbers alone do not fit the terminal, the table is printed at its natural width (the
    terminal wraps its lines). Off a terminal the console is wide already. Returns the console.

    ``drop``: column headers that may be left out, least needed first, while the table is wider
    than the terminal (a line then says which, and that ``--wide`` / ``--json`` show them);
    ``wide``: never drop (the table at its natural width)."""
    from rich.console import Console
    from rich.measure import Measurement
    c = c or console()
    hidden = []
    if not wide:
        natural = Console(width=WIDE)
        for header in drop:   # until every column fits unfolded
            if Measurement.get(natural, natural.options, table).maximum <= c.width:
                break
            index = next((i for i, col in enumerate(table.columns) if str(col.header) == header), None)
            if index is not None:
                _drop_column(table, index)
                hidden.append(header)
    need = _needed_width(table)
    if need > c.width:
        wide = Console(width=WIDE)
        natural = Measurement.get(wide, wide.options, table).maximum
        c = type(c)(width=max(natural, c.width), force_terminal=c.is_terminal, color_system=c.color_system)
    c.print(table)
    if hidden:
        c.print(f"({len(hidden)} column(s) left out to fit {c.width} columns: {', '.join(hidden)}; "
                "--wide or --json shows them)")
    return c


def _needed_width(table) -> int:
    """Columns the table needs: numbers (right-aligned) never wrap, text columns fold."""
    from rich.cells import cell_len
    need = len(table.columns) * 3 + 1                       # borders and padding
    for col in table.columns:
        if col.justify == "right":
            col.no_wrap = True
        if col.no_wrap:
            texts = [str(col.header), *(str(x) for x in col.cells)]
            need += max(cell_len(line) for t in texts for line in t.split("\n"))
        else:
            col.overflow = "fold"
            need += 6                                        # a folded column still needs a few
    return need


def _drop_column(table, index: int) -> None:
    """Remove column ``index`` with its cells (rich keeps a row's cells in its columns)."""
    del table.columns[index]
    for i, col in enumerate(table.columns):
        col._index = i


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
