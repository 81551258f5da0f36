"""autopar report: every section in HTML, Markdown and CSV; scaling arithmetic; the diff."""
import io
import os
import re

import pandas as pd
import pytest

from autopar.cli.main import main
from autopar.report import build, make_report
from autopar.report.analysis import scaling
from autopar.report.load import read_inputs

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "report")
G = [os.path.join(FIX, f"g{n}.json") for n in (256, 512, 1024)]
SECTIONS = ("ranked", "why", "step-time", "memory", "timeline", "comm", "scaling", "diff")
CHARTS = ("step-time", "overheads", "memory", "timeline", "comm", "scaling")


def no_t1(*key):
    return None, "test"


@pytest.fixture(scope="module")
def html_text():
    return make_report(G, fmt="html", one_gpu_time=lambda *k: (1e5, "T(1) given by the test"))


def test_html_has_every_section_and_chart(html_text):
    for s in SECTIONS:
        assert f"<section id='{s}'>" in html_text
    figs = re.findall(r"<figure class='chart' data-chart='([^']+)'[^>]*>\s*<svg", html_text)
    for c in CHARTS:
        assert c in figs
    # memory and timeline for the best 3 of each of the 3 searches (default --detail 3)
    assert figs.count("memory") == 9 and figs.count("timeline") == 9
    assert "Bottleneck: " in html_text and "most loaded stage" in html_text and "HBM" in html_text
    for sched in ("1f1b", "interleaved-1f1b", "gpipe"):
        assert f"under {sched};" in html_text     # each timeline's caption names its schedule
    assert "only the first" in html_text   # capped timelines say so


def test_html_is_self_contained(html_text):
    # nothing to fetch: no scripts, stylesheets, images or fonts from anywhere
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b", html_text, re.I)
    assert "@import" not in html_text and "@font-face" not in html_text
    urls = set(re.findall(r"(?:https?:)?//[\w.-]+[^\s\"'<>)]*", html_text))
    allowed = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink", "http://purl.org/dc/elements/1.1/",
               "http://creativecommons.org/ns#", "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
               "http://purl.org/dc/dcmitype/StillImage"}
    assert urls <= allowed, urls - allowed
    assert re.findall(r'(?:href|src)="(?!#)', html_text) == []
    # ids are unique on the page although every chart comes from its own SVG
    ids = re.findall(r'\bid="([^"]+)"', html_text)
    assert len(ids) == len(set(ids))


def test_charts_come_from_matplotlib():
    from autopar.report import charts
    recs = read_inputs(G)
    svg = charts.step_time_chart(recs)
    assert svg.startswith("<svg") and "matplotlib" in svg.lower()


def test_markdown_has_every_section():
    md = make_report(G, fmt="md", one_gpu_time=no_t1)
    for h in ("## Ranked plans", "## Why this plan", "## Step time by term", "## Memory per pipeline stage",
              "## Pipeline timelines", "## Communication per step", "## Scaling", "## Diff: #1 vs #2"):
        assert h in md
    assert "◀" in md and "```" in md
    assert "one-GPU time not available" in md


def test_csv_is_one_row_per_plan():
    df = pd.read_csv(io.StringIO(make_report(G, fmt="csv", one_gpu_time=no_t1)))
    assert len(df) == 10 and list(df["id"]) == list(range(1, 11))
    for col in ("dp", "tp", "pp", "schedule", "step_time_s", "tokens_per_s", "mfu", "fits",
                "breakdown_s.bubble", "memory_bytes.total", "comm_bytes.dp"):
        assert col in df.columns
    parts = [c for c in df.columns if c.startswith("breakdown_s.")]
    assert (df[parts].sum(axis=1) - df["step_time_s"]).abs().max() < 1e-6


def test_scaling_speedup_and_efficiency():
    recs = read_inputs(G)
    [s] = scaling(recs, lambda *k: (2000.0, "given"))
    assert [p.gpus for p in s.points] == [256, 512, 1024]
    for p in s.points:
        assert p.speedup == pytest.approx(2000.0 / p.step_time_s)
        assert p.efficiency == pytest.approx(p.speedup / p.gpus)
        assert p.record is min((r for r in recs if r.gpus == p.gpus and r["fits"]),
                               key=lambda r: r["step_time_s"])
    # without T(1): against the smallest real count, said so, efficiency 1 there
    [s] = scaling(recs, no_t1)
    assert s.points[0].efficiency == pytest.approx(1.0) and "not available" in s.one_gpu_note
    assert "against the smallest GPU count searched, 256" in s.one_gpu_note


def test_report_scales_against_the_smallest_real_gpu_count_by_default():
    """No fictional one-GPU run (the cost model's, memory ignored) unless asked for."""
    from autopar.report.core import build
    [s] = build(read_inputs(G)).scaling
    assert s.points[0].efficiency == pytest.approx(1.0)
    assert "against the smallest GPU count searched, 256" in s.one_gpu_note
    assert "memory ignored" not in s.one_gpu_note


def test_why_and_diff():
    rep = build(read_inputs(G), diff=(1, 3), one_gpu_time=no_t1)
    w = rep.why[0]
    assert w["best"].id == 1 and w["bottleneck_text"]
    texts = dict((r.id, t) for r, t in w["runners_up"])
    assert "does not fit" in texts[3]                      # #3 needs 128 GiB > 80 GiB
    assert "slower" in texts[2] and "pipeline bubble" in texts[2]
    a, b, rows = rep.diff
    assert (a.id, b.id) == (1, 3)
    names = [r[0] for r in rows]
    assert {"dp", "pp", "schedule", "step time", "memory per GPU", "fits"} <= set(names)


def test_cli_formats_and_default_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["report", *G, "--detail", "1"]) == 0
    assert (tmp_path / "report.html").read_text().startswith("<!DOCTYPE html>")
    assert main(["report", *G, "-o", "r.md"]) == 0
    assert (tmp_path / "r.md").read_text().startswith("# autopar report")
    capsys.readouterr()
    assert main(["report", G[0], "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("id,source")


def test_minimal_estimates_still_render(tmp_path):
    """Only the required predictions (no breakdown, stages_detail, comm): every format renders,
    sections say what is missing instead of failing."""
    base = {"model": "gpt2-small", "hardware": "cpu-2core", "gpus": 2, "global_batch": 8,
            "step_time_s": 1.5, "tokens_per_s": 1000.0, "memory_bytes": {"total": 3e9}, "fits": True}
    p = tmp_path / "min.json"
    p.write_text(__import__("json").dumps([dict(base, dp=2), dict(base, pp=2, step_time_s=2.0, fits=False)]))
    html = make_report([str(p)], one_gpu_time=no_t1)
    assert "no stages_detail" in html and "data-chart='step-time'" in html
    assert "## Ranked plans" in make_report([str(p)], fmt="md", one_gpu_time=no_t1)
    assert len(pd.read_csv(io.StringIO(make_report([str(p)], fmt="csv", one_gpu_time=no_t1)))) == 2


def test_diff_prints_stage_splits_as_row_ranges():
    from autopar.report.analysis import diff, stage_ranges_text
    assert stage_ranges_text([[0, 5], [5, 9], [9, 10]]) == "rows 0–4 | 5–8 | 9"
    assert stage_ranges_text(None) == "balanced"
    import copy
    a = read_inputs(G)[0]
    b = copy.copy(a)
    b.plan = a.plan.with_(stages=((0, 40), (40, 98)), pp=2, vpp=1)
    a.plan = a.plan.with_(stages=((0, 50), (50, 98)), pp=2, vpp=1)
    rows = {w: (x, y) for w, x, y, _ in diff(a, b)}
    assert rows["stages"] == ("rows 0–49 | 50–97", "rows 0–39 | 40–97"), rows
