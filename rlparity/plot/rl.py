"""Figures of an online RL run: the curves of :func:`rlparity.metrics.rl.rl_curves`, one panel per
metric and one line per profile (plotly, interactive; returned, never shown)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from rlparity.plot.palette import color

DEFAULT_PANELS = ("reward", "kl_new_old", "clamp_log_ratio_new_old_indicator", "mean_ratio", "entropy", "ess",
                  "lag", "masked_fraction", "wall_s")
_REFERENCE_LINES = {"mean_ratio": 1.0, "ess": 1.0, "ratio_new_old": 1.0}
_DASH = {"pi_old": "solid", "mu": "dot"}


def _title(curves: xr.Dataset, var: str) -> str:
    units = curves[var].attrs.get("units")
    return f"{var} ({units})" if units and units != "1" else var


def plot_rl_curves(curves: xr.Dataset, variables: Sequence[str] | None = None, *, cols: int = 3,
                   height_per_row: int = 260) -> go.Figure:
    """The curves of an online RL run: one panel per metric, x = optimizer step, one line per run.

    Colour is the engine profile, the same in every panel; solid lines have the ratio denominator
    pi_old, dotted ones mu; click a legend entry to hide a run. Hover shows the run, step and value
    and names the metric's pair. Dashed grey lines mark 1 for ratios and ESS. Panel titles carry
    each variable's units (nats for logprob quantities).

    Parameters
    ----------
    curves : xarray.Dataset
        :func:`rlparity.metrics.rl.rl_curves` (dims ``profile`` and ``step``).
    variables : sequence of str, optional
        The metrics to draw; None: those of :data:`DEFAULT_PANELS` the curves hold.
    cols : int, default 3
        Panels per row (at most the number of variables).
    height_per_row : int, default 260
        Height of one row of panels, in pixels.

    Returns
    -------
    plotly.graph_objects.Figure
        The panels (not shown).

    Raises
    ------
    ValueError
        If a variable asked for is not in the curves, or there is no variable to draw.
    """
    variables = list(variables or [v for v in DEFAULT_PANELS if v in curves])
    missing = [v for v in variables if v not in curves]
    if missing:
        raise ValueError(f"no curve(s) {missing}; the curves hold {sorted(curves.data_vars)}")
    if not variables:
        raise ValueError("no variable to draw: pass variables=[...] from rlparity.metrics.rl.CURVE_VARIABLES")
    cols = max(1, min(cols, len(variables)))
    rows = math.ceil(len(variables) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[_title(curves, v) for v in variables],
                        horizontal_spacing=0.07, vertical_spacing=0.5 / rows if rows > 1 else 0.1)
    steps = curves["step"].values
    profiles = curves["profile"].values.tolist()
    engines = (curves["engine_profile"].values.tolist() if "engine_profile" in curves.coords else profiles)
    olds = curves["old_policy"].values.tolist() if "old_policy" in curves.coords else [""] * len(profiles)
    palette = {e: color(e) for e in dict.fromkeys(engines)}  # the shared palette: the same in every figure
    for i, var in enumerate(variables):
        r, c = i // cols + 1, i % cols + 1
        pair = curves[var].attrs.get("pair", "")
        for j, prof in enumerate(profiles):
            fig.add_trace(go.Scatter(
                x=steps, y=curves[var].sel(profile=prof).values, mode="lines+markers", name=prof,
                legendgroup=prof, showlegend=i == 0,
                line={"color": palette[engines[j]], "dash": _DASH.get(olds[j], "solid")},
                marker={"size": 5},
                hovertemplate=(f"{prof}<br>step %{{x}}: {var} = %{{y:.4g}}"
                               + (f"<br>{pair}" if pair else "") + "<extra></extra>")), row=r, col=c)
        if var in _REFERENCE_LINES:
            fig.add_hline(y=_REFERENCE_LINES[var], line_dash="dash", line_color="gray", row=r, col=c)
        fig.update_xaxes(title_text="step" if r == rows else None, row=r, col=c)
    loss = curves.attrs.get("loss", "")
    fig.update_layout(title=f"Online RL per engine profile ({loss}; backend pair d = log pi_old - log mu)",
                      height=height_per_row * rows + 120, legend={"orientation": "h", "y": -0.08})
    return fig


__all__ = ["DEFAULT_PANELS", "plot_rl_curves"]
