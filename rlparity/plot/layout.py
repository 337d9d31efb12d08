"""The book's layout rules for every figure, in one place, and a check of them.

:func:`book_layout` is applied to every figure the notebooks show (the renderer that
:func:`rlparity.plot.init_notebook` registers calls it), so a plot function only draws; the rules:

* **responsive width**: no fixed width (the figure fills the page's column, :data:`COLUMN_PX`
  wide in the book's theme); a fixed height stays;
* **no SI prefixes**: every axis and colour bar writes its exponents as powers of ten
  (``exponentformat="power"``), so a log-ratio never reads "0.5μ nats";
* **titles that fit**: the figure title and the subplot titles are wrapped (``<br>``) to the width
  their panel has in the column, and the top margin grows with the title's lines so the title
  never runs into the subplot titles.

:func:`layout_problems` finds what breaks these rules in a figure (a dict, as plotly serialises
it, or a ``Figure``): tests run it on every figure of the executed notebooks.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

#: width of the book's content column (sphinx-book-theme, 1400 px screen) in CSS pixels
COLUMN_PX = 784
#: average glyph width as a share of the font size (plotly's default font, Open Sans / Arial)
_GLYPH = 0.55
_TITLE_FONT, _SUBTITLE_FONT = 15, 12
_PLAIN_EXPONENTS = ("power", "e", "E", "none")


def _as_dict(fig) -> dict:
    return fig.to_plotly_json() if hasattr(fig, "to_plotly_json") else fig


def _axes(layout: dict) -> list[tuple[str, dict]]:
    return [(k, v) for k, v in layout.items() if re.fullmatch(r"[xy]axis\d*", k) and isinstance(v, dict)]


def _text_width(line: str, size: float) -> float:
    return len(re.sub(r"<[^>]+>", "", line)) * size * _GLYPH


def _wrap(text: str, width_px: float, size: float) -> str:
    chars = max(12, int(width_px / (size * _GLYPH)))
    lines = [w for part in str(text).split("<br>") for w in (textwrap.wrap(part, chars) or [""])]
    return "<br>".join(lines)


def _subplot_titles(layout: dict) -> list[tuple[dict, float]]:
    """The subplot-title annotations with the width (paper share) of the panel each sits over."""
    domains = [tuple(ax.get("domain", (0, 1))) for k, ax in _axes(layout) if k.startswith("x")]
    out = []
    for ann in layout.get("annotations", []) or []:
        if ann.get("xref") != "paper" or ann.get("yref") != "paper" or ann.get("yanchor") != "bottom" \
                or ann.get("showarrow", True) is not False:
            continue
        x = ann.get("x", 0.5)
        spans = [d[1] - d[0] for d in domains if d[0] - 1e-6 <= x <= d[1] + 1e-6]
        out.append((ann, min(spans) if spans else 1.0))
    return out


def _plot_width(layout: dict) -> float:
    margin = layout.get("margin") or {}
    return COLUMN_PX - margin.get("l", 80) - margin.get("r", 80)


def book_layout(fig):
    """Apply the book's layout rules (module docstring) to ``fig`` in place and return it.

    No fixed width, exponents as powers of ten on every axis and colour bar, the title and subplot
    titles wrapped to their width with the top margin made room for them (a fixed height grows by
    the margin's increase beyond 100 px).

    Parameters
    ----------
    fig : plotly.graph_objects.Figure
        The figure to change.

    Returns
    -------
    plotly.graph_objects.Figure
        ``fig`` itself, changed.
    """
    fig.update_layout(width=None, autosize=True)
    fig.update_xaxes(exponentformat="power")
    fig.update_yaxes(exponentformat="power")
    for trace in fig.data:
        if "colorbar" in trace and trace.showscale is not False:
            trace.update(colorbar={"exponentformat": "power"})
        marker = getattr(trace, "marker", None)
        # only a marker that shows its scale or has a colour bar already: setting one on any other (every
        # bar's marker accepts the property) made plotly.js draw an empty bar ("<rect> height NaN" in the console)
        if marker is not None and "colorbar" in marker and (marker.showscale or "colorbar" in marker.to_plotly_json()):
            marker.update(colorbar={"exponentformat": "power"})
    layout = fig.layout.to_plotly_json()
    plot_w = _plot_width(layout)
    sub_lines = 0
    for ann in fig.layout.annotations:
        for a, span in _subplot_titles({**layout, "annotations": [ann.to_plotly_json()]}):
            text = _wrap(a.get("text", ""), span * plot_w - 8, _SUBTITLE_FONT)
            ann.update(text=text, font={"size": _SUBTITLE_FONT})
            sub_lines = max(sub_lines, text.count("<br>") + 1)
    title = fig.layout.title.text
    title_lines = 0
    if title:
        wrapped = _wrap(title, COLUMN_PX - 40, _TITLE_FONT)
        title_lines = wrapped.count("<br>") + 1
        fig.update_layout(title={"text": wrapped, "font": {"size": _TITLE_FONT}, "x": 0.01, "xanchor": "left",
                                 "y": 1.0, "yanchor": "top", "yref": "container", "pad": {"t": 8}})
    top = 20 + 20 * title_lines + 16 * sub_lines
    fig.update_layout(margin={"t": max(top, 40)})
    if fig.layout.height is not None:  # keep the plotting area: the margin grew inside a fixed height
        fig.update_layout(height=fig.layout.height + max(0, top - 100))
    return fig


def layout_problems(fig: Any, *, column: int = COLUMN_PX) -> list[str]:
    """What in ``fig`` breaks the book's layout rules.

    A width over ``column`` px, an axis or colour bar with SI-prefixed exponents, a title line or a
    subplot-title line wider than its room, a top margin too small for the title's lines.

    Parameters
    ----------
    fig : plotly.graph_objects.Figure or dict
        The figure, or its dict as plotly serialises it.
    column : int, default COLUMN_PX
        Width of the book's content column, in CSS pixels.

    Returns
    -------
    list of str
        One line per problem; empty when the figure is fit for the page.
    """
    d = _as_dict(fig)
    layout = d.get("layout", {}) or {}
    problems = []
    if (layout.get("width") or 0) > column:
        problems.append(f"width {layout['width']} px > column {column} px")
    for name, ax in _axes(layout):
        if ax.get("exponentformat") not in _PLAIN_EXPONENTS:
            problems.append(f"{name}: SI-prefixed exponents (exponentformat={ax.get('exponentformat', 'B')!r})")
    for trace in d.get("data", []):
        for bar in (trace.get("colorbar"), (trace.get("marker") or {}).get("colorbar")):
            if bar is not None and bar.get("exponentformat") not in _PLAIN_EXPONENTS:
                problems.append(f"{trace.get('type')} colour bar: SI-prefixed exponents")
    plot_w = _plot_width(layout)
    for ann, span in _subplot_titles(layout):
        for line in str(ann.get("text", "")).split("<br>"):
            size = (ann.get("font") or {}).get("size", _SUBTITLE_FONT)
            if _text_width(line, size) > span * plot_w + 0.04 * plot_w:
                problems.append(f"subplot title too wide for its panel: {line[:60]!r}")
    title = layout.get("title") or {}
    text = title.get("text") if isinstance(title, dict) else title
    if text:
        size = (title.get("font") or {}).get("size", 17) if isinstance(title, dict) else 17
        lines = str(text).split("<br>")
        problems += [f"title line too wide: {ln[:60]!r}" for ln in lines if _text_width(ln, size) > column - 20]
        subs = max((str(a.get("text", "")).count("<br>") + 1 for a, _ in _subplot_titles(layout)), default=0)
        need = 18 * len(lines) + 14 * subs
        if (layout.get("margin") or {}).get("t", 100) < need:
            problems.append(f"top margin {(layout.get('margin') or {}).get('t')} px < {need} px for the titles")
    return problems


def trace_colors(fig: Any) -> dict[str, str | None]:
    """The colour of each named trace of ``fig``.

    Parameters
    ----------
    fig : plotly.graph_objects.Figure or dict
        The figure, or its dict as plotly serialises it.

    Returns
    -------
    dict of str to str or None
        ``{name: colour}``: the line colour, else the marker colour; ``None`` where plotly's colour
        cycle would pick one (so the same name could change colour from one figure to the next),
        ``"per point"`` for a colour scale.
    """
    out: dict[str, str | None] = {}
    for trace in _as_dict(fig).get("data", []):
        name = trace.get("name")
        if not name:
            continue
        c = (trace.get("line") or {}).get("color") or (trace.get("marker") or {}).get("color")
        out[str(name)] = c if c is None or isinstance(c, str) else "per point"
    return out


__all__ = ["COLUMN_PX", "book_layout", "layout_problems", "trace_colors"]
