"""Figures of floors (:mod:`rlparity.metrics.floors`): each trainer shape's floor beside the backend
gap, and the floor between two shapes per position beside the gap there."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import plotly.graph_objects as go
import xarray as xr

from rlparity.metrics import core
from rlparity.metrics.floors import trainer_floor
from rlparity.metrics.summary import log_ratio
from rlparity.plot.palette import color
from rlparity.trace import arm_record


def plot_floor_table(tables: Mapping[str, xr.Dataset]) -> go.Figure:
    """Each trainer shape's floor beside the backend gap, one colour per run.

    One group of bars per trainer shape (mean ``|delta log p|`` against the reference shape, nats,
    log axis); the dashed line of each run is its backend gap (mean ``|d|``, nats) and the dotted one
    the engine's batch spread, when the table has it.

    Parameters
    ----------
    tables : mapping of str to xarray.Dataset
        ``{label: floor_table(...)}`` (:mod:`rlparity.metrics.floors`), one per run.

    Returns
    -------
    plotly.graph_objects.Figure
        The grouped bar chart (not shown).
    """
    fig = go.Figure()
    for label, t in tables.items():
        shapes = [s for s in t["shape"].values.tolist() if s != t.attrs.get("reference")]
        vals = np.maximum(t["floor_mean_abs"].sel(shape=shapes).values, 1e-12)
        share = t["share_of_gap"].sel(shape=shapes).values
        c = color(label)
        fig.add_trace(go.Bar(x=shapes, y=vals, name=label, marker_color=c, customdata=share,
                             hovertemplate="%{x}: %{y:.3g} nats (%{customdata:.0%} of the gap)<extra>" + label
                             + "</extra>"))
        gap = float(np.ravel(t["gap_mean_abs_d"].values)[0])  # one gap (a table read back may repeat it per shape)
        fig.add_hline(y=gap, line_dash="dash", line_color=c, annotation_text=f"gap {label}",
                      annotation_position="top left")
        eng = ((t.attrs.get("engine_floor") or {}).get("batch_shape") or {}).get("mean_abs")
        if eng:
            fig.add_hline(y=eng, line_dash="dot", line_color=c, annotation_text=f"engine batch {label}",
                          annotation_position="bottom right")
    fig.update_layout(title="The trainer's floor per shape (vs batch 1) beside the backend gap",
                      yaxis={"type": "log", "title": "mean |delta log p| (nats)"}, barmode="group",
                      xaxis={"title": "trainer shape"}, autosize=True, height=420)
    return fig


def plot_floor_by_position(a: xr.Dataset, b: xr.Dataset) -> go.Figure:
    """The floor between two rescorings per position, beside the backend gap there.

    Parameters
    ----------
    a : xarray.Dataset
        A trace rescored with one trainer shape; its backend gap (mean ``|d|`` over sequences,
        nats) is drawn dashed.
    b : xarray.Dataset
        The same rollout rescored with another trainer shape.

    Returns
    -------
    plotly.graph_objects.Figure
        Per position, the mean over sequences of ``|log pi_a - log pi_b|`` and the gap of ``a``, in
        nats on a log axis (not shown).
    """
    f = trainer_floor(a, b, dim="sequence")
    d = log_ratio(a).values
    gap = core.masked_mean(np.abs(d), a["response_mask"].values, axis=0)
    pos = f["position"].values if "position" in f.coords else np.arange(f.sizes["position"])
    fig = go.Figure([
        go.Scatter(x=pos, y=np.maximum(f["floor_mean_abs"].values, 1e-12), mode="lines+markers",
                   name="trainer floor (two shapes)", line={"color": color("trainer floor (two shapes)")},
                   hovertemplate="position %{x}: %{y:.3g} nats<extra></extra>"),
        go.Scatter(x=pos, y=gap, mode="lines", name="backend gap mean |d|",
                   line={"dash": "dash", "color": color("backend gap mean |d|")},
                   hovertemplate="position %{x}: %{y:.3g} nats<extra></extra>")])
    sa = arm_record(a).scorer.shape or {}
    sb = arm_record(b).scorer.shape or {}
    fig.update_layout(title=f"Floor per position: batch {sa.get('batch_size')} {sa.get('layout')} vs batch "
                            f"{sb.get('batch_size')} {sb.get('layout')}",
                      xaxis={"title": "response position"}, yaxis={"type": "log", "title": "nats"}, autosize=True,
                      height=380)
    return fig


__all__ = ["plot_floor_by_position", "plot_floor_table"]
