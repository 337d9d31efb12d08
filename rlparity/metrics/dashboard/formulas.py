"""What every peer's formulas share: the inputs prepared (tokens a policy gives probability 0 left
out of the mask), the masked statistics written so dask can stream them, and their evaluation in
one ``dask.compute`` (:func:`_computed`, :func:`_evaluate`: with a lazy trace, its chunks
CRC-checked in the same computation)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.storage.lazy.arm import is_lazy
from rlparity.trace.storage.lazy.digests import chunk_digests, verify_chunk_digests


def _as(x, dtype):
    """``x`` as ``dtype`` without reading it: a dask array stays lazy, a list becomes numpy."""
    return x.astype(dtype) if hasattr(x, "astype") and hasattr(x, "ndim") else np.asarray(x, dtype)


def _prep(log_train, log_rollout, mask):
    lt0, lr0 = _as(log_train, float), _as(log_rollout, float)
    m = _as(mask, bool) & np.isfinite(lt0) & np.isfinite(lr0)
    lt = np.where(m, lt0, 0.0)
    lr = np.where(m, lr0, 0.0)
    return lt, lr, m


# Every formula below is written so that dask can stream it over a lazy trace's chunks (and numpy
# run it unchanged on a trace in memory): no boolean indexing (masked statistics are sums over the
# mask / counts, masked extremes ``where(m, x, -inf).max()``), no Python branch on a value, no
# second pass over the tokens (spreads from sums of squares). Each peer function builds its metrics
# as 0-d arrays; :func:`_computed` evaluates them together (one ``dask.compute`` on a lazy trace).

def _masked_max(x, m):
    return np.where(m, x, -np.inf).max()


def _masked_min(x, m):
    return np.where(m, x, np.inf).min()


def _masked_std(x, mf, n):
    """The sample std (n - 1) of ``x`` over the mask from one pass of sums (NaN below 2 tokens)."""
    s, s2 = (x * mf).sum(), (x * x * mf).sum()
    return np.where(n > 1, np.sqrt(np.maximum(s2 - s * s / np.maximum(n, 1), 0.0) / np.maximum(n - 1, 1)), np.nan)


def _computed(func):
    """A peer function returning its metrics as (possibly lazy) 0-d arrays -> plain floats, all
    evaluated at once. ``_lazy=True`` returns the arrays unevaluated (for :func:`~rlparity.metrics.dashboard.traces.as_dashboard`,
    which adds its counts to the same computation)."""
    @functools.wraps(func)
    def wrapper(*args, _lazy: bool = False, **kwargs):
        with np.errstate(divide="ignore", invalid="ignore"):  # empty masks give NaN, as the peers' code does
            out = func(*args, **kwargs)
        return out if _lazy else _evaluate(out)
    return wrapper


def _evaluate(out: Mapping[str, Any], trace: xr.Dataset | None = None, read: tuple[str, ...] = ()) -> dict[str, float]:
    """The (possibly lazy) metrics as floats, in one ``dask.compute``; with a lazy ``trace``, the
    chunks of its variables ``read`` are CRC-checked in the same computation."""
    if any(hasattr(v, "dask") for v in out.values()):
        import dask

        digests = chunk_digests(trace, list(read)) if trace is not None and is_lazy(trace) else {}
        out, digests = dask.compute(dict(out), digests)
        if trace is not None:
            verify_chunk_digests(trace, digests)
    out = {k: float(v) for k, v in out.items()}
    if out.pop(_USABLE, 1.0) == 0:
        raise ValueError("no usable token: every real token has a probability-0 side or the mask is empty")
    return out


_USABLE = "__usable_tokens"  # the count a peer needs at least one of, checked once the values are computed
