"""Mismatch metrics on traces: a thin xarray layer over :mod:`rlparity.metrics.core`.

Every metric names its pair and direction in its attrs: the backend pair is
``(pi_old, mu)`` = (trainer, rollout engine) and ``d = log pi_old - log mu``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import xarray as xr

from rlparity._provenance import make_attrs
from rlparity.metrics import core, objective
from rlparity.metrics.dashboard import DASHBOARDS, as_dashboard
from rlparity.trace import validate

TrainerSide = Literal["processed", "raw"]
TRAINER_VARIABLE = {"processed": "trainer_processed_logprob", "raw": "trainer_logprob"}


def trainer_variable(trainer: TrainerSide) -> str:
    if trainer not in TRAINER_VARIABLE:
        raise ValueError(f"trainer={trainer!r}; use 'processed' or 'raw'")
    return TRAINER_VARIABLE[trainer]


def log_ratio(trace: xr.Dataset, trainer: TrainerSide = "processed") -> xr.DataArray:
    """Per-token ``d = log pi_old - log mu`` (nats), NaN on padding, -inf where pi_old = 0."""
    validate(trace, require_trainer=True)
    var = trainer_variable(trainer)
    d = (trace[var] - trace["rollout_logprob"]).where(trace["response_mask"])
    d.name = "log_ratio"
    d.attrs = {"units": "nats", "pair": "backend (pi_old, mu)",
               "direction": f"{var} - rollout_logprob", "long_name": "log pi_old - log mu"}
    return d


def summary(trace: xr.Dataset, trainer: TrainerSide = "processed", eps: float = 0.2) -> xr.Dataset:
    """Parity summary of one trace: token stats of d, mean ratio, KL estimators, probability-0
    tokens, and the same broken down by sequence and position."""
    d_da = log_ratio(trace, trainer)
    d = d_da.values
    mask = trace["response_mask"].values.astype(bool)
    log_pi = trace[trainer_variable(trainer)].values
    log_mu = trace["rollout_logprob"].values
    stats = core.abs_stats(d, mask)
    data: dict[str, tuple] = {}
    scalar = {
        "log_ratio_mean": (stats["mean"], "mean of d over tokens"),
        "abs_log_ratio_mean": (stats["mean_abs"], "mean of |d|"),
        "abs_log_ratio_rms": (stats["rms"], "RMS of d"),
        "abs_log_ratio_max": (stats["max_abs"], "max of |d|"),
        "mean_ratio": (core.mean_ratio(d, mask), "mean of exp(d) = pi_old/mu"),
        "clip_fraction": (core.clip_fraction(d, mask, eps), f"share of tokens with pi_old/mu outside [1-{eps}, 1+{eps}]"),
        "ess_token": (core.ess(np.exp(d[core.finite_mask(d, mask)])), "normalised ESS of token weights pi_old/mu"),
        "n_tokens": (int(mask.sum()), "real response tokens"),
        "n_zero_prob": (int(core.zero_prob_count(log_pi, mask)), "tokens the trainer gives probability 0"),
    }
    for q in core.QUANTILES:
        key = f"q{int(q * 100):02d}"
        scalar[f"log_ratio_{key}"] = (stats[key], f"{q:.0%} quantile of d")
    for k, v in core.kl_estimators(d, mask).items():
        scalar[f"kl_{k}"] = (v, f"Schulman {k}, samples from mu, r = pi_old/mu"
                             + (" (estimates KL(mu||pi_old))" if k in ("k1", "k3") else ""))
    for k, v in core.prob_stats(log_pi, log_mu, mask).items():
        scalar[k] = (v, {"prob_diff_mean": "mean |pi_old - mu|", "prob_diff_max": "max |pi_old - mu|",
                         "prob_diff_std": "std |pi_old - mu|", "prob_pearson": "Pearson corr(pi_old, mu)"}[k])
    for k, (v, ln) in scalar.items():
        data[k] = ((), v, {"long_name": ln})
    seq = core.sequence_log_ratio(d, mask)
    data["log_ratio_mean_by_sequence"] = (("sequence",), seq["log_geometric_ratio"],
                                          {"units": "nats", "long_name": "mean_t d per sequence (log GSPO ratio)"})
    data["log_ratio_sum_by_sequence"] = (("sequence",), seq["log_product_ratio"],
                                         {"units": "nats", "long_name": "sum_t d per sequence (log product ratio)"})
    data["zero_prob_by_sequence"] = (("sequence",), core.zero_prob_count(log_pi, mask, axis=1), {})
    data["log_ratio_mean_by_position"] = (("position",), core.masked_mean(d, mask, axis=0),
                                          {"units": "nats", "long_name": "mean_i d per position"})
    data["abs_log_ratio_mean_by_position"] = (("position",), core.masked_mean(np.abs(d), mask, axis=0),
                                              {"units": "nats"})
    data["zero_prob_by_position"] = (("position",), core.zero_prob_count(log_pi, mask, axis=0), {})
    ds = xr.Dataset({k: xr.Variable(dims, np.asarray(v), attrs) for k, (dims, v, attrs) in data.items()},
                    coords={"sequence": trace["sequence"], "position": trace["position"]})
    ds.attrs = make_attrs(pair="backend (pi_old, mu)", direction=d_da.attrs["direction"],
                          trainer_side=trainer, arm=trace.attrs.get("arm", "default"), units="nats")
    return ds


_SCALAR_ORDER = ["n_tokens", "log_ratio_mean", "abs_log_ratio_mean", "abs_log_ratio_rms",
                 "abs_log_ratio_max", "log_ratio_q01", "log_ratio_q50", "log_ratio_q99", "mean_ratio",
                 "kl_k1", "kl_k3", "clip_fraction", "ess_token", "prob_pearson", "n_zero_prob"]


def format_summary(s: xr.Dataset, top: int = 5) -> str:
    """A readable text block of :func:`summary` (what ``rlparity summary`` prints)."""
    lines = [f"parity summary  arm={s.attrs.get('arm')}  pair={s.attrs['pair']}  "
             f"d = {s.attrs['direction']} (nats)"]
    for k in _SCALAR_ORDER:
        v = s[k].item()
        lines.append(f"  {k:<22} {v:>12.6g}   {s[k].attrs.get('long_name', '')}")
    zs = s["zero_prob_by_sequence"].values
    if zs.sum():
        idx = np.flatnonzero(zs)[:top]
        lines.append(f"  probability-0 tokens by sequence: {dict(zip(idx.tolist(), zs[idx].tolist()))}")
        zp = s["zero_prob_by_position"].values
        idp = np.flatnonzero(zp)[:top]
        lines.append(f"  probability-0 tokens by position: {dict(zip(idp.tolist(), zp[idp].tolist()))}")
    by_seq = s["log_ratio_mean_by_sequence"].values
    if np.isfinite(by_seq).any():
        worst = np.argsort(-np.nan_to_num(np.abs(by_seq)))[:top]
        lines.append("  worst sequences (mean d): " + ", ".join(f"{i}:{by_seq[i]:+.4f}" for i in worst))
    by_pos = s["log_ratio_mean_by_position"].values
    if by_pos.size:
        k = min(8, by_pos.size)
        lines.append("  mean d by position[:%d]: " % k + " ".join(f"{v:+.4f}" for v in by_pos[:k]))
    return "\n".join(lines)


def by_temperature(trace: xr.Dataset, trainer: TrainerSide = "processed") -> xr.Dataset:
    """Token stats of d grouped by each request's temperature (dim ``temperature``).

    The raw-mode signature: with ``raw_logprobs`` the mean of d moves with temperature (the
    engine reports ``log softmax(z)`` while the sampler drew from ``log softmax(z / T)``);
    with ``processed_logprobs`` it stays at zero for every temperature.
    """
    d = log_ratio(trace, trainer).values
    mask = trace["response_mask"].values.astype(bool)
    temps = trace["temperature"].values
    log_pi = trace[trainer_variable(trainer)].values
    kept = trace["trainer_log_kept_mass"].values if "trainer_log_kept_mass" in trace else None
    values = np.unique(temps)
    cols: dict[str, list[float]] = {k: [] for k in (
        "log_ratio_mean", "abs_log_ratio_rms", "mean_ratio", "n_tokens", "n_zero_prob", "log_kept_mass_mean")}
    for t in values:
        m = mask & (temps == t)[:, None]
        st = core.abs_stats(d, m)
        cols["log_ratio_mean"].append(st["mean"])
        cols["abs_log_ratio_rms"].append(st["rms"])
        cols["mean_ratio"].append(core.mean_ratio(d, m))
        cols["n_tokens"].append(int(m.sum()))
        cols["n_zero_prob"].append(int(core.zero_prob_count(log_pi, m)))
        cols["log_kept_mass_mean"].append(float(core.masked_mean(kept, m)) if kept is not None else np.nan)
    units = {"log_ratio_mean": "nats", "abs_log_ratio_rms": "nats", "log_kept_mass_mean": "nats"}
    ds = xr.Dataset({k: ("temperature", np.asarray(v), {"units": units[k]} if k in units else {})
                     for k, v in cols.items()}, coords={"temperature": values})
    ds.attrs = make_attrs(pair="backend (pi_old, mu)", direction=f"{trainer_variable(trainer)} - rollout_logprob",
                          trainer_side=trainer, arm=trace.attrs.get("arm", "default"), units="nats")
    return ds


def zero_prob_tokens(trace: xr.Dataset, trainer: TrainerSide = "processed") -> xr.Dataset:
    """Every token the trainer gives probability 0, one row each (dim ``token``): where it is,
    what was sampled, the rollout's logprob and the trainer's rank of it. Never averaged away."""
    log_pi = trace[trainer_variable(trainer)].values
    mask = trace["response_mask"].values.astype(bool)
    seq, pos = np.nonzero(mask & np.isneginf(log_pi))
    rank = trace["trainer_token_rank"].values[seq, pos] if "trainer_token_rank" in trace else np.full(seq.size, -1)
    ds = xr.Dataset({
        "sequence_index": ("token", seq.astype(np.int64)),
        "position_index": ("token", pos.astype(np.int64)),
        "token_id": ("token", trace["token_id"].values[seq, pos]),
        "rollout_logprob": ("token", trace["rollout_logprob"].values[seq, pos], {"units": "nats"}),
        "trainer_logprob": ("token", trace["trainer_logprob"].values[seq, pos], {"units": "nats"}),
        "trainer_token_rank": ("token", rank),
        "top_k": ("token", trace["top_k"].values[seq]),
        "top_p": ("token", trace["top_p"].values[seq]),
    }, coords={"token": np.arange(seq.size)})
    ds.attrs = make_attrs(trainer_side=trainer, arm=trace.attrs.get("arm", "default"),
                          long_name="tokens the trainer gives probability 0")
    return ds


__all__ = ["DASHBOARDS", "as_dashboard", "by_temperature", "core", "format_summary", "log_ratio", "objective",
           "summary", "trainer_variable", "zero_prob_tokens"]
