"""Statistics of the mismatch ``d = log pi - log mu`` (nats): ``|d|`` and its quantiles, the mean
ratio, Schulman's KL estimators, the effective sample size of the importance weights, the gap
between the probabilities, and whether the mean of ``d`` is what a faithful rollout gives.
"""

from __future__ import annotations

import numpy as np

from rlparity.metrics.core.reductions import (count, finite_mask, masked_max_abs, masked_mean, masked_quantile,
                                              masked_rms, masked_std, pearson)


QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)


def abs_stats(d: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Mean, RMS, max and quantiles of ``|d|`` (and the signed mean) over finite real tokens.

    Parameters
    ----------
    d : numpy.ndarray
        The log-ratio ``log pi - log mu`` per token (nats).
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).

    Returns
    -------
    dict[str, float]
        ``mean`` (signed), ``mean_abs``, ``rms``, ``max_abs`` (nats), ``n_tokens``, and the quantiles
        of the signed ``d`` at :data:`QUANTILES` as ``q01``, ``q05``, ``q50``, ``q95``, ``q99`` (nats).
    """
    m = finite_mask(d, mask)
    qs = masked_quantile(d, m, QUANTILES)
    out = {"mean": float(masked_mean(d, m)), "mean_abs": float(masked_mean(np.abs(d), m)),
           "rms": float(masked_rms(d, m)), "max_abs": float(masked_max_abs(d, m)), "n_tokens": int(count(m))}
    for q, v in zip(QUANTILES, np.atleast_1d(qs)):
        out[f"q{int(q * 100):02d}"] = float(v)
    return out


def mean_ratio(d: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    """Mean of ``rho = exp(d)`` over finite real tokens.

    Parameters
    ----------
    d : numpy.ndarray
        The log-ratio ``log pi - log mu`` per token (nats).
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray or float
        The mean ratio ``pi / mu`` (dimensionless; 1 for a faithful rollout).
    """
    m = finite_mask(d, mask)
    return masked_mean(np.exp(np.where(m, d, 0.0)), m, axis=axis)


def kl_estimators(d: np.ndarray, mask: np.ndarray, axis=None) -> dict[str, np.ndarray]:
    """Schulman's k1, k2, k3 with samples from mu and r = pi/mu (k1, k3 estimate KL(mu || pi)).

    Parameters
    ----------
    d : numpy.ndarray
        The log-ratio ``log pi - log mu`` per token (nats).
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    dict[str, numpy.ndarray]
        ``k1`` = mean of ``-d``, ``k2`` = mean of ``d^2 / 2``, ``k3`` = mean of ``exp(d) - 1 - d``
        (nats) over finite real tokens.
    """
    m = finite_mask(d, mask)
    x = np.where(m, d, 0.0)
    return {"k1": masked_mean(-x, m, axis=axis), "k2": masked_mean(x ** 2 / 2, m, axis=axis),
            "k3": masked_mean(np.expm1(x) - x, m, axis=axis)}


def ess(weights: np.ndarray, mask: np.ndarray | None = None, axis=None) -> np.ndarray:
    """Normalised effective sample size of raw (untruncated) weights.

    ``(sum w)^2 / (n sum w^2)`` over the finite (and ``mask``-ed) entries along ``axis``.

    Parameters
    ----------
    weights : numpy.ndarray
        Importance weights (e.g. ``pi / mu`` per token or per sequence).
    mask : numpy.ndarray, optional
        Boolean, True on entries to use; ``None`` uses every finite entry.
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray or float
        The ESS in (0, 1] (1 for equal weights); NaN where no entry is usable or all weights are 0.
    """
    w = np.asarray(weights, dtype=float)
    m = finite_mask(w, mask)
    s1 = np.sum(np.where(m, w, 0.0), axis=axis)
    s2 = np.sum(np.where(m, w, 0.0) ** 2, axis=axis)
    return ess_from_sums(s1, s2, count(m, axis))


def ess_from_sums(s1, s2, n):
    """The normalised ESS ``s1^2 / (n s2)`` from sums that add across blocks of a trace.

    Parameters
    ----------
    s1 : float or numpy.ndarray
        Sum of the importance weights.
    s2 : float or numpy.ndarray
        Sum of their squares.
    n : int or numpy.ndarray
        Number of weights summed.

    Returns
    -------
    float or numpy.ndarray
        ESS / n in (0, 1]; NaN where ``n`` or ``s2`` is 0 (a float for scalar sums).
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where((n > 0) & (s2 > 0), s1 ** 2 / (np.maximum(n, 1) * np.where(s2 > 0, s2, 1.0)), np.nan)
    return out if np.ndim(out) else float(out)


def prob_stats(log_pi: np.ndarray, log_mu: np.ndarray, mask: np.ndarray, axis=None) -> dict[str, np.ndarray]:
    """``|pi - mu|`` (mean, max, std) and the Pearson correlation of pi and mu over real tokens.

    A token with pi = 0 counts here with pi = 0: probabilities, unlike log-ratios, stay finite.

    Parameters
    ----------
    log_pi : numpy.ndarray
        The trainer's logprob per token (nats).
    log_mu : numpy.ndarray
        The rollout's logprob per token (nats); tokens where it is not finite are left out.
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    dict[str, numpy.ndarray]
        ``prob_diff_mean``, ``prob_diff_max``, ``prob_diff_std`` (probabilities) and ``prob_pearson``.
    """
    m = np.asarray(mask, dtype=bool) & np.isfinite(log_mu) & ~np.isnan(log_pi)
    pi, mu = np.exp(np.where(m, log_pi, -np.inf)), np.exp(np.where(m, log_mu, -np.inf))
    diff = np.abs(pi - mu)
    return {"prob_diff_mean": masked_mean(diff, m, axis=axis), "prob_diff_max": masked_max_abs(diff, m, axis=axis),
            "prob_diff_std": masked_std(diff, m, axis=axis), "prob_pearson": pearson(pi, mu, m, axis=axis)}


def offset_test(d: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Whether the mean of ``d = log pi - log mu`` is what a faithful rollout gives.

    Tokens drawn from mu with ``pi = mu`` up to zero-mean numeric noise have ``E[d] ~ -Var(d)/2``
    (and a mean ratio ``E[pi/mu] = 1``); ``offset = mean(d) + var(d)/2`` is 0 then, and its
    z-score ``offset / se`` says how many standard errors it is off.

    Parameters
    ----------
    d : numpy.ndarray
        The log-ratio per token (nats).
    mask : numpy.ndarray
        Boolean, True on real tokens.

    Returns
    -------
    dict[str, float]
        ``offset`` and ``offset_se`` (nats), ``z``, ``mean`` (nats), ``var`` (nats squared) and
        ``n_tokens``; NaN with fewer than 2 tokens.
    """
    m = finite_mask(d, mask)
    x = d[m].astype(float)
    n = int(x.size)
    if n < 2:
        return {"offset": float("nan"), "offset_se": float("nan"), "z": float("nan"), "mean": float("nan"),
                "var": float("nan"), "n_tokens": n}
    mean, var = float(x.mean()), float(x.var(ddof=1))
    # the offset's standard error: that of the mean of d + (d - mean)^2 / 2
    se = float(np.std(x + (x - mean) ** 2 / 2, ddof=1) / np.sqrt(n))
    off = mean + var / 2
    return {"offset": off, "offset_se": se, "z": off / se if se > 0 else float("inf") * np.sign(off),
            "mean": mean, "var": var, "n_tokens": n}
