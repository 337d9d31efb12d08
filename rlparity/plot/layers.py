"""Figures of the per-layer divergence profile (tables from :mod:`rlparity.metrics.layers`); each
returns a plotly Figure and never shows it."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import xarray as xr

from rlparity.plot.palette import color as arm_color

_ZERO = 1e-9  # exact zero drawn here on log axes


def plot_layer_profile(table: xr.Dataset, *, title: str | None = None) -> go.Figure:
    """The relative error per site on a log axis, one line per arm, its floor dotted.

    Sites are the embedding, each layer's modules in data-flow order, the final norm and the LM
    head. Exact zeros are drawn at 1e-9.

    Parameters
    ----------
    table : xarray.Dataset
        The profile table (:func:`rlparity.metrics.layers.profile_table`): ``relative_error``,
        ``floor`` and ``comparison`` per ``arm`` and ``site``.
    title : str, optional
        The figure's title; None: a default that says what the dotted floor is.

    Returns
    -------
    plotly.graph_objects.Figure
        The profile (not shown).
    """
    fig = go.Figure()
    sites = table["site"].values.tolist()
    for arm in table["arm"].values.tolist():
        color = arm_color(arm)
        y = table["relative_error"].sel(arm=arm).values
        comp = str(table["comparison"].sel(arm=arm).item())
        fig.add_trace(go.Scatter(x=sites, y=np.maximum(y, _ZERO), mode="lines+markers", name=f"{arm} (vs {comp})",
                                 legendgroup=arm, line={"color": color},
                                 hovertemplate=f"{arm}<br>%{{x}}: %{{y:.3g}}<extra>vs {comp}</extra>"))
        fl = table["floor"].sel(arm=arm).values
        if np.isfinite(fl).any():
            fig.add_trace(go.Scatter(x=sites, y=np.maximum(fl, _ZERO), mode="lines", name=f"{arm}: floor",
                                     legendgroup=arm, showlegend=False, line={"color": color, "dash": "dot",
                                                                               "width": 1},
                                     hovertemplate=f"floor of {arm}<br>%{{x}}: %{{y:.3g}}<extra></extra>"))
    fig.update_yaxes(type="log", title_text="relative error: RMS(engine - reference) / RMS(reference)")
    fig.update_xaxes(title_text="site (data-flow order)", tickangle=-60)
    fig.update_layout(title=title or "Where the engine's states part from the reference, layer by layer (dotted: "
                                     "the floor a clean parity capture reaches)", height=480)
    return fig


def plot_position_heatmap(errors: xr.DataArray, *, title: str | None = None) -> go.Figure:
    """The relative error per site and position of one sequence, log10 colour scale.

    Rows are sites in data-flow order from the top, columns positions of prompt + response;
    positions the engine served from its prefix cache (not recomputed) are blank.

    Parameters
    ----------
    errors : xarray.DataArray
        :func:`rlparity.metrics.layers.relative_error` with ``dim=()``, one ``layer_sequence``
        selected (dims ``site`` and ``full_position``).
    title : str, optional
        The figure's title; None: a default that says what blank cells mean.

    Returns
    -------
    plotly.graph_objects.Figure
        The heatmap (not shown).
    """
    z = np.log10(np.maximum(errors.transpose("site", "full_position").values.astype(float), _ZERO))
    fig = go.Figure(go.Heatmap(z=z, x=errors["full_position"].values, y=errors["site"].values,
                               colorscale="Viridis", colorbar={"title": "log10 rel. error"},
                               hovertemplate="%{y}, position %{x}: 10^%{z:.2f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title_text="site")
    fig.update_xaxes(title_text="position in prompt + response")
    fig.update_layout(title=title or "Relative error per site and position (blank: served from the prefix cache)",
                      height=460)
    return fig


__all__ = ["plot_layer_profile", "plot_position_heatmap"]
