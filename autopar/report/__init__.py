"""autopar.report: compare plans side by side — HTML with charts, Markdown, CSV.

``make_report(paths, fmt="html")`` reads plans files (``autopar search -o``) or estimate JSON
(``autopar estimate --json``) and returns the report text; ``build(records)`` gives the
``Report`` object with every section computed (ranked plans, why the best wins, step-time terms,
memory per pipeline stage, pipeline timelines, communication, scaling, a diff of two plans).
Modules: ``load`` (the inputs, read by ``costmodels.contracts.plans_file.PlansFile``, as ``PlanRecord``s),
``analysis`` (words and numbers), ``timeline`` (schedule simulation), ``charts`` (matplotlib →
inline SVG), ``validate_chart`` (predicted vs measured, for ``autopar validate`` output),
``render`` (HTML / Markdown / CSV). The report reads search and validate output; neither of
them imports the report.
"""
from __future__ import annotations

from autopar.report.core import FORMATS, Report, build, make_report, write_atomic

__all__ = ["FORMATS", "Report", "build", "make_report", "write_atomic", "scale_search"]


def scale_search(model: str, hardware: str, gpus: int, global_batch: int, seq: int | None = None,
                 top: int = 3) -> dict:
    """Run the search (``autopar.search.search``) at one GPU count; the plans-file dict."""
    from autopar.search import search
    return search(model, hardware=hardware, gpus=gpus, global_batch=global_batch, seq=seq,
                  top=top).plans_file()
