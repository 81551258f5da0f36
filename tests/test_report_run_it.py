"""The report's "Run it" section: the best plan of each search exported to each trainer — the
export command and the launch line it writes, or the trainer's one-line refusal."""
from __future__ import annotations

import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G = sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "report", "g*.json")))


def test_run_it_section_in_markdown_and_html():
    from autopar.report import build
    from autopar.report.load import read_inputs
    rep = build(read_inputs(G[:1]))
    md = rep.render("md")
    section = md[md.index("## Run it"):]
    best = rep.groups[0][0]
    assert f"autopar export {best.source} --index {best.file_rank} --to torchrun -o run-torchrun.sh" in section
    assert "torchrun --nnodes" in section and "--plan '{" in section        # the line that runs it
    for trainer in ("megatron", "torchtitan", "deepspeed"):
        assert f"--to {trainer}" in section
    html = rep.render("html")
    assert "<section id='run'><h2>Run it</h2>" in html and "torchrun --nnodes" in html
