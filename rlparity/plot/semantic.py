"""Figures of the semantic layer. Each takes traces (one, ``{arm: trace}``, a store path) or a
metrics Dataset and returns a plotly Figure."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import xarray as xr

from rlparity.metrics import by_temperature, core, log_ratio
from rlparity.trace import as_arms

_D = "d = log pi_old - log mu (nats)"


def ratio_histogram(data, trainer: str = "processed", bins: int = 80, *, log_y: bool = True) -> go.Figure:
    """Histogram of the per-token log-ratio d for each arm; tokens with pi_old = 0 (d = -inf) are
    counted in the legend, not dropped silently."""
    fig = go.Figure()
    for arm, ds in as_arms(data).items():
        d = log_ratio(ds, trainer).values
        mask = ds["response_mask"].values.astype(bool)
        fin = core.finite_mask(d, mask)
        n_inf = int((mask & ~fin).sum())
        name = f"{arm} (mean ratio {core.mean_ratio(d, mask):.4f}" + (f", {n_inf} at pi_old=0)" if n_inf else ")")
        fig.add_trace(go.Histogram(x=d[fin], nbinsx=bins, name=name, opacity=0.6))
    fig.update_layout(barmode="overlay", title=f"per-token log-ratio vs the trainer's {trainer} logprob",
                      xaxis_title=_D, yaxis_title="tokens", legend_title="arm")
    if log_y:
        fig.update_yaxes(type="log")
    return fig


def offset_vs_temperature(data, trainer: str = "processed") -> go.Figure:
    """Mean d (with its RMS as error bar) against each request's temperature, one line per arm:
    flat at zero for processed logprobs, moving with temperature for raw ones."""
    fig = go.Figure()
    for arm, ds in as_arms(data).items():
        bt = ds if "temperature" in ds.dims else by_temperature(ds, trainer)  # type: ignore[arg-type]
        fig.add_trace(go.Scatter(x=bt["temperature"].values, y=bt["log_ratio_mean"].values,
                                 error_y={"type": "data", "array": bt["abs_log_ratio_rms"].values},
                                 mode="lines+markers", name=arm))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(title="mean log-ratio by temperature (error bar: RMS of d)",
                      xaxis_title="sampling temperature", yaxis_title="mean " + _D, legend_title="arm")
    return fig


def ratio_by_position(data, trainer: str = "processed") -> go.Figure:
    """Mean d and mean ``|d|`` per response position, one line per arm."""
    fig = go.Figure()
    for arm, ds in as_arms(data).items():
        d = log_ratio(ds, trainer).values
        m = core.finite_mask(d, ds["response_mask"].values.astype(bool))
        pos = ds["position"].values
        fig.add_trace(go.Scatter(x=pos, y=core.masked_mean(d, m, axis=0), mode="lines", name=f"{arm}: mean d"))
        fig.add_trace(go.Scatter(x=pos, y=core.masked_mean(np.abs(d), m, axis=0), mode="lines",
                                 line_dash="dash", name=f"{arm}: mean |d|"))
    fig.add_hline(y=0, line_dash="dot", line_color="grey")
    fig.update_layout(title="log-ratio by response position", xaxis_title="response position",
                      yaxis_title=_D, legend_title="arm / statistic")
    return fig


def zero_prob_map(data, trainer: str = "processed") -> go.Figure:
    """Where the tokens with pi_old = 0 are (sequence x position), per arm; empty arms are listed
    in the title so that "none" is visible too."""
    from rlparity.metrics import zero_prob_tokens

    fig = go.Figure()
    counts = []
    for arm, ds in as_arms(data).items():
        z = zero_prob_tokens(ds, trainer)  # type: ignore[arg-type]
        counts.append(f"{arm}: {z.sizes['token']}")
        fig.add_trace(go.Scatter(x=z["position_index"].values, y=z["sequence_index"].values, mode="markers",
                                 name=arm, text=[f"token {t}, rank {r}" for t, r in
                                                 zip(z["token_id"].values, z["trainer_token_rank"].values)]))
    fig.update_layout(title="tokens the trainer gives probability 0 (" + ", ".join(counts) + ")",
                      xaxis_title="response position", yaxis_title="sequence")
    return fig


def temperature_table(data, trainer: str = "processed") -> xr.Dataset:
    """``by_temperature`` of every arm stacked along a new ``arm`` dim (for tables)."""
    arms = as_arms(data)
    return xr.concat([by_temperature(ds, trainer) for ds in arms.values()],  # type: ignore[arg-type]
                     dim=xr.DataArray(list(arms), dims="arm", name="arm"), join="outer")


__all__ = ["offset_vs_temperature", "ratio_by_position", "ratio_histogram", "temperature_table",
           "zero_prob_map"]
