"""Figures of the inference-path ablation. Each takes the arms of an ablation store (``{arm:
trace}``, a DataTree or a store path) or a table computed by :mod:`rlparity.experiments.ablation`
and returns a plotly Figure (never shows it)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from rlparity.experiments.ablation import REFERENCE, ablation_table, batch_table, reference_log_ratio
from rlparity.trace import as_arms

_NA = "#bbbbbb"


def _table(data) -> xr.Dataset:
    return data if isinstance(data, xr.Dataset) and "setting" in data.dims and "status" in data else \
        ablation_table(data)


def ablation_bars(data) -> go.Figure:
    """One row per setting, three panels: mean ``|d|`` against the trainer (the reference arm's
    value dashed), max ``|d_ref|`` against the reference arm, and the share of sequences identical to the
    reference. Settings the platform could not run are listed with their reason (hover)."""
    t = _table(data)
    names = t["setting"].values.tolist()
    ran = t["status"].values == "ran"
    labels = [f"{s} ({f}={v})" if f else s for s, f, v in zip(names, t["field"].values, t["value"].values)]
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.04, subplot_titles=(
        "mean |d| vs trainer (nats)", "max |d_ref| vs reference arm (nats)", "sequences identical to reference"))
    hover = [str(r) if not ok else "" for r, ok in zip(t["reason"].values, ran)]
    panels = (("trainer_abs_log_ratio_mean", "#1f77b4"), ("reference_abs_log_ratio_max", "#d62728"),
              ("reference_identical_sequences", "#2ca02c"))
    for col, (var, color) in enumerate(panels, start=1):
        x = t[var].values.astype(float)
        fig.add_trace(go.Bar(
            y=labels, x=np.where(ran, x, 0.0), orientation="h", marker_color=[color if ok else _NA for ok in ran],
            text=[f"{v:.3g}" if ok else "not applicable" for v, ok in zip(x, ran)], textposition="auto",
            customdata=hover, name=var, showlegend=False,
            hovertemplate="%{y}: %{x:.4g}<br>%{customdata}<extra>" + var + "</extra>"), row=1, col=col)
    ref_gap = float(t["trainer_abs_log_ratio_mean"].sel(setting=REFERENCE))
    fig.add_vline(x=ref_gap, line_dash="dash", line_color="black", row=1, col=1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title="One setting changed at a time (reference: "
                            f"{t.attrs.get('reference', REFERENCE)}; grey: not applicable here, hover for why)",
                      height=120 + 34 * len(names), bargap=0.25, margin={"l": 10})
    return fig


def reference_gap_by_position(data, settings=None) -> go.Figure:
    """``|d_ref| = |log mu_arm - log mu_reference|`` by response position, one line per ran setting,
    on the tokens both arms sampled identically (mean over sequences; zero is drawn at 1e-9 on
    the log axis so bitwise-equal arms stay visible)."""
    arms = as_arms(data)
    ref = arms[REFERENCE]
    fig = go.Figure()
    for name, tr in arms.items():
        if name == REFERENCE or (settings is not None and name not in settings):
            continue
        d = reference_log_ratio(tr, ref)
        with np.errstate(invalid="ignore"):
            mean = np.nanmean(np.abs(d), axis=0) if np.isfinite(d).any() else np.full(d.shape[1], np.nan)
        fig.add_trace(go.Scatter(x=np.arange(d.shape[1]), y=np.maximum(mean, 1e-9), mode="lines+markers",
                                 name=name, hovertemplate="position %{x}: %{y:.3g} nats<extra>" + name + "</extra>"))
    fig.update_layout(title="Rollout logprobs against the reference arm, by position",
                      xaxis_title="response position", yaxis_title="mean |d_ref| (nats, 1e-9 = bitwise equal)",
                      yaxis_type="log")
    return fig


def batch_composition(data) -> go.Figure:
    """Greedy output of one prompt by the size of the batch it ran in, per setting: distinct
    outputs (1 = deterministic) and the logprob spread on their common prefix."""
    bt = data if isinstance(data, xr.Dataset) and "distinct_outputs" in data else batch_table(data)
    names = bt["setting"].values.tolist()
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=(
        "distinct greedy outputs over batch sizes", "logprob spread on the common prefix (nats)"))
    fig.add_trace(go.Bar(y=names, x=bt["distinct_outputs"].values, orientation="h", showlegend=False,
                         text=bt["distinct_outputs"].values, textposition="auto"), row=1, col=1)
    fig.add_trace(go.Bar(y=names, x=bt["logprob_spread"].values, orientation="h", showlegend=False,
                         text=[f"{v:.2g}" for v in bt["logprob_spread"].values], textposition="auto"), row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title="Batch composition: the same prompt at temperature 0 in batches of "
                            f"{', '.join(map(str, _sizes(data)))}", height=120 + 34 * len(names))
    return fig


def _sizes(data) -> list[int]:
    if isinstance(data, xr.Dataset):
        return data.attrs.get("batch_sizes", [])
    for tr in as_arms(data).values():
        if "batch_size" in tr.coords:
            return tr["batch_size"].values.tolist()
    return []


__all__ = ["ablation_bars", "batch_composition", "reference_gap_by_position"]
