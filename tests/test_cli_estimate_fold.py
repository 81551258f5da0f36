"""``autopar estimate`` on a plans file: one column per plan, folded to the terminal (plans in as
many tables as fit, labels wrapped over their column), the whole table with ``--wide``; it was
~300 columns for five plans whatever the terminal."""
from __future__ import annotations

import json
import os
import re

import pytest
from rich.cells import cell_len

from autopar.cli.estimate import render

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "report", "g256.json")


@pytest.fixture(scope="module")
def results():
    d = json.load(open(FIX))
    keep = ("model", "gpus", "hardware", "global_batch", "seq")
    return [dict(p, **{k: d[k] for k in keep}) for p in d["plans"]]


def lines_of(capsys, results, columns, monkeypatch, wide=False):
    monkeypatch.setenv("COLUMNS", str(columns))
    render(results, wide=wide)
    return capsys.readouterr().out.splitlines()


def test_plans_fold_into_tables_that_fit_the_terminal(results, capsys, monkeypatch):
    n = len(results)
    assert n >= 3
    out = lines_of(capsys, results, 72, monkeypatch)
    assert max(cell_len(line) for line in out) <= 72
    heads = [int(x) for line in out if line.startswith("┃") for x in re.findall(r"\bplan (\d+)\b", line)]
    assert sorted(heads) == list(range(1, n + 1))            # every plan, once
    assert sum("step time" in line for line in out) > 1      # the row names repeat in each table
    assert any(f"of {n}" in line for line in out) and "--wide" in " ".join(out[-3:])


def test_wide_is_one_table_at_its_natural_width(results, capsys, monkeypatch):
    out = lines_of(capsys, results, 100, monkeypatch, wide=True)
    assert max(cell_len(line) for line in out) > 100
    assert sum("step time" in line for line in out) == 1
    from costmodels.contracts.plans_file import PlanResult
    label = PlanResult.from_dict(results[0]).plan.label()
    assert any(label in line for line in out)                # each label whole, on one line


def test_a_table_that_fits_is_left_as_it_is(results, capsys, monkeypatch):
    out = lines_of(capsys, results[:1], 200, monkeypatch)
    assert sum("step time" in line for line in out) == 1 and not any("--wide" in line for line in out)


def test_estimate_takes_wide():
    from autopar.cli.main import build_parser
    args = build_parser().parse_args(["estimate", "gpt:layers=2", "--plan", "{}", "--wide"])
    assert args.wide is True
