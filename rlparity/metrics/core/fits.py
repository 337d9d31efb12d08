"""Where a reading lies between two candidate readings: the slope through the origin (least squares
and a robust Huber fit) and its standard error by a jackknife over whole sequences.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlparity.metrics.core.reductions import finite_mask


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
