"""Predicted-vs-measured chart of ``autopar validate``'s output (matplotlib, inline SVG).

``validation_chart(result) -> str``: two scatter panels (step time, memory), one point per plan
that ran, labelled with its rank, on the y = x line with a ±15 % (step) / ±10 % (memory) band,
and the summary (MAPE, Spearman) in the titles. ``autopar report`` embeds it for each input whose
``PlansFile`` has a ``validate`` section. It lives in the report, which draws what validate wrote,
so that the report needs nothing from ``autopar.validate`` (no report <-> validate loop).
"""
from __future__ import annotations

from autopar.report.charts import to_svg
from costmodels.contracts.plans_file import PlansFile


def _panel(ax, pred, meas, labels, band, unit_scale, unit, title):
    pred = [x / unit_scale for x in pred]
    meas = [x / unit_scale for x in meas]
    lo = min(min(pred), min(meas)) * 0.8
    hi = max(max(pred), max(meas)) * 1.25
    xs = [lo, hi]
    ax.plot(xs, xs, color="#555", lw=1, label="predicted = measured")
    ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs], color="#4c72b0",
                    alpha=0.12, lw=0, label=f"±{band:.0%}")
    ax.scatter(meas, pred, s=28, color="#dd8452", zorder=3)
    for x, y, lab in zip(meas, pred, labels):
        ax.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal", adjustable="box")
    ax.tick_params(labelsize=7)
    ax.set_xlabel(f"measured ({unit})", fontsize=8)
    ax.set_ylabel(f"predicted ({unit})", fontsize=8)
    ax.set_title(title, fontsize=8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", frameon=False)


def validation_chart(result) -> str:
    """SVG of predicted vs measured step time and memory for a validate result (its dict or
    ``PlansFile``)."""
    from matplotlib.figure import Figure
    pf = PlansFile.read(result, label="<validate result>")
    plans = [dict(r.values, rank=r.rank) for r in pf.results if r.values.get("measured_step_s")]
    fig = Figure(figsize=(9.0, 4.0), layout="constrained", dpi=72)   # as every report chart (charts._figure)
    if not plans:
        fig.text(0.5, 0.5, "no plan was measured", ha="center")
        return to_svg(fig)
    s = (pf.validate or {}).get("summary", {})
    labels = [str(p["rank"]) for p in plans]
    a1, a2 = fig.subplots(1, 2)
    _panel(a1, [p["predicted_step_s"] for p in plans], [p["measured_step_s"] for p in plans], labels,
           0.15, 1.0, "s", f"step time: MAPE {s.get('step_time_mape', float('nan')):.1%}, "
                           f"Spearman {s.get('step_time_spearman', float('nan')):.3f}")
    _panel(a2, [p["predicted_memory_bytes"] for p in plans], [p["measured_memory_bytes"] for p in plans],
           labels, 0.10, 2 ** 20, "MiB", f"peak memory: MAPE {s.get('memory_mape', float('nan')):.1%}, "
                                         f"worst {s.get('memory_max_error', float('nan')):.0%}")
    fig.suptitle(f"{pf.model or ''} on {pf.hardware or ''}, {pf.gpus or ''} ranks, "
                 f"global batch {pf.global_batch or ''}: predicted vs measured (labels: rank)",
                 fontsize=8)
    return to_svg(fig)
