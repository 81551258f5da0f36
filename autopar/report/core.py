"""The report object: read the inputs, compute every section once, render in any format."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from autopar.report import analysis
from autopar.report.load import PlanRecord, read_inputs, records_of
from autopar.report.timeline import ScheduleCheck, Timeline, schedule_check, timeline_for
from costmodels.contracts.checks import quote
from costmodels.contracts.errors import PlanError
from costmodels.contracts.files import check_output_path, write_text_atomic
from costmodels.contracts.plan import V_SCHEDULES

FORMATS = ("html", "md", "csv")
EXTENSIONS = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".csv": "csv"}


@dataclass
class Report:
    records: list[PlanRecord]
    groups: list[list[PlanRecord]]
    why: list[dict]
    scaling: list[analysis.ScalingSeries]
    diff: tuple | None
    timelines: dict[int, Timeline]
    detail_records: list[PlanRecord]
    detail_limit: int | None
    scaling_notes: list[str] = field(default_factory=list)
    checks: dict[int, ScheduleCheck] = field(default_factory=dict)

    def check_text(self, r: PlanRecord) -> str | None:
        """A warning when simulating the plan's whole schedule gives a larger bubble than the
        estimate's (uneven virtual chunks on a rank), else None."""
        c = self.checks.get(r.id)
        if c is None or not c.flagged:
            return None
        secs = analysis.seconds
        return (f"simulating the whole {r.plan.schedule} schedule ({c.micro_batches} micro-batches) with "
                f"this plan's per-chunk times gives a {secs(c.simulated_bubble_s)} bubble, not the "
                f"estimate's {secs(c.estimated_bubble_s)}: step ≈ {secs(c.simulated_step_s)} instead of "
                f"{secs(c.step_time_s)} (+{100 * c.extra_s / c.step_time_s:.0f}%). Its virtual "
                "chunks are uneven (their size changes from one chunk column to the next), which "
                "stalls the schedule in ways the estimate's closed form (slowest chunk per column) "
                "does not see")

    @property
    def title(self) -> str:
        models = sorted({r.model for r in self.records})
        hws = sorted({str(r.get("hardware")) for r in self.records})
        gpus = sorted({r.gpus for r in self.records})
        return f"{', '.join(models)} on {', '.join(hws)} · {', '.join(map(str, gpus))} GPUs"

    @property
    def subtitle(self) -> str:
        files = sorted({r.source for r in self.records if not r.source.startswith("<")})
        batches = sorted({r.get("global_batch") for r in self.records})
        s = (f"{len(self.records)} plans in {len(self.groups)} setting(s)"
             + (f" ({', '.join(os.path.basename(f) for f in files)})" if files else "")
             + f" · global batch {', '.join(map(str, batches))}")
        return s

    def timeline_caption(self, t: Timeline, r: PlanRecord | None = None) -> str:
        split = any(o.kind == "W" for o in t.ops)
        passes = ("Forward (blues), input-gradient backward (oranges) and weight-gradient passes "
                  "(greens; the backward split in two, W deferred to fill the bubble)" if split
                  else "Forward (blues) and backward (oranges)")
        where = ("on each pipeline rank (rank r runs stages r and 2·pp − 1 − r: the V placement)"
                 if t.schedule in V_SCHEDULES else "on each pipeline stage")
        s = (f"{passes} of each micro-batch, one shade per virtual chunk, {where} under "
             f"{t.schedule}; the gaps are the pipeline bubble (idle {100 * t.idle_fraction:.1f}% of "
             "the drawn span).")
        if t.capped:
            s += (f" The step has {t.total_micro_batches} micro-batches; only the first "
                  f"{t.micro_batches} are simulated and drawn (warm-up, steady state and drain), so the "
                  "idle share drawn is larger than the step's")
            bf = r.get("bubble_fraction") if r is not None else None
            s += f" ({100 * float(bf):.1f}% per the estimate)." if isinstance(bf, (int, float)) else "."
        if r is not None and r.id in self.checks:
            c = self.checks[r.id]
            s += (f" Whole step simulated: bubble {analysis.seconds(c.simulated_bubble_s)} on the busiest "
                  f"rank vs the estimate's {analysis.seconds(c.estimated_bubble_s)}"
                  + (" — see the warning under 'Why this plan'." if c.flagged else "."))
        if r is not None and r.plan.pools and r.get("stages_detail"):
            from autopar.report.pools import speeds_caption
            s += speeds_caption(r)
        return s

    def detail_note_html(self) -> str:
        shown, total = len(self.detail_records), len(self.records)
        if shown == total:
            return ""
        return (f"<p class='note'>Shown for the best {self.detail_limit} plan(s) of each search "
                f"({shown} of {total}); pass --detail all for every plan.</p>")

    def render(self, fmt: str = "html") -> str:
        from autopar.report import render
        if fmt == "html":
            return render.to_html(self)
        if fmt == "md":
            return render.to_markdown(self)
        if fmt == "csv":
            return render.to_csv(self)
        raise PlanError(f"unknown report format '{fmt}'; choose one of {', '.join(FORMATS)}")


def build(records: list[PlanRecord], diff: tuple[int, int] | None = None, detail: int | None = None,
          one_gpu_time=None, scaling_notes=()) -> Report:
    """Compute every section. ``diff`` is a pair of row numbers of the ranked table (default: the
    first search's best and runner-up); ``detail`` limits memory / timeline charts to the best
    ``detail`` plans of each search (None: all)."""
    groups = analysis.groups(records)
    # a plan whose simulated schedule is slower than its estimate (flagged ⚠) is ranked by the
    # simulated step time, the one the report trusts, not by the estimate it fails
    simulated = {id(r): c for g in groups for r in g if (c := schedule_check(r)) is not None}
    groups = [sorted(g, key=lambda r: analysis.trusted_rank_key(r, simulated.get(id(r)))) for g in groups]
    ordered = [r for g in groups for r in g]
    for i, r in enumerate(ordered, 1):   # row numbers follow the ranked table
        r.id = i
    why = [analysis.why(g) for g in groups]
    detail_records = [r for g in groups for r in (g if detail is None else g[:detail])]
    timelines = {}
    for r in detail_records:
        t = timeline_for(r)
        if t is not None:
            timelines[r.id] = t
    checks = {r.id: simulated[id(r)] for r in ordered if id(r) in simulated}
    scaling = analysis.scaling(ordered, one_gpu_time)
    notes = list(scaling_notes)
    if len({p.gpus for s in scaling for p in s.points}) < 2:
        notes.append("Only one GPU count in the inputs: give plans files for several counts, or "
                     "--scale 64,128,... to search at each, for a real scaling curve.")
    pair = None
    if diff is not None:
        by_id = {r.id: r for r in ordered}
        bad = [i for i in diff if i not in by_id]
        if bad:
            raise PlanError(f"--diff {diff[0]},{diff[1]}: no plan #{bad[0]}; the ranked table has "
                            f"plans #1 to #{len(ordered)}")
        pair = (by_id[diff[0]], by_id[diff[1]])
    else:
        g = next((g for g in groups if len(g) > 1), None)
        if g:
            pair = (g[0], g[1])
        elif len(ordered) > 1:
            pair = (ordered[0], ordered[1])
    d = (pair[0], pair[1], analysis.diff(*pair)) if pair else None
    return Report(ordered, groups, why, scaling, d, timelines, detail_records, detail, notes, checks)


def make_report(paths: list[str], fmt: str = "html", diff: tuple[int, int] | None = None,
                detail: int | None = 3, allow_mixed: bool = False, extra: list | None = None,
                one_gpu_time=None, notes=()) -> str:
    """The report text for plans files ``paths`` (plus already-parsed ``extra`` plans-file dicts,
    e.g. from a search run in-process)."""
    records = read_inputs(paths, allow_mixed=allow_mixed) if paths else []
    for data in extra or []:
        records.extend(records_of(data, f"<search at {data.get('gpus')} GPUs>"))
    if not records:
        raise PlanError("no plans to report on; pass plans files or --scale with a model")
    models = {r.model for r in records}
    if len(models) > 1 and not allow_mixed:
        raise PlanError(f"the inputs hold plans for different models ({', '.join(sorted(models))}); "
                        "compare one model at a time or pass --allow-mixed")
    return build(records, diff=diff, detail=detail, one_gpu_time=one_gpu_time,
                 scaling_notes=notes).render(fmt)


def output_target(path: str | None, fmt: str | None) -> tuple[str | None, str]:
    """(file to write or None for standard output, format) for ``report -o PATH --format FMT``.

    The rule: a file's extension says its format (``EXTENSIONS``) and must agree with
    ``--format`` when both are given; a name without an extension needs ``--format``; any other
    extension (``p.json``) is refused, so a report never lands in a file whose name says it is
    something else. ``-`` is standard output. Without ``-o``: ``report.html`` for HTML, standard
    output for md / csv. The path itself is checked here too (``check_output_path``: an empty
    name, a directory, a missing or unwritable folder), before any report work."""
    if fmt is not None and fmt not in FORMATS:
        raise PlanError(f"unknown report format {quote(fmt)}; choose one of {', '.join(FORMATS)}")
    if path is None or path == "-":
        fmt = fmt or "html"
        return (("report.html" if fmt == "html" and path is None else None), fmt)
    if not str(path).strip():
        check_output_path(path)          # one line: the name is empty
    ext = os.path.splitext(str(path))[1].lower()
    named = EXTENSIONS.get(ext)
    if ext and named is None:
        raise PlanError(f"report -o {quote(path)}: '{quote(ext, 20).strip(chr(39))}' is not a report "
                        f"format; name the file {', '.join(EXTENSIONS)} (the extension picks the format)")
    if named and fmt and named != fmt:
        raise PlanError(f"report -o {quote(path)}: the extension says {named} but --format is {fmt}; make them "
                        "agree (or leave --format out: the extension picks it)")
    if not named and not fmt:
        raise PlanError(f"report -o {quote(path)} has no extension to pick the format from; name it "
                        ".html, .md or .csv, or give --format")
    check_output_path(path)
    return path, named or fmt


def write_atomic(path: str, text: str) -> None:
    write_text_atomic(path, text)


__all__ = ["Report", "build", "make_report", "output_target", "write_atomic", "FORMATS", "EXTENSIONS"]
