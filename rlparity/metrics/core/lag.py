"""Policy lag: how many updates old the weights that sampled each token are, and its statistics.
"""

from __future__ import annotations

import numpy as np

from rlparity.metrics.core.reductions import _ratio, count, finite_mask, masked_mean


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
