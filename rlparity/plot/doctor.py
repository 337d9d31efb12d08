"""Figures of the doctor's page (:mod:`rlparity.diagnose.doctor`): the mismatch over steps with
the recorded floors, the recorder's alarms and the step each cause was first named; and the growth
decomposition per window. The numbers come computed (:func:`rlparity.metrics.run.step_table`,
:func:`rlparity.metrics.run.growth_decomposition`); these functions only draw (plotly; returned,
never shown)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from rlparity.plot.palette import color

_ALARM_SYMBOL = {"warning": "triangle-up", "error": "x"}
_PARTS = ("length", "confidence", "low_prob", "lag", "residual")


def plot_mismatch_over_steps(steps: xr.Dataset, *, alarms: Sequence[Mapping[str, Any]] = (),
                             first_named: Mapping[str, Mapping[str, Any]] | None = None,
                             title: str = "mismatch over steps") -> go.Figure:
    """Mean ``|d|`` and k3 per step (``d = log pi_old - log mu``, nats, log scale), the recorded
    trainer and engine floors as dashed lines, the alarms as markers on the mean ``|d|`` line and a
    vertical line where each cause was first named.

    Parameters
    ----------
    steps : xarray.Dataset
        :func:`rlparity.metrics.run.step_table` (dim ``step``).
    alarms : sequence of mapping, default ()
        ``{"step", "code", "level"}`` per alarm (``RunDoctor.alarms``).
    first_named : mapping, optional
        ``{cause: {"step": ...}}`` (``RunDoctor.first_named``).
    title : str, default "mismatch over steps"
        The figure's title.

    Returns
    -------
    plotly.graph_objects.Figure
        Two panels sharing the step axis: mean ``|d|`` with floors and alarms, k3 (not shown).
    """
    x = steps["step"].values
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("mean |d| (nats)", "k3 = mean exp(d) - 1 - d (nats)"))
    gap = steps["abs_log_ratio_mean"].values
    fig.add_trace(go.Scatter(x=x, y=gap, mode="lines+markers", name="mean |d|", line={"color": color("mean |d|")},
                             hovertemplate="step %{x}: mean |d| = %{y:.4g} nats<extra></extra>"), row=1, col=1)
    for var, name in (("trainer_floor", "trainer floor"), ("engine_floor", "engine floor")):
        if var in steps and np.isfinite(steps[var].values).any():
            fig.add_trace(go.Scatter(x=x, y=steps[var].values, mode="lines", name=name,
                                     line={"dash": "dash", "color": color(name)},
                                     hovertemplate=f"step %{{x}}: {name} %{{y:.3g}} nats<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=steps["kl_k3"].values, mode="lines+markers", name="k3",
                             line={"color": color("k3")},
                             hovertemplate="step %{x}: k3 = %{y:.3g} nats<extra></extra>"), row=2, col=1)
    at = {int(k): float(v) for k, v in zip(x, gap)}
    for level in ("warning", "error"):
        hits = [a for a in alarms if a["level"] == level and int(a["step"]) in at]
        if hits:
            fig.add_trace(go.Scatter(x=[a["step"] for a in hits], y=[at[int(a["step"])] for a in hits], mode="markers",
                                     name=f"alarm ({level})", text=[a["code"] for a in hits],
                                     marker={"symbol": _ALARM_SYMBOL[level], "size": 11, "color": color(f"alarm {level}")},
                                     hovertemplate="step %{x}: %{text}<extra></extra>"), row=1, col=1)
    for cause, where in (first_named or {}).items():
        fig.add_vline(x=where["step"], line_dash="dot", line_color="gray", annotation_text=f"{cause} named",
                      annotation_position="top left", row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(type="log", row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_layout(title=f"{title} (backend pair d = log pi_old - log mu)", height=560,
                      legend={"orientation": "h", "y": -0.12})
    return fig


def plot_growth(windows: Sequence[Mapping[str, Any]], *, title: str = "why the mismatch changed") -> go.Figure:
    """The change of mean ``|d|`` of each window against the first, one stacked bar per window split
    into its parts (response length, confidence, low-probability tokens, policy lag, residual), with
    the measured change as a marker and each part's bootstrap interval on hover.

    Parameters
    ----------
    windows : sequence of mapping
        ``RunDoctor.windows`` (those with a ``growth``: :func:`rlparity.metrics.run.growth_decomposition`).
    title : str, default "why the mismatch changed"
        The figure's title.

    Returns
    -------
    plotly.graph_objects.Figure
        The bars (not shown).

    Raises
    ------
    ValueError
        If no window has a decomposition (one window only).
    """
    grown = [w for w in windows if w.get("growth")]
    if not grown:
        raise ValueError("no window has a decomposition: the run needs at least two windows of steps")
    labels = [f"{w['start']}-{w['end']}" for w in grown]
    fig = go.Figure()
    for part in _PARTS:
        vals = [w["growth"]["parts"][part] for w in grown]
        fig.add_trace(go.Bar(x=labels, y=[v["value"] for v in vals], name=part, marker={"color": color(part)},
                             customdata=[[v["low"], v["high"]] for v in vals],
                             hovertemplate=(f"steps %{{x}}: {part} %{{y:.3g}} nats "
                                            "[%{customdata[0]:.3g}, %{customdata[1]:.3g}]<extra></extra>")))
    fig.add_trace(go.Scatter(x=labels, y=[w["growth"]["change"] for w in grown], mode="markers", name="measured change",
                             marker={"symbol": "diamond", "size": 10, "color": "black"},
                             hovertemplate="steps %{x}: change %{y:.3g} nats<extra></extra>"))
    fig.update_layout(barmode="relative", title=f"{title} (mean |d| against the first window, nats)",
                      xaxis_title="window (steps)", yaxis_title="change of mean |d| (nats)", height=420,
                      legend={"orientation": "h", "y": -0.2})
    return fig




def plot_sequence_views(views: Mapping[int, Mapping[str, Any]], *,
                        title: str = "inside the ratio bands, per step") -> go.Figure:
    """The sequence-level views over steps: per band the share of tokens (solid) and of whole
    sequences (dashed) with ``rho = pi_old/mu`` inside it, and the shares with ``|d| > ln 2``.

    Parameters
    ----------
    views : Mapping[int, Mapping]
        ``RunDoctor.views``: per step, ``token_share`` / ``sequence_share`` (``{band: share}``),
        ``above_ln2_token_share``, ``above_ln2_sequence_share``.
    title : str
        The figure's title.

    Returns
    -------
    plotly.graph_objects.Figure
        One line per band and level.
    """
    ks = sorted(int(k) for k in views)
    fig = go.Figure()
    if not ks:
        return fig
    bands = list(views[ks[0]]["token_share"])
    for b in bands:
        for level, dash in (("token", "solid"), ("sequence", "dash")):
            fig.add_scatter(x=ks, y=[views[k][f"{level}_share"][b] for k in ks], mode="lines+markers",
                            name=f"{level}s in {b}", line={"dash": dash, "color": color(f"ratio band {b}")})
    for level, dash in (("token", "solid"), ("sequence", "dash")):
        fig.add_scatter(x=ks, y=[views[k][f"above_ln2_{level}_share"] for k in ks], mode="lines+markers",
                        name=f"{level}s with |d| > ln 2", line={"dash": dash, "color": "black"})
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="share", yaxis_range=[0, 1.02])
    return fig


__all__ = ["plot_growth", "plot_mismatch_over_steps", "plot_sequence_views"]
