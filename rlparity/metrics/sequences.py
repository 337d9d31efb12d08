"""Sequence-level views of the backend pair: how many tokens, and how many whole sequences, sit
inside ratio bands; the share far off (``|d| > ln 2``, the ratio outside ``[1/2, 2]``); the mean
``|d|`` of each sequence; the tokens with the largest KL.

The pair is (pi_old, mu): ``d = log pi_old - log mu`` (nats), ``rho = exp(d)``. A real token
whose ``d`` is not finite (a side gives it probability 0) lies outside every band and above
``ln 2``, and is counted in ``n_zero_prob``; a sequence is inside a band when every one of its
real tokens is. The per-token KL is Schulman's ``k3 = rho - 1 - d`` (samples from mu: it
estimates KL(mu || pi_old)).

Layers: a numpy core on ``d`` with response positions along ``axis`` (:func:`band_shares`,
:func:`sequence_mean_abs`, :func:`top_kl`) and an xarray layer on a scored trace
(:func:`sequence_view`, :func:`top_kl_tokens`). The bands default to ``defaults().ratio_bands``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.metrics.objective import finite_tokens, policy_logprob, real_tokens
from rlparity.metrics.summary import trainer_side

LN2 = math.log(2.0)


def _bands(bands: Mapping[str, tuple[float, float]] | None) -> dict[str, tuple[float, float]]:
    b = dict(defaults().ratio_bands if bands is None else bands)
    for name, (lo, hi) in b.items():
        if not 0 < lo <= 1 <= hi:
            raise ValueError(f"ratio band {name!r} = ({lo}, {hi}) must hold 1 with 0 < low <= 1 <= high")
    return b


def band_shares(d: np.ndarray, mask: np.ndarray | None = None, *,
                bands: Mapping[str, tuple[float, float]] | None = None, axis: int = -1) -> dict[str, Any]:
    """Shares of tokens and of whole sequences inside each ratio band, and far off.

    Parameters
    ----------
    d : numpy.ndarray
        ``log pi_old - log mu`` per token (nats), response positions along ``axis``.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    bands : Mapping[str, tuple of float], optional
        ``{name: (low, high)}`` on ``rho`` (default ``defaults().ratio_bands``).
    axis : int, default -1
        The axis of response positions.

    Returns
    -------
    dict
        ``token_share`` and ``sequence_share`` (``{band: share}``), ``above_ln2_token_share``,
        ``above_ln2_sequence_share`` (sequences with at least one such token), ``n_tokens``,
        ``n_sequences`` (with a real token), ``n_zero_prob``; NaN shares where nothing is counted.
    """
    d = np.asarray(d, dtype=float)
    real = real_tokens(d, mask)
    fin = finite_tokens(d, mask)
    n_tok = int(real.sum())
    has = real.any(axis=axis)
    n_seq = int(has.sum())
    r = np.exp(np.where(fin, d, 0.0))

    def shares(hit: np.ndarray) -> tuple[float, float]:
        tok = float((hit & real).sum() / n_tok) if n_tok else float("nan")
        whole = (hit | ~real).all(axis=axis) & has
        return tok, float(whole.sum() / n_seq) if n_seq else float("nan")

    token_share, sequence_share = {}, {}
    for name, (lo, hi) in _bands(bands).items():
        token_share[name], sequence_share[name] = shares(fin & (r >= lo) & (r <= hi))
    far = real & ~(fin & (np.abs(np.where(fin, d, 0.0)) <= LN2))
    return {"token_share": token_share, "sequence_share": sequence_share,
            "above_ln2_token_share": float(far.sum() / n_tok) if n_tok else float("nan"),
            "above_ln2_sequence_share": float((far.any(axis=axis) & has).sum() / n_seq) if n_seq else float("nan"),
            "n_tokens": n_tok, "n_sequences": n_seq, "n_zero_prob": int((real & ~fin).sum())}


def sequence_mean_abs(d: np.ndarray, mask: np.ndarray | None = None, *, axis: int = -1) -> np.ndarray:
    """Mean ``|d|`` of each sequence over its real tokens with a finite ``d`` (NaN: none).

    Parameters
    ----------
    d : numpy.ndarray
        ``log pi_old - log mu`` per token (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    axis : int, default -1
        The axis of response positions (reduced).

    Returns
    -------
    numpy.ndarray
        One value per sequence (nats).
    """
    d = np.asarray(d, dtype=float)
    fin = finite_tokens(d, mask)
    n = fin.sum(axis=axis)
    s = np.where(fin, np.abs(np.where(fin, d, 0.0)), 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s / np.maximum(n, 1), np.nan)


def top_kl(d: np.ndarray, mask: np.ndarray | None = None, *, n: int | None = None) -> list[tuple[int, int, float, float]]:
    """The ``n`` tokens of a ``(sequence, position)`` array with the largest ``k3 = rho - 1 - d``.

    Parameters
    ----------
    d : numpy.ndarray
        ``log pi_old - log mu``, dims ``(sequence, position)`` (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    n : int, optional
        How many (default ``defaults().top_tokens``).

    Returns
    -------
    list of (sequence, position, d, k3)
        Largest ``k3`` first; a token with a non-finite ``d`` comes first with ``k3 = inf``.
    """
    d = np.asarray(d, dtype=float)
    if d.ndim != 2:
        raise ValueError(f"d has {d.ndim} dims; give (sequence, position)")
    real = real_tokens(d, mask)
    fin = finite_tokens(d, mask)
    with np.errstate(over="ignore", invalid="ignore"):
        k3 = np.where(fin, np.expm1(np.where(fin, d, 0.0)) - np.where(fin, d, 0.0), np.inf)
    k3 = np.where(real, k3, -np.inf)
    n = defaults().top_tokens if n is None else int(n)
    flat = np.argsort(-k3, axis=None, kind="stable")[: min(n, int(real.sum()))]
    seq, pos = np.unravel_index(flat, d.shape)
    return [(int(i), int(t), float(d[i, t]), float(k3[i, t])) for i, t in zip(seq, pos)]


def backend_log_ratio(trace: xr.Dataset, trainer: TrainerSide | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """``d = log pi_old - log mu`` of a scored trace (NaN on padding), its response mask and the
    trainer side read (:func:`rlparity.metrics.summary.trainer_side`).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored trace.
    trainer : {"processed", "raw"}, optional
        The trainer reading that is pi_old.

    Returns
    -------
    tuple of (numpy.ndarray, numpy.ndarray, str)
        ``d`` (sequence, position), the mask, the side.
    """
    side = trainer_side(trace, trainer)
    mask = trace["response_mask"].values.astype(bool)
    with np.errstate(invalid="ignore"):
        d = policy_logprob(trace, "old", side) - policy_logprob(trace, "mu", side)
    return np.where(mask, d, np.nan), mask, side


def sequence_view(trace: xr.Dataset, *, trainer: TrainerSide | None = None,
                  bands: Mapping[str, tuple[float, float]] | None = None) -> xr.Dataset:
    """The sequence-level view of one scored trace (one step).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored trace (pi_old and mu).
    trainer : {"processed", "raw"}, optional
        The trainer reading that is pi_old (default :func:`rlparity.metrics.summary.trainer_side`).
    bands : Mapping[str, tuple of float], optional
        Ratio bands (default ``defaults().ratio_bands``).

    Returns
    -------
    xarray.Dataset
        ``token_share`` and ``sequence_share`` (dim ``band``, coords ``band_low`` / ``band_high``),
        ``above_ln2_token_share``, ``above_ln2_sequence_share``, ``sequence_mean_abs_log_ratio``
        (dim ``sequence``, nats); the pair, the counts and the rules in attrs.
    """
    d, mask, side = backend_log_ratio(trace, trainer)
    b = _bands(bands)
    s = band_shares(d, mask, bands=b)
    names = list(b)
    band_coords = {"band": names, "band_low": ("band", [b[k][0] for k in names]),
                   "band_high": ("band", [b[k][1] for k in names])}
    return xr.Dataset(
        {"token_share": ("band", [s["token_share"][k] for k in names],
                         {"long_name": "share of real tokens with rho = pi_old/mu in the band"}),
         "sequence_share": ("band", [s["sequence_share"][k] for k in names],
                            {"long_name": "share of sequences whose every real token has rho in the band"}),
         "above_ln2_token_share": ((), s["above_ln2_token_share"], {"long_name": "share of tokens with |d| > ln 2"}),
         "above_ln2_sequence_share": ((), s["above_ln2_sequence_share"],
                                      {"long_name": "share of sequences with a token of |d| > ln 2"}),
         "sequence_mean_abs_log_ratio": (("sequence",), sequence_mean_abs(d, mask),
                                         {"long_name": "mean |d| of the sequence", "units": "nats"})},
        coords={**band_coords, "sequence": trace["sequence"].values},
        attrs={"pair": "backend", "direction": f"d = log pi_old ({side} trainer reading) - log mu", "units": "nats",
               "n_tokens": s["n_tokens"], "n_sequences": s["n_sequences"], "n_zero_prob": s["n_zero_prob"],
               "zero_prob_rule": "a token a side gives probability 0 is outside every band and above ln 2"})


def top_kl_tokens(trace: xr.Dataset, *, n: int | None = None, trainer: TrainerSide | None = None,
                  decode: Callable[[list[int]], str] | None = None) -> list[dict[str, Any]]:
    """The tokens of one scored trace with the largest ``k3``, with their text when ``decode`` is given.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored trace.
    n : int, optional
        How many (default ``defaults().top_tokens``).
    trainer : {"processed", "raw"}, optional
        The trainer reading that is pi_old.
    decode : callable, optional
        ``token ids -> text`` (e.g. a tokenizer's ``decode``); None: no text.

    Returns
    -------
    list of dict
        ``sequence``, ``position``, ``token_id``, ``d`` (nats), ``k3`` (nats), ``mu`` and ``pi_old``
        (probabilities), ``text`` (None without ``decode``).
    """
    d, mask, side = backend_log_ratio(trace, trainer)
    log_mu = policy_logprob(trace, "mu", side)
    ids = trace["token_id"].values
    rows = []
    for i, t, di, k in top_kl(d, mask, n=n):
        tok = int(ids[i, t])
        rows.append({"sequence": i, "position": t, "token_id": tok, "d": di, "k3": k,
                     "mu": float(np.exp(log_mu[i, t])), "pi_old": float(np.exp(log_mu[i, t] + di)),
                     "text": None if decode is None else decode([tok])})
    return rows


__all__ = ["LN2", "backend_log_ratio", "band_shares", "sequence_mean_abs", "sequence_view", "top_kl", "top_kl_tokens"]
