"""Figures of mixture-of-experts routing agreement (tables from :mod:`rlparity.metrics.routing`).
Each returns a plotly Figure (never shows it)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
import xarray as xr

from rlparity.plot.palette import color as arm_color

# the token groups of the routing figures, one colour each in every figure
_NO_FLIP, _FLIP, _REPLAYED = "#7f7f7f", "#d62728", "#2ca02c"

_D = "|d| = |log pi_old - log mu| (nats)"


def plot_flip_rate_by_layer(tables: Mapping[str, xr.Dataset]) -> go.Figure:
    """Routing flip rate per MoE layer, one bar group per arm.

    Parameters
    ----------
    tables : mapping of str to xarray.Dataset
        ``{arm: routing_table(trace)}`` (:func:`rlparity.metrics.routing.routing_table`).

    Returns
    -------
    plotly.graph_objects.Figure
        The share of tokens whose engine top-k set differs from the trainer's, per layer (not
        shown).
    """
    fig = go.Figure()
    for arm, t in tables.items():
        layers = [str(int(x)) for x in t["moe_layer"].values]
        fig.add_trace(go.Bar(x=layers, y=t["flip_rate"].values, name=arm, marker_color=arm_color(arm),
                             customdata=np.stack([t["n_flips"].values, t["n_tokens"].values], axis=1),
                             hovertemplate="layer %{x}: flip rate %{y:.4f} (%{customdata[0]} of %{customdata[1]} "
                                           "tokens)<extra>" + arm + "</extra>"))
    fig.update_layout(title="routing flips per MoE layer (engine's top-k set differs from the trainer's)",
                      xaxis_title="MoE layer (decoder layer index)", yaxis_title="share of tokens flipped",
                      barmode="group", legend_title="arm")
    return fig


def plot_margin_vs_mismatch(points: xr.Dataset, *, title: str = "") -> go.Figure:
    """Each token's smallest router margin against its mismatch ``|d|`` (nats), log-log.

    Flipped tokens are highlighted; with routing replay the flipped tokens are drawn again with the
    engine's routes forced.

    Parameters
    ----------
    points : xarray.Dataset
        :func:`rlparity.metrics.routing.token_points`: ``min_router_margin``, ``abs_d``,
        ``flipped`` and, with replay, ``abs_d_replay``.
    title : str, default ""
        The figure's title; empty: "router margin vs mismatch per token".

    Returns
    -------
    plotly.graph_objects.Figure
        The scatter (not shown).
    """
    m = points["min_router_margin"].values
    fig = go.Figure()
    flipped = points["flipped"].values.astype(bool)
    for sel, name, color in ((~flipped, "no flip", _NO_FLIP), (flipped, "routing flip", _FLIP)):
        fig.add_trace(go.Scattergl(x=m[sel], y=points["abs_d"].values[sel], mode="markers", name=name,
                                   marker={"size": 5 if name == "no flip" else 8, "color": color,
                                           "opacity": 0.5 if name == "no flip" else 0.9}))
    if "abs_d_replay" in points:
        fig.add_trace(go.Scattergl(x=m[flipped], y=points["abs_d_replay"].values[flipped], mode="markers",
                                   name="routing flip, routes replayed",
                                   marker={"size": 8, "color": _REPLAYED, "symbol": "x"}))
    fig.update_layout(title=title or "router margin vs mismatch per token", xaxis_title="trainer's smallest "
                      "router margin over the MoE layers (k-th minus (k+1)-th logit)", yaxis_title=_D,
                      xaxis_type="log", yaxis_type="log", legend_title="token")
    return fig


def plot_replay(summaries: Mapping[str, xr.Dataset]) -> go.Figure:
    """Mean ``|d|`` (nats) of flipped and unflipped tokens, with and without routing replay, per arm.

    Parameters
    ----------
    summaries : mapping of str to xarray.Dataset
        ``{arm: flip_summary(trace)}`` (:mod:`rlparity.metrics.routing`); arms without flips or
        without replay are left out.

    Returns
    -------
    plotly.graph_objects.Figure
        Grouped bars on a log axis (not shown).
    """
    fig = go.Figure()
    keys = (("abs_d_unflipped", "no flip", _NO_FLIP), ("abs_d_flipped", "routing flip", _FLIP),
            ("abs_d_flipped_replay", "routing flip, routes replayed", _REPLAYED))
    arms = [a for a, s in summaries.items() if "abs_d_flipped_replay" in s and int(s["n_flipped"]) > 0]
    for var, name, colour in keys:
        fig.add_trace(go.Bar(x=arms, y=[float(summaries[a][var]) for a in arms], name=name, marker_color=colour))
    fig.update_layout(title="routing replay (R3): the flipped tokens' mismatch with the engine's routes forced",
                      yaxis_title="mean " + _D, yaxis_type="log", barmode="group", legend_title="tokens")
    return fig


__all__ = ["plot_flip_rate_by_layer", "plot_margin_vs_mismatch", "plot_replay"]
