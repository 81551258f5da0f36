"""The report's view of a pooled plan (heterogeneous cluster): stages coloured by pool, memory per
stage against *its* pool's HBM, and per-pool speeds for the timeline.

Why its own module: a uniform plan has one HBM line and one speed; a pooled one has a line and
a speed per pool, and the other sections (charts.memory_chart, the timeline) only need a label
per stage from here (``stage_label``). Everything is read from the estimate's ``stages_detail``
(``pool``, ``hardware``, ``hbm_bytes`` per stage) and ``cluster`` (GPUs used and idle per
pool, the links between pools), so the report draws what the cost model priced.
"""
from __future__ import annotations

from autopar.report.analysis import gib, seconds
from costmodels.contracts.plan_pools import short_name

POOL_COLORS = ["#4C78A8", "#E45756", "#54A24B", "#B279A2", "#F58518", "#9D755D"]


def pooled(r) -> bool:
    return bool(r.plan.pools) and bool(r.get("stages_detail"))


def stage_label(r, stage: int) -> str:
    """``stage 3`` on a uniform plan, ``stage 3 · h100-80g-sxm`` on a pooled one."""
    if not r.plan.pools:
        return f"stage {stage}"
    return f"stage {stage} · {short_name(r.plan.pools[r.plan.stage_pools[stage]][0])}"


def stage_rows(r) -> list[list[str]]:
    """One row per stage: pool, rows, time per micro-batch (fwd + bwd), memory vs its HBM."""
    out = []
    for d in r["stages_detail"]:
        t = sum(d["fwd_s"]) + sum(d["bwd_s"])
        rows = sum(b - a for a, b in d["rows"])
        mem, h = d["memory_bytes"]["total"], float(d.get("hbm_bytes") or r.get("hbm_bytes") or 0)
        out.append([str(d["stage"]), short_name(str(d.get("hardware", ""))), str(rows), seconds(t),
                    seconds(t / rows) if rows else "–", f"{gib(mem)} / {gib(h)}",
                    f"{100 * mem / h:.0f} %" if h else "–"])
    return out


STAGE_COLUMNS = ["stage", "pool", "rows", "fwd+bwd per micro-batch", "per row", "memory / HBM", "of HBM"]


def pool_rows(r) -> list[list[str]]:
    """One row per pool: GPUs used and idle, stages, the pool's speed (mean time per row)."""
    out = []
    cl = r.get("cluster") or {}
    for u in cl.get("pools", []):
        det = [d for d in r["stages_detail"] if d.get("pool") == u["pool"]]
        rows = sum(b - a for d in det for a, b in d["rows"])
        t = sum(sum(d["fwd_s"]) + sum(d["bwd_s"]) for d in det)
        out.append([str(u["pool"]), short_name(str(u.get("name", u["profile"]))), str(u["gpus"]), str(u["used"]),
                    str(u["idle"]), str(u["stages"]), seconds(t / rows) if rows else "unused"])
    return out


POOL_COLUMNS = ["pool", "profile", "GPUs", "used", "idle", "stages", "time per row"]


def speeds_caption(r) -> str:
    """The timeline caption's per-pool speeds: how long a row takes on each pool's stages."""
    rows = pool_rows(r)
    parts = [f"{p[1]}: {p[6]} a row ({p[5]} stage(s))" for p in rows if p[6] != "unused"]
    why = (r.get("cluster") or {}).get("why") or []
    s = " Per-pool speed (fwd + bwd of one micro-batch per row): " + "; ".join(parts) + "."
    if why:
        s += " Split: " + " · ".join(why) + "."
    return s


def html_section(report, figure, table, escape, chart) -> tuple[str, str, str] | None:
    """The report's "Pools" section (None when no plan is pooled); ``chart`` draws a record's
    memory by pool (``charts.pool_memory_chart``: charts imports this module, not the reverse)."""
    recs = [r for r in report.detail_records if pooled(r)]
    if not recs:
        return None
    parts = []
    for r in recs:
        parts.append(f"<h3>#{r.id} {escape(r.label())}</h3>")
        parts.append(table(POOL_COLUMNS, pool_rows(r), left=(1,)))
        parts.append(figure("memory", chart(r), f"#{r.id}: total memory of each stage's GPUs, "
                            "coloured by pool; each dashed line is that stage's pool HBM.", key=f"pool{r.id}"))
        parts.append(table(STAGE_COLUMNS, stage_rows(r), left=(1,)))
        for line in (r.get("cluster") or {}).get("why") or []:
            parts.append(f"<p class='note'>{escape(line)}</p>")
    return ("pools", "Pools (heterogeneous cluster)", "".join(parts))


def markdown_lines(report, md_table) -> list[str]:
    recs = [r for r in report.detail_records if pooled(r)]
    if not recs:
        return []
    out = ["## Pools (heterogeneous cluster)", ""]
    for r in recs:
        out += [f"**#{r.id} {r.label()}**", "", md_table(POOL_COLUMNS, pool_rows(r)), "",
                md_table(STAGE_COLUMNS, stage_rows(r)), ""]
        out += [f"- {line}" for line in (r.get("cluster") or {}).get("why") or []] + [""]
    return out
