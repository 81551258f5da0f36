"""A table with one column per plan (``autopar estimate`` on a plans file), folded to the terminal.

Its rows are fixed (step time, memory, each term ...) and its columns are the plans, each headed by
the plan's label (``dp16·tp2·pp8 vpp6 mb1 ZeRO-2 sp interleaved-1f1b``, ~50 characters), so five
plans made a ~300-column table in a 100-column terminal. Here the labels wrap onto a few lines
over their column (whose values are ~10 characters), and the plans are printed in as many tables
as the terminal needs, each repeating the row names and saying which plans it holds: "plans 1–3
of 5". ``--wide`` prints the one table at its natural width; off a terminal (a pipe, a file) the
console is wide already, so the one table is what a script reads (``--json`` is the full data).

``PlanColumns`` takes the calls of a ``rich.table.Table`` that ``autopar.cli.estimate.render``
makes (``add_column``, ``add_row``), so the rows are written once, and ``print`` lays them out.
"""
from __future__ import annotations

import textwrap

MIN_PLAN_WIDTH = 16      # a plan's column: wide enough for its label to wrap in few lines


class PlanColumns:
    def __init__(self, title: str):
        self.title = title
        self.headers: list[str] = []
        self.justify: list[str] = []
        self.rows: list[tuple[str, ...]] = []

    def add_column(self, header: str = "", justify: str = "left") -> None:
        self.headers.append(header)
        self.justify.append(justify)

    def add_row(self, *cells: str) -> None:
        self.rows.append(tuple(cells))

    # ---- layout ---------------------------------------------------------------------------
    def _table(self, columns: list[int], title: str, wrap_to: dict[int, int] | None = None):
        from rich.table import Table
        t = Table(title=title)
        for i in [0, *columns]:
            header = self.headers[i]
            if wrap_to and i in wrap_to:   # "plan 3" on its own line, the label wrapped below it
                first, _, label = header.partition("\n")
                header = "\n".join([first, *textwrap.wrap(label, wrap_to[i], break_on_hyphens=False)])
            t.add_column(header, justify=self.justify[i], no_wrap=i > 0)
        for row in self.rows:
            t.add_row(*(row[i] for i in [0, *columns]))
        return t

    def _widths(self) -> tuple[int, dict[int, int]]:
        """(the row names' width, each plan column's width with its label wrapped)."""
        from rich.text import Text
        cell = lambda s: Text.from_markup(str(s)).cell_len  # noqa: E731
        names = max(cell(r[0]) for r in self.rows) if self.rows else 0
        plans = {}
        for i in range(1, len(self.headers)):
            values = max((cell(r[i]) for r in self.rows), default=0)
            first, _, label = self.headers[i].partition("\n")
            width = max(values, len(first), MIN_PLAN_WIDTH)
            lines = textwrap.wrap(label, width, break_on_hyphens=False) or [""]
            plans[i] = max(width, *(len(line) for line in lines))
        return names, plans

    def chunks(self, width: int) -> list[list[int]]:
        """Plan columns (1-based indices into the headers) in groups whose table fits ``width``
        terminal columns; a plan too wide for any table still gets one of its own."""
        names, plans = self._widths()
        groups, current, used = [], [], names + 4 + 1          # borders and padding
        for i, w in plans.items():
            if current and used + w + 3 > width:
                groups.append(current)
                current, used = [], names + 4 + 1
            current.append(i)
            used += w + 3
        if current:
            groups.append(current)
        return groups

    def print(self, wide: bool = False) -> None:
        from rich.console import Console
        from rich.measure import Measurement

        from autopar.cli.common import WIDE, console, print_table
        c = console()
        everything = list(range(1, len(self.headers)))
        natural = self._table(everything, self.title)
        measure = Console(width=WIDE)
        if wide or Measurement.get(measure, measure.options, natural).maximum <= c.width:
            print_table(natural, c, wide=True)      # fits (or asked for whole): labels on one line
            return
        _, plans = self._widths()
        groups = self.chunks(c.width)
        n = len(everything)
        for g in groups:
            span = "" if len(groups) == 1 else f" · plan {g[0]} of {n}" if len(g) == 1 else \
                f" · plans {g[0]}–{g[-1]} of {n}"
            c.print(self._table(g, self.title + span, plans))
        if len(groups) > 1:
            c.print(f"({n} plans in {len(groups)} tables to fit {c.width} columns; --wide prints "
                    "them in one table, --json gives every figure)")
