"""Figures of the objective layer. Each takes one kind of input, named in its signature (traces,
or a table from :mod:`rlparity.metrics.objective`, or the result of
:func:`rlparity.experiments.objective.correction_demo`) and returns a plotly Figure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from rlparity.config.defaults import TrainerSide
from rlparity.metrics import objective as ob
from rlparity.plot.palette import color
from rlparity.trace import as_arms


def plot_backend_vs_update_ratio(arms, trainer: TrainerSide | None = None, bins: int = 80) -> go.Figure:
    """Per-token log-ratios of the backend pair (log pi_old - log mu) and the update pair
    (log pi_theta - log pi_old), one panel each, every arm overlaid: the backend ratio should be
    a spike at 0 (parity); the update ratio is what the optimizer did."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("backend pair: log pi_old - log mu",
                                                        "update pair: log pi_theta - log pi_old"))
    for arm, ds in as_arms(arms).items():
        for col, pair in enumerate(("backend", "update"), start=1):
            if pair not in ob.available_pairs(ds, trainer):
                continue
            d = ob.pair_log_ratio(ds, pair, trainer).values
            v = d[np.isfinite(d)]
            fig.add_trace(go.Histogram(x=v, nbinsx=bins, name=f"{arm}: {pair}", opacity=0.6,
                                       legendgroup=arm, marker_color=color(arm)), row=1, col=col)
    fig.update_layout(barmode="overlay", title="Backend ratio vs update ratio (nats), kept apart",
                      legend_title="arm: pair")
    fig.update_yaxes(type="log", title_text="tokens")
    return fig


def plot_weights_truncation(trace: xr.Dataset, *, cap: float | None = None, trainer: TrainerSide | None = None,
                            bins: int = 60) -> go.Figure:
    """The backend importance weights pi_old/mu of one trace before and after token TIS at ``cap``
    (default :data:`~rlparity.metrics.objective.OBJECTIVE_DEFAULTS`), with the raw-weight ESS."""
    c = ob.OBJECTIVE_DEFAULTS.is_cap if cap is None else cap
    d = ob.pair_log_ratio(trace, "backend", trainer).values
    ok = ob.finite_tokens(d)
    raw = np.exp(d[ok])
    tis = np.minimum(raw, c)
    ess = ob.token_ess(d).value
    fig = go.Figure()
    fig.add_trace(go.Histogram(x=raw, nbinsx=bins, name="raw pi_old/mu", opacity=0.6))
    fig.add_trace(go.Histogram(x=tis, nbinsx=bins, name=f"truncated at C={c:g}", opacity=0.6))
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(barmode="overlay", title=f"{trace.attrs.get('arm', '')}: backend weights before/after "
                                               f"truncation (token ESS of the raw weights {ess:.3f})",
                      xaxis_title="weight pi_old/mu", yaxis_title="tokens")
    fig.update_yaxes(type="log")
    return fig


def plot_objective_summary(tables: Mapping[str, xr.Dataset],
                           variables: tuple[str, ...] = ("ess_token", "ess_sequence_geometric",
                                                         "masked_fraction_token_band",
                                                         "masked_fraction_geometric_band",
                                                         "token_clip_fraction")) -> go.Figure:
    """ESS, masked fractions and clip fraction per arm and pair (``tables``: ``{arm:
    objective_summary(trace)}``); one panel per variable."""
    fig = make_subplots(rows=1, cols=len(variables), subplot_titles=variables, shared_yaxes=True)
    for col, v in enumerate(variables, start=1):
        for arm, t in tables.items():
            if v not in t:
                continue
            fig.add_trace(go.Bar(x=[f"{arm}<br>{p}" for p in t["pair"].values], y=t[v].values, name=arm,
                                 showlegend=col == 1, legendgroup=arm, marker_color=color(arm),
                                 text=[f"{x:.3g}" for x in t[v].values], textposition="auto"), row=1, col=col)
    fig.update_layout(title="Importance-sampling health per arm and pair (ESS on raw weights)", barmode="group",
                      height=420, width=max(700, 260 * len(variables)))
    return fig


def plot_correction_demo(demo: Mapping[str, Any]) -> go.Figure:
    """What a correction applied to a raw-logprob trace does (``demo``: the result of
    :func:`rlparity.experiments.objective.correction_demo`): the ratio statistics before/after,
    the masked share, and the cosine of its policy-gradient direction with the parity update."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "mean ratio and clip fraction (backend pair)", "masked share", "gradient cosine with the parity update"))
    for name in ("before", "after"):
        fig.add_trace(go.Bar(x=["mean ratio - 1", "clip fraction"],
                             y=[demo[name]["mean_ratio"] - 1, demo[name]["clip_fraction"]],
                             name=f"raw trace, {'uncorrected' if name == 'before' else 'corrected'}"), row=1, col=1)
    fig.add_trace(go.Bar(x=["tokens", "sequences"], y=[demo["masked_fraction"]["tokens"],
                                                        demo["masked_fraction"]["sequences"]],
                         name="masked", showlegend=False), row=1, col=2)
    fig.add_trace(go.Bar(x=["raw, uncorrected", "raw, corrected"],
                         y=[demo["cosine_raw_uncorrected_vs_parity"], demo["cosine_raw_corrected_vs_parity"]],
                         name="cosine", showlegend=False,
                         text=[f"{demo['cosine_raw_uncorrected_vs_parity']:.3f}",
                               f"{demo['cosine_raw_corrected_vs_parity']:.3f}"], textposition="auto"), row=1, col=3)
    fig.update_yaxes(range=[0, 1.05], row=1, col=3)
    fig.update_layout(title="A correction makes the ratios look fixed, yet the update is not the parity update",
                      barmode="group", height=400)
    return fig


__all__ = ["plot_backend_vs_update_ratio", "plot_correction_demo", "plot_objective_summary",
           "plot_weights_truncation"]
