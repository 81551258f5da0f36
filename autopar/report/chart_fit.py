"""Keep every label of a report chart inside its figure (the SVG's box), whatever its length.

A chart's texts come from the data (a plan's label, a model's name), so no fixed figure size or
legend layout holds for every input: the step-time legend was cut at the right edge ("exposed PP
send/re…") and a memory chart's title at "memory per". ``fit_texts(fig)`` draws the figure, finds
texts that leave it, and makes them fit, in the order that loses least:

- a legend with entries outside the figure loses a column (its entries wrap onto more rows);
- a title (axes titles, the figure's suptitle) or axis label wider than the figure is wrapped
  onto more lines at the width it has (never narrower than its longest word);
- a text still out at the left or right after that is shrunk (tick labels of a crowded axis).

A text out only at the top or bottom was placed there by hand (a title at y > 1): narrowing
cannot cure it, so it is left for ``outside_texts`` (and the tests) to report.

Constrained layout (every report figure uses it) then makes room for the taller legends and
titles when the figure is saved. ``outside_texts(fig)`` lists what still leaves the figure; the
tests assert it is empty.
"""
from __future__ import annotations

import textwrap

from matplotlib.figure import Figure
from matplotlib.text import Text

MARGIN_PX = 0.5     # a text may touch the edge (anti-aliasing) but not cross it


def _renderer(fig: Figure, draw: bool = True):
    """A renderer with every text placed: a whole draw, or (``draw=False``, twice as fast) only
    the layout engine's pass, which places axes, titles and the figure's legends; an axes legend's
    entries are placed only by a draw, so ``fit_texts`` measures legends by their whole box."""
    engine = fig.get_layout_engine()
    if draw or engine is None:     # no layout engine: only a draw places the texts
        fig.draw_without_rendering()
    else:
        engine.execute(fig)
    return fig._get_renderer()


def _visible_texts(fig: Figure) -> list[Text]:
    """The texts drawn: tick labels only of the ticks the axis draws (matplotlib keeps labels
    of ticks outside the view limits, placed nowhere in particular, which are not drawn)."""
    ticks = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            ticks.update(id(lab) for tick in axis.get_major_ticks() + axis.get_minor_ticks()
                         for lab in (tick.label1, tick.label2))
            ticks.difference_update(id(lab) for tick in axis._update_ticks()
                                    for lab in (tick.label1, tick.label2))
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in ticks]


def _outside(extent, box) -> bool:
    return (extent.x0 < box.x0 - MARGIN_PX or extent.x1 > box.x1 + MARGIN_PX
            or extent.y0 < box.y0 - MARGIN_PX or extent.y1 > box.y1 + MARGIN_PX)


def outside_texts(fig: Figure) -> list[tuple[str, tuple[float, float, float, float]]]:
    """(text, its box in pixels) for every visible text that is not wholly inside the figure."""
    renderer = _renderer(fig)
    box = fig.bbox
    out = []
    for t in _visible_texts(fig):
        e = t.get_window_extent(renderer)
        if _outside(e, box):
            out.append((t.get_text(), (e.x0, e.y0, e.x1, e.y1)))
    return out


def _legends(fig: Figure):
    return list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def _wrap(t: Text, extent, box) -> bool:
    """Wrap ``t`` to the width it has between its anchor and the figure's edge; False if it
    cannot get narrower (one word)."""
    text = t.get_text()
    longest = max(len(line) for line in text.split("\n"))
    ha = t.get_horizontalalignment()
    if ha == "left":
        room = box.x1 - max(extent.x0, box.x0)
    elif ha == "right":
        room = min(extent.x1, box.x1) - box.x0
    else:
        room = box.width
    chars = max(8, int(longest * 0.95 * room / max(extent.width, 1.0)))
    if chars >= longest:
        chars = longest - 1
    # never narrower than its longest word (a plan label, a pool list): that would only split the
    # rest into more lines; such a text is shrunk instead
    chars = max(chars, max(len(word) for word in text.split()))
    lines = []
    for line in text.split("\n"):
        lines += textwrap.wrap(line, chars, break_long_words=False, break_on_hyphens=False) or [""]
    wrapped = "\n".join(lines)
    if wrapped == text:
        return False
    t.set_text(wrapped)
    return True


def _set_columns(legend, ncols: int) -> None:
    """Re-pack ``legend`` in ``ncols`` columns. ``Legend.set_ncols`` only records the number: the
    entries were packed when the legend was made, so they are packed again here from the legend's
    own handles and labels (matplotlib's ``_init_legend_box``, as its constructor does)."""
    handles = list(legend.legend_handles)
    labels = [t.get_text() for t in legend.get_texts()]
    legend.set_ncols(ncols)
    legend._init_legend_box(handles, labels)   # markerfirst: the default, as every report legend
    legend._set_loc(legend._loc_real)          # the new box placed where the old one was
    legend.stale = True


def fit_texts(fig: Figure, rounds: int = 6, drawn: bool = False) -> bool:
    """Narrow legends, wrap titles and shrink what is left until every text is inside ``fig``;
    True if anything changed. ``drawn``: the figure was just drawn (saved) at its own dpi, so the
    first look needs no layout pass: a figure that fits already costs nothing more."""
    changed_any = False
    for i in range(rounds):
        renderer = fig._get_renderer() if drawn and i == 0 else _renderer(fig, draw=False)
        box = fig.bbox
        changed = False
        in_legends = set()
        for legend in _legends(fig):
            in_legends.update(map(id, legend.get_texts()))
            e = legend.get_window_extent(renderer)    # too wide: fewer columns (too tall: no cure)
            if legend._ncols > 1 and (e.x0 < box.x0 - MARGIN_PX or e.x1 > box.x1 + MARGIN_PX):
                _set_columns(legend, legend._ncols - 1)
                changed = True
        for t in _visible_texts(fig):
            if id(t) in in_legends:
                continue
            e = t.get_window_extent(renderer)
            if not (e.x0 < box.x0 - MARGIN_PX or e.x1 > box.x1 + MARGIN_PX):
                continue    # inside, or out only at the top or bottom: a placement narrower won't cure
            if e.width > box.width * 0.5 and _wrap(t, e, box):
                changed = True
            elif t.get_fontsize() > 4:
                t.set_fontsize(t.get_fontsize() * 0.85)
                changed = True
        if not changed:
            break
        changed_any = True
    return changed_any
