"""Figures of a scored fault matrix (:func:`rlparity.diagnose.scoring.score_matrix`): the confusion
matrix of true causes against the causes the diagnosis names, and recall / false alarms per cause."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots


def plot_confusion(scores: xr.Dataset, *, normalize: bool = True, title: str | None = None) -> go.Figure:
    """Heatmap of the causes injected (rows) against the causes the diagnosis names (columns).

    Rows are the causes injected (``clean`` = none), columns the causes named at WARNING or above
    (``(nothing)``: none; ``(unattributed)``: a problem naming no cause). Hover gives the counts.

    Parameters
    ----------
    scores : xarray.Dataset
        A scored fault matrix (:func:`rlparity.diagnose.scoring.score_matrix`).
    normalize : bool, default True
        Divide each row by the arms holding that cause, so the diagonal is recall; False draws the
        counts of arms.
    title : str, optional
        The figure's title; None: the number of arms and the headline hit rates.

    Returns
    -------
    plotly.graph_objects.Figure
        The heatmap (not shown).
    """
    counts = scores["confusion"].values.astype(float)
    rows, cols = scores["true_cause"].values.tolist(), scores["named_cause"].values.tolist()
    n_arms = np.array([int(scores["n_present"].sel(cause=r)) if r in scores["cause"].values else
                       int(scores.attrs.get("clean_arms", 0)) for r in rows], dtype=float)
    z = counts / np.maximum(n_arms, 1)[:, None] if normalize else counts
    text = [[f"{int(c)}" if c else "" for c in row] for row in counts]
    fig = go.Figure(go.Heatmap(
        z=z, x=cols, y=rows, text=text, texttemplate="%{text}", colorscale="Blues", zmin=0,
        zmax=1 if normalize else None, colorbar={"title": "share of arms" if normalize else "arms"},
        hovertemplate="true %{y}<br>named %{x}<br>%{text} arm(s)<extra></extra>"))
    a = scores.attrs
    fig.update_layout(
        title=title or (f"Causes injected vs causes named ({a.get('n_arms')} arms; headline right: single "
                        f"{a.get('headline_right_single', float('nan')):.0%}, pairs "
                        f"{a.get('headline_right_pairs', float('nan')):.0%})"),
        xaxis={"title": "named at WARNING or above", "tickangle": -40}, yaxis={"title": "injected", "autorange": "reversed"},
        height=140 + 26 * len(rows), margin={"l": 170, "b": 150}, autosize=True)
    return fig


def plot_recall(scores: xr.Dataset, *, title: str | None = None) -> go.Figure:
    """Recall and false alarms per cause, side by side.

    Parameters
    ----------
    scores : xarray.Dataset
        A scored fault matrix (:func:`rlparity.diagnose.scoring.score_matrix`).
    title : str, optional
        The figure's title; None: "Recall and false alarms per cause".

    Returns
    -------
    plotly.graph_objects.Figure
        Horizontal bars per cause: recall (share of its arms where it is named, left) and false
        alarms (arms naming it without it, right); hover gives the arm counts.
    """
    causes = scores["cause"].values.tolist()
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=("recall (share of its arms where it is named)", "false alarms (arms)"))
    fig.add_trace(go.Bar(y=causes, x=scores["recall"].values, orientation="h", marker_color="#1f77b4",
                         customdata=np.stack([scores["n_named_when_present"].values, scores["n_present"].values], -1),
                         hovertemplate="%{y}: named in %{customdata[0]} of %{customdata[1]} arms<extra></extra>",
                         showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(y=causes, x=scores["false_alarms"].values, orientation="h", marker_color="#d62728",
                         hovertemplate="%{y}: named in %{x} arm(s) without it<extra></extra>", showlegend=False),
                  row=1, col=2)
    fig.update_xaxes(range=[0, 1.05], tickformat=".0%", row=1, col=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=title or "Recall and false alarms per cause", height=120 + 24 * len(causes),
                      margin={"l": 170}, autosize=True)
    return fig


__all__ = ["plot_confusion", "plot_recall"]
