"""Figures of the inference-path ablation. Each takes one table computed by
:mod:`rlparity.metrics.ablation` and returns a plotly Figure (never shows it)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from rlparity.plot.palette import color

_NA = "#bbbbbb"


def plot_ablation_bars(table: xr.Dataset) -> go.Figure:
    """The one-knob ablation: one row per setting, three panels.

    Mean ``|d|`` against the trainer (nats; the reference arm's value dashed), max ``|d_ref|``
    against the reference arm (nats), and the share of sequences identical to the reference.
    Settings the platform could not run are drawn as hatched grey "not applicable" bars, their
    reason on hover.

    Parameters
    ----------
    table : xarray.Dataset
        :func:`rlparity.metrics.ablation.ablation_table`.

    Returns
    -------
    plotly.graph_objects.Figure
        Three panels of horizontal bars (not shown).
    """
    t = table
    reference = t.attrs.get("reference", "reference")
    names = t["setting"].values.tolist()
    ran = t["status"].values == "ran"
    labels = [f"{s} ({f}={v})" if f else s for s, f, v in zip(names, t["field"].values, t["value"].values)]
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.04, subplot_titles=(
        "mean |d| vs trainer (nats)", "max |d_ref| vs reference arm (nats)", "sequences identical to reference"))
    hover = [str(r) if not ok else "" for r, ok in zip(t["reason"].values, ran)]
    panels = (("trainer_abs_log_ratio_mean", "#1f77b4"), ("reference_abs_log_ratio_max", "#d62728"),
              ("reference_identical_sequences", "#2ca02c"))
    for col, (var, panel_color) in enumerate(panels, start=1):
        x = t[var].values.astype(float)
        fig.add_trace(go.Bar(
            y=labels, x=np.where(ran, x, np.nan), orientation="h", marker_color=panel_color,
            text=[f"{v:.3g}" if ok else "" for v, ok in zip(x, ran)], textposition="auto",
            name=var, showlegend=False, hovertemplate="%{y}: %{x:.4g}<extra>" + var + "</extra>"), row=1, col=col)
        # a setting that could not run here: a hatched grey bar across the panel, labelled, the reason on hover
        span = float(np.nanmax(np.where(ran, x, np.nan))) if ran.any() else 1.0
        fig.add_trace(go.Bar(
            y=labels, x=np.where(ran, np.nan, span or 1.0), orientation="h", marker_color=_NA,
            marker_pattern_shape="/", opacity=0.5, text=["not applicable" if not ok else "" for ok in ran],
            textposition="inside", insidetextanchor="start", textfont_color="black", customdata=hover,
            name="not applicable", showlegend=False,
            hovertemplate="%{y}: not applicable<br>%{customdata}<extra></extra>"), row=1, col=col)
    ref_gap = float(t["trainer_abs_log_ratio_mean"].sel(setting=reference))
    fig.add_vline(x=ref_gap, line_dash="dash", line_color="black", row=1, col=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"One setting changed at a time (reference arm: {reference}; hatched grey: not "
                            "applicable here, hover for why)", height=120 + 34 * len(names), bargap=0.25,
                      barmode="overlay", margin={"l": 10})
    return fig


def plot_reference_gap_by_position(table: xr.Dataset) -> go.Figure:
    """``|d_ref| = |log mu_arm - log mu_reference|`` (nats) by response position, one line per setting.

    Zero is drawn at 1e-9 on the log axis so bitwise-equal arms stay visible.

    Parameters
    ----------
    table : xarray.Dataset
        :func:`rlparity.metrics.ablation.reference_gap_by_position`.

    Returns
    -------
    plotly.graph_objects.Figure
        The lines (not shown).
    """
    fig = go.Figure()
    for name in table["setting"].values.tolist():
        y = table["reference_abs_log_ratio_mean"].sel(setting=name).values
        fig.add_trace(go.Scatter(x=table["position"].values, y=np.maximum(y, 1e-9), mode="lines+markers",
                                 name=name, line={"color": color(name)},
                                 hovertemplate="position %{x}: %{y:.3g} nats<extra>" + name + "</extra>"))
    fig.update_layout(title=f"Rollout logprobs against the reference arm ({table.attrs.get('reference')}), by position",
                      xaxis_title="response position", yaxis_title="mean |d_ref| (nats, 1e-9 = bitwise equal)",
                      yaxis_type="log")
    return fig


def plot_batch_composition(table: xr.Dataset) -> go.Figure:
    """Greedy output of one prompt by the size of the batch it ran in, per setting.

    Parameters
    ----------
    table : xarray.Dataset
        :func:`rlparity.metrics.ablation.batch_table`.

    Returns
    -------
    plotly.graph_objects.Figure
        Two panels: distinct outputs over batch sizes (1 = deterministic) and the logprob spread on
        their common prefix, in nats (not shown).
    """
    names = table["setting"].values.tolist()
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=(
        "distinct greedy outputs over batch sizes", "logprob spread on the common prefix (nats)"))
    fig.add_trace(go.Bar(y=names, x=table["distinct_outputs"].values, orientation="h", showlegend=False,
                         text=table["distinct_outputs"].values, textposition="auto"), row=1, col=1)
    fig.add_trace(go.Bar(y=names, x=table["logprob_spread"].values, orientation="h", showlegend=False,
                         text=[f"{v:.2g}" for v in table["logprob_spread"].values], textposition="auto"), row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    sizes = ", ".join(map(str, table.attrs.get("batch_sizes", [])))
    fig.update_layout(title=f"Batch composition: the same prompt at temperature 0 in batches of {sizes}",
                      height=120 + 34 * len(names))
    return fig


def plot_bisect_ranking(tables: dict[str, xr.Dataset]) -> go.Figure:
    """Bisect's knobs ranked by how far each moves the user's tokens, in units of the replay floor.

    One panel per table (e.g. the CPU and a GPU run), one horizontal bar per knob on a log axis
    (the dashed line is the floor: 1 unit), the share of the trainer gap each closes in the label
    where recorded. A knob that moved nothing (0 units: bitwise equal to the baseline replay) is
    drawn at 0.1 units and labelled 0; knobs that did not run are hatched grey, the reason on hover.

    Parameters
    ----------
    tables : dict of str to xarray.Dataset
        Panel title -> :func:`rlparity.metrics.replay.bisect_table`.

    Returns
    -------
    plotly.graph_objects.Figure
        The panels (not shown).
    """
    fig = make_subplots(rows=1, cols=len(tables), subplot_titles=[
        f"{title}: {t.attrs.get('mode')} replay, floor unit {t.attrs.get('unit'):.2g} nats"
        for title, t in tables.items()], horizontal_spacing=0.2)
    top = 1.0
    for col, t in enumerate(tables.values(), start=1):
        ran = t["status"].values == "ran"
        units = t["floor_units"].values.astype(float)
        explained = t["explained"].values.astype(float)
        top = max(top, float(np.nanmax(np.where(ran, units, np.nan), initial=1.0)))
        text = [("" if not ok else f"{u:.3g}" + (f", closes {e:.4g}" if np.isfinite(e) else ""))
                for u, e, ok in zip(units, explained, ran)]
        fig.add_trace(go.Bar(
            y=t["knob"].values, x=np.where(ran, np.maximum(units, 0.1), np.nan), orientation="h", text=text,
            textposition="auto", marker_color=color("pipelinerl-parity"), name="shift in floor units",
            showlegend=False, customdata=t["worst_token"].values,
            hovertemplate="%{y}: %{text} x floor<br>worst token %{customdata}<extra></extra>"), row=1, col=col)
        fig.add_trace(go.Bar(
            y=t["knob"].values, x=np.where(ran, np.nan, 1.0), orientation="h", marker_color=_NA,
            marker_pattern_shape="/", opacity=0.5, text=np.where(ran, "", t["status"].values),
            textposition="inside", insidetextanchor="start", textfont_color="black", customdata=t["reason"].values,
            name="did not run", showlegend=False, hovertemplate="%{y}: %{text}<br>%{customdata}<extra></extra>"),
            row=1, col=col)
        fig.add_vline(x=1.0, line_dash="dash", line_color="black", row=1, col=col)
    fig.update_xaxes(type="log", range=[-1.2, np.log10(top) + 0.6], title_text="shift (x replay floor)")
    fig.update_yaxes(autorange="reversed")
    n = max(t.sizes["knob"] for t in tables.values())
    fig.update_layout(title="Each knob flipped alone, on the capture's own tokens (dashed: the replay floor)",
                      height=140 + 30 * n, barmode="overlay", bargap=0.25, margin={"l": 10})
    return fig


__all__ = ["plot_ablation_bars", "plot_bisect_ranking", "plot_batch_composition", "plot_reference_gap_by_position"]
