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
from rlparity.trace import arm_record, as_arms


def plot_backend_vs_update_ratio(arms, trainer: TrainerSide | None = None, bins: int = 80) -> go.Figure:
    """Per-token log-ratios (nats) of the backend pair and the update pair, one panel each.

    The backend pair is log pi_old - log mu, the update pair log pi_theta - log pi_old; every arm is
    overlaid. The backend ratio should be a spike at 0 (parity); the update ratio is what the
    optimizer did. An arm without a pair's readings is left out of that panel.

    Parameters
    ----------
    arms : xarray.Dataset, mapping or str
        One trace, ``{arm: trace}``, a DataTree or a store path (:func:`rlparity.trace.as_arms`).
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: ``defaults().trainer``.
    bins : int, default 80
        Histogram bins per arm and pair.

    Returns
    -------
    plotly.graph_objects.Figure
        Two panels of overlaid histograms, log y axis (not shown).
    """
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
    """The backend importance weights pi_old/mu of one trace, split at the cap C of token TIS.

    The weights above C (truncated to C) are drawn in their own colour; the title gives the share
    of tokens truncated and the token ESS of the raw weights.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with pi_old and mu.
    cap : float, optional
        The cap C; None: ``OBJECTIVE_DEFAULTS.is_cap``
        (:data:`~rlparity.metrics.objective.OBJECTIVE_DEFAULTS`).
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: ``defaults().trainer``.
    bins : int, default 60
        Histogram bins.

    Returns
    -------
    plotly.graph_objects.Figure
        The stacked histogram with C dashed and 1 (parity) dotted (not shown).
    """
    c = ob.OBJECTIVE_DEFAULTS.is_cap if cap is None else cap
    d = ob.pair_log_ratio(trace, "backend", trainer).values
    ok = ob.finite_tokens(d)
    raw = np.exp(d[ok])
    ess = ob.token_ess(d).value
    above = raw > c
    edges = np.linspace(float(raw.min()), float(max(raw.max(), c)), bins + 1)
    fig = go.Figure()
    for sel, name, colour in ((~above, "kept as is", "#4c78a8"), (above, f"truncated to C = {c:.3g}", "#e45756")):
        counts, _ = np.histogram(raw[sel], bins=edges)
        fig.add_trace(go.Bar(x=0.5 * (edges[1:] + edges[:-1]), y=counts, width=np.diff(edges), name=name,
                             marker_color=colour))
    fig.add_vline(x=c, line_dash="dash", line_color="#e45756")
    fig.add_vline(x=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(barmode="stack", bargap=0,
                      title=f"{arm_record(trace).arm or ''}: backend weights pi_old/mu<br>token TIS at C = {c:.3g} "
                            f"truncates {above.mean():.1%} of tokens (token ESS {ess:.3f})", height=420,
                      xaxis_title="weight pi_old/mu (a ratio: 1 = parity)", yaxis_title="tokens")
    fig.update_yaxes(type="log", dtick=1)
    return fig


_SUMMARY_LABELS = {"ess_token": "token ESS", "ess_sequence_geometric": "sequence ESS (geometric)",
                   "masked_fraction_token_band": "masked: token band",
                   "masked_fraction_geometric_band": "masked: geometric band", "token_clip_fraction": "PPO clip fraction"}


def plot_objective_summary(tables: Mapping[str, xr.Dataset],
                           variables: tuple[str, ...] = ("ess_token", "ess_sequence_geometric",
                                                         "masked_fraction_token_band",
                                                         "masked_fraction_geometric_band",
                                                         "token_clip_fraction")) -> go.Figure:
    """ESS, masked fractions and clip fraction per arm and pair, one panel per variable.

    Three panels to a row, the pairs on the x axis, one colour per arm; every variable is a share
    in [0, 1].

    Parameters
    ----------
    tables : mapping of str to xarray.Dataset
        ``{arm: objective_summary(trace)}`` (:mod:`rlparity.metrics.objective`).
    variables : tuple of str, optional
        The summary variables to draw; the default is token ESS, geometric sequence ESS, the two
        masked fractions and the PPO clip fraction. An arm whose table lacks a variable is left
        out of its panel.

    Returns
    -------
    plotly.graph_objects.Figure
        Grouped bars (not shown).
    """
    cols = min(3, len(variables))
    rows = -(-len(variables) // cols)
    fig = make_subplots(rows=rows, cols=cols, vertical_spacing=0.25, horizontal_spacing=0.08,
                        subplot_titles=[_SUMMARY_LABELS.get(v, v) for v in variables])
    for i, v in enumerate(variables):
        r, c = divmod(i, cols)
        for arm, t in tables.items():
            if v not in t:
                continue
            fig.add_trace(go.Bar(x=[str(p) for p in t["pair"].values], y=t[v].values, name=arm,
                                 showlegend=i == 0, legendgroup=arm, marker_color=color(arm),
                                 hovertemplate=f"{arm}, %{{x}}: %{{y:.4g}}<extra></extra>"), row=r + 1, col=c + 1)
        fig.update_yaxes(range=[0, 1.05], row=r + 1, col=c + 1)
    fig.update_layout(title="Importance-sampling health per arm and pair (ESS on raw weights; shares of tokens)",
                      barmode="group", template="plotly_white", height=260 * rows + 120, legend_title="arm")
    return fig


_BEFORE, _AFTER = "#9d9da1", "#4c78a8"


def plot_correction_demo(demo: Mapping[str, Any]) -> go.Figure:
    """What a correction applied to a raw-logprob trace does.

    Top row and the first panel of the second: verl's four health rules on the weights,
    uncorrected and corrected, each against its healthy range (shaded); then the share of tokens
    the cap truncates (and at verl's C = 2) and the mask drops; last, the cosine of the update's
    policy-gradient direction with the parity update's on the same samples: with pi_old
    recomputed and no correction the raw logprobs never enter the loss (cosine 1 by
    construction), the correction brings them in, and a ratio against mu (PipelineRL, prime-rl)
    has them in the update from the start.

    Parameters
    ----------
    demo : mapping
        The result of :func:`rlparity.experiments.objective.correction_demo`.

    Returns
    -------
    plotly.graph_objects.Figure
        Six panels (not shown).
    """
    rules = demo.get("health_rules") or {}
    lo, hi = rules.get("rollout_is_mean", (0.5, 2.0))
    panels = (("rollout_is_mean", f"weight mean ({lo:g} to {hi:g})", (lo, hi)),
              ("rollout_is_eff_sample_size", f"ESS (>= {rules.get('rollout_is_eff_sample_size_min', 0.3):g})",
               (rules.get("rollout_is_eff_sample_size_min", 0.3), 1.0)),
              ("rollout_is_std", f"weight std (<= {rules.get('rollout_is_std_max', 1.0):g})",
               (0.0, rules.get("rollout_is_std_max", 1.0))),
              ("chi2_token", f"chi2 per token (<= {rules.get('chi2_token_max', 1.0):g})",
               (0.0, rules.get("chi2_token_max", 1.0))))
    fig = make_subplots(rows=2, cols=3, vertical_spacing=0.22, horizontal_spacing=0.1,
                        subplot_titles=[p[1] for p in panels] + ["share of tokens", "cosine with the parity update"])
    cells = [(1, 1), (1, 2), (1, 3), (2, 1)]
    for (key, _, (a, b)), (r, c) in zip(panels, cells):
        vals = [demo["uncorrected_health"][key], demo["corrected_health"][key]]
        fig.add_trace(go.Bar(x=["uncorrected", "corrected"], y=vals, marker_color=[_BEFORE, _AFTER], showlegend=False,
                             text=[f"{v:.3g}" for v in vals], textposition="auto"), row=r, col=c)
        fig.add_hrect(y0=a, y1=b, fillcolor="#54a24b", opacity=0.25, line_width=0, layer="below", row=r, col=c)
        fig.update_yaxes(range=[0, max(b, *vals) * 1.15], row=r, col=c)
    cap = demo["correction"]["cap"]
    shares = {f"truncated at C={cap:.3g}": demo["truncated_fraction"],
              "truncated at C=2": demo["truncated_fraction_at_verl_cap"],
              "masked tokens": demo["masked_fraction"]["tokens"],
              "masked sequences": demo["masked_fraction"]["sequences"]}
    fig.add_trace(go.Bar(x=list(shares), y=list(shares.values()), marker_color=_AFTER, showlegend=False,
                         text=[f"{v:.1%}" for v in shares.values()], textposition="auto"), row=2, col=2)
    fig.update_yaxes(range=[0, max(0.05, *shares.values()) * 1.2], tickformat=".0%", row=2, col=2)
    cos = {"pi_old ratio, uncorrected": demo["cosine_raw_uncorrected_vs_parity"],
           "pi_old ratio, corrected": demo["cosine_raw_corrected_vs_parity"],
           "mu ratio, uncorrected": demo.get("cosine_raw_vs_parity_mu_denominator", float("nan"))}
    fig.add_trace(go.Bar(x=list(cos), y=list(cos.values()), marker_color=[_BEFORE, _AFTER, "#f58518"], showlegend=False,
                         text=[f"{v:.3f}" for v in cos.values()], textposition="auto"), row=2, col=3)
    fig.update_yaxes(range=[0, 1.05], row=2, col=3)
    fig.update_layout(title="Raw logprobs, corrected: verl's health rules (healthy range shaded) before and after,"
                            "<br>and the update it gives", template="plotly_white", height=640, margin={"t": 110})
    return fig


__all__ = ["plot_backend_vs_update_ratio", "plot_correction_demo", "plot_objective_summary",
           "plot_weights_truncation"]
