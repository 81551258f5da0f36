"""Turning a ``Report`` into HTML (self-contained, charts as inline SVG), Markdown or CSV."""
from __future__ import annotations

import html
import io
import os
from typing import Any

from autopar.report import overheads
from autopar.report.analysis import breakdown, comm_rows, gib, pct, seconds, stage_memories
from autopar.report.load import COMM_KINDS, MEMORY_KEYS, PlanRecord
from costmodels.contracts.breakdown import BREAKDOWN_KEYS, COMM_KIND_LABELS, TERM_LABELS
from costmodels.contracts.plan import V_SCHEDULES
from costmodels.profiles.error_bands import band_suffix

RANK_COLUMNS = ("#", "GPUs", "dp", "tp", "pp", "vpp", "schedule", "micro-batch", "ZeRO", "recompute",
                "SP", "step time (± check error)", "tokens/s", "TFLOP/s/GPU", "MFU", "memory/GPU", "fits", "file")


def ranked_rows(report) -> list[list[str]]:
    rows = []
    for g in report.groups:
        for r in g:
            p = r.plan
            mfu = r.get("mfu")
            tf = r.get("tflops_per_gpu")
            rows.append([str(r.id), str(r.gpus), _dp_cell(p), str(p.tp), str(p.pp), str(p.vpp), p.schedule,
                         str(p.micro_batch_size), str(p.zero), p.recompute,
                         "on" if p.sequence_parallel else "off",
                         seconds(float(r["step_time_s"])) + band_suffix(r.get("error_band"))
                         + (" ⚠" if report.check_text(r) else ""),
                         f"{float(r['tokens_per_s']):,.0f}",
                         f"{float(tf):.1f}" if tf is not None else "–",
                         pct(float(mfu)) if mfu is not None else "–",
                         gib(float(r["memory_bytes"].get("total", 0))), "yes" if r["fits"] else "NO",
                         f"{os.path.basename(r.source)} (rank {r.file_rank})"])
    return rows


def _dp_cell(p) -> str:
    """The dp column: dp, with the cp degree and HSDP's replicas × shard group when the plan has them."""
    return (str(p.dp) + (f" ·cp{p.cp}" if p.cp > 1 else "")
            + (f" (hsdp {p.replicas}×{p.dp_shard})" if p.dp_shard else ""))


def dataframe(records: list[PlanRecord]):
    """One row per plan, every plan field and prediction flattened (``breakdown_s.bubble``, ...)."""
    import pandas as pd
    rows = []
    for r in records:
        d: dict[str, Any] = {"id": r.id, "source": r.source, "file_rank": r.file_rank}
        for k in ("model", "hardware", "gpus", "global_batch", "seq"):
            d[k] = r.get(k)
        pd_ = r.plan.to_dict()
        pd_["stages"] = (" ".join(f"{a}-{b}" for a, b in r.plan.stages) if r.plan.stages else "balanced")
        pd_.pop("version", None)
        d.update(pd_)
        for k in ("num_micro_batches", "step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                  "bubble_fraction", "hbm_bytes", "fits"):
            d[k] = r.get(k)
        for k in (*MEMORY_KEYS, "total"):
            d[f"memory_bytes.{k}"] = r["memory_bytes"].get(k)
        b = breakdown(r)
        for k in BREAKDOWN_KEYS:
            d[f"breakdown_s.{k}"] = b[k]
        cb = r.get("comm_bytes") or {}
        for k in COMM_KINDS:
            d[f"comm_bytes.{k}"] = cb.get(k)
        rows.append(d)
    return pd.DataFrame(rows)


def to_csv(report) -> str:
    buf = io.StringIO()
    df = dataframe(report.records)
    checks = [report.checks.get(r.id) for r in report.records]
    df["simulated_bubble_s"] = [c.simulated_bubble_s if c else None for c in checks]
    df["simulated_step_time_s"] = [c.simulated_step_s if c else None for c in checks]
    df.to_csv(buf, index=False)
    return buf.getvalue()


# ---- Markdown ---------------------------------------------------------------------------------
def _md_table(header, rows) -> str:
    esc = [[str(c).replace("|", "\\|") for c in row] for row in rows]
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in esc]
    return "\n".join(out)


def to_markdown(report) -> str:
    L = [f"# autopar report: {report.title}", "", report.subtitle, ""]
    L += ["## Ranked plans", "", _md_table(RANK_COLUMNS, ranked_rows(report)), ""]
    L += ["## Why this plan", ""]
    for w in report.why:
        b = w["best"]
        L.append(f"**{b.gpus} GPUs — best #{b.id} {b.label()}**: "
                 f"{w['bottleneck_text']}. Memory: {w['memory_text']}.")
        if b.file_meta.get("comparison"):
            L += ["", f"Your configuration: {b.file_meta['comparison']}."]
        L.append("")
        for r, text in w["runners_up"]:
            L.append(f"- #{r.id} {r.label()}: {text}")
        L.append("")
        warns = [f"- ⚠ #{r.id} {r.label()}: {report.check_text(r)}."
                 for r in report.groups[report.why.index(w)] if report.check_text(r)]
        if warns:
            L += warns + [""]
    L += ["## Step time by term", ""]
    keys = [k for k in BREAKDOWN_KEYS if any(breakdown(r)[k] for r in report.records)]
    L.append(_md_table(["#", "plan", "step time"] + [TERM_LABELS[k] for k in keys],
                       [[str(r.id), f"{r.label()} · {r.gpus} GPUs", seconds(float(r["step_time_s"]))]
                        + [seconds(breakdown(r)[k]) for k in keys] for r in report.records]))
    L += [""] + overheads.markdown_lines(report, _md_table)
    L += ["", "## Memory per pipeline stage", ""]
    for r in report.detail_records:
        mems = stage_memories(r)
        worst = max(mems, key=lambda m: m[2])[0]
        L.append(f"**#{r.id} {r.label()}** (HBM {gib(float(r.get('hbm_bytes') or 0))}, most loaded "
                 f"stage {worst})")
        L.append("")
        L.append(_md_table(["stage", *MEMORY_KEYS, "total"],
                           [[f"{m[0]}{' ◀' if m[0] == worst else ''}", *(gib(m[1][k]) for k in MEMORY_KEYS),
                             gib(m[2])] for m in mems]))
        L.append("")
    from autopar.report import pools
    L += pools.markdown_lines(report, _md_table)
    L += ["## Pipeline timelines", ""]
    for r in report.detail_records:
        t = report.timelines.get(r.id)
        if t is None:
            L += [f"#{r.id} {r.label()}: no stages_detail in the input, no timeline.", ""]
            continue
        L.append(f"**#{r.id} {r.label()}**: {report.timeline_caption(t, r)}")
        L += ["", "```", ascii_timeline(t), "```", ""]
    L += ["## Communication per step", ""]
    crow = []
    for r in report.records:
        for c in comm_rows(r):
            crow.append([str(r.id), r.label(), COMM_KIND_LABELS.get(c.get("kind"), str(c.get("kind"))),
                         str(c.get("collective") or ""), str(c.get("group_size") or ""), str(c.get("tier")),
                         gib(float(c.get("bytes_per_gpu") or 0)),
                         seconds(float(c["time_s"])) if c.get("time_s") is not None else "–",
                         seconds(float(c["exposed_s"])) if c.get("exposed_s") is not None else "–"])
    L.append(_md_table(["#", "plan", "kind", "collective", "group", "tier", "bytes/GPU", "time", "exposed"], crow))
    L += ["", "## Scaling", ""]
    for s in report.scaling:
        L.append(f"**{s.label}** — {s.one_gpu_note}")
        L.append("")
        L.append(_md_table(["GPUs", "best plan", "step time", "tokens/s", "speed-up", "efficiency"],
                           [[str(p.gpus), f"#{p.record.id} {p.record.label()}", seconds(p.step_time_s),
                             f"{p.tokens_per_s:,.0f}", f"{p.speedup:.1f}×", pct(p.efficiency)]
                            for p in s.points]))
        for n in s.notes:
            L.append(f"\n_{n}_")
        L.append("")
    for note in report.scaling_notes:
        L += [f"_{note}_", ""]
    L += run_it_markdown(report)
    if report.diff:
        a, b, rows = report.diff
        L += [f"## Diff: #{a.id} vs #{b.id}", "", _md_table(["", f"#{a.id} {a.label()}", f"#{b.id} {b.label()}",
                                                           "difference"], rows), ""]
    return "\n".join(L).rstrip() + "\n"


def ascii_timeline(t, width: int = 100) -> str:
    """Ranks as text rows: F / B / W blocks in time (W: the weight-gradient pass of the
    zero-bubble schedules), '.' idle (the micro-batch number would be too busy for large counts,
    so only the kind is drawn); under a V schedule each row names the rank's two stages."""
    scale = width / t.makespan if t.makespan > 0 else 1
    lines = []
    v = t.schedule in V_SCHEDULES
    for rank in range(t.pp):
        row = ["."] * width
        for o in t.ops:
            if o.rank != rank:
                continue
            a, b = int(o.start * scale), max(int(o.start * scale) + 1, int(o.end * scale))
            for i in range(a, min(b, width)):
                row[i] = o.kind if o.kind in ("F", "B", "W") else "B"
        name = f"rank {rank:>3} (stages {rank}, {2 * t.pp - 1 - rank})" if v else f"stage {rank:>3}"
        lines.append(f"{name} |{''.join(row)}|")
    return "\n".join(lines)


# ---- HTML ------------------------------------------------------------------------------------
CSS = """
body{font-family:-apple-system,'Segoe UI',Helvetica,Arial,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f3b57;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;opacity:.85;font-size:13px}
nav{padding:8px 32px;background:#e8eef4;font-size:13px} nav a{margin-right:14px;color:#1f3b57}
main{padding:8px 32px 40px;max-width:1800px}
section{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:12px 20px;margin:16px 0}
h2{font-size:17px;margin:6px 0 10px;color:#1f3b57} h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:12px;margin:6px 0}
th,td{border-bottom:1px solid #e5e5e5;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f0f3f6;position:sticky;top:0} td.l,th.l{text-align:left}
tr.best td{background:#eaf5ea;font-weight:600} tr.nofit td{color:#b00000}
figure.chart{margin:8px 0;overflow-x:auto}
figure.chart svg{display:block;width:100%;height:auto;min-width:480px}
.grid figure.chart{flex:1 1 520px;min-width:0}
figcaption{font-size:12px;color:#555} .note{font-size:12px;color:#555}
.why li{margin:3px 0;font-size:13px} li.warn{color:#8a4b00} .grid{display:flex;flex-wrap:wrap;gap:8px 24px}
.scroll{overflow-x:auto}
table.wrap td{white-space:normal;overflow-wrap:anywhere;max-width:32em}
code{overflow-wrap:anywhere}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f5f7f9;padding:6px 10px;font-size:12px}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _table(header, rows, left=(), row_class=None, wrap=False) -> str:
    """An HTML table; ``wrap``: long cell values (a plan's 64 split points) wrap inside their
    column instead of pushing the table off the screen."""
    h = "".join(f"<th class='l'>{_e(c)}</th>" if i in left else f"<th>{_e(c)}</th>" for i, c in enumerate(header))
    body = []
    for j, row in enumerate(rows):
        cls = f" class='{row_class[j]}'" if row_class and row_class[j] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td class='l'>{_e(c)}</td>" if i in left else f"<td>{_e(c)}</td>"
                                           for i, c in enumerate(row)) + "</tr>")
    table = "<table class='wrap'>" if wrap else "<table>"
    return f"<div class='scroll'>{table}<thead><tr>{h}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


def _figure(kind: str, svg: str, caption: str = "", key: str = "") -> str:
    cap = f"<figcaption>{_e(caption)}</figcaption>" if caption else ""
    return (f"<figure class='chart' data-chart='{_e(kind)}'" + (f" data-plan='{_e(key)}'" if key else "")
            + f">{svg}{cap}</figure>")


def to_html(report) -> str:
    from autopar.report import charts
    best_ids = {g[0].id for g in report.groups}
    nofit = {r.id for r in report.records if not r["fits"]}
    classes = []
    for g in report.groups:
        for r in g:
            classes.append("best" if r.id in best_ids else "nofit" if r.id in nofit else "")
    S = []
    S.append(("ranked", "Ranked plans",
              "<p class='note'>Grouped by search (GPU count); within each, fitting plans by step time. "
              "Green: the best of its search. ⚠: simulating its whole schedule gives a longer step than "
              "the estimate (see Why this plan); such a plan is ranked by that simulated step time, "
              "the one this report trusts. ±: the cost model's error on published runs of the plan's "
              "regime (~: borrowed from another regime; docs/validation.md).</p>"
              + _table(RANK_COLUMNS, ranked_rows(report), left=(6, 9, 17), row_class=classes)))
    why = []
    for w in report.why:
        b = w["best"]
        items = "".join(f"<li><b>#{r.id} {_e(r.label())}</b>: {_e(text)}</li>" for r, text in w["runners_up"])
        why.append(f"<h3>{b.gpus} GPUs · {_e(b.get('hardware'))}: best is #{b.id} {_e(b.label())}</h3>"
                   f"<ul class='why'><li>Bottleneck: {_e(w['bottleneck_text'])}.</li>"
                   f"<li>Memory: {_e(w['memory_text'])}.</li>"
                   + (f"<li>Your configuration: {_e(b.file_meta['comparison'])}.</li>"
                      if b.file_meta.get("comparison") else "")
                   + (f"<li>Runners-up lose on:<ul>{items}</ul></li>" if items else "")
                   + "".join(f"<li class='warn'>⚠ <b>#{r.id} {_e(r.label())}</b>: {_e(report.check_text(r))}.</li>"
                             for r in report.groups[report.why.index(w)] if report.check_text(r))
                   + "</ul>")
    S.append(("why", "Why this plan", "".join(why)))
    validated = {id(r.file_meta["validate"]): r.file_meta["validate"] for r in report.records
                 if "validate" in r.file_meta}
    if validated:   # inputs written by autopar validate: predicted vs measured
        from autopar.report.validate_chart import validation_chart
        S.append(("validate", "Predicted vs measured (autopar validate)", "".join(
            _figure("validate", validation_chart(v), "Each point is a plan run for real (label: its "
                    "rank in the validate file); on the line the prediction is exact. Method: "
                    + _e(str(v["validate"].get("method", {}).get("clock_meaning", ""))))
            for v in validated.values())))
    S.append(("step-time", "Step time by term",
              _figure("step-time", charts.step_time_chart(report.records),
                      "Compute, recompute, pipeline bubble and the exposed (not overlapped) DP / TP / PP "
                      "communication and ZeRO gathers; the bar ends at the predicted step time.")
              + overheads.html_section(report, _figure)))
    mem = []
    for r in report.detail_records:
        mems = stage_memories(r)
        worst = max(mems, key=lambda m: m[2])[0]
        mem.append(_figure("memory", charts.memory_chart(r),
                           f"#{r.id}: per pipeline stage (most loaded GPU of each stage); most loaded stage "
                           f"{worst}; dashed line: HBM.", key=str(r.id)))
    S.append(("memory", "Memory per pipeline stage",
              report.detail_note_html() + "<div class='grid'>" + "".join(mem) + "</div>"))
    from autopar.report import pools
    pool_section = pools.html_section(report, _figure, _table, _e, charts.pool_memory_chart)
    if pool_section:
        S.append(pool_section)
    tl = []
    for r in report.detail_records:
        t = report.timelines.get(r.id)
        if t is None:
            tl.append(f"<p class='note'>#{r.id} {_e(r.label())}: the input has no stages_detail, so no "
                      "timeline.</p>")
            continue
        tl.append(_figure("timeline", charts.timeline_chart(r, t), report.timeline_caption(t, r), key=str(r.id)))
    S.append(("timeline", "Pipeline timelines", report.detail_note_html() + "".join(tl)))
    crow = []
    for r in report.records:
        for c in comm_rows(r):
            crow.append([f"#{r.id}", r.label(), COMM_KIND_LABELS.get(c.get("kind"), c.get("kind")),
                         c.get("collective") or "", c.get("group_size") or "", c.get("tier"),
                         gib(float(c.get("bytes_per_gpu") or 0)),
                         seconds(float(c["time_s"])) if c.get("time_s") is not None else "–",
                         seconds(float(c["exposed_s"])) if c.get("exposed_s") is not None else "–"])
    S.append(("comm", "Communication per step",
              _figure("comm", charts.comm_chart(report.records),
                      "Bytes each GPU sends per training step, one panel per kind (each with its own "
                      "scale); the colour is the link tier the group crosses.")
              + "<details><summary class='note'>every collective</summary>"
              + _table(["plan", "", "kind", "collective", "group", "tier", "bytes/GPU", "time", "exposed"],
                       crow, left=(0, 1, 2, 3, 5)) + "</details>"))
    sc = []
    if report.scaling:
        sc.append(_figure("scaling", charts.scaling_chart(report.scaling),
                          "Best plan at each GPU count. Speed-up = N₀ · T(N₀) / T(N) against the "
                          "smallest GPU count searched, N₀ (a real plan that fits; a one-GPU plan "
                          "in the inputs is used when there is one, as each series says below); "
                          "efficiency = speed-up / N, 100 % at N₀."))
        for s in report.scaling:
            sc.append(f"<h3>{_e(s.label)}</h3><p class='note'>{_e(s.one_gpu_note)}</p>")
            sc.append(_table(["GPUs", "best plan", "step time", "tokens/s", "speed-up", "efficiency"],
                             [[p.gpus, f"#{p.record.id} {p.record.label()}", seconds(p.step_time_s),
                               f"{p.tokens_per_s:,.0f}", f"{p.speedup:.1f}×", pct(p.efficiency)]
                              for p in s.points], left=(1,)))
            sc.extend(f"<p class='note'>{_e(n)}</p>" for n in s.notes)
    sc.extend(f"<p class='note'>{_e(n)}</p>" for n in report.scaling_notes)
    S.append(("scaling", "Scaling", "".join(sc)))
    S.append(("run", "Run it", run_it_html(report)))
    if report.diff:
        a, b, rows = report.diff
        S.append(("diff", f"Diff: #{a.id} vs #{b.id}",
                  f"<p class='note'>Plan fields that differ, then every prediction (difference = "
                  f"#{b.id} − #{a.id}). Choose others with --diff I,J.</p>"
                  + _table(["", f"#{a.id} {a.label()} · {a.gpus} GPUs", f"#{b.id} {b.label()} · {b.gpus} GPUs",
                            "difference"], [keep_ranges_whole(r) for r in rows], left=(0,), wrap=True)))
    nav = "".join(f"<a href='#{k}'>{_e(t)}</a>" for k, t, _ in S)
    body = "".join(f"<section id='{k}'><h2>{_e(t)}</h2>{c}</section>" for k, t, c in S)
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>autopar report: {_e(report.title)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>autopar report: {_e(report.title)}</h1><p>{_e(report.subtitle)}</p></header>"
            f"<nav>{nav}</nav><main>{body}</main></body></html>\n")


def keep_ranges_whole(row):
    """A diff row for HTML: a stage split's ranges ("12–15") never break across lines, only
    between ranges (word joiners around the dash, which is otherwise a break opportunity)."""
    if row[0] != "stages":
        return row
    return (row[0], *(str(c).replace("–", "\u2060–\u2060") for c in row[1:]))


# ---- run it: the best plan of each search, exported to each trainer (autopar.report.run_it) ----
def _run_sections(report):
    from autopar.report.run_it import run_lines
    return [(g[0], run_lines(g[0], g[0].source)) for g in report.groups if g]


def run_it_html(report) -> str:
    out = ["<p class='note'>The best plan of each search in each trainer's own launch: the "
           "<code>autopar export</code> command, and the launch line it writes (or why that trainer "
           "cannot run the plan).</p>"]
    for best, lines in _run_sections(report):
        out.append(f"<h3>#{best.id} {_e(best.label())} · {best.gpus} GPUs</h3>")
        for ln in lines:
            body = (f"<pre>{_e(ln.launch)}</pre>" if ln.launch else
                    f"<p class='note'>{_e(ln.refusal or 'no launch line')}</p>")
            out.append(f"<p><b>{_e(ln.trainer)}</b>: <code>{_e(ln.command)}</code></p>{body}")
    return "".join(out)


def run_it_markdown(report) -> list[str]:
    L = ["## Run it", ""]
    for best, lines in _run_sections(report):
        L += [f"**#{best.id} {best.label()} · {best.gpus} GPUs**", ""]
        for ln in lines:
            L.append(f"- {ln.trainer}: `{ln.command}`")
            L += ["", "```bash", ln.launch, "```", ""] if ln.launch else [f"  ({ln.refusal})", ""]
    return L
