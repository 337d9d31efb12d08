"""Figures of the LM-head precision experiment. Each takes the arms of a head-dtype matrix
(``{arm: trace}``, a DataTree or a store path) or a table computed by
:mod:`rlparity.experiments.head`, and returns a plotly Figure (never shows it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from rlparity.experiments.head import (
    _cells,
    _order,
    gap_by_logit,
    gap_by_position,
    head_table,
    probability_pairs,
)
from rlparity.trace import as_arms

_D = "d = log pi_old - log mu (nats)"
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
HEATMAP_VARIABLES = ("abs_log_ratio_rms", "abs_log_ratio_max", "prob_pearson", "clip_fraction")
_TITLES = {"abs_log_ratio_rms": "RMS of d (nats)", "abs_log_ratio_max": "max |d| (nats)",
           "abs_log_ratio_mean": "mean |d| (nats)", "mean_ratio": "mean pi_old/mu",
           "prob_pearson": "Pearson(pi_old, mu)", "clip_fraction": "clip fraction (eps 0.2)",
           "kl_k3": "k3 KL(mu||pi_old)"}


def _label(cell: tuple[str, str]) -> str:
    return f"rollout {_SHORT.get(cell[0], cell[0])} / trainer {_SHORT.get(cell[1], cell[1])}"


def _table(data) -> xr.Dataset:
    return data if isinstance(data, xr.Dataset) and "rollout_head" in data.dims else head_table(data)


def matrix_heatmap(data, variables: Sequence[str] | str = HEATMAP_VARIABLES) -> go.Figure:
    """The rollout x trainer head-dtype matrix as heatmaps, one panel per variable, each cell
    annotated with its value (``data``: arms or a :func:`head_table`)."""
    table = _table(data)
    variables = (variables,) if isinstance(variables, str) else tuple(variables)
    for v in variables:
        if v not in table:
            raise ValueError(f"{v!r} is not a head_table variable; choose from {sorted(table.data_vars)}")
    fig = make_subplots(rows=1, cols=len(variables), subplot_titles=[_TITLES.get(v, v) for v in variables],
                        horizontal_spacing=0.08)
    x = [f"trainer {_SHORT.get(t, t)}" for t in table["trainer_head"].values]
    y = [f"rollout {_SHORT.get(r, r)}" for r in table["rollout_head"].values]
    for k, v in enumerate(variables, start=1):
        z = table[v].values.astype(float)
        text = [[("" if not np.isfinite(c) else f"{c:.4g}") for c in row] for row in z]
        scale = "Viridis_r" if v == "prob_pearson" else "Viridis"
        fig.add_trace(go.Heatmap(z=z, x=x, y=y, text=text, texttemplate="%{text}", colorscale=scale,
                                 showscale=False, hovertemplate="%{y}, %{x}: %{z:.6g}<extra>" + v + "</extra>"),
                      row=1, col=k)
    fig.update_layout(title=f"LM-head precision matrix ({table.attrs.get('direction', _D)}; "
                            f"body {table.attrs.get('body_dtype', 'pinned')} on both sides)",
                      height=330, width=max(420, 300 * len(variables)))
    return fig


def probability_scatter(data, *, max_points: int = 1500, trainer: str = "processed", seed: int = 0) -> go.Figure:
    """Token probabilities, rollout mu against trainer pi_old, one panel per cell (the
    correlation MiniMax-M1 reports); ``max_points`` tokens per cell (seeded subsample)."""
    cells = _cells(as_arms(data))
    rows, cols = _order(k[0] for k in cells), _order(k[1] for k in cells)
    titles = []
    for r in rows:
        for t in cols:
            if (r, t) in cells:
                p = probability_pairs(cells[(r, t)][1], trainer=trainer)
                m = np.isfinite(p["pi"]) & np.isfinite(p["mu"])
                corr = np.corrcoef(p["pi"][m], p["mu"][m])[0, 1] if m.sum() > 1 else np.nan
                titles.append(f"{_label((r, t))}: Pearson {corr:.5f}")
            else:
                titles.append(f"{_label((r, t))}: not run")
    fig = make_subplots(rows=len(rows), cols=len(cols), subplot_titles=titles, shared_xaxes=True,
                        shared_yaxes=True, horizontal_spacing=0.06, vertical_spacing=0.1)
    for i, r in enumerate(rows, start=1):
        for j, t in enumerate(cols, start=1):
            if (r, t) not in cells:
                continue
            p = probability_pairs(cells[(r, t)][1], trainer=trainer, max_points=max_points, seed=seed)
            fig.add_trace(go.Scattergl(x=p["mu"], y=p["pi"], mode="markers", name=_label((r, t)),
                                       marker={"size": 4, "opacity": 0.5, "color": p["abs_log_ratio"],
                                               "colorscale": "Viridis", "cmin": 0,
                                               "showscale": (i, j) == (1, len(cols)),
                                               "colorbar": {"title": "|d| (nats)"}},
                                       customdata=np.stack([p["abs_log_ratio"], p["max_logit"]], axis=1),
                                       hovertemplate="mu %{x:.5f}<br>pi_old %{y:.5f}<br>|d| %{customdata[0]:.4g}"
                                                     "<br>max logit %{customdata[1]:.3g}<extra></extra>"),
                          row=i, col=j)
            fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line={"dash": "dot", "color": "grey"},
                                     showlegend=False, hoverinfo="skip"), row=i, col=j)
            fig.update_xaxes(title_text="rollout probability mu" if i == len(rows) else None, row=i, col=j)
            fig.update_yaxes(title_text="trainer probability pi_old" if j == 1 else None, row=i, col=j)
    fig.update_layout(title="sampled-token probability: rollout engine vs trainer, per head-dtype cell",
                      showlegend=False, height=380 * len(rows), width=420 * len(cols) + 80)
    return fig


def error_vs_logit(data, *, n_bins: int = 8, trainer: str = "processed") -> go.Figure:
    """RMS of d per bin of the trainer's largest logit, one line per cell (``data``: arms or a
    :func:`gap_by_logit` Dataset). A low-precision head's error grows with logit magnitude."""
    g = data if isinstance(data, xr.Dataset) and "logit_bin" in data.dims else gap_by_logit(data, n_bins=n_bins,
                                                                                          trainer=trainer)
    fig = go.Figure()
    x = g["logit_center"].values
    for r in g["rollout_head"].values:
        for t in g["trainer_head"].values:
            y = g["abs_log_ratio_rms"].sel(rollout_head=r, trainer_head=t).values
            if not np.isfinite(y).any():
                continue
            n = g["n_tokens"].sel(rollout_head=r, trainer_head=t).values
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=_label((r, t)),
                                     line={"dash": "solid" if r == t else "dash"}, customdata=n,
                                     hovertemplate="max logit %{x:.3g}: RMS d %{y:.4g} (%{customdata} tokens)"
                                                   "<extra></extra>"))
    fig.update_layout(title="log-ratio vs logit magnitude (quantile bins of the trainer's largest logit)",
                      xaxis_title="trainer's largest logit (bin centre)", yaxis_title="RMS of " + _D,
                      legend_title="cell")
    return fig


def error_by_position(data, *, trainer: str = "processed") -> go.Figure:
    """RMS of d per response position, one line per cell (``data``: arms or a
    :func:`gap_by_position` Dataset)."""
    g = data if isinstance(data, xr.Dataset) and "position" in data.dims and "rollout_head" in data.dims \
        else gap_by_position(data, trainer=trainer)
    fig = go.Figure()
    for r in g["rollout_head"].values:
        for t in g["trainer_head"].values:
            y = g["abs_log_ratio_rms"].sel(rollout_head=r, trainer_head=t).values
            if not np.isfinite(y).any():
                continue
            fig.add_trace(go.Scatter(x=g["position"].values, y=y, mode="lines", name=_label((r, t)),
                                     line={"dash": "solid" if r == t else "dash"}))
    fig.update_layout(title="log-ratio by response position", xaxis_title="response position",
                      yaxis_title="RMS of " + _D, legend_title="cell")
    return fig


__all__ = ["HEATMAP_VARIABLES", "error_by_position", "error_vs_logit", "matrix_heatmap", "probability_scatter"]
