"""Figures of the semantic layer. Each takes one kind of input, named in its signature (traces:
one, ``{arm: trace}`` or a store path; or a table from :mod:`rlparity.metrics.semantic`) and
returns a plotly Figure (never shows it)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import xarray as xr

from rlparity.metrics import log_ratio, summary, zero_prob_tokens
from rlparity.plot.palette import color
from rlparity.trace import as_arms

_D = "d = log pi_old - log mu (nats)"


def plot_ratio_histogram(arms, trainer: str | None = None, bins: int = 80, *, log_y: bool = True) -> go.Figure:
    """Histogram of the per-token log-ratio d (nats) for each arm.

    Tokens with pi_old = 0 (d = -inf) are counted in the legend, not dropped silently; the legend
    also gives each arm's mean ratio.

    Parameters
    ----------
    arms : xarray.Dataset, mapping or str
        One trace, ``{arm: trace}``, a DataTree or a store path (:func:`rlparity.trace.as_arms`).
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: ``defaults().trainer``.
    bins : int, default 80
        Histogram bins per arm.
    log_y : bool, default True
        Log scale on the token counts.

    Returns
    -------
    plotly.graph_objects.Figure
        Overlaid histograms (not shown).
    """
    fig = go.Figure()
    side = trainer
    for arm, ds in as_arms(arms).items():
        d = log_ratio(ds, trainer)
        s = summary(ds, trainer)
        side = s.attrs["trainer_side"]
        n_inf = int(s["n_zero_prob"])
        name = f"{arm} (mean ratio {float(s['mean_ratio']):.4f}" + (f", {n_inf} at pi_old=0)" if n_inf else ")")
        values = d.values[np.isfinite(d.values)]
        fig.add_trace(go.Histogram(x=values, nbinsx=bins, name=name, opacity=0.6, marker_color=color(arm)))
    fig.update_layout(barmode="overlay", title=f"per-token log-ratio vs the trainer's {side} logprob",
                      xaxis_title=_D, yaxis_title="tokens", legend_title="arm")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def plot_offset_vs_temperature(table: xr.Dataset) -> go.Figure:
    """Mean d (nats, with its RMS as error bar) against each request's temperature, one line per arm.

    Flat at zero for processed logprobs, moving with temperature for raw ones.

    Parameters
    ----------
    table : xarray.Dataset
        :func:`rlparity.metrics.temperature_table`.

    Returns
    -------
    plotly.graph_objects.Figure
        The lines (not shown).
    """
    fig = go.Figure()
    for arm in table["arm"].values.tolist():
        row = table.sel(arm=arm)
        fig.add_trace(go.Scatter(x=table["temperature"].values, y=row["log_ratio_mean"].values,
                                 error_y={"type": "data", "array": row["abs_log_ratio_rms"].values},
                                 mode="lines+markers", name=arm, line={"color": color(arm)}))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(title="mean log-ratio by temperature (error bar: RMS of d)",
                      xaxis_title="sampling temperature", yaxis_title="mean " + _D, legend_title="arm")
    return fig


def plot_ratio_by_position(arms, trainer: str | None = None) -> go.Figure:
    """Mean d and mean ``|d|`` (nats) per response position, one line each per arm.

    Parameters
    ----------
    arms : xarray.Dataset, mapping or str
        One trace, ``{arm: trace}``, a DataTree or a store path (:func:`rlparity.trace.as_arms`).
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: ``defaults().trainer``.

    Returns
    -------
    plotly.graph_objects.Figure
        The lines, mean ``|d|`` dashed (not shown).
    """
    fig = go.Figure()
    for arm, ds in as_arms(arms).items():
        s = summary(ds, trainer, dim="sequence")
        pos = s["position"].values
        c = color(arm)
        fig.add_trace(go.Scatter(x=pos, y=s["log_ratio_mean"].values, mode="lines", name=f"{arm}: mean d",
                                 legendgroup=arm, line={"color": c}))
        fig.add_trace(go.Scatter(x=pos, y=s["abs_log_ratio_mean"].values, mode="lines",
                                 line={"color": c, "dash": "dash"}, name=f"{arm}: mean |d|", legendgroup=arm))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(title="log-ratio by response position", xaxis_title="response position",
                      yaxis_title=_D, legend_title="arm / statistic")
    return fig


def plot_zero_prob_map(arms, trainer: str | None = None) -> go.Figure:
    """Where the tokens with pi_old = 0 are (sequence x position), per arm.

    Every arm's count is in the title, so that "none" is visible too.

    Parameters
    ----------
    arms : xarray.Dataset, mapping or str
        One trace, ``{arm: trace}``, a DataTree or a store path (:func:`rlparity.trace.as_arms`).
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: ``defaults().trainer``.

    Returns
    -------
    plotly.graph_objects.Figure
        A scatter of the tokens; hover gives token id and trainer rank (not shown).
    """
    fig = go.Figure()
    counts = []
    for arm, ds in as_arms(arms).items():
        z = zero_prob_tokens(ds, trainer)
        counts.append(f"{arm}: {z.sizes['token']}")
        fig.add_trace(go.Scatter(x=z["position_index"].values, y=z["sequence_index"].values, mode="markers",
                                 name=arm, marker_color=color(arm), text=[f"token {t}, rank {r}" for t, r in
                                                 zip(z["token_id"].values, z["trainer_token_rank"].values)]))
    fig.update_layout(title="tokens the trainer gives probability 0 (" + ", ".join(counts) + ")",
                      xaxis_title="response position", yaxis_title="sequence")
    return fig


__all__ = ["plot_offset_vs_temperature", "plot_ratio_by_position", "plot_ratio_histogram", "plot_zero_prob_map"]
