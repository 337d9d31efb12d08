"""Figures of the LM-head precision matrix. Each takes one kind of input, named in its
signature: a table computed by :mod:`rlparity.metrics.head_precision` (``head_table``, ``gap_by_logit``,
``gap_by_position``) or the arms of a head-dtype matrix; each returns a plotly Figure (never shows
it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from rlparity.metrics.head_precision import dtype_order, head_cells, head_table, probability_pairs
from rlparity.plot.palette import color

_D = "d = log pi_old - log mu (nats)"
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
HEATMAP_VARIABLES = ("abs_log_ratio_rms", "abs_log_ratio_max", "prob_pearson", "clip_fraction")
_TITLES = {"abs_log_ratio_rms": "RMS of d (nats)", "abs_log_ratio_max": "max |d| (nats)",
           "abs_log_ratio_mean": "mean |d| (nats)", "mean_ratio": "mean pi_old/mu",
           "prob_pearson": "Pearson(pi_old, mu)", "clip_fraction": "clip fraction (eps 0.2)",
           "kl_k3": "k3 KL(mu||pi_old)"}


def _label(cell: tuple[str, str]) -> str:
    return f"rollout {_SHORT.get(cell[0], cell[0])} / trainer {_SHORT.get(cell[1], cell[1])}"


def plot_matrix_heatmap(table: xr.Dataset, variables: Sequence[str] | str = HEATMAP_VARIABLES) -> go.Figure:
    """The rollout x trainer head-dtype matrix as heatmaps, one panel per variable.

    Each cell is annotated with its value; two panels a row.

    Parameters
    ----------
    table : xarray.Dataset
        :func:`rlparity.metrics.head_precision.head_table` (dims ``rollout_head`` and
        ``trainer_head``).
    variables : str or sequence of str, default HEATMAP_VARIABLES
        The table variables to draw, one panel each (logprob quantities in nats).

    Returns
    -------
    plotly.graph_objects.Figure
        The heatmaps (not shown).

    Raises
    ------
    ValueError
        If a variable is not in the table.
    """
    variables = (variables,) if isinstance(variables, str) else tuple(variables)
    for v in variables:
        if v not in table:
            raise ValueError(f"{v!r} is not a head_table variable; choose from {sorted(table.data_vars)}")
    cols = min(2, len(variables))  # two panels a row: each keeps its cell labels readable in the book's column
    rows = -(-len(variables) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[_TITLES.get(v, v) for v in variables],
                        horizontal_spacing=0.16, vertical_spacing=0.22)
    x = [f"trainer {_SHORT.get(t, t)}" for t in table["trainer_head"].values]
    y = [f"rollout {_SHORT.get(r, r)}" for r in table["rollout_head"].values]
    for k, v in enumerate(variables):
        z = table[v].values.astype(float)
        text = [[("" if not np.isfinite(c) else f"{c:.4g}") for c in row] for row in z]
        scale = "Viridis_r" if v == "prob_pearson" else "Viridis"
        fig.add_trace(go.Heatmap(z=z, x=x, y=y, text=text, texttemplate="%{text}", colorscale=scale,
                                 showscale=False, hovertemplate="%{y}, %{x}: %{z:.6g}<extra>" + v + "</extra>"),
                      row=k // cols + 1, col=k % cols + 1)
    fig.update_layout(title=f"LM-head precision matrix ({table.attrs.get('direction', _D)}; "
                            f"body {table.attrs.get('body_dtype', 'pinned')} on both sides)",
                      height=120 + 260 * rows)
    return fig


def plot_probability_scatter(arms, *, max_points: int = 1500, trainer: str | None = None,
                             seed: int = 0) -> go.Figure:
    """Token probabilities, rollout mu against trainer pi_old, one panel per head-dtype cell.

    The correlation MiniMax-M1 reports; each panel's title gives the cell's Pearson correlation
    (:func:`~rlparity.metrics.head_precision.head_table`), each point is coloured by its ``|d|``
    (nats). A cell of the matrix that was not run is an empty panel titled "not run".

    Parameters
    ----------
    arms : mapping or sequence
        The arms of a head-dtype matrix (what
        :func:`rlparity.metrics.head_precision.head_cells` accepts).
    max_points : int, default 1500
        Tokens drawn per cell (a seeded subsample).
    trainer : str, optional
        The trainer reading (``"processed"`` or ``"raw"``); None: ``defaults().trainer``.
    seed : int, default 0
        Seed of the subsample.

    Returns
    -------
    plotly.graph_objects.Figure
        The grid of scatters (not shown).
    """
    cells = head_cells(arms)
    table = head_table({name: ds for name, ds in cells.values()}, trainer=trainer)
    rows, cols = dtype_order(k[0] for k in cells), dtype_order(k[1] for k in cells)
    titles = [f"{_label((r, t))}: Pearson {float(table['prob_pearson'].sel(rollout_head=r, trainer_head=t)):.5f}"
              if (r, t) in cells else f"{_label((r, t))}: not run" for r in rows for t in cols]
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


def plot_gap_by_logit(g: xr.Dataset) -> go.Figure:
    """RMS of d (nats) per bin of the trainer's largest logit, one line per head-dtype cell.

    A low-precision head's error grows with logit magnitude; cells with matching dtypes are solid,
    mixed ones dashed.

    Parameters
    ----------
    g : xarray.Dataset
        :func:`rlparity.metrics.head_precision.gap_by_logit`.

    Returns
    -------
    plotly.graph_objects.Figure
        The lines (not shown).
    """
    fig = go.Figure()
    x = g["logit_center"].values
    for r in g["rollout_head"].values:
        for t in g["trainer_head"].values:
            y = g["abs_log_ratio_rms"].sel(rollout_head=r, trainer_head=t).values
            if not np.isfinite(y).any():
                continue
            n = g["n_tokens"].sel(rollout_head=r, trainer_head=t).values
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=_label((r, t)),
                                     line={"dash": "solid" if r == t else "dash", "color": color(_label((r, t)))},
                                     customdata=n,
                                     hovertemplate="max logit %{x:.3g}: RMS d %{y:.4g} (%{customdata} tokens)"
                                                   "<extra></extra>"))
    fig.update_layout(title="log-ratio vs logit magnitude (quantile bins of the trainer's largest logit)",
                      xaxis_title="trainer's largest logit (bin centre)", yaxis_title="RMS of " + _D,
                      legend_title="cell")
    return fig


def plot_gap_by_position(g: xr.Dataset) -> go.Figure:
    """RMS of d (nats) per response position, one line per head-dtype cell.

    Parameters
    ----------
    g : xarray.Dataset
        :func:`rlparity.metrics.head_precision.gap_by_position`.

    Returns
    -------
    plotly.graph_objects.Figure
        The lines (not shown).
    """
    fig = go.Figure()
    for r in g["rollout_head"].values:
        for t in g["trainer_head"].values:
            y = g["abs_log_ratio_rms"].sel(rollout_head=r, trainer_head=t).values
            if not np.isfinite(y).any():
                continue
            fig.add_trace(go.Scatter(x=g["position"].values, y=y, mode="lines", name=_label((r, t)),
                                     line={"dash": "solid" if r == t else "dash", "color": color(_label((r, t)))}))
    fig.update_layout(title="log-ratio by response position", xaxis_title="response position",
                      yaxis_title="RMS of " + _D, legend_title="cell")
    return fig


__all__ = ["HEATMAP_VARIABLES", "plot_gap_by_logit", "plot_gap_by_position", "plot_matrix_heatmap",
           "plot_probability_scatter"]
