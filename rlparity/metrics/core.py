"""Mismatch metrics on plain numpy arrays (each definition in its function's docstring).

Conventions: ``d = log pi - log mu`` per token (nats), ``mask`` marks real tokens, and every
reduction takes ``axis`` (an int, a tuple, or ``None`` for all), as numpy does. Tokens where
``log pi = -inf`` (the trainer gives probability 0) are excluded from every average and counted
by :func:`zero_prob_count` instead; no function silently averages them away. A reduction over
no usable token is NaN (counts are 0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)


def finite_mask(d: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Real tokens (``mask``) where ``d`` is finite.

    Parameters
    ----------
    d : numpy.ndarray
        Values per token (e.g. the log-ratio ``d``, nats).
    mask : numpy.ndarray, optional
        Boolean, True on real tokens; ``None`` counts every entry as real.

    Returns
    -------
    numpy.ndarray
        Boolean, True where the token is real and ``d`` is finite.
    """
    m = np.isfinite(d)
    return m if mask is None else (m & np.asarray(mask, dtype=bool))


def count(mask: np.ndarray, axis=None) -> np.ndarray:
    """Number of true entries along ``axis`` (int64).

    Parameters
    ----------
    mask : numpy.ndarray
        Boolean (or castable to it).
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray
        The counts (int64; a numpy scalar when every axis is reduced).
    """
    return np.sum(np.asarray(mask, dtype=bool), axis=axis, dtype=np.int64)


def zero_prob_count(log_pi: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    """Number of real tokens where the trainer gives probability 0 (``log pi = -inf``).

    Parameters
    ----------
    log_pi : numpy.ndarray
        The trainer's logprob per token (nats).
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray
        The counts (int64).
    """
    return count(np.isneginf(log_pi) & np.asarray(mask, dtype=bool), axis=axis)


def _ratio(num: np.ndarray, n: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(n > 0, num / np.maximum(n, 1), np.nan)
    return out if np.ndim(out) else float(out)


def masked_mean(x: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    """Mean of ``x`` over real tokens where it is finite.

    Parameters
    ----------
    x : numpy.ndarray
        Values per token.
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray or float
        The means, in the unit of ``x``; NaN where no token is usable.
    """
    m = finite_mask(x, mask)
    return _ratio(np.sum(np.where(m, x, 0.0), axis=axis), count(m, axis))


def masked_rms(x: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    """Root mean square of ``x`` over real tokens where it is finite.

    Parameters
    ----------
    x : numpy.ndarray
        Values per token.
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray or float
        The RMS, in the unit of ``x``; NaN where no token is usable.
    """
    m = finite_mask(x, mask)
    return np.sqrt(_ratio(np.sum(np.where(m, x, 0.0) ** 2, axis=axis), count(m, axis)))


def masked_max_abs(x: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    """Largest ``|x|`` over real tokens where it is finite (NaN where there are none).

    Parameters
    ----------
    x : numpy.ndarray
        Values per token.
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray or float
        The largest absolute values, in the unit of ``x``.
    """
    m = finite_mask(x, mask)
    top = np.max(np.where(m, np.abs(x), -np.inf), axis=axis, initial=-np.inf)  # an empty array: no tokens
    return np.where(count(m, axis) > 0, top, np.nan) if np.ndim(top) else (float(top) if m.any() else np.nan)


def masked_std(x: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    """Population standard deviation of ``x`` over real tokens where it is finite.

    Parameters
    ----------
    x : numpy.ndarray
        Values per token.
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray or float
        The standard deviations (ddof 0), in the unit of ``x``; NaN where no token is usable.
    """
    m = finite_mask(x, mask)
    mean = masked_mean(x, m, axis=axis)
    dev = np.where(m, x - (np.expand_dims(mean, axis) if axis is not None and np.ndim(mean) else mean), 0.0)
    return np.sqrt(_ratio(np.sum(dev ** 2, axis=axis), count(m, axis)))


def masked_quantile(x: np.ndarray, mask: np.ndarray, q, axis=None) -> np.ndarray:
    """Quantiles ``q`` of ``x`` over real finite tokens; the quantile axis comes first.

    Parameters
    ----------
    x : numpy.ndarray
        Values per token.
    mask : numpy.ndarray
        Boolean, True on real tokens (broadcast against ``x``).
    q : float or sequence of float
        Quantile levels in [0, 1].
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray
        The quantiles (linear interpolation), one leading entry per level of a sequence ``q``; NaN
        where no token is usable.
    """
    m = finite_mask(x, mask)
    v = np.where(m, x, np.nan)
    if v.size == 0:  # no tokens at all (numpy gives one NaN whatever q and axis): NaN in the result's shape
        axes = range(v.ndim) if axis is None else np.atleast_1d(axis) % max(v.ndim, 1)
        rest = tuple(n for k, n in enumerate(v.shape) if k not in set(int(a) for a in axes))
        return np.full(np.shape(q) + rest, np.nan)
    with np.errstate(invalid="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices are NaN, by design
            return np.nanquantile(v, q, axis=axis)


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


def pearson(x: np.ndarray, y: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    """Pearson correlation of ``x`` and ``y`` over entries where both are finite and ``mask`` holds.

    Parameters
    ----------
    x : numpy.ndarray
        First variable.
    y : numpy.ndarray
        Second variable, the shape of ``x``.
    mask : numpy.ndarray
        Boolean, True on entries to use.
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray or float
        The correlation in [-1, 1]; NaN with fewer than 2 entries or no spread.
    """
    m = finite_mask(x, mask) & np.isfinite(y)
    mx, my = masked_mean(x, m, axis=axis), masked_mean(y, m, axis=axis)
    if axis is not None and np.ndim(mx):
        mx, my = np.expand_dims(mx, axis), np.expand_dims(my, axis)
    dx, dy = np.where(m, x - mx, 0.0), np.where(m, y - my, 0.0)
    sxy, sxx, syy = (np.sum(a, axis=axis) for a in (dx * dy, dx * dx, dy * dy))
    n = count(m, axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where((n > 1) & (sxx > 0) & (syy > 0), sxy / np.sqrt(sxx * syy), np.nan)
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


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    # an elementwise product summed (pairwise), not BLAS ddot: on a loaded machine OpenBLAS's dot of
    # 16k floats took 24 ms against 17 us for this (issue 42: diagnose 35x slower under load)
    return float(np.sum(a * b))


def reading_fit(y: np.ndarray, x: np.ndarray, mask: np.ndarray) -> dict[str, float]:
    """Where ``y`` lies between two readings that differ by ``x``.

    The least-squares slope through the origin ``alpha = sum(x y) / sum(x^2)``, its standard error,
    the residual RMS (the numeric noise no hypothesis explains) and the RMS of ``x`` (how far apart
    the readings are), over real tokens where both are finite.

    With ``y = mu - log pi_raw`` and ``x = log pi_processed - log pi_raw``, ``alpha`` is 1 when the
    rollout reports the processed distribution, 0 when it reports the raw one, whatever the device
    or precision adds as noise: the verdict is relative, not a tolerance in nats.

    Parameters
    ----------
    y : numpy.ndarray
        The reading to place, per token (nats).
    x : numpy.ndarray
        The difference of the two candidate readings, per token (nats).
    mask : numpy.ndarray
        Boolean, True on real tokens.

    Returns
    -------
    dict[str, float]
        ``alpha``, ``alpha_se``, ``noise_rms`` (nats), ``separation_rms`` (nats) and ``n_tokens``;
        ``alpha``, ``alpha_se`` and ``noise_rms`` are NaN with fewer than 2 tokens or no separation.
    """
    m = finite_mask(y, mask) & np.isfinite(x)
    xv, yv = x[m].astype(float), y[m].astype(float)
    n = int(xv.size)
    sxx = float(_dot(xv, xv))
    if n < 2 or sxx <= 0:
        return {"alpha": float("nan"), "alpha_se": float("nan"), "noise_rms": float("nan"),
                "separation_rms": float(np.sqrt(sxx / n)) if n else float("nan"), "n_tokens": n}
    alpha = float(_dot(xv, yv) / sxx)
    resid = yv - alpha * xv
    noise = float(np.sqrt(_dot(resid, resid) / (n - 1)))
    return {"alpha": alpha, "alpha_se": noise / np.sqrt(sxx), "noise_rms": noise,
            "separation_rms": float(np.sqrt(sxx / n)), "n_tokens": n}


def jackknife_slope_se(fit: Callable[[np.ndarray], float], mask: np.ndarray, *, groups: int = 20) -> dict[str, Any]:
    """Standard error of a slope by a delete-a-group jackknife over whole sequences.

    Tokens of one sequence share their prompt, their KV and (in a trainer left in train mode) their
    dropout masks, so they are not independent draws: a per-token standard error can be many times
    too small on a few sequences. The sequences (axis 0 of a ``(sequence, position)`` mask; each
    token is its own group on a 1-d mask) are dealt into ``groups`` groups by index modulo
    ``groups``; the slope is refitted without each group in turn and ``se = sqrt((K - 1) / K *
    sum (a_k - mean a)^2)`` (Quenouille-Tukey).

    Parameters
    ----------
    fit : callable
        Maps a boolean mask (the shape of ``mask``) to the slope fitted on those tokens.
    mask : numpy.ndarray
        Boolean, True on the tokens fitted on.
    groups : int, default 20
        Most groups (K); fewer when fewer sequences hold tokens.

    Returns
    -------
    dict
        ``se`` (NaN with fewer than 2 groups or a refit that fails) and ``n_groups`` (K).
    """
    m = np.asarray(mask, dtype=bool)
    rows = m.any(axis=tuple(range(1, m.ndim))) if m.ndim > 1 else m.copy() if m.ndim else np.zeros(0, bool)
    units = np.flatnonzero(rows)
    k = int(min(groups, units.size))
    if k < 2:
        return {"se": float("nan"), "n_groups": k}
    label = np.full(m.shape[0], -1)
    label[units] = np.arange(units.size) % k
    est = np.array([fit(m & (label != g).reshape((-1,) + (1,) * (m.ndim - 1))) for g in range(k)], dtype=float)
    if not np.all(np.isfinite(est)):
        return {"se": float("nan"), "n_groups": k}
    return {"se": float(np.sqrt((k - 1) / k * np.sum((est - est.mean()) ** 2))), "n_groups": k}


def robust_reading_fit(y: np.ndarray, x: np.ndarray, mask: np.ndarray, *, c: float = 1.345,
                       iterations: int = 20, start: float | None = None) -> dict[str, float]:
    """:func:`reading_fit` made robust: a Huber M-estimate of the slope through the origin.

    Iteratively reweighted least squares, tuning ``c`` times the residuals' robust scale (1.4826 x
    their median absolute value). Tokens a cause the diagnosis has not identified moved far from the
    line (a stale KV block, a flipped top-k boundary) get little weight instead of dragging the
    slope; on well-behaved tokens it equals the least-squares slope.

    Parameters
    ----------
    y : numpy.ndarray
        The reading to place, per token (nats).
    x : numpy.ndarray
        The difference of the two candidate readings, per token (nats).
    mask : numpy.ndarray
        Boolean, True on real tokens.
    c : float, default 1.345
        Huber tuning constant, in robust scales.
    iterations : int, default 20
        Most reweighting steps.
    start : float, optional
        The slope the reweighting starts from; None: the least-squares slope. A refit on a subset
        (the jackknife) converges in a few steps from the full fit's slope.

    Returns
    -------
    dict[str, float]
        The keys of :func:`reading_fit` (``alpha_se`` a sandwich standard error) plus ``noise_scale``
        (the robust scale of the residuals, nats) and ``downweighted_share`` (tokens given weight < 1).
    """
    out = reading_fit(y, x, mask)
    m = finite_mask(y, mask) & np.isfinite(x)
    xv, yv = x[m].astype(float), y[m].astype(float)
    if not np.isfinite(out["alpha"]) or xv.size < 3:
        return {**out, "noise_scale": out["noise_rms"], "downweighted_share": 0.0}
    alpha = out["alpha"] if start is None or not np.isfinite(start) else float(start)
    w = np.ones_like(xv)
    scale = float("nan")
    for _ in range(iterations):
        resid = yv - alpha * xv
        scale = 1.4826 * float(np.median(np.abs(resid)))
        if scale <= 0:
            break
        a = np.abs(resid)
        w = np.where(a <= c * scale, 1.0, c * scale / np.maximum(a, 1e-300))
        sxx = float(_dot(w * xv, xv))
        if sxx <= 0:
            break
        new = float(_dot(w * xv, yv) / sxx)
        if abs(new - alpha) <= 1e-10 * max(1.0, abs(alpha)):
            alpha = new
            break
        alpha = new
    resid = yv - alpha * xv
    sw = float(_dot(w * xv, xv))
    n = xv.size
    # sandwich standard error of a weighted slope (Huber's, for heavy tails)
    se = float(np.sqrt(_dot((w * xv) ** 2, resid ** 2)) / sw) if sw > 0 else float("nan")
    se = se if np.isfinite(se) else out["alpha_se"]
    return {"alpha": alpha, "alpha_se": se, "noise_rms": float(np.sqrt(_dot(resid, resid) / (n - 1))),
            "separation_rms": out["separation_rms"], "n_tokens": n,
            "noise_scale": scale if np.isfinite(scale) else out["noise_rms"],
            "downweighted_share": float(np.mean(w < 1.0))}


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


def token_lag(policy_version: np.ndarray, mask: np.ndarray, latest: int | None = None) -> np.ndarray:
    """Policy lag per token: ``latest - policy_version``.

    How many updates old the weights that sampled the token are (PipelineRL logs the trainer's
    version at use time minus the sample's).

    Parameters
    ----------
    policy_version : numpy.ndarray
        The policy version that sampled each token; negative: unknown (a dump that records none).
    mask : numpy.ndarray
        Boolean, True on real tokens.
    latest : int, optional
        The current version; ``None`` takes the newest version among the real tokens.

    Returns
    -------
    numpy.ndarray
        The lag per token (float, in updates); NaN on padding and where the version is unknown.
    """
    pv = np.asarray(policy_version, dtype=float)
    m = np.asarray(mask, dtype=bool) & (pv >= 0)
    if latest is None:
        latest = float(np.max(pv[m])) if m.any() else 0.0
    return np.where(m, float(latest) - pv, np.nan)


def lag_stats(lag: np.ndarray, mask: np.ndarray, axis=None) -> dict[str, np.ndarray]:
    """Max and mean of the token lag and the share of off-policy tokens (lag > 0).

    Parameters
    ----------
    lag : numpy.ndarray
        The lag per token (:func:`token_lag`).
    mask : numpy.ndarray
        Boolean, True on real tokens.
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    dict[str, numpy.ndarray]
        ``lag_max``, ``lag_mean``, ``offpolicy_share`` and ``n_tokens`` (the real tokens counted)
        along ``axis``.
    """
    m = finite_mask(lag, mask)
    top = np.max(np.where(m, lag, -np.inf), axis=axis, initial=-np.inf)  # an empty array: no tokens
    n = count(m, axis)
    return {"lag_max": np.where(n > 0, top, np.nan) if np.ndim(top) else (float(top) if n else np.nan),
            "lag_mean": masked_mean(lag, m, axis=axis),
            "offpolicy_share": _ratio(count(m & (np.where(m, lag, 0.0) > 0), axis), n),
            "n_tokens": n}
