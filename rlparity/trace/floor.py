"""The floor statistic: how far two readings of the same tokens are apart (nats).

One form for every floor (the trainer's self-check, the engine's batch spread, the trainer shapes
of :mod:`rlparity.experiments.floors`), so they can be read side by side and against the backend
gap. numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def spread(a: Any, b: Any) -> dict[str, Any]:
    """How far two readings of the same tokens are apart.

    Parameters
    ----------
    a : array_like
        One reading per token (nats).
    b : array_like
        The other reading, the shape of ``a`` (nats).

    Returns
    -------
    dict[str, Any]
        ``n_tokens`` (entries finite in both), ``mean_abs``, ``rms`` and ``max_abs`` of ``|a - b|``
        (nats); NaN statistics when no entry is finite in both.
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    d = np.abs(a[ok] - b[ok])
    if not d.size:
        return {"n_tokens": 0, "mean_abs": float("nan"), "rms": float("nan"), "max_abs": float("nan")}
    return {"n_tokens": int(d.size), "mean_abs": float(d.mean()), "rms": float(np.sqrt(np.mean(d ** 2))),
            "max_abs": float(d.max())}


__all__ = ["spread"]
