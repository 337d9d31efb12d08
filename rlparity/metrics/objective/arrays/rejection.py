"""Rejection masks: which tokens a rule keeps (a ratio band, a KL estimator's bound: verl's
``rollout_rs``), and the share of tokens or sequences it rejects."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlparity.config.defaults import Level
from rlparity.metrics.objective.settings import BAND_RULES, KL_RULES, OBJECTIVE_DEFAULTS, RULES, Kind
from rlparity.metrics.objective.arrays.tokens import (
    ValueWithCounts,
    _share,
    finite_tokens,
    real_tokens,
    share_of,
    share_parts,
)
from rlparity.metrics.objective.arrays.weights import importance_weights


def band_keep(d: np.ndarray, mask: np.ndarray | None = None, *, band: tuple[float, float],
              level: Level = "token", kind: Kind = "geometric", axis: int = -1) -> np.ndarray:
    """Rejection by a ratio band: keep a usable token whose ``rho`` (``level="token"``), or every
    token of a sequence whose product / geometric ratio (``"sequence"``), lies in ``band``. Excluded
    tokens and padding are never kept.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    band : tuple of float
        ``(low, high)`` on the ratio.
    level : {"token", "sequence"}
        Token ratio, or the sequence's ratio on each of its tokens.
    kind : {"product", "geometric"}
        The sequence ratio: ``sum_t d`` or ``mean_t d``.
    axis : int
        The axis of response positions.

    Returns
    -------
    numpy.ndarray
        Boolean, the tokens kept.
    """
    lo, hi = band
    w = importance_weights(d, mask, level=level, kind=kind, axis=axis)
    with np.errstate(invalid="ignore"):
        return np.isfinite(w) & (w >= lo) & (w <= hi) & finite_tokens(d, mask)


def kl_statistic(d: np.ndarray, estimator: str) -> np.ndarray:
    """Schulman's estimators per token with ``r = exp(d)``: ``k1 = -d``, ``k2 = d^2 / 2``, ``k3 = r
    - 1 - d`` (samples from the denominator policy; k1 and k3 estimate KL(denominator ||
    numerator)).

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    estimator : {"k1", "k2", "k3"}
        Schulman's estimator.

    Returns
    -------
    numpy.ndarray
        The estimator per token.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        if estimator == "k1":
            return -d
        if estimator == "k2":
            return 0.5 * d ** 2
        if estimator == "k3":
            return np.expm1(d) - d
    raise ValueError(f"estimator={estimator!r}; use 'k1', 'k2' or 'k3'")


def kl_keep(d: np.ndarray, mask: np.ndarray | None = None, *, rule: str = "token_k3",
            threshold: float | tuple[float, float] | None = None, axis: int = -1) -> np.ndarray:
    """Rejection by a KL estimator (verl's ``rollout_rs`` options): ``rule`` is ``<level>_<k>`` with
    level ``token`` | ``seq_sum`` | ``seq_mean`` | ``seq_max``. The statistic is the token's k
    value, or its sum / mean / max over the sequence. ``k1`` keeps a statistic inside the band
    ``threshold = (low, high)``; ``k2`` / ``k3`` keep it ``<= threshold``. Defaults:
    ``OBJECTIVE_DEFAULTS.kl_thresholds[rule]``. Excluded tokens are never kept, and a sequence rule
    drops every token of a sequence with an excluded token.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    rule : str
        ``<level>_<k>``, one of :data:`KL_RULES`.
    threshold : float or tuple, optional
        ``(low, high)`` for k1, an upper bound for k2 / k3 (default ``OBJECTIVE_DEFAULTS.kl_thresholds[rule]``).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    numpy.ndarray
        Boolean, the tokens kept.
    """
    if rule not in KL_RULES:
        raise ValueError(f"rule={rule!r}; use one of {list(KL_RULES)}")
    level, est = rule.rsplit("_", 1)
    thr = OBJECTIVE_DEFAULTS.kl_thresholds[rule] if threshold is None else threshold
    if est == "k1":
        if np.ndim(thr) != 1 or len(thr) != 2:
            raise ValueError(f"{rule}: threshold must be a (low, high) band on k1 = -d in nats, got {thr!r}")
        lo, hi = thr
    else:
        if np.ndim(thr) != 0:
            raise ValueError(f"{rule}: threshold must be one upper bound (nats), got {thr!r}")
        lo, hi = -np.inf, float(thr)
    m = real_tokens(d, mask)
    u = m & np.isfinite(d)
    k = np.where(u, kl_statistic(np.where(u, d, 0.0), est), np.nan)
    if level == "token":
        stat = k
    else:
        bad = (m & ~u).any(axis=axis)
        if level == "seq_sum":
            s = np.where(u, k, 0.0).sum(axis=axis)
        elif level == "seq_mean":
            n = m.sum(axis=axis)
            s = np.where(u, k, 0.0).sum(axis=axis) / np.maximum(n, 1)
        else:
            s = np.where(u, k, -np.inf).max(axis=axis)
        s = np.where(bad | (m.sum(axis=axis) == 0), np.nan, s)
        stat = np.expand_dims(s, axis)
    with np.errstate(invalid="ignore"):
        return u & np.isfinite(stat) & (stat >= lo) & (stat <= hi)


def rejection_keep(d: np.ndarray, mask: np.ndarray | None = None, *, rule: str = "token_band",
                   threshold: Any = None, axis: int = -1) -> np.ndarray:
    """One rejection rule: ``token_band`` (rho in ``[1/C, C]``), ``geometric_band`` and
    ``product_band`` (sequence ratio in a band), or a KL rule of :func:`kl_keep`. ``threshold`` is
    the band or bound (default from :data:`OBJECTIVE_DEFAULTS`).

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    rule : str
        One of :data:`RULES`.
    threshold : optional
        The rule's band or bound (default from :data:`OBJECTIVE_DEFAULTS`).
    axis : int
        The axis of response positions.

    Returns
    -------
    numpy.ndarray
        Boolean, the tokens kept.
    """
    if rule in BAND_RULES:
        band = OBJECTIVE_DEFAULTS.band(rule) if threshold is None else tuple(threshold)
        level: Level = "token" if rule == "token_band" else "sequence"
        kind: Kind = "product" if rule == "product_band" else "geometric"
        return band_keep(d, mask, band=band, level=level, kind=kind, axis=axis)
    if rule in KL_RULES:
        return kl_keep(d, mask, rule=rule, threshold=threshold, axis=axis)
    raise ValueError(f"rule={rule!r}; use one of {list(RULES)}")


def rejected_fraction(keep: np.ndarray, d: np.ndarray, mask: np.ndarray | None = None, *,
                      level: Level = "token", axis=None, position_axis: int = -1) -> ValueWithCounts:
    """Share rejected by a rejection mask.

    ``level="token"``: usable tokens not kept (over ``axis``). ``"sequence"``: sequences (with a
    usable token) that lose at least one usable token; counts are sequences. Excluded tokens are
    reported in ``n_excluded``, not as rejected; the other tokens of a sequence that a sequence
    rule drops because its ratio is undefined do count as rejected.

    Parameters
    ----------
    keep : numpy.ndarray
        Boolean, shaped like ``d``: the tokens a rule keeps.
    d : numpy.ndarray
        Per-token log ratio (nats), response positions along the last axis.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    level : {"token", "sequence"}
        Share of tokens, or of sequences.
    axis : int or tuple of int, optional
        Axes reduced (token level; ``None``: all).
    position_axis : int
        The axis of response positions (sequence level).

    Returns
    -------
    ValueWithCounts
        The share, with tokens (or sequences) used and excluded.
    """
    if level == "token":
        return share_of(share_parts(~np.asarray(keep, bool), d, mask, axis))
    if level != "sequence":
        raise ValueError(f"level={level!r}; use 'token' or 'sequence'")
    return sequences_rejected(rejected_sequences(keep, d, mask, position_axis=position_axis))


def rejected_sequences(keep: np.ndarray, d: np.ndarray, mask: np.ndarray | None = None, *,
                       position_axis: int = -1) -> dict[str, np.ndarray]:
    """Per sequence: whether it has a usable token, loses one to a rejection, holds an excluded one.

    Parameters
    ----------
    keep : numpy.ndarray
        Boolean, shaped like ``d``: the tokens a rule keeps.
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    position_axis : int
        The axis of response positions.

    Returns
    -------
    dict
        Boolean arrays, one entry per sequence: ``has``, ``hit``, ``excluded`` (concatenate
        blocks of sequences, then :func:`sequences_rejected`).
    """
    u = finite_tokens(d, mask)
    return {"has": u.any(axis=position_axis), "hit": (u & ~np.asarray(keep, bool)).any(axis=position_axis),
            "excluded": (real_tokens(d, mask) & ~u).any(axis=position_axis)}


def sequences_rejected(parts: dict[str, np.ndarray]) -> ValueWithCounts:
    """The share of sequences (with a usable token) that lose at least one to a rejection.

    Parameters
    ----------
    parts : dict
        :func:`rejected_sequences` of every sequence.

    Returns
    -------
    ValueWithCounts
        The share, sequences used, sequences with an excluded token.
    """
    return ValueWithCounts(float(_share(parts["hit"], parts["has"])), int(parts["has"].sum()),
                           int(parts["excluded"].sum()))


__all__ = ["band_keep", "kl_keep", "kl_statistic", "rejected_fraction", "rejected_sequences", "rejection_keep",
           "sequences_rejected"]
