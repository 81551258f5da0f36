"""The report's charts, drawn with matplotlib (object API, Agg-free SVG backend) as inline SVG.

Each function returns an SVG string ready to paste into HTML: no XML prolog, element ids prefixed
so several charts share one page, fonts drawn as paths (nothing to fetch), deterministic ids and
no date metadata (the same inputs give the same bytes).
"""
from __future__ import annotations

import io
import itertools
import re

from matplotlib import rcParams
from matplotlib.figure import Figure
from matplotlib.patches import Patch, PathPatch
from matplotlib.path import Path
from matplotlib.ticker import FuncFormatter, NullFormatter, ScalarFormatter

from autopar.report.analysis import ScalingSeries, breakdown, comm_rows, hbm, stage_memories
from autopar.report.chart_fit import fit_texts
from autopar.report.load import MEMORY_KEYS, PlanRecord
from autopar.report.pools import POOL_COLORS, short_name, stage_label
from autopar.report.timeline import Timeline
from costmodels.contracts.breakdown import BREAKDOWN_KEYS, COMM_KIND_LABELS, TERM_LABELS
from costmodels.contracts.plan import V_SCHEDULES

TERM_COLORS = {"compute": "#4C78A8", "recompute": "#9ECAE9", "bubble": "#E45756",
               "dp_exposed": "#F58518", "tp_exposed": "#54A24B", "pp_exposed": "#B279A2",
               "zero_exposed": "#EECA3B"}
MEMORY_COLORS = {"params": "#4C78A8", "grads": "#72B7B2", "optimizer": "#F58518",
                 "gathered": "#9D755D", "activations": "#E45756", "reserve": "#BAB0AC"}
COMM_COLORS = {"dp": "#F58518", "tp": "#54A24B", "pp": "#B279A2", "zero": "#EECA3B", "cp": "#4C78A8"}
TIER_COLORS = ["#4C78A8", "#E45756", "#54A24B", "#B279A2", "#F58518"]
FWD = ["#4C78A8", "#9ECAE9", "#2E5A87", "#72B7B2"]
GIB = 2 ** 30   # bytes per GiB: the memory unit every command and the report print
BWD = ["#F58518", "#FFBF79", "#B5441B", "#E45756"]
WGT = ["#54A24B", "#A6D96A", "#2F6B2A", "#88D27A"]   # weight-gradient passes (split backward)
PALETTES = {"F": FWD, "B": BWD, "W": WGT}
_counter = itertools.count()
_NUM = re.compile(r"(-?\d+\.\d)\d+")


SVG_DPI = 72       # the SVG backend's own: saving keeps every placement the drawing made
FULL_WIDTH = 12.0   # inches of a chart that spans the page (the HTML scales it to the page's width)


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained", dpi=SVG_DPI)
    return fig


def to_svg(fig: Figure) -> str:
    """The figure as an inline ``<svg>`` element with ids unique on the page."""
    svg = _save_svg(fig)
    # no title, legend or label left outside the figure (autopar.report.chart_fit): looked at in
    # the drawing just saved, and saved again only when something had to move
    if fit_texts(fig, drawn=fig.dpi == SVG_DPI):
        svg = _save_svg(fig)
    svg = svg[svg.index("<svg"):]
    # path data to 0.1 pt (a tenth of a point is invisible; full precision doubles the size)
    svg = re.sub(r'\bd="([^"]*)"', lambda m: 'd="' + _NUM.sub(lambda n: n.group(1), m.group(1)) + '"', svg)
    prefix = f"c{next(_counter)}-"
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', svg)
    svg = re.sub(r'(href="#|url\(#)([^")]+)', lambda m: m.group(1) + (prefix + m.group(2) if m.group(2) in ids
                                                                    else m.group(2)), svg)
    return svg


def _save_svg(fig: Figure) -> str:
    buf = io.StringIO()
    with rcParams_context({"svg.fonttype": "path", "svg.hashsalt": "autopar-report"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    return buf.getvalue()


class rcParams_context:
    def __init__(self, values):
        self.values, self.saved = values, {}

    def __enter__(self):
        self.saved = {k: rcParams[k] for k in self.values}
        rcParams.update(self.values)

    def __exit__(self, *exc):
        rcParams.update(self.saved)


def _style(ax) -> None:
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)


def _time_unit(t_max: float) -> tuple[float, str]:
    if t_max >= 1:
        return 1.0, "s"
    if t_max >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


# ---- step time ------------------------------------------------------------------------------
def step_time_chart(records: list[PlanRecord]) -> str:
    return to_svg(step_time_figure(records))


def step_time_figure(records: list[PlanRecord]) -> Figure:
    n = len(records)
    fig = _figure(FULL_WIDTH, 1.4 + 0.32 * n)
    ax = fig.add_subplot()
    scale, unit = _time_unit(max(float(r["step_time_s"]) for r in records))
    labels = [f"#{r.id} {r.label()} · {r.gpus} GPUs" + ("" if r["fits"] else " (no fit)") for r in records]
    ys = list(range(n))[::-1]
    left = [0.0] * n
    used = set()
    for k in BREAKDOWN_KEYS:
        vals = [breakdown(r)[k] * scale for r in records]
        if not any(vals):
            continue
        used.add(k)
        ax.barh(ys, vals, left=left, color=TERM_COLORS[k], label=TERM_LABELS[k], height=0.7)
        left = [a + b for a, b in zip(left, vals)]
    for y, r in zip(ys, records):
        ax.text(float(r["step_time_s"]) * scale, y, f" {float(r['step_time_s']) * scale:.3g}",
                va="center", fontsize=7)
    ax.set_yticks(ys, labels, fontsize=7)
    ax.set_xlabel(f"step time ({unit})")
    ax.set_xlim(0, max(left) * 1.12 if max(left) > 0 else 1)
    ax.set_title("Step time per plan, by term", fontsize=10, loc="left")
    # the legend as a row of the figure itself (constrained layout makes room for it), in as many
    # columns as its longest label lets fit the figure's width: no entry is cut at the edge
    longest = max((len(TERM_LABELS[k]) for k in used), default=10)
    fig.legend(fontsize=7, ncols=max(1, min(len(used), int(FULL_WIDTH * 72 / (7 * 0.6 * longest + 40)))),
               loc="outside upper center", frameon=False)
    _style(ax)
    return fig


# ---- memory per stage -------------------------------------------------------------------------
def memory_chart(r: PlanRecord) -> str:
    mems = stage_memories(r)
    n = len(mems)
    fig = _figure(6.4, 3.0)
    ax = fig.add_subplot()
    xs = list(range(n))
    bottom = [0.0] * n
    for k in MEMORY_KEYS:
        vals = [m[1][k] / GIB for m in mems]
        ax.bar(xs, vals, bottom=bottom, color=MEMORY_COLORS[k], label=k, width=0.75)
        bottom = [a + b for a, b in zip(bottom, vals)]
    totals = [m[2] / GIB for m in mems]
    worst = max(range(n), key=totals.__getitem__)
    ax.bar([worst], [totals[worst]], width=0.75, fill=False, edgecolor="black", linewidth=1.6)
    ax.annotate("most loaded", (worst, totals[worst]), xytext=(0, 8), textcoords="offset points",
                ha="center", fontsize=7, arrowprops={"arrowstyle": "-|>", "lw": 0.8})
    h = hbm(r)
    top = max(totals)
    if h:
        ax.axhline(h / GIB, color="#c00000", linestyle="--", linewidth=1.2)
        ax.text(n - 0.5, h / GIB, f"HBM {h / GIB:.0f} GiB ", color="#c00000", fontsize=7,
                ha="right", va="top")
        top = max(top, h / GIB)
    ax.set_ylim(0, top * 1.22)
    ax.set_xticks(xs, [str(m[0]) for m in mems], fontsize=7 if n <= 32 else 5)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    fig.suptitle(f"#{r.id} {r.label()}: memory per pipeline stage", fontsize=10, x=0.02, ha="left")
    ax.legend(fontsize=6.5, ncols=6, loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False,
              borderaxespad=0.2)
    ax.spines[["top", "right"]].set_visible(False)
    return to_svg(fig)


# ---- memory per stage by pool (heterogeneous clusters, autopar.report.pools) ------------------
def pool_memory_chart(r) -> str:
    """Total memory per stage, bar coloured by its pool, each stage's own HBM marked."""
    det = r["stages_detail"]
    fig = _figure(6.4, 3.0)
    ax = fig.add_subplot()
    xs = list(range(len(det)))
    pools = r.plan.stage_pools
    totals = [d["memory_bytes"]["total"] / GIB for d in det]
    hbms = [float(d.get("hbm_bytes") or 0) / GIB for d in det]
    ax.bar(xs, totals, color=[POOL_COLORS[q % len(POOL_COLORS)] for q in pools], width=0.75)
    ax.hlines(hbms, [x - 0.45 for x in xs], [x + 0.45 for x in xs], colors="#c00000", linestyles="--",
              linewidth=1.2)
    ax.set_ylim(0, max(max(totals), max(hbms)) * 1.2)
    ax.set_xticks(xs, [str(x) for x in xs], fontsize=7 if len(xs) <= 32 else 5)
    ax.set_xlabel("pipeline stage (colour: pool; dashed: that pool's HBM)")
    ax.set_ylabel("GiB per GPU")
    handles = [Patch(color=POOL_COLORS[q % len(POOL_COLORS)], label=short_name(ref))
               for q, (ref, _) in enumerate(r.plan.pools) if q in pools]
    ax.legend(handles=handles, fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=4, frameon=False)
    fig.suptitle(f"#{r.id} {r.label()}: memory per stage by pool", fontsize=9, x=0.02, ha="left")
    ax.spines[["top", "right"]].set_visible(False)
    return to_svg(fig)


# ---- pipeline timeline --------------------------------------------------------------------------
def timeline_chart(r: PlanRecord, t: Timeline) -> str:
    """Ranks as rows, one block per operation: forward (blues), backward (oranges) and, for the
    zero-bubble schedules that split it, the weight-gradient pass W (greens) in its own colour;
    one shade per chunk. Under a V schedule each rank's two chunks are stages r and 2·pp − 1 − r,
    which the row labels say."""
    pp = t.pp
    fig = _figure(FULL_WIDTH, 1.3 + 0.26 * pp if pp > 1 else 1.8)
    ax = fig.add_subplot()
    scale, unit = _time_unit(t.makespan)
    label_blocks = len(t.ops) <= 256
    kinds = [k for k in PALETTES if any(o.kind == k for o in t.ops)]
    for kind in kinds:
        palette = PALETTES[kind]
        for c in range(t.vpp):
            ops = [o for o in t.ops if o.kind == kind and o.chunk == c]
            if not ops:
                continue
            # one compound path per colour: thousands of blocks stay one SVG element
            verts, codes = [], []
            for o in ops:
                x0, x1 = o.start * scale, o.end * scale
                y0 = pp - 1 - o.rank - 0.4
                verts += [(x0, y0), (x1, y0), (x1, y0 + 0.8), (x0, y0 + 0.8), (x0, y0)]
                codes += [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY]
            # add_artist, not add_patch: limits are set below, and walking thousands of
            # segments to update them is the slowest part of the chart
            patch = PathPatch(Path(verts, codes), facecolor=palette[c % len(palette)],
                              edgecolor="white", linewidth=0.3, transform=ax.transData)
            patch.set_gid(f"ops-{kind}{c}")   # the SVG names each kind's blocks (tests read it)
            patch.set_clip_path(ax.patch)
            ax.add_artist(patch)
            if label_blocks:
                for o in ops:
                    ax.text((o.start + o.end) / 2 * scale, pp - 1 - o.rank, str(o.micro_batch),
                            ha="center", va="center", fontsize=5, color="white")
    ax.set_ylim(-0.6, pp - 0.4)
    ax.set_yticks(range(pp), [rank_label(t, pp - 1 - i) if t.schedule in V_SCHEDULES else stage_label(r, pp - 1 - i)
                              for i in range(pp)], fontsize=6 if pp <= 32 else 4)
    ax.set_xlim(0, t.makespan * scale)
    ax.set_xlabel(f"time ({unit})")
    shown = (f"first {t.micro_batches} of {t.total_micro_batches} micro-batches drawn"
             if t.capped else f"{t.micro_batches} micro-batches")
    ax.set_title(f"#{r.id} {r.label()} · {shown} · idle {100 * t.idle_fraction:.0f}%", fontsize=9, loc="left")
    shade = " (shade: virtual chunk)" if t.vpp > 1 else ""
    names = {"F": "forward", "B": "backward (input gradient)" if "W" in kinds else "backward",
             "W": "weight gradient"}
    handles = [Patch(color=PALETTES[k][0], label=names[k] + shade) for k in kinds]
    ax.legend(handles=handles, fontsize=6, ncols=min(8, len(handles)), loc="lower right",
              bbox_to_anchor=(1.0, 1.08), frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    return to_svg(fig)


def rank_label(t: Timeline, rank: int) -> str:
    """A row of the timeline: the pipeline rank, with its two stages under a V schedule (the
    model runs down the ranks and back up: rank r holds stages r and 2·pp − 1 − r)."""
    if t.schedule in V_SCHEDULES:
        return f"rank {rank} · stages {rank}, {2 * t.pp - 1 - rank}"
    return f"stage {rank}"


# ---- communication --------------------------------------------------------------------------------
def comm_chart(records: list[PlanRecord]) -> str:
    """One panel per kind (its own scale: TP volume would otherwise hide DP and PP), a bar per
    plan, coloured by the link tier the collective crosses."""
    n = len(records)
    rows = {r.id: comm_rows(r) for r in records}
    kinds = [k for k in COMM_COLORS if any(float(c.get("bytes_per_gpu") or 0) > 0 and c.get("kind") == k
                                           for rs in rows.values() for c in rs)]
    kinds += sorted({str(c.get("kind")) for rs in rows.values() for c in rs
                     if c.get("kind") not in COMM_COLORS and float(c.get("bytes_per_gpu") or 0) > 0})
    tiers = sorted({str(c.get("tier")) for rs in rows.values() for c in rs})
    colour = {t: TIER_COLORS[i % len(TIER_COLORS)] for i, t in enumerate(tiers)}
    fig = _figure(FULL_WIDTH, 1.5 + 0.3 * n)
    axes = fig.subplots(1, max(1, len(kinds)), sharey=True, squeeze=False)[0]
    ys = list(range(n))[::-1]
    for ax, kind in zip(axes, kinds or ["none"]):
        top = 0.0
        for y, r in zip(ys, records):
            left = 0.0
            for c in sorted((c for c in rows[r.id] if c.get("kind") == kind), key=lambda c: str(c.get("tier"))):
                v = float(c.get("bytes_per_gpu") or 0.0) / GIB
                if v <= 0:
                    continue
                ax.barh([y], [v], left=[left], color=colour[str(c.get("tier"))], height=0.7)
                left += v
            top = max(top, left)
            if left > 0:
                ax.text(left, y, " " + _num(left), va="center", fontsize=6)
        ax.set_xlim(0, top * 1.35 if top > 0 else 1)
        ax.set_title(COMM_KIND_LABELS.get(kind, kind), fontsize=9)
        ax.set_xlabel("GiB per GPU per step", fontsize=7)
        ax.tick_params(labelsize=6)
        _style(ax)
    axes[0].set_yticks(ys, [f"#{r.id} {r.label()} · {r.gpus} GPUs" for r in records], fontsize=7)
    handles = [Patch(color=colour[t], label=f"link tier: {t}") for t in tiers]
    fig.legend(handles=handles, fontsize=7, ncols=max(1, len(handles)), loc="outside upper center",
               frameon=False)
    return to_svg(fig)


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


# ---- scaling ------------------------------------------------------------------------------------
def scaling_chart(series: list[ScalingSeries]) -> str:
    fig = _figure(FULL_WIDTH, 3.6)
    axes = fig.subplots(1, 3)
    for s in series:
        ns = [p.gpus for p in s.points]
        axes[0].plot(ns, [p.tokens_per_s for p in s.points], marker="o", label=s.label)
        axes[1].plot(ns, [p.speedup for p in s.points], marker="o", label=s.label)
        axes[2].plot(ns, [100 * p.efficiency for p in s.points], marker="o", label=s.label)
        p0 = s.points[0]
        axes[0].plot(ns, [p0.tokens_per_s * n / p0.gpus for n in ns], color="#999999", linestyle=":",
                     linewidth=1)
        axes[1].plot(ns, ns, color="#999999", linestyle=":", linewidth=1)
    axes[0].set_title("predicted throughput", fontsize=9)
    axes[0].set_ylabel("tokens/s")
    axes[1].set_title("speed-up N₀·T(N₀) / T(N), N₀ the smallest count  (dotted: ideal)", fontsize=9)
    axes[2].set_title("scaling efficiency = speed-up / N", fontsize=9)
    axes[2].set_ylabel("%")
    axes[2].set_ylim(0, 105)
    for ax in axes:
        ax.set_xlabel("GPUs")
        ax.set_xscale("log", base=2)
        ax.grid(color="#e5e5e5", linewidth=0.6)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(labelsize=7)
    axes[1].set_yscale("log", base=2)
    axes[0].set_ylim(bottom=0)
    for ax in axes:
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    axes[1].yaxis.set_major_formatter(ScalarFormatter())
    axes[0].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    if len(series) > 1:
        axes[0].legend(fontsize=6, frameon=False)
    return to_svg(fig)
