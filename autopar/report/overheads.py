"""Overheads against the best plan: what separates plans when compute is most of every step.

In the step-time chart compute is ~95 % of every bar of a large model's plans, so the terms that
decide between them (bubble, exposed communication, recomputation) are slivers. This view drops
the shared part and draws, one row per plan:

- left panel, "overheads": every term but compute, stacked, on a scale of their own;
- right panel, "against the best plan": per term (compute included), the plan's time minus that
  of the best plan of its search (right of zero: slower there; left: faster), and a black mark at
  the net difference in step time.

The terms are the estimate's breakdown, except a plan flagged ⚠ (its whole schedule simulated
gives a longer bubble than the estimate's): its bubble is the simulated one, so the terms add up
to the step time the ranked table ranks it by, and every fitting runner-up's net is ≥ 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from autopar.report.analysis import breakdown, seconds
from autopar.report.load import PlanRecord
from costmodels.contracts.breakdown import BREAKDOWN_KEYS, TERM_LABELS


@dataclass
class OverheadRow:
    record: PlanRecord
    best: PlanRecord                 # the best plan of the record's search (itself for the best)
    terms: dict[str, float]          # seconds per breakdown term (trusted bubble)
    deltas: dict[str, float]         # terms minus the best plan's

    @property
    def overhead_s(self) -> float:
        return sum(v for k, v in self.terms.items() if k != "compute")

    @property
    def net_s(self) -> float:
        return sum(self.deltas.values())


def trusted_terms(report, r: PlanRecord) -> dict[str, float]:
    """The estimate's terms, with a flagged plan's bubble grown to its simulated one."""
    terms = breakdown(r)
    c = report.checks.get(r.id)
    if c is not None and c.flagged:
        terms["bubble"] += max(0.0, c.extra_s)
    return terms


def overhead_rows(report) -> list[OverheadRow]:
    rows = []
    for g in report.groups:
        if not g:
            continue
        best = trusted_terms(report, g[0])
        for r in g:
            t = trusted_terms(report, r)
            rows.append(OverheadRow(r, g[0], t, {k: t[k] - best[k] for k in BREAKDOWN_KEYS}))
    return rows


def compute_share(rows: list[OverheadRow]) -> float:
    """Compute's share of the step, the median over the plans (what makes the other terms slivers)."""
    shares = sorted(r.terms["compute"] / max(sum(r.terms.values()), 1e-30) for r in rows)
    return shares[len(shares) // 2] if shares else 0.0


def overheads_chart(report) -> str:
    from autopar.report.charts import FULL_WIDTH, TERM_COLORS, _figure, _style, _time_unit, to_svg
    rows = overhead_rows(report)
    n = len(rows)
    fig = _figure(FULL_WIDTH, 1.6 + 0.32 * n)
    left_ax, right_ax = fig.subplots(1, 2, sharey=True, width_ratios=(1, 1.3))
    top = max([r.overhead_s for r in rows] + [abs(d) for r in rows for d in r.deltas.values()] + [1e-12])
    scale, unit = _time_unit(top)
    ys = list(range(n))[::-1]
    used = [k for k in BREAKDOWN_KEYS if any(r.terms[k] for r in rows) and k != "compute"
            or k == "compute" and any(r.deltas[k] for r in rows)]
    left = [0.0] * n
    for k in used:
        if k == "compute":
            continue
        vals = [r.terms[k] * scale for r in rows]
        left_ax.barh(ys, vals, left=left, color=TERM_COLORS[k], height=0.7)
        left = [a + b for a, b in zip(left, vals)]
    for y, r in zip(ys, rows):
        left_ax.text(r.overhead_s * scale, y, " " + _short(r.overhead_s * scale), va="center", fontsize=7)
    left_ax.set_xlim(0, max(left + [1e-12]) * 1.18)
    left_ax.set_title("overheads: every term but compute", fontsize=9, loc="left")
    left_ax.set_xlabel(f"seconds per step ({unit})" if unit != "s" else "seconds per step")
    pos, neg = [0.0] * n, [0.0] * n
    for k in used:
        ds = [r.deltas[k] * scale for r in rows]
        for i, d in enumerate(ds):
            if d == 0:
                continue
            base = pos if d > 0 else neg
            right_ax.barh([ys[i]], [d], left=[base[i]], color=TERM_COLORS[k], height=0.7)
            base[i] += d
    nets = [r.net_s * scale for r in rows]
    right_ax.scatter(nets, ys, marker="D", s=14, color="black", zorder=3, label="net: step time − best's")
    for i, (y, r, net) in enumerate(zip(ys, rows, nets)):
        word = "best of its search" if r.record is r.best else ("+" if net >= 0 else "−") + _short(abs(net))
        right_ax.text(max(pos[i], net, 0.0), y, "  " + word, va="center", fontsize=7)
    lo, hi = min(neg + nets + [0.0]), max(pos + nets + [0.0])
    span = max(hi - lo, 1e-12)
    right_ax.set_xlim(lo - 0.05 * span, hi + 0.35 * span)
    right_ax.axvline(0, color="#444444", linewidth=0.8)
    right_ax.set_title("against the best plan of its search, per term (right: slower)", fontsize=9, loc="left")
    right_ax.set_xlabel(f"difference ({unit})")
    left_ax.set_yticks(ys, [f"#{r.record.id} {r.record.label()} · {r.record.gpus} GPUs" for r in rows],
                       fontsize=7)
    for ax in (left_ax, right_ax):
        _style(ax)
        ax.tick_params(labelsize=7)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    handles = [Patch(color=TERM_COLORS[k], label=TERM_LABELS[k]) for k in used]
    handles.append(Line2D([], [], marker="D", color="black", linestyle="", markersize=4,
                          label="net difference in step time"))
    fig.legend(handles=handles, fontsize=7, ncols=len(handles), loc="outside upper center", frameon=False)
    return to_svg(fig)


def _short(v: float) -> str:
    return f"{v:.3g}"


def caption(report, rows: list[OverheadRow]) -> str:
    share = compute_share(rows)
    flagged = [r.record.id for r in rows if (c := report.checks.get(r.record.id)) is not None and c.flagged]
    return (f"Compute is {100 * share:.0f}% of the median plan's step, so the terms that separate the "
            "plans are drawn here without it: left, each plan's overheads; right, each term's time "
            "minus the best plan of the same search's (the diamond: the net difference in step time)."
            + (f" Plans {', '.join(f'#{i}' for i in flagged)} (⚠): the bubble is the simulated one, "
               "as the ranking uses." if flagged else ""))


def html_section(report, figure) -> str:
    rows = overhead_rows(report)
    if not rows:
        return ""
    return ("<h3 id='overheads'>Overheads against the best plan</h3>"
            + figure("overheads", overheads_chart(report), caption(report, rows)))


def markdown_lines(report, md_table) -> list[str]:
    rows = overhead_rows(report)
    if not rows:
        return []
    keys = [k for k in BREAKDOWN_KEYS if any(r.deltas[k] for r in rows)]

    def signed(v: float) -> str:
        return "same" if v == 0 else ("+" if v > 0 else "−") + seconds(abs(v))
    table = [[str(r.record.id), f"{r.record.label()} · {r.record.gpus} GPUs", seconds(r.overhead_s),
              "best" if r.record is r.best else f"#{r.best.id}", signed(r.net_s)]
             + [signed(r.deltas[k]) for k in keys] for r in rows]
    return ["### Overheads against the best plan", "", caption(report, rows), "",
            md_table(["#", "plan", "overheads", "against", "step time"] + [TERM_LABELS[k] for k in keys],
                     table), ""]
