"""The report on a pooled plan (autopar/report/pools.py): stages by pool, memory per stage against
its own pool's HBM, per-pool speeds in the timeline caption and labels."""
from __future__ import annotations

from synthetic_tables import gpt_table

from autopar.report.analysis import gib
from autopar.report.core import make_report
from costmodels.contracts.plan import Plan
from costmodels.contracts.plans_file import PLANS_FILE_VERSION
from costmodels.model.estimate import estimate
from costmodels.profiles.cluster import parse_hardware
from costmodels.profiles.hardware_files import load_profile


def _plans_file():
    t = gpt_table(8, 512, 8, 1000, 256, model="gpt:layers=8,hidden=512,heads=8,vocab=1000,seq=256")
    c = parse_hardware("a100-40g-sxm:8,h100-80g-sxm:8")
    plan = Plan(dp=4, tp=2, pp=2, stages=((0, 4), (4, 10)), pools=c.spec(), stage_pools=(0, 1))
    d = estimate(t, c, plan, 16, 16).to_dict()
    return {"version": PLANS_FILE_VERSION, "model": t.model, "hardware": c.label(), "gpus": c.gpus,
            "global_batch": 16, "seq": t.seq, "plans": [d]}, d


def test_report_shows_pools_memory_against_each_pools_hbm_and_speeds():
    data, d = _plans_file()
    md = make_report([], fmt="md", extra=[data])
    assert "## Pools (heterogeneous cluster)" in md
    stage_lines = [ln for ln in md.splitlines() if ln.startswith("| 0 | a100-40g-sxm") or
                   ln.startswith("| 1 | h100-80g-sxm")]
    # each stage against its own pool's HBM (the profiles' figures, as the report formats bytes)
    for name, line_start in (("a100-40g-sxm", "| 0 | a100-40g-sxm | 4 |"),
                             ("h100-80g-sxm", "| 1 | h100-80g-sxm | 6 |")):
        row = next(ln for ln in stage_lines if ln.startswith(line_start))
        assert f"/ {gib(load_profile(name).hbm_bytes)} |" in row, row
    hbm = {s["pool"]: s["hbm_bytes"] for s in d["stages_detail"]}
    assert hbm[0] < hbm[1]
    assert "Per-pool speed" in md and "a100-40g-sxm:" in md and "h100-80g-sxm:" in md
    html = make_report([], fmt="html", extra=[data])
    # the chart's title (matplotlib writes each of its lines as an SVG comment) may be wrapped to
    # fit its figure (autopar.report.chart_fit)
    import re
    drawn = " ".join(" ".join(re.findall(r"<!--(.*?)-->", html, re.S)).split())
    assert "Pools (heterogeneous cluster)" in html and "memory per stage by pool" in drawn


def test_uniform_report_has_no_pools_section():
    data, _ = _plans_file()
    t = gpt_table(8, 512, 8, 1000, 256, model=data["model"])
    d = estimate(t, "h100-80g-sxm", Plan(dp=4, tp=2, pp=2), 16, 16).to_dict()
    md = make_report([], fmt="md", extra=[{**data, "hardware": "h100-80g-sxm", "plans": [d]}])
    assert "Pools" not in md and "Per-pool" not in md
