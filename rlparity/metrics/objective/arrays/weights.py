"""The ratios and the corrections trainers apply to them: PPO / GSPO clip fractions, importance
weights (raw, truncated: TIS) and the decoupled three-policy weight."""

from __future__ import annotations

import numpy as np

from rlparity.config.defaults import Level
from rlparity.metrics.objective.settings import OBJECTIVE_DEFAULTS, Kind
from rlparity.metrics.objective.arrays.tokens import (
    ValueWithCounts,
    _safe_exp,
    _sequence_counts,
    _share,
    finite_tokens,
    logprob_difference,
    real_tokens,
    sequence_log_ratio,
    share_of,
    share_parts,
)


def token_clip_fraction(d: np.ndarray, mask: np.ndarray | None = None, *, eps_low: float | None = None,
                        eps_high: float | None = None, axis=None) -> ValueWithCounts:
    """PPO clip fraction: share of usable tokens with ``rho = exp(d)`` outside the clip range.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats), response positions along the last axis.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    eps_low, eps_high : float, optional
        The range ``[1 - eps_low, 1 + eps_high]`` (default ``OBJECTIVE_DEFAULTS.ppo_eps``).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    ValueWithCounts
        The share, tokens used, tokens excluded (over ``axis``).
    """
    lo, hi = _eps(eps_low, eps_high, "token")
    u = finite_tokens(d, mask)
    r = _safe_exp(d, u)
    return share_of(share_parts((r < lo) | (r > hi), d, mask, axis))


def sequence_clip_fraction(d: np.ndarray, mask: np.ndarray | None = None, *, eps_low: float | None = None,
                           eps_high: float | None = None, kind: Kind = "geometric", axis: int = -1) -> ValueWithCounts:
    """GSPO clip fraction: share of sequences whose ratio lies outside the clip range.

    The ratio is ``s_i = exp(mean_t d)`` (``kind="geometric"``) or ``exp(sum_t d)``.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats), response positions along the last axis.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    eps_low, eps_high : float, optional
        The range ``[1 - eps_low, 1 + eps_high]`` (default the GSPO paper's 3e-4 / 4e-4).
    kind : {"geometric", "product"}
        The sequence ratio.
    axis : int
        The axis of response positions.

    Returns
    -------
    ValueWithCounts
        The share, sequences used, sequences excluded.
    """
    lo, hi = _eps(eps_low, eps_high, "sequence")
    return sequences_clip_fraction(sequence_log_ratio(d, mask, kind=kind, axis=axis), lo, hi)


def sequences_clip_fraction(s: ValueWithCounts, low: float, high: float) -> ValueWithCounts:
    """The share of sequences whose ratio ``exp(s)`` lies outside ``[low, high]``.

    Parameters
    ----------
    s : ValueWithCounts
        :func:`~rlparity.metrics.objective.arrays.tokens.sequence_log_ratio` of every sequence (NaN: an excluded sequence).
    low, high : float
        The band on the ratio (``1 - eps_low``, ``1 + eps_high``).

    Returns
    -------
    ValueWithCounts
        The share, sequences used, sequences excluded.
    """
    ok = np.isfinite(s.value)
    r = _safe_exp(s.value, ok)
    return ValueWithCounts(float(_share((r < low) | (r > high), ok)), *_sequence_counts(s))


def _eps(eps_low, eps_high, level):
    dl, dh = OBJECTIVE_DEFAULTS.eps(level)
    return 1.0 - (dl if eps_low is None else eps_low), 1.0 + (dh if eps_high is None else eps_high)


def importance_weights(d: np.ndarray, mask: np.ndarray | None = None, *, level: Level = "token",
                       kind: Kind = "product", cap: float | None = None, axis: int = -1) -> np.ndarray:
    """Importance weights shaped like ``d``: token ``w_t = exp(d_t)``.

    sequence ``w_i = exp(sum_t d)`` (``kind="product"``) or ``exp(mean_t d)`` (``"geometric"``) on
    every token of the sequence. With ``cap`` the weights are truncated, ``min(w, cap)`` (TIS). NaN
    at padding, at excluded tokens and on every token of an excluded sequence.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    level : {"token", "sequence"}
        Token or sequence level.
    kind : {"product", "geometric"}
        The sequence ratio: ``sum_t d`` or ``mean_t d``.
    cap : float, optional
        Truncate at ``min(w, cap)`` (None: raw weights).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    numpy.ndarray
        Weights shaped like ``d``.
    """
    if level == "token":
        u = finite_tokens(d, mask)
        w = np.where(u, _safe_exp(d, u), np.nan)
    elif level == "sequence":
        s = sequence_log_ratio(d, mask, kind=kind, axis=axis)
        ok = np.isfinite(s.value)
        ws = np.where(ok, _safe_exp(s.value, ok), np.nan)
        w = np.where(real_tokens(d, mask), np.expand_dims(ws, axis), np.nan)
    else:
        raise ValueError(f"level={level!r}; use 'token' or 'sequence'")
    return w if cap is None else np.minimum(w, cap)


def tis_weights(d: np.ndarray, mask: np.ndarray | None = None, *, cap: float | None = None) -> np.ndarray:
    """Token truncated importance sampling: ``w = min(rho, C)`` (``C`` default ``OBJECTIVE_DEFAULTS.is_cap``).

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    cap : float, optional
        The truncation ``C`` (default ``OBJECTIVE_DEFAULTS.is_cap``).

    Returns
    -------
    numpy.ndarray
        Truncated token weights shaped like ``d``.
    """
    return importance_weights(d, mask, level="token", cap=OBJECTIVE_DEFAULTS.is_cap if cap is None else cap)


def decoupled_weights(log_mu: np.ndarray, log_old: np.ndarray, log_theta: np.ndarray,
                      mask: np.ndarray | None = None, *, cap: float | None = None) -> dict[str, np.ndarray]:
    """The decoupled (three-policy) token weight and its parts, shaped like the inputs:

    * ``correction_weight`` = pi_old / mu (backend pair), truncated at ``cap`` when given;
    * ``update_ratio`` = pi_theta / pi_old (update pair, what PPO clips);
    * ``weight`` = their product, the factor on the advantage;
    * ``bypass_ratio`` = pi_theta / mu (two-policy form; equals ``weight`` when ``cap`` is None).

    Parameters
    ----------
    log_mu : numpy.ndarray
        Log-probabilities of the rollout (mu).
    log_old : numpy.ndarray
        Log-probabilities of the trainer at the rollout's weights (pi_old).
    log_theta : numpy.ndarray
        Log-probabilities of the trainer after the step (pi_theta).
    mask : numpy.ndarray, optional
        Real tokens (``None``: where pi_old and mu are not NaN).
    cap : float, optional
        Truncation of the correction weight (None: raw).

    Returns
    -------
    dict
        ``correction_weight``, ``update_ratio``, ``weight``, ``bypass_ratio``, each shaped like the inputs.
    """
    m = real_tokens(logprob_difference(log_old, log_mu), mask) if mask is None else np.asarray(mask, bool)
    corr = importance_weights(logprob_difference(log_old, log_mu, m), m, cap=cap)
    upd = importance_weights(logprob_difference(log_theta, log_old, m), m)
    return {"correction_weight": corr, "update_ratio": upd, "weight": corr * upd,
            "bypass_ratio": importance_weights(logprob_difference(log_theta, log_mu, m), m)}


__all__ = ["decoupled_weights", "importance_weights", "sequence_clip_fraction", "sequences_clip_fraction",
           "tis_weights", "token_clip_fraction"]
