"""Masked reductions over axes: the real tokens where a value is finite, how many there are, and
the mean, RMS, largest absolute value, standard deviation, quantiles and correlation over them.

Every reduction takes ``axis`` (an int, a tuple, or ``None`` for all), as numpy does; a reduction
over no usable token is NaN (counts are 0).
"""

from __future__ import annotations

import numpy as np


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
