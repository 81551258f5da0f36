"""The step-time chart's legend lies inside its figure (it was cut at the right edge:
"exposed PP send/re…"): every legend entry's box within the figure's box once drawn."""
from __future__ import annotations

import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "report", "g*.json")))


def test_step_time_legend_is_inside_the_figure():
    from autopar.report import build
    from autopar.report.charts import step_time_figure
    from autopar.report.load import read_inputs
    rep = build(read_inputs(G))
    fig = step_time_figure(rep.records)
    fig.draw_without_rendering()
    box = fig.bbox
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends
    renderer = fig._get_renderer()
    for legend in legends:
        for text in legend.get_texts():
            e = text.get_window_extent(renderer)
            assert box.x0 - 0.5 <= e.x0 and e.x1 <= box.x1 + 0.5, (text.get_text(), e, box)
            assert box.y0 - 0.5 <= e.y0 and e.y1 <= box.y1 + 0.5, (text.get_text(), e, box)
