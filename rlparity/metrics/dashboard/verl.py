"""verl's dashboard: ``rollout_corr/*`` (the off-policy, importance-sampling and rejection-sampling
metrics) and ``training/rollout_*``, with verl's own formulas (:func:`verl_metrics`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlparity.metrics.objective import OBJECTIVE_DEFAULTS
from rlparity.metrics.dashboard.formulas import _USABLE, _computed, _masked_max, _masked_min, _masked_std, _prep

SAFETY_BOUND = 20.0  # verl's exp clamp


def _vmean(x, m, axis=None):
    """verl_F.masked_mean: sum(x * m) / (sum(m) + 1e-8)."""
    return (x * m).sum(axis=axis) / (m.sum(axis=axis) + 1e-8)


def _seq_fraction(cond, valid):
    """The share of the ``valid`` sequences meeting ``cond`` (verl: ``cond[valid].mean()``)."""
    return (cond & valid).sum() / np.maximum(valid.sum(), 1)


def _verl_is_metrics(d, m, level, cap):
    mf = m.astype(float)
    if level == "token":
        raw = np.exp(np.clip(d, -SAFETY_BOUND, SAFETY_BOUND)) * mf
    elif level == "sequence":
        s = (d * mf).sum(axis=-1, keepdims=True)
        raw = np.exp(np.clip(s, -SAFETY_BOUND, SAFETY_BOUND)) * mf
    else:
        raise ValueError(f"rollout_is={level!r}; use 'token', 'sequence' or None")
    w = np.minimum(raw, cap)
    lower = 1.0 / cap
    out: dict[str, Any] = {}
    if level == "sequence":
        out["rollout_is_max"] = np.exp(np.minimum(s.max(), SAFETY_BOUND))
        out["rollout_is_min"] = np.exp(s.min())
        out["rollout_is_mean"] = _vmean(w, mf)
        out["rollout_is_ratio_fraction_high"] = (s > math.log(cap)).mean()
        out["rollout_is_ratio_fraction_low"] = (s < math.log(lower)).mean()
    else:
        out["rollout_is_mean"] = _vmean(w, mf)
        out["rollout_is_ratio_fraction_high"] = _vmean((raw > cap).astype(float), mf)
        out["rollout_is_ratio_fraction_low"] = _vmean((raw < lower).astype(float), mf)
        out["rollout_is_max"] = _masked_max(w, m)
        out["rollout_is_min"] = _masked_min(w, m)
    wc = np.clip(w, 0.0, cap)
    mc, mc2 = _vmean(wc, mf), _vmean(wc ** 2, mf)
    out["rollout_is_std"] = np.where(mf.sum() > 1, np.sqrt(np.maximum(mc2 - mc ** 2, 0.0)), 0.0)
    # 1 / mean((wc / (mean wc + 1e-8))^2), its mean of squares taken in the same pass as mean wc
    out["rollout_is_eff_sample_size"] = (mc + 1e-8) ** 2 / mc2
    seq = _vmean(w, mf, axis=-1)
    out["rollout_is_seq_mean"] = seq.mean()
    out["rollout_is_seq_std"] = seq.std(ddof=1) if seq.size > 1 else 0.0
    out["rollout_is_seq_max"] = seq.max()
    out["rollout_is_seq_min"] = seq.min()
    out["rollout_is_seq_max_deviation"] = np.abs(seq - 1.0).max()
    raw_seq = _vmean(raw, mf, axis=-1)
    out["rollout_is_seq_fraction_high"] = (raw_seq > cap).mean()
    out["rollout_is_seq_fraction_low"] = (raw_seq < lower).mean()
    return out


_RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
               "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def _verl_rs(d, m, options: Mapping[str, Any]):
    mf = m.astype(float)
    ls = np.clip(d, -SAFETY_BOUND, SAFETY_BOUND)
    tk = {"k1": lambda: -ls, "k2": lambda: 0.5 * ls ** 2, "k3": lambda: np.exp(ls) - 1.0 - ls}
    seq_valid = mf.sum(axis=-1) > 0
    combined = None
    out: dict[str, Any] = {}
    for opt, thr in options.items():
        level, est = opt.rsplit("_", 1)
        if opt not in _RS_OPTIONS:
            raise ValueError(f"rollout_rs option {opt!r} is not one of verl's k1/k2/k3 options")
        is_k1 = est == "k1"
        if is_k1:
            if np.ndim(thr) != 1:
                raise ValueError(f"rollout_rs threshold of {opt} must be a (lower, upper) ratio pair, got {thr!r}")
            lo_log, hi_log = math.log(thr[0]), math.log(thr[1])
        else:
            lo_log, hi_log = None, float(thr)
        k = tk[est]()
        up = hi_log
        low = lo_log if is_k1 else 0.0
        p = f"rollout_rs_{opt}"
        if level == "token":
            stat = k
            keep = (stat >= lo_log) & (stat <= hi_log) if is_k1 else stat <= hi_log
            out[f"{p}_mean"] = _vmean(stat, mf)
            out[f"{p}_max"], out[f"{p}_min"] = _masked_max(stat, m), _masked_min(stat, m)
            out[f"{p}_fraction_high"] = _vmean((stat > up).astype(float), mf)
            out[f"{p}_fraction_low"] = _vmean((stat < low).astype(float), mf) if is_k1 else 0.0
        else:
            if level == "seq_sum":
                seq_stat = (k * mf).sum(axis=-1)
            elif level == "seq_mean":
                seq_stat = _vmean(k, mf, axis=-1)
            else:
                mx = np.where(m, k, -np.inf).max(axis=-1)
                seq_stat = np.where(mx == -np.inf, 0.0, mx)
            keep_s = (seq_stat >= lo_log) & (seq_stat <= hi_log) if is_k1 else seq_stat <= hi_log
            keep = keep_s[:, None]  # broadcast over positions
            out[f"{p}_mean"] = _vmean(seq_stat[:, None], mf)
            out[f"{p}_max"], out[f"{p}_min"] = _masked_max(seq_stat, seq_valid), _masked_min(seq_stat, seq_valid)
            out[f"{p}_fraction_high"] = _seq_fraction(seq_stat > up, seq_valid)
            out[f"{p}_fraction_low"] = _seq_fraction(seq_stat < low, seq_valid) if is_k1 else 0.0
        kf = keep.astype(float)
        combined = kf if combined is None else combined * kf
        out[f"{p}_masked_fraction"] = _vmean(1.0 - kf, mf)
        seq_keep = (~(~keep & m)).all(axis=-1)
        out[f"{p}_seq_masked_fraction"] = ((1.0 - seq_keep) * seq_valid).sum() / np.maximum(seq_valid.sum(), 1)
    if options:
        out["rollout_rs_masked_fraction"] = _vmean(1.0 - combined, mf)
        final_keep = (combined > 0.5) & m
        out["rollout_rs_seq_masked_fraction"] = (~final_keep & m).any(axis=-1).mean()
    return out


@_computed
def verl_metrics(log_train, log_rollout, mask, *, rollout_is: str | None = "token",
                 rollout_is_threshold: float | None = None,
                 rollout_rs: Mapping[str, Any] | None = None) -> dict[str, float]:
    """verl's ``rollout_corr/*`` and ``training/rollout_*`` metrics.

    Pair: ``old_log_prob`` = the trainer recomputed at the rollout's weights (pi_old) against
    ``rollout_log_prob`` (mu); verl's ``log_ratio = log pi_train - log pi_rollout``. Source:
    verl-project/verl ``verl/trainer/ppo/rollout_corr_helper.py`` at 20c30bf8 and
    ``verl/utils/debug/metrics.py``:

    * ``kl`` = token mean of ``log mu - log pi`` (k1 of KL(mu||pi), may be negative);
      ``k3_kl`` = token mean of ``exp(d) - d - 1`` (unclamped).
    * ``training_ppl`` / ``rollout_ppl``: batch mean of per-sequence ``exp(-mean_t logp)``;
      ``*_log_ppl`` without the exp; ``log_ppl_diff`` = batch mean of (seq-mean logp_rollout -
      seq-mean logp_train), ``log_ppl_abs_diff``, ``_max``, ``_min``; ``ppl_ratio`` = batch mean of
      ``exp(log_ppl_diff_i)``.
    * ``chi2_token`` = token mean of ``exp(2 clamp(d, +-20))`` - 1; ``chi2_seq`` = sequence mean of
      ``exp(2 clamp(sum_t d, +-20))`` - 1.
    * ``rollout_is_*`` (``rollout_is`` = ``"token"`` | ``"sequence"`` | None, threshold C default
      ``OBJECTIVE_DEFAULTS.is_cap``, verl's 2.0): weights ``exp(clamp(d))`` or the broadcast
      ``exp(clamp(sum d))``, truncated ``min(w, C)``; mean / max / min of truncated weights (sequence
      mode: max / min from the log sums), fraction above C / below 1/C of the raw weights; ``std``
      and ``eff_sample_size = 1 / mean((w / mean w)^2)`` of the weights clamped to [0, C];
      ``rollout_is_seq_*`` on per-sequence means of the truncated weights (std with n - 1),
      ``seq_fraction_high/low`` on per-sequence means of the raw weights.
    * ``rollout_rs_*`` (``rollout_rs`` = ``{option: threshold}``, default the three band rules as
      verl options: ``token_k1`` with the token band, ``seq_mean_k1`` with the geometric band,
      ``seq_sum_k1`` with the product band): k1 = -d, k2 = d^2 / 2, k3 = exp(d) - 1 - d on
      ``clamp(d, +-20)``; a k1 threshold is a ratio pair ``(lower, upper)`` applied as
      ``log lower <= k1 <= log upper`` (verl's rule: with a symmetric band this is the ratio band);
      k2 / k3 an upper bound. Per option ``_mean``, ``_max``, ``_min``, ``_fraction_high``,
      ``_fraction_low``, ``_masked_fraction`` (tokens), ``_seq_masked_fraction``; combined
      ``rollout_rs_masked_fraction`` and ``rollout_rs_seq_masked_fraction``.
    * ``training/rollout_probs_diff_{max,mean,std}`` of ``|exp(log pi) - exp(log mu)|`` (std with
      n - 1) and ``training/rollout_actor_probs_pearson_corr`` of the probabilities.

    verl's masked mean divides by ``count + 1e-8``; so does this. Every statistic is a whole-batch
    one (``dim=`` makes no sense here); the arrays may be dask arrays (streamed chunk by chunk,
    evaluated in one ``dask.compute``).

    Parameters
    ----------
    log_train : numpy.ndarray or dask.array.Array
        The trainer side's log-probabilities, ``(sequence, position)``.
    log_rollout : numpy.ndarray or dask.array.Array
        The rollout's (mu) log-probabilities, same shape.
    mask : numpy.ndarray or dask.array.Array
        Boolean, real tokens.
    rollout_is : {"token", "sequence"} or None
        verl's importance-sampling level.
    rollout_is_threshold : float, optional
        The truncation C (default ``OBJECTIVE_DEFAULTS.is_cap``).
    rollout_rs : mapping, optional
        verl's rejection-sampling options, ``{rule: threshold}``.

    Returns
    -------
    dict
        ``{peer metric name: float}``.
    """
    lt, lr, m = _prep(log_train, log_rollout, mask)
    mf = m.astype(float)
    n = mf.sum()
    d = lt - lr
    o = OBJECTIVE_DEFAULTS
    cap = o.is_cap if rollout_is_threshold is None else float(rollout_is_threshold)
    out: dict[str, Any] = {}
    if rollout_is is not None:
        out.update(_verl_is_metrics(d, m, rollout_is, cap))
    rs = ({"token_k1": o.token_band, "seq_mean_k1": o.geometric_band, "seq_sum_k1": o.product_band}
          if rollout_rs is None else dict(rollout_rs))
    out.update(_verl_rs(d, m, rs))
    mt = _vmean(lt, mf, axis=-1)
    mr = _vmean(lr, mf, axis=-1)
    out["training_ppl"] = np.exp(-mt).mean()
    out["training_log_ppl"] = (-mt).mean()
    out["kl"] = _vmean(lr - lt, mf)
    out["k3_kl"] = _vmean(np.exp(d) - d - 1.0, mf)
    out["rollout_ppl"] = np.exp(-mr).mean()
    out["rollout_log_ppl"] = (-mr).mean()
    lpd = mr - mt
    out["log_ppl_diff"] = lpd.mean()
    out["log_ppl_abs_diff"] = np.abs(lpd).mean()
    out["log_ppl_diff_max"] = lpd.max()
    out["log_ppl_diff_min"] = lpd.min()
    out["ppl_ratio"] = np.exp(lpd).mean()
    rho = np.exp(np.clip(d, -SAFETY_BOUND, SAFETY_BOUND))
    out["chi2_token"] = _vmean(rho ** 2, mf) - 1.0
    s = np.clip((d * mf).sum(axis=-1), -SAFETY_BOUND, SAFETY_BOUND)
    out["chi2_seq"] = np.exp(2.0 * s).mean() - 1.0
    metrics = {f"rollout_corr/{k}": v for k, v in out.items()}
    pt, pr = np.exp(lt), np.exp(lr)
    diff = np.abs(pt - pr)
    nn = np.maximum(n, 1)
    metrics["training/rollout_probs_diff_max"] = _masked_max(diff, m)
    metrics["training/rollout_probs_diff_mean"] = (diff * mf).sum() / nn
    metrics["training/rollout_probs_diff_std"] = _masked_std(diff, mf, n)
    spt, spr = (pt * mf).sum(), (pr * mf).sum()
    cxy = (pt * pr * mf).sum() - spt * spr / nn
    cxx = (pt * pt * mf).sum() - spt * spt / nn
    cyy = (pr * pr * mf).sum() - spr * spr / nn
    metrics["training/rollout_actor_probs_pearson_corr"] = cxy / np.sqrt(cxx * cyy)
    metrics[_USABLE] = n
    return metrics


__all__ = ["verl_metrics"]
