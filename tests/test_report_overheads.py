"""The "overheads against the best plan" view: each plan's terms but compute, and per term its
difference from the best plan of its search, adding up to the difference in the step time the
ranking trusts (a ⚠ plan's bubble is its simulated one)."""
from __future__ import annotations

import glob
import os
from unittest import mock

import pytest

from autopar.report import build, charts, overheads
from autopar.report.load import read_inputs
from autopar.report.timeline import ScheduleCheck

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "report", "g*.json")))


@pytest.fixture(scope="module")
def report():
    rep = build(read_inputs(G), detail=1)
    # one runner-up flagged: its simulated schedule stalls 2 s longer than the estimate's bubble
    r = rep.groups[0][1]
    rep.checks[r.id] = ScheduleCheck(micro_batches=8, simulated_s=10.0, busiest_rank_s=8.0,
                                     estimated_bubble_s=0.0, step_time_s=float(r["step_time_s"]))
    assert rep.checks[r.id].flagged
    return rep


def trusted_step(rep, r):
    c = rep.checks.get(r.id)
    return c.simulated_step_s if c is not None and c.flagged else float(r["step_time_s"])


def test_terms_against_the_best_add_up_to_the_trusted_step_time(report):
    rows = overheads.overhead_rows(report)
    assert len(rows) == len(report.records)
    for row in rows:
        gap = trusted_step(report, row.record) - trusted_step(report, row.best)
        assert row.net_s == pytest.approx(gap, rel=1e-9, abs=1e-9)
        assert row.overhead_s == pytest.approx(sum(row.terms.values()) - row.terms["compute"])
        if row.record is row.best:
            assert all(v == 0 for v in row.deltas.values())
    flagged = next(r for r in rows if r.record is report.groups[0][1])
    assert flagged.terms["bubble"] == pytest.approx(
        float(flagged.record["breakdown_s"]["bubble"]) + 2.0)


def test_the_chart_draws_overheads_on_their_own_scale(report):
    figs = []
    keep = charts.to_svg
    with mock.patch.object(charts, "to_svg", lambda fig: figs.append(fig) or keep(fig)):
        svg = overheads.overheads_chart(report)
    left, right = figs[0].axes
    rows = overheads.overhead_rows(report)
    ys = list(range(len(rows)))[::-1]
    # left: each plan's bars add up to its overheads (every term but compute), in seconds
    for y, row in zip(ys, rows):
        drawn = sum(p.get_width() for p in left.patches if abs(p.get_y() + p.get_height() / 2 - y) < 1e-6)
        assert drawn == pytest.approx(row.overhead_s, rel=1e-9)
    largest = max(r.overhead_s for r in rows)
    assert largest <= left.get_xlim()[1] <= 1.3 * largest     # its own scale, not the step time's
    # right: the positive and negative per-term differences drawn for each plan
    for y, row in zip(ys, rows):
        widths = [p.get_width() for p in right.patches if abs(p.get_y() + p.get_height() / 2 - y) < 1e-6]
        assert sorted(widths) == pytest.approx(sorted(d for d in row.deltas.values() if d), rel=1e-9)
    assert svg.startswith("<svg")


def test_html_and_markdown_carry_the_view(report):
    from autopar.report.render import _figure
    html = overheads.html_section(report, _figure)
    assert "data-chart='overheads'" in html and "Overheads against the best plan" in html
    assert "(⚠)" in html                     # the flagged plan's bubble is said to be the simulated one
    md = "\n".join(overheads.markdown_lines(report, lambda h, rows: "\n".join(
        "| " + " | ".join(map(str, r)) + " |" for r in [h, *rows])))
    assert md.count("| best |") == len(report.groups)
