"""The book's figure layout rules (rlparity.plot.layout), checked on real figure objects: the check
finds what the issue saw (a 1340 px figure in a 784 px column, SI-prefixed nats, subplot titles
running into each other), :func:`book_layout` repairs it, and the notebooks' renderer applies it to
every figure it shows. Not-applicable settings are drawn, not left blank."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlparity.plot.layout import COLUMN_PX, book_layout, layout_problems


def _matrix():
    from test_head import synthetic_matrix

    return synthetic_matrix()


def test_a_too_wide_figure_with_si_prefixes_is_found_and_repaired():
    from rlparity.plot.head_precision import plot_probability_scatter

    fig = plot_probability_scatter(_matrix(), max_points=20)
    assert fig.layout.width > COLUMN_PX  # the over-wide figure (420 px a panel)
    found = layout_problems(fig)
    assert any(p.startswith("width") for p in found) and any("SI-prefixed" in p for p in found)
    book_layout(fig)
    assert layout_problems(fig) == [] and fig.layout.width is None
    # nats axes write powers of ten: 5e-7 is drawn as 5x10^-7, never as "0.5μ"
    assert {fig.layout[k].exponentformat for k in fig.layout if k.startswith(("xaxis", "yaxis"))} == {"power"}


def test_subplot_titles_that_would_overlap_are_wrapped_and_the_top_margin_makes_room():
    long = "a subplot title long enough to run into the next panel's title at 784 px"
    fig = make_subplots(rows=1, cols=3, subplot_titles=(long, long, long))
    for c in (1, 2, 3):
        fig.add_trace(go.Bar(x=[1, 2], y=[3e-7, 5e-7]), row=1, col=c)
    fig.update_layout(title="an even longer figure title that, at fifteen pixels a glyph, needs two lines "
                            "in the book's column to be read in full")
    found = layout_problems(fig)
    assert sum("subplot title too wide" in p for p in found) == 3, found
    book_layout(fig)
    assert layout_problems(fig) == []
    assert all("<br>" in a.text for a in fig.layout.annotations)
    assert "<br>" in fig.layout.title.text and fig.layout.margin.t >= 18 * 2 + 14 * 3


def test_a_short_figure_passes_untouched_by_the_check():
    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, 1]))
    fig.update_layout(title="short", xaxis_exponentformat="power", yaxis_exponentformat="e")
    assert layout_problems(fig) == []


def test_the_notebook_renderer_applies_the_rules_to_every_figure_shown():
    import plotly.io as pio

    from rlparity.plot import init_notebook
    from rlparity.plot.head_precision import plot_matrix_heatmap
    from rlparity.metrics.head_precision import head_table

    name = init_notebook()
    fig = plot_matrix_heatmap(head_table(_matrix()))
    bundle = pio.renderers[name].to_mimebundle(fig.to_dict())
    shown = bundle["application/vnd.plotly.v1+json"]
    assert layout_problems(shown) == []
    assert "width" not in shown["layout"] and '"responsive": true' in bundle["text/html"]
    assert len(shown["data"]) == 4 and {t["xaxis"] for t in shown["data"]} == {"x", "x2", "x3", "x4"}


def test_settings_that_could_not_run_are_drawn_as_not_applicable():
    from test_path import _store

    from rlparity.metrics.ablation import ablation_table
    from rlparity.plot.path import plot_ablation_bars

    na = {"arm": "cascade_attention", "knob": "cascade_attention", "field": "disable_cascade_attn",
          "value": False, "reference_value": True, "status": "not_applicable", "reason": "removed in this vLLM"}
    fig = plot_ablation_bars(ablation_table(_store([[-1.0, -2.5, -3.0], [-0.5, -0.7, -0.9]], [na])))
    na_bars = [t for t in fig.data if t.name == "not applicable"]
    assert len(na_bars) == 3  # one per panel
    for t in na_bars:
        row = [i for i, y in enumerate(t.y) if y.startswith("cascade_attention")]
        assert len(row) == 1 and t.x[row[0]] > 0 and t.text[row[0]] == "not applicable"  # drawn, labelled
        assert "removed in this vLLM" in t.customdata[row[0]]
        assert all(np.isnan(x) for i, x in enumerate(t.x) if i != row[0])  # the rows that ran stay free


def test_book_layout_gives_a_colour_bar_only_where_a_scale_is_shown():
    """A bar's marker accepts a colour bar but shows none: setting one there made plotly.js draw an
    empty bar (the browser logged '<rect> attribute height: Expected length, "NaN"' on 02 and 04).
    The heatmap's and a scaled marker's colour bars get the power exponents; a plain bar's none."""
    import plotly.graph_objects as go

    from rlparity.plot.layout import book_layout, layout_problems

    fig = go.Figure([go.Bar(x=[1, 2], y=[1e-6, 2e-6], name="bar"),
                     go.Scatter(x=[1, 2], y=[1, 2], mode="markers", name="scaled",
                                marker={"color": [1e-6, 2e-6], "showscale": True}),
                     go.Heatmap(z=[[1e-6, 2e-6]], name="heat")])
    d = book_layout(fig).to_plotly_json()["data"]
    assert "colorbar" not in d[0].get("marker", {})
    assert d[1]["marker"]["colorbar"]["exponentformat"] == "power"
    assert d[2]["colorbar"]["exponentformat"] == "power"
    assert layout_problems(fig) == []
