"""The objective layer's numpy core: functions of ``d`` (any shape, response positions along
``axis``, default the last) and a boolean ``mask`` of real tokens (``None``: every non-NaN entry);
every reduction returns :class:`ValueWithCounts` (value, entries used, entries excluded)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from rlparity.config.defaults import Level
from rlparity.metrics import core
from rlparity.metrics.objective.settings import BAND_RULES, KL_RULES, OBJECTIVE_DEFAULTS, RULES, Kind

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
    """The normalised ESS ``s1^2 / (n s2)`` of :func:`ess_parts` (:func:`rlparity.metrics.core.ess`).

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


def token_clip_fraction(d: np.ndarray, mask: np.ndarray | None = None, *, eps_low: float | None = None,
                        eps_high: float | None = None, axis=None) -> ValueWithCounts:
    """PPO clip fraction: share of usable tokens with ``rho = exp(d)`` outside the clip range.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats), response positions along the last axis.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    eps_low, eps_high : float, optional
        The range ``[1 - eps_low, 1 + eps_high]`` (default ``OBJECTIVE_DEFAULTS.ppo_eps``).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    ValueWithCounts
        The share, tokens used, tokens excluded (over ``axis``).
    """
    lo, hi = _eps(eps_low, eps_high, "token")
    u = finite_tokens(d, mask)
    r = _safe_exp(d, u)
    return share_of(share_parts((r < lo) | (r > hi), d, mask, axis))


def sequence_clip_fraction(d: np.ndarray, mask: np.ndarray | None = None, *, eps_low: float | None = None,
                           eps_high: float | None = None, kind: Kind = "geometric", axis: int = -1) -> ValueWithCounts:
    """GSPO clip fraction: share of sequences whose ratio lies outside the clip range.

    The ratio is ``s_i = exp(mean_t d)`` (``kind="geometric"``) or ``exp(sum_t d)``.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats), response positions along the last axis.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    eps_low, eps_high : float, optional
        The range ``[1 - eps_low, 1 + eps_high]`` (default the GSPO paper's 3e-4 / 4e-4).
    kind : {"geometric", "product"}
        The sequence ratio.
    axis : int
        The axis of response positions.

    Returns
    -------
    ValueWithCounts
        The share, sequences used, sequences excluded.
    """
    lo, hi = _eps(eps_low, eps_high, "sequence")
    return sequences_clip_fraction(sequence_log_ratio(d, mask, kind=kind, axis=axis), lo, hi)


def sequences_clip_fraction(s: ValueWithCounts, low: float, high: float) -> ValueWithCounts:
    """The share of sequences whose ratio ``exp(s)`` lies outside ``[low, high]``.

    Parameters
    ----------
    s : ValueWithCounts
        :func:`sequence_log_ratio` of every sequence (NaN: an excluded sequence).
    low, high : float
        The band on the ratio (``1 - eps_low``, ``1 + eps_high``).

    Returns
    -------
    ValueWithCounts
        The share, sequences used, sequences excluded.
    """
    ok = np.isfinite(s.value)
    r = _safe_exp(s.value, ok)
    return ValueWithCounts(float(_share((r < low) | (r > high), ok)), *_sequence_counts(s))


def _eps(eps_low, eps_high, level):
    dl, dh = OBJECTIVE_DEFAULTS.eps(level)
    return 1.0 - (dl if eps_low is None else eps_low), 1.0 + (dh if eps_high is None else eps_high)


def importance_weights(d: np.ndarray, mask: np.ndarray | None = None, *, level: Level = "token",
                       kind: Kind = "product", cap: float | None = None, axis: int = -1) -> np.ndarray:
    """Importance weights shaped like ``d``: token ``w_t = exp(d_t)``.

    sequence ``w_i = exp(sum_t d)`` (``kind="product"``) or ``exp(mean_t d)`` (``"geometric"``) on
    every token of the sequence. With ``cap`` the weights are truncated, ``min(w, cap)`` (TIS). NaN
    at padding, at excluded tokens and on every token of an excluded sequence.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    level : {"token", "sequence"}
        Token or sequence level.
    kind : {"product", "geometric"}
        The sequence ratio: ``sum_t d`` or ``mean_t d``.
    cap : float, optional
        Truncate at ``min(w, cap)`` (None: raw weights).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    numpy.ndarray
        Weights shaped like ``d``.
    """
    if level == "token":
        u = finite_tokens(d, mask)
        w = np.where(u, _safe_exp(d, u), np.nan)
    elif level == "sequence":
        s = sequence_log_ratio(d, mask, kind=kind, axis=axis)
        ok = np.isfinite(s.value)
        ws = np.where(ok, _safe_exp(s.value, ok), np.nan)
        w = np.where(real_tokens(d, mask), np.expand_dims(ws, axis), np.nan)
    else:
        raise ValueError(f"level={level!r}; use 'token' or 'sequence'")
    return w if cap is None else np.minimum(w, cap)


def tis_weights(d: np.ndarray, mask: np.ndarray | None = None, *, cap: float | None = None) -> np.ndarray:
    """Token truncated importance sampling: ``w = min(rho, C)`` (``C`` default ``OBJECTIVE_DEFAULTS.is_cap``).

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    cap : float, optional
        The truncation ``C`` (default ``OBJECTIVE_DEFAULTS.is_cap``).

    Returns
    -------
    numpy.ndarray
        Truncated token weights shaped like ``d``.
    """
    return importance_weights(d, mask, level="token", cap=OBJECTIVE_DEFAULTS.is_cap if cap is None else cap)


def band_keep(d: np.ndarray, mask: np.ndarray | None = None, *, band: tuple[float, float],
              level: Level = "token", kind: Kind = "geometric", axis: int = -1) -> np.ndarray:
    """Rejection by a ratio band: keep a usable token whose ``rho`` (``level="token"``), or every
    token of a sequence whose product / geometric ratio (``"sequence"``), lies in ``band``. Excluded
    tokens and padding are never kept.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    band : tuple of float
        ``(low, high)`` on the ratio.
    level : {"token", "sequence"}
        Token ratio, or the sequence's ratio on each of its tokens.
    kind : {"product", "geometric"}
        The sequence ratio: ``sum_t d`` or ``mean_t d``.
    axis : int
        The axis of response positions.

    Returns
    -------
    numpy.ndarray
        Boolean, the tokens kept.
    """
    lo, hi = band
    w = importance_weights(d, mask, level=level, kind=kind, axis=axis)
    with np.errstate(invalid="ignore"):
        return np.isfinite(w) & (w >= lo) & (w <= hi) & finite_tokens(d, mask)


def kl_statistic(d: np.ndarray, estimator: str) -> np.ndarray:
    """Schulman's estimators per token with ``r = exp(d)``: ``k1 = -d``, ``k2 = d^2 / 2``, ``k3 = r
    - 1 - d`` (samples from the denominator policy; k1 and k3 estimate KL(denominator ||
    numerator)).

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    estimator : {"k1", "k2", "k3"}
        Schulman's estimator.

    Returns
    -------
    numpy.ndarray
        The estimator per token.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        if estimator == "k1":
            return -d
        if estimator == "k2":
            return 0.5 * d ** 2
        if estimator == "k3":
            return np.expm1(d) - d
    raise ValueError(f"estimator={estimator!r}; use 'k1', 'k2' or 'k3'")


def kl_keep(d: np.ndarray, mask: np.ndarray | None = None, *, rule: str = "token_k3",
            threshold: float | tuple[float, float] | None = None, axis: int = -1) -> np.ndarray:
    """Rejection by a KL estimator (verl's ``rollout_rs`` options): ``rule`` is ``<level>_<k>`` with
    level ``token`` | ``seq_sum`` | ``seq_mean`` | ``seq_max``. The statistic is the token's k
    value, or its sum / mean / max over the sequence. ``k1`` keeps a statistic inside the band
    ``threshold = (low, high)``; ``k2`` / ``k3`` keep it ``<= threshold``. Defaults:
    ``OBJECTIVE_DEFAULTS.kl_thresholds[rule]``. Excluded tokens are never kept, and a sequence rule
    drops every token of a sequence with an excluded token.

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    rule : str
        ``<level>_<k>``, one of :data:`KL_RULES`.
    threshold : float or tuple, optional
        ``(low, high)`` for k1, an upper bound for k2 / k3 (default ``OBJECTIVE_DEFAULTS.kl_thresholds[rule]``).
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    numpy.ndarray
        Boolean, the tokens kept.
    """
    if rule not in KL_RULES:
        raise ValueError(f"rule={rule!r}; use one of {list(KL_RULES)}")
    level, est = rule.rsplit("_", 1)
    thr = OBJECTIVE_DEFAULTS.kl_thresholds[rule] if threshold is None else threshold
    if est == "k1":
        if np.ndim(thr) != 1 or len(thr) != 2:
            raise ValueError(f"{rule}: threshold must be a (low, high) band on k1 = -d in nats, got {thr!r}")
        lo, hi = thr
    else:
        if np.ndim(thr) != 0:
            raise ValueError(f"{rule}: threshold must be one upper bound (nats), got {thr!r}")
        lo, hi = -np.inf, float(thr)
    m = real_tokens(d, mask)
    u = m & np.isfinite(d)
    k = np.where(u, kl_statistic(np.where(u, d, 0.0), est), np.nan)
    if level == "token":
        stat = k
    else:
        bad = (m & ~u).any(axis=axis)
        if level == "seq_sum":
            s = np.where(u, k, 0.0).sum(axis=axis)
        elif level == "seq_mean":
            n = m.sum(axis=axis)
            s = np.where(u, k, 0.0).sum(axis=axis) / np.maximum(n, 1)
        else:
            s = np.where(u, k, -np.inf).max(axis=axis)
        s = np.where(bad | (m.sum(axis=axis) == 0), np.nan, s)
        stat = np.expand_dims(s, axis)
    with np.errstate(invalid="ignore"):
        return u & np.isfinite(stat) & (stat >= lo) & (stat <= hi)


def rejection_keep(d: np.ndarray, mask: np.ndarray | None = None, *, rule: str = "token_band",
                   threshold: Any = None, axis: int = -1) -> np.ndarray:
    """One rejection rule: ``token_band`` (rho in ``[1/C, C]``), ``geometric_band`` and
    ``product_band`` (sequence ratio in a band), or a KL rule of :func:`kl_keep`. ``threshold`` is
    the band or bound (default from :data:`OBJECTIVE_DEFAULTS`).

    Parameters
    ----------
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    rule : str
        One of :data:`RULES`.
    threshold : optional
        The rule's band or bound (default from :data:`OBJECTIVE_DEFAULTS`).
    axis : int
        The axis of response positions.

    Returns
    -------
    numpy.ndarray
        Boolean, the tokens kept.
    """
    if rule in BAND_RULES:
        band = OBJECTIVE_DEFAULTS.band(rule) if threshold is None else tuple(threshold)
        level: Level = "token" if rule == "token_band" else "sequence"
        kind: Kind = "product" if rule == "product_band" else "geometric"
        return band_keep(d, mask, band=band, level=level, kind=kind, axis=axis)
    if rule in KL_RULES:
        return kl_keep(d, mask, rule=rule, threshold=threshold, axis=axis)
    raise ValueError(f"rule={rule!r}; use one of {list(RULES)}")


def rejected_fraction(keep: np.ndarray, d: np.ndarray, mask: np.ndarray | None = None, *,
                      level: Level = "token", axis=None, position_axis: int = -1) -> ValueWithCounts:
    """Share rejected by a rejection mask.

    ``level="token"``: usable tokens not kept (over ``axis``). ``"sequence"``: sequences (with a
    usable token) that lose at least one usable token; counts are sequences. Excluded tokens are
    reported in ``n_excluded``, not as rejected; the other tokens of a sequence that a sequence
    rule drops because its ratio is undefined do count as rejected.

    Parameters
    ----------
    keep : numpy.ndarray
        Boolean, shaped like ``d``: the tokens a rule keeps.
    d : numpy.ndarray
        Per-token log ratio (nats), response positions along the last axis.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    level : {"token", "sequence"}
        Share of tokens, or of sequences.
    axis : int or tuple of int, optional
        Axes reduced (token level; ``None``: all).
    position_axis : int
        The axis of response positions (sequence level).

    Returns
    -------
    ValueWithCounts
        The share, with tokens (or sequences) used and excluded.
    """
    if level == "token":
        return share_of(share_parts(~np.asarray(keep, bool), d, mask, axis))
    if level != "sequence":
        raise ValueError(f"level={level!r}; use 'token' or 'sequence'")
    return sequences_rejected(rejected_sequences(keep, d, mask, position_axis=position_axis))


def rejected_sequences(keep: np.ndarray, d: np.ndarray, mask: np.ndarray | None = None, *,
                       position_axis: int = -1) -> dict[str, np.ndarray]:
    """Per sequence: whether it has a usable token, loses one to a rejection, holds an excluded one.

    Parameters
    ----------
    keep : numpy.ndarray
        Boolean, shaped like ``d``: the tokens a rule keeps.
    d : numpy.ndarray
        Per-token log ratio (nats).
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    position_axis : int
        The axis of response positions.

    Returns
    -------
    dict
        Boolean arrays, one entry per sequence: ``has``, ``hit``, ``excluded`` (concatenate
        blocks of sequences, then :func:`sequences_rejected`).
    """
    u = finite_tokens(d, mask)
    return {"has": u.any(axis=position_axis), "hit": (u & ~np.asarray(keep, bool)).any(axis=position_axis),
            "excluded": (real_tokens(d, mask) & ~u).any(axis=position_axis)}


def sequences_rejected(parts: dict[str, np.ndarray]) -> ValueWithCounts:
    """The share of sequences (with a usable token) that lose at least one to a rejection.

    Parameters
    ----------
    parts : dict
        :func:`rejected_sequences` of every sequence.

    Returns
    -------
    ValueWithCounts
        The share, sequences used, sequences with an excluded token.
    """
    return ValueWithCounts(float(_share(parts["hit"], parts["has"])), int(parts["has"].sum()),
                           int(parts["excluded"].sum()))


def weights_ess(weights: np.ndarray, valid: np.ndarray | None = None, axis=None) -> ValueWithCounts:
    """:func:`rlparity.metrics.core.ess` (``(sum w)^2 / (n sum w^2)`` in (0, 1] over the finite,
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
        :func:`sequence_log_ratio` of every sequence (NaN: an excluded sequence).

    Returns
    -------
    ValueWithCounts
        The ESS, sequences used, sequences excluded.
    """
    return ValueWithCounts(float(ess_of(ess_parts(s.value, np.isfinite(s.value)))), *_sequence_counts(s))


def decoupled_weights(log_mu: np.ndarray, log_old: np.ndarray, log_theta: np.ndarray,
                      mask: np.ndarray | None = None, *, cap: float | None = None) -> dict[str, np.ndarray]:
    """The decoupled (three-policy) token weight and its parts, shaped like the inputs:

    * ``correction_weight`` = pi_old / mu (backend pair), truncated at ``cap`` when given;
    * ``update_ratio`` = pi_theta / pi_old (update pair, what PPO clips);
    * ``weight`` = their product, the factor on the advantage;
    * ``bypass_ratio`` = pi_theta / mu (two-policy form; equals ``weight`` when ``cap`` is None).

    Parameters
    ----------
    log_mu : numpy.ndarray
        Log-probabilities of the rollout (mu).
    log_old : numpy.ndarray
        Log-probabilities of the trainer at the rollout's weights (pi_old).
    log_theta : numpy.ndarray
        Log-probabilities of the trainer after the step (pi_theta).
    mask : numpy.ndarray, optional
        Real tokens (``None``: where pi_old and mu are not NaN).
    cap : float, optional
        Truncation of the correction weight (None: raw).

    Returns
    -------
    dict
        ``correction_weight``, ``update_ratio``, ``weight``, ``bypass_ratio``, each shaped like the inputs.
    """
    m = real_tokens(logprob_difference(log_old, log_mu), mask) if mask is None else np.asarray(mask, bool)
    corr = importance_weights(logprob_difference(log_old, log_mu, m), m, cap=cap)
    upd = importance_weights(logprob_difference(log_theta, log_old, m), m)
    return {"correction_weight": corr, "update_ratio": upd, "weight": corr * upd,
            "bypass_ratio": importance_weights(logprob_difference(log_theta, log_mu, m), m)}
