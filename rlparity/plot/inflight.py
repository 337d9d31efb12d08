"""Figures of the inflight weight-update matrix. Each draws one table computed by
:mod:`rlparity.metrics.inflight` and returns a plotly Figure (never shows it)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from rlparity.metrics.inflight import PAUSE_MODES
from rlparity.plot.palette import color as palette_color

_FLOOR = 1e-9  # zero drawn here on log axes
_STYLE = {(False, True): ("#d62728", "solid"), (True, True): ("#1f77b4", "solid"),
          (False, False): ("#ff7f0e", "dot"), (True, False): ("#2ca02c", "dot")}


def _cell_label(clear: bool, prefix: bool) -> str:
    return f"{'clear' if clear else 'keep'} cache, prefix caching {'on' if prefix else 'off'}"


def _cells(table: xr.Dataset, arm: str) -> tuple[str, bool, bool]:
    return (str(table["mode"].sel(arm=arm).item()), bool(table["clear_cache"].sel(arm=arm).item()),
            bool(table["prefix_caching"].sel(arm=arm).item()))


def plot_gap_by_update_time(gap: xr.Dataset, table: xr.Dataset) -> go.Figure:
    """Mean ``|d|`` (nats) against token time relative to the weight update, one panel per pause mode.

    Time 0 is the resume, negative times are before it; one line per (clear_cache, prefix caching)
    cell; hover shows the bin's tokens and mean policy version.

    Parameters
    ----------
    gap : xarray.Dataset
        :func:`rlparity.metrics.inflight.gap_by_update_time`.
    table : xarray.Dataset
        :func:`rlparity.metrics.inflight.inflight_table` (each arm's mode and cache cell).

    Returns
    -------
    plotly.graph_objects.Figure
        The panels on a log y axis (not shown).
    """
    modes = [m for m in PAUSE_MODES if m in set(table["mode"].values.tolist())]
    fig = make_subplots(rows=1, cols=len(modes), shared_yaxes=True, subplot_titles=[f"pause mode {m}" for m in modes],
                        horizontal_spacing=0.04)
    x = gap["time_center"].values
    shown = set()
    for arm in gap["arm"].values.tolist():
        mode, clear, prefix = _cells(table, arm)
        color, dash = _STYLE[(clear, prefix)]
        y = gap["abs_log_ratio_mean"].sel(arm=arm).values
        n = gap["n_tokens"].sel(arm=arm).values
        v = gap["policy_version_mean"].sel(arm=arm).values
        ok = n > 0
        label = _cell_label(clear, prefix)
        fig.add_trace(go.Scatter(
            x=x[ok], y=np.maximum(y[ok], _FLOOR), mode="lines+markers", name=label, legendgroup=label,
            showlegend=label not in shown, line={"color": color, "dash": dash},
            customdata=np.stack([n[ok], v[ok]], axis=-1),
            hovertemplate=(f"{arm}<br>t=%{{x:.2f}} s: mean |d| %{{y:.3g}} nats<br>%{{customdata[0]}} tokens, "
                           "mean version %{customdata[1]:.2f}<extra></extra>")),
            row=1, col=modes.index(mode) + 1)
        shown.add(label)
    for c in range(1, len(modes) + 1):
        fig.add_vline(x=0, line_dash="dash", line_color="black", row=1, col=c)
        fig.update_xaxes(title_text="token time - update (s)", row=1, col=c)
    fig.update_yaxes(type="log")  # every panel: shared axes of two types made plotly drop the link (a console warning)
    fig.update_yaxes(title_text="mean |d| (nats)", row=1, col=1)
    fig.update_layout(title="d = log pi_old - log mu against token time relative to the weight update "
                            "(each token scored at its own version)", height=420)
    return fig


def plot_lag_histogram(hist: xr.Dataset, *, level: str = "n_tokens") -> go.Figure:
    """Tokens or sequences per policy lag value, stacked bars per arm.

    Parameters
    ----------
    hist : xarray.Dataset
        :func:`rlparity.metrics.inflight.lag_histogram`.
    level : {"n_tokens", "n_sequences"}, default "n_tokens"
        Count tokens, or sequences (by their max lag).

    Returns
    -------
    plotly.graph_objects.Figure
        The histogram (not shown).

    Raises
    ------
    ValueError
        If ``level`` is neither ``"n_tokens"`` nor ``"n_sequences"``.
    """
    if level not in ("n_tokens", "n_sequences"):
        raise ValueError(f"level={level!r}: use 'n_tokens' or 'n_sequences'")
    fig = go.Figure()
    for lag in hist["lag"].values.tolist():
        fig.add_trace(go.Bar(x=hist["arm"].values, y=hist[level].sel(lag=lag).values, name=f"lag {lag}",
                             marker_color=palette_color(f"lag {lag}"), hovertemplate="%{x}: %{y}<extra>lag " + str(lag) + "</extra>"))
    what = "tokens" if level == "n_tokens" else "sequences (by their oldest token)"
    fig.update_layout(barmode="stack", title=f"Policy lag per arm: {what} by lag (latest version - token version)",
                      xaxis_title="arm", yaxis_title=what, xaxis_tickangle=-35, height=420)
    return fig


def plot_inflight_bars(table: xr.Dataset) -> go.Figure:
    """Per arm: mean ``|d|`` after the update with the noise floor, and the mean token lag.

    Mean ``|d|`` (nats, log axis) is of the requests submitted after the update; stale arms are red.

    Parameters
    ----------
    table : xarray.Dataset
        :func:`rlparity.metrics.inflight.inflight_table`.

    Returns
    -------
    plotly.graph_objects.Figure
        Two panels of horizontal bars (not shown).
    """
    arms = table["arm"].values.tolist()
    stale = table["n_stale_sequences"].values > 0
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04, subplot_titles=(
        "mean |d| after the update (nats; dashed: noise floor)", "mean token lag (versions)"))
    after = table["after_abs_log_ratio_mean"].values.astype(float)
    fig.add_trace(go.Bar(y=arms, x=np.maximum(after, _FLOOR), orientation="h", showlegend=False,
                         marker_color=["#d62728" if s else "#1f77b4" for s in stale],
                         text=[f"{v:.3g}" for v in after], textposition="auto",
                         hovertemplate="%{y}: %{x:.3g} nats<extra></extra>"), row=1, col=1)
    floor = table["floor_abs_log_ratio_mean"].values.astype(float)
    fig.add_trace(go.Scatter(y=arms, x=np.maximum(floor, _FLOOR), mode="markers", name="noise floor",
                             marker={"symbol": "line-ns-open", "size": 14, "color": "black"},
                             hovertemplate="%{y}: floor %{x:.3g} nats<extra></extra>"), row=1, col=1)
    lag = table["lag_mean"].values.astype(float)
    fig.add_trace(go.Bar(y=arms, x=lag, orientation="h", showlegend=False, marker_color="#7f7f7f",
                         text=[f"{v:.2f}" for v in lag], textposition="auto"), row=1, col=2)
    fig.update_xaxes(type="log", row=1, col=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title="Inflight weight updates per arm (red: stale prefix-cache hits)",
                      height=140 + 30 * len(arms), margin={"l": 10})
    return fig


__all__ = ["plot_gap_by_update_time", "plot_inflight_bars", "plot_lag_histogram"]
