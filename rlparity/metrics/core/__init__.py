"""Mismatch metrics on plain numpy arrays (each definition in its function's docstring).

Conventions: ``d = log pi - log mu`` per token (nats), ``mask`` marks real tokens, and every
reduction takes ``axis`` (an int, a tuple, or ``None`` for all), as numpy does. Tokens where
``log pi = -inf`` (the trainer gives probability 0) are excluded from every average and counted
by :func:`~rlparity.metrics.core.reductions.zero_prob_count` instead; no function silently
averages them away. A reduction over no usable token is NaN (counts are 0).

One topic a module, every public name importable from here (``core.masked_mean``):
:mod:`~rlparity.metrics.core.reductions` (masked counts, means, RMS, maxima, standard deviations,
quantiles, correlations), :mod:`~rlparity.metrics.core.mismatch` (statistics of ``d``: ``|d|``,
the mean ratio, KL estimators, the ESS, the probability gap, the offset test),
:mod:`~rlparity.metrics.core.fits` (where a reading lies between two: least-squares and robust
slopes, the jackknife over sequences) and :mod:`~rlparity.metrics.core.lag` (policy lag).
"""

from __future__ import annotations

from rlparity.metrics.core.fits import jackknife_slope_se, reading_fit, robust_reading_fit
from rlparity.metrics.core.lag import lag_stats, token_lag
from rlparity.metrics.core.mismatch import (QUANTILES, abs_stats, ess, ess_from_sums, kl_estimators, mean_ratio,
                                            offset_test, prob_stats)
from rlparity.metrics.core.reductions import (count, finite_mask, masked_max_abs, masked_mean, masked_quantile,
                                              masked_rms, masked_std, pearson, zero_prob_count)

__all__ = [
    "QUANTILES", "abs_stats", "count", "ess", "ess_from_sums", "finite_mask", "jackknife_slope_se", "kl_estimators",
    "lag_stats", "masked_max_abs", "masked_mean", "masked_quantile", "masked_rms", "masked_std", "mean_ratio",
    "offset_test", "pearson", "prob_stats", "reading_fit", "robust_reading_fit", "token_lag", "zero_prob_count",
]
