"""The core's base: ``d`` per token, which tokens count, and the counts every reduction rests on.

:class:`ValueWithCounts`, :func:`logprob_difference`, the real-token and usable-token masks
(:func:`real_tokens`, :func:`finite_tokens`), token counts and shares that add across blocks
(:func:`token_counts`, :func:`share_parts`, :func:`share_of`), :func:`token_mean` and the
per-sequence :func:`sequence_log_ratio`."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from rlparity.metrics.objective.settings import Kind


class ValueWithCounts(NamedTuple):
    """A reduction's value with the counts it rests on.

    Counts are tokens or sequences, as the function says. (Named ``Measured`` before issue 23.)

    Parameters
    ----------
    value : float or numpy.ndarray
        The reduction's value.
    n_used : int or numpy.ndarray
        Entries it used.
    n_excluded : int or numpy.ndarray
        Entries left out because a policy gives probability 0.
    """

    value: Any
    n_used: Any
    n_excluded: Any


def logprob_difference(log_num: np.ndarray, log_den: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """``d = log_num - log_den`` per token (nats), NaN outside ``mask``.

    ``-inf`` where the numerator policy gives probability 0, ``+inf`` where the denominator does
    (NaN where both do).

    Parameters
    ----------
    log_num : numpy.ndarray
        Log-probabilities of the numerator policy.
    log_den : numpy.ndarray
        Log-probabilities of the denominator policy.
    mask : numpy.ndarray, optional
        Real tokens; NaN outside (None: no mask).

    Returns
    -------
    numpy.ndarray
        ``d``, shaped like the inputs.
    """
    num = np.asarray(log_num, dtype=float)
    den = np.asarray(log_den, dtype=float)
    with np.errstate(invalid="ignore"):
        d = num - den
    return d if mask is None else np.where(np.asarray(mask, bool), d, np.nan)


def real_tokens(d: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """The real-token mask: ``mask``, or every non-NaN entry of ``d`` when ``mask`` is None.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).

    Returns
    -------
    numpy.ndarray
        Boolean, shaped like ``d``.
    """
    return ~np.isnan(d) if mask is None else np.asarray(mask, bool)


def finite_tokens(d: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Real tokens with a finite ``d`` (the ones averages use).

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).

    Returns
    -------
    numpy.ndarray
        Boolean, shaped like ``d``.
    """
    return real_tokens(d, mask) & np.isfinite(d)


def token_counts(d: np.ndarray, mask: np.ndarray | None = None, axis=None) -> tuple[Any, Any]:
    """(tokens used, tokens excluded because ``d`` is not finite) over ``axis``.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    tuple
        (tokens used, tokens excluded) over ``axis``.
    """
    m = real_tokens(d, mask)
    u = m & np.isfinite(d)
    return u.sum(axis=axis), (m & ~u).sum(axis=axis)


def _share(hit: np.ndarray, used: np.ndarray, axis=None):
    n = used.sum(axis=axis)
    k = (hit & used).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, k / np.maximum(n, 1), np.nan)


def share_parts(hit: np.ndarray, d: np.ndarray, mask: np.ndarray | None = None, axis=None) -> dict[str, Any]:
    """The counts a share of usable tokens rests on, summed over ``axis``.

    Counts add across blocks of sequences, so a share over a trace larger than memory is the
    :func:`share_of` of its blocks' summed parts.

    Parameters
    ----------
    hit : numpy.ndarray
        Boolean, shaped like ``d``: the tokens the share counts (e.g. clipped, rejected).
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    dict
        ``hit`` (usable tokens hit), ``used`` (usable tokens), ``excluded`` (real tokens with a
        non-finite ``d``).
    """
    m = real_tokens(d, mask)
    u = m & np.isfinite(d)
    return {"hit": (np.asarray(hit, bool) & u).sum(axis=axis), "used": u.sum(axis=axis),
            "excluded": (m & ~u).sum(axis=axis)}


def share_of(parts: dict[str, Any]) -> ValueWithCounts:
    """The share ``hit / used`` of :func:`share_parts` (NaN where nothing is used).

    Parameters
    ----------
    parts : dict
        ``hit``, ``used`` and ``excluded`` counts (one block's, or several blocks' summed).

    Returns
    -------
    ValueWithCounts
        The share, tokens used, tokens excluded.
    """
    n, k = parts["used"], parts["hit"]
    with np.errstate(invalid="ignore", divide="ignore"):
        return ValueWithCounts(np.where(n > 0, k / np.maximum(n, 1), np.nan), n, parts["excluded"])


def _safe_exp(x: np.ndarray, ok: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(np.where(ok, x, 0.0))


def token_mean(x: np.ndarray, d: np.ndarray, mask: np.ndarray | None = None, axis=None) -> ValueWithCounts:
    """Mean of ``x`` over the usable tokens of ``d`` (real, finite d).

    Parameters
    ----------
    x : numpy.ndarray
        The values averaged, shaped like ``d``.
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    ValueWithCounts
        The mean, tokens used, tokens excluded.
    """
    u = finite_tokens(d, mask) & np.isfinite(x)
    n = u.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(n > 0, np.where(u, x, 0.0).sum(axis=axis) / np.maximum(n, 1), np.nan)
    return ValueWithCounts(v, *token_counts(d, mask, axis))


def sequence_log_ratio(d: np.ndarray, mask: np.ndarray | None = None, *, kind: Kind = "geometric",
                       axis: int = -1) -> ValueWithCounts:
    """Per sequence (``axis`` reduced): ``sum_t d`` (log of the product ratio) or ``mean_t d`` (log
    of the geometric ratio, GSPO's ``log s_i``). NaN for a sequence without tokens or with a
    non-finite token; ``n_used`` = its real tokens, ``n_excluded`` = its non-finite tokens.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    kind : {"product", "geometric"}
        The sequence ratio: ``sum_t d`` or ``mean_t d``.
    axis : int
        The axis of response positions.

    Returns
    -------
    ValueWithCounts
        One value per sequence, its real tokens, its non-finite tokens.
    """
    if kind not in ("product", "geometric"):
        raise ValueError(f"kind={kind!r}; use 'product' or 'geometric'")
    m = real_tokens(d, mask)
    u = m & np.isfinite(d)
    n_tok = m.sum(axis=axis)
    n_bad = (m & ~u).sum(axis=axis)
    total = np.where(u, d, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        val = total if kind == "product" else total / np.maximum(n_tok, 1)
    return ValueWithCounts(np.where((n_tok > 0) & (n_bad == 0), val, np.nan), n_tok, n_bad)


def _sequence_counts(s: ValueWithCounts) -> tuple[int, int]:
    ok = np.isfinite(s.value)
    return int(ok.sum()), int((np.asarray(s.n_excluded) > 0).sum())


__all__ = ["ValueWithCounts", "finite_tokens", "logprob_difference", "real_tokens", "sequence_log_ratio", "share_of",
           "share_parts", "token_counts", "token_mean"]
