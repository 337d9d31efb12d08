"""Mismatch metrics on plain numpy arrays (see ../shared/docs/metrics.md for the definitions).

Conventions: ``d = log pi - log mu`` per token (nats), ``mask`` marks real tokens. Tokens where
``log pi = -inf`` (the trainer gives probability 0) are excluded from every average and counted
by :func:`zero_prob_count` instead; no function silently averages them away.
"""

from __future__ import annotations

import numpy as np

QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)


def finite_mask(d: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    m = np.isfinite(d)
    return m if mask is None else (m & mask.astype(bool))


def zero_prob_count(log_pi: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    """Number of real tokens where the trainer gives probability 0 (``log pi = -inf``)."""
    return np.sum(np.isneginf(log_pi) & mask.astype(bool), axis=axis)


def _masked(d, mask):
    m = finite_mask(d, mask)
    return np.where(m, d, 0.0), m


def masked_mean(x: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    v, m = _masked(x, mask)
    n = m.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, v.sum(axis=axis) / np.maximum(n, 1), np.nan)


def abs_stats(d: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Mean, RMS, max and quantiles of |d| (and the signed mean) over finite real tokens."""
    m = finite_mask(d, mask)
    x = d[m]
    if x.size == 0:
        nan = float("nan")
        return {"mean": nan, "mean_abs": nan, "rms": nan, "max_abs": nan,
                **{f"q{int(q * 100):02d}": nan for q in QUANTILES}, "n_tokens": 0}
    a = np.abs(x)
    out = {"mean": float(x.mean()), "mean_abs": float(a.mean()), "rms": float(np.sqrt((x ** 2).mean())),
           "max_abs": float(a.max()), "n_tokens": int(x.size)}
    for q, v in zip(QUANTILES, np.quantile(x, QUANTILES)):
        out[f"q{int(q * 100):02d}"] = float(v)
    return out


def mean_ratio(d: np.ndarray, mask: np.ndarray) -> float:
    """Mean of ``rho = exp(d)`` over finite real tokens."""
    m = finite_mask(d, mask)
    return float(np.exp(d[m]).mean()) if m.any() else float("nan")


def kl_estimators(d: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Schulman's k1, k2, k3 with samples from mu and r = pi/mu (k1, k3 estimate KL(mu || pi))."""
    m = finite_mask(d, mask)
    x = d[m]
    if x.size == 0:
        return {"k1": float("nan"), "k2": float("nan"), "k3": float("nan")}
    return {"k1": float((-x).mean()), "k2": float((x ** 2 / 2).mean()),
            "k3": float((np.expm1(x) - x).mean())}


def clip_fraction(d: np.ndarray, mask: np.ndarray, eps: float = 0.2) -> float:
    """Share of real finite tokens with rho outside [1 - eps, 1 + eps]."""
    m = finite_mask(d, mask)
    if not m.any():
        return float("nan")
    r = np.exp(d[m])
    return float(((r < 1 - eps) | (r > 1 + eps)).mean())


def ess(weights: np.ndarray) -> float:
    """Normalised effective sample size (sum w)^2 / (n sum w^2) of raw (untruncated) weights."""
    w = np.asarray(weights, dtype=float)
    w = w[np.isfinite(w)]
    if w.size == 0 or not np.any(w):
        return float("nan")
    return float(w.sum() ** 2 / (w.size * (w ** 2).sum()))


def prob_stats(log_pi: np.ndarray, log_mu: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """|pi - mu| (mean, max, std) and the Pearson correlation of pi and mu over real tokens."""
    m = mask.astype(bool) & np.isfinite(log_mu) & ~np.isnan(log_pi)
    pi, mu = np.exp(log_pi[m]), np.exp(log_mu[m])
    if pi.size < 2:
        return {"prob_diff_mean": float("nan"), "prob_diff_max": float("nan"),
                "prob_diff_std": float("nan"), "prob_pearson": float("nan")}
    diff = np.abs(pi - mu)
    corr = float(np.corrcoef(pi, mu)[0, 1]) if pi.std() > 0 and mu.std() > 0 else float("nan")
    return {"prob_diff_mean": float(diff.mean()), "prob_diff_max": float(diff.max()),
            "prob_diff_std": float(diff.std()), "prob_pearson": corr}


def sequence_log_ratio(d: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Per sequence: sum of d (log product ratio), mean of d (log geometric ratio, GSPO)."""
    v, m = _masked(d, mask)
    n = m.sum(axis=-1)
    total = v.sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, total / np.maximum(n, 1), np.nan)
    return {"log_product_ratio": total, "log_geometric_ratio": mean, "n_tokens": n}
