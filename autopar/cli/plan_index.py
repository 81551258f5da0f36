"""``--index K``: which plan of a plans file, numbered from 1 as every table numbers them
(``autopar search`` prints #1 for the best). ``--index 0`` was the old 0-based form: it is refused
in one line that says so, rather than silently exporting the plan below the one meant."""
from __future__ import annotations

from costmodels.contracts.errors import PlanError


def add_index_arg(p) -> None:
    from autopar.cli.common import int_arg
    p.add_argument("--index", type=int_arg(low=0, high=10 ** 6), default=1, metavar="K",
                   help="which plan of a plans file, numbered from 1 as in the tables (default 1, the best)")


def pick(count: int, index: int, source: str) -> int:
    """The 0-based position of plan ``index`` (1-based) among ``count``; one line when there is none."""
    if index == 0:
        raise PlanError("--index counts from 1, as the tables number plans (#1 is the best); "
                        "--index 0 was the old 0-based form: give --index 1 for the best plan")
    if index > count:
        raise PlanError(f"--index {index} but {source} holds {count} plan(s): give 1 to {count}")
    return index - 1
