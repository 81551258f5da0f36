"""Every text of a report chart lies inside its figure, whatever the data's labels: a legend too
wide for its row loses columns, a title wider than the figure wraps (autopar.report.chart_fit;
the memory chart's title was cut at "memory per", the step-time legend at "exposed PP send/re…")."""
from __future__ import annotations

import glob
import os
from unittest import mock

from autopar.report import charts
from autopar.report.chart_fit import outside_texts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "report", "g*.json")))


def test_a_long_title_and_a_wide_legend_are_brought_inside():
    fig = charts._figure(4.0, 3.0)
    ax = fig.add_subplot()
    for i in range(4):
        ax.plot([0, 1], [i, i + 1], label=f"a rather long legend entry number {i}")
    fig.legend(fontsize=7, ncols=4, loc="outside upper center", frameon=False)
    title = "a chart title that is much longer than the four inches this figure is wide, by far"
    fig.suptitle(title, x=0.02, ha="left", fontsize=10)
    assert outside_texts(fig)                      # as drawn, the title and the legend leave the figure
    svg = charts.to_svg(fig)
    assert outside_texts(fig) == []
    assert "\n" in fig.get_suptitle() and fig.get_suptitle().replace("\n", " ") == title  # wrapped, not cut
    assert fig.legends[0]._ncols < 4       # four entries of ~150 px do not fit a row of 288 px
    assert svg.startswith("<svg") and 'viewBox="0 0 288 ' in svg   # 4 in at 72 dpi, scaled by the page


def test_memory_and_step_time_charts_keep_their_texts_inside():
    from autopar.report.load import read_inputs
    records = read_inputs(G)
    for i, r in enumerate(records, 1):
        r.id = i
    figs = []
    keep = charts.to_svg
    with mock.patch.object(charts, "to_svg", lambda fig: figs.append(fig) or keep(fig)):
        charts.memory_chart(records[0])          # its title was cut at "memory per"
        charts.step_time_chart(records)
    assert len(figs) == 2
    for fig in figs:
        assert outside_texts(fig) == []
    assert "memory per pipeline stage" in figs[0].get_suptitle().replace("\n", " ")


def test_the_validate_chart_keeps_its_texts_inside():
    from autopar.report.validate_chart import validation_chart
    result = os.path.join(ROOT, "benchmarks", "bench_validate_cpu2core.json")
    figs = []
    keep = charts.to_svg
    with mock.patch.object(charts, "to_svg", lambda fig: figs.append(fig) or keep(fig)), \
            mock.patch("autopar.report.validate_chart.to_svg", lambda fig: figs.append(fig) or keep(fig)):
        svg = validation_chart(result)
    assert svg.startswith("<svg") and figs
    assert outside_texts(figs[-1]) == []
