"""The health of the importance weights: their effective sample size, over tokens or sequences, in
log space and from sums that merge across blocks (:func:`ess_parts`, :func:`merge_ess_parts`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlparity.metrics import core
from rlparity.metrics.objective.settings import Kind
from rlparity.metrics.objective.arrays.tokens import (
    ValueWithCounts,
    _safe_exp,
    _sequence_counts,
    finite_tokens,
    sequence_log_ratio,
    token_counts,
)


def ess_parts(logw: np.ndarray, ok: np.ndarray, axis=None) -> dict[str, Any]:
    """The sums an effective sample size rests on, in log space, over ``axis``.

    Weights ``exp(logw)`` are scaled by their largest, ``top``, so none overflows; blocks with
    different ``top`` combine in :func:`merge_ess_parts`.

    Parameters
    ----------
    logw : numpy.ndarray
        Log weights.
    ok : numpy.ndarray
        Boolean, shaped like ``logw``: the weights counted (finite).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    dict
        ``top`` (largest counted log weight, ``-inf`` where none), ``s1`` = sum of
        ``exp(logw - top)``, ``s2`` = sum of its squares, ``n`` = weights counted.
    """
    ok = np.asarray(ok, bool)
    top_k = np.max(np.where(ok, logw, -np.inf), axis=axis, keepdims=True)
    w = np.where(ok, _safe_exp(logw - np.where(np.isfinite(top_k), top_k, 0.0), ok), 0.0)
    s1 = np.sum(w, axis=axis)
    return {"top": top_k.reshape(np.shape(s1)), "s1": s1, "s2": np.sum(w ** 2, axis=axis),
            "n": core.count(ok, axis)}


def merge_ess_parts(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two blocks' :func:`ess_parts` as one (rescaled to the larger ``top``).

    Parameters
    ----------
    a, b : dict
        :func:`ess_parts` of two blocks, reduced to the same shape.

    Returns
    -------
    dict
        The parts of both blocks together.
    """
    top = np.maximum(a["top"], b["top"])
    safe = np.where(np.isfinite(top), top, 0.0)

    def scale(t):
        fin = np.isfinite(t)
        return np.where(fin, np.exp(np.where(fin, t - safe, 0.0)), 0.0)

    sa, sb = scale(a["top"]), scale(b["top"])
    return {"top": top, "s1": a["s1"] * sa + b["s1"] * sb, "s2": a["s2"] * sa ** 2 + b["s2"] * sb ** 2,
            "n": a["n"] + b["n"]}


def ess_of(parts: dict[str, Any]):
    """The normalised ESS ``s1^2 / (n s2)`` of :func:`ess_parts` (:func:`rlparity.metrics.core.mismatch.ess`).

    Parameters
    ----------
    parts : dict
        ``s1``, ``s2`` and ``n`` (one block's, or merged).

    Returns
    -------
    numpy.ndarray or float
        The ESS in (0, 1]; NaN where no weight is counted.
    """
    return core.ess_from_sums(parts["s1"], parts["s2"], parts["n"])


def weights_ess(weights: np.ndarray, valid: np.ndarray | None = None, axis=None) -> ValueWithCounts:
    """:func:`rlparity.metrics.core.mismatch.ess` (``(sum w)^2 / (n sum w^2)`` in (0, 1] over the finite,
    ``valid`` weights) with its counts: weights used, and valid weights left out as not finite. Give
    it raw weights: truncation hides a collapse.

    Parameters
    ----------
    weights : numpy.ndarray
        Raw (untruncated) weights.
    valid : numpy.ndarray, optional
        Boolean, the weights counted (``None``: all finite ones).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    ValueWithCounts
        The ESS, weights used, valid weights left out as not finite.
    """
    w = np.asarray(weights, dtype=float)
    ok = np.isfinite(w) & (True if valid is None else np.asarray(valid, bool))
    excl = ((~np.isfinite(w)) & (True if valid is None else np.asarray(valid, bool))).sum(axis=axis)
    return ValueWithCounts(core.ess(w, valid, axis=axis), ok.sum(axis=axis), excl)


def token_ess(d: np.ndarray, mask: np.ndarray | None = None, axis=None) -> ValueWithCounts:
    """ESS of the raw token weights ``exp(d)`` (scale-free: computed as ``exp(d - max d)``).

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats), response positions along the last axis.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    ValueWithCounts
        The ESS in (0, 1], tokens used, tokens excluded.
    """
    return ValueWithCounts(ess_of(ess_parts(d, finite_tokens(d, mask), axis)), *token_counts(d, mask, axis))


def sequence_ess(d: np.ndarray, mask: np.ndarray | None = None, *, kind: Kind = "product",
                 axis: int = -1) -> ValueWithCounts:
    """ESS over sequences of the raw sequence weights (product or geometric ratio).

    Computed in log space so a long sequence cannot overflow it.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats), response positions along the last axis.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    kind : {"product", "geometric"}
        The sequence weight.
    axis : int
        The axis of response positions.

    Returns
    -------
    ValueWithCounts
        The ESS, sequences used, sequences excluded.
    """
    return sequences_ess(sequence_log_ratio(d, mask, kind=kind, axis=axis))


def sequences_ess(s: ValueWithCounts) -> ValueWithCounts:
    """ESS over sequences of the raw weights ``exp(s)``, in log space.

    Parameters
    ----------
    s : ValueWithCounts
        :func:`~rlparity.metrics.objective.arrays.tokens.sequence_log_ratio` of every sequence (NaN: an excluded sequence).

    Returns
    -------
    ValueWithCounts
        The ESS, sequences used, sequences excluded.
    """
    return ValueWithCounts(float(ess_of(ess_parts(s.value, np.isfinite(s.value)))), *_sequence_counts(s))


__all__ = ["ess_of", "ess_parts", "merge_ess_parts", "sequence_ess", "sequences_ess", "token_ess", "weights_ess"]
