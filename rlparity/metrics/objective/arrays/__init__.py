"""The objective layer's numpy core: functions of ``d`` (any shape, response positions along
``axis``, default the last) and a boolean ``mask`` of real tokens (``None``: every non-NaN entry);
every reduction returns :class:`ValueWithCounts` (value, entries used, entries excluded).

One topic a module, every public name importable from here: :mod:`~rlparity.metrics.objective.arrays.tokens`
(``d``, the real / usable token masks, counts, shares, token means, the per-sequence log ratio),
:mod:`~rlparity.metrics.objective.arrays.weights` (clip fractions, importance and decoupled weights),
:mod:`~rlparity.metrics.objective.arrays.ess` (effective sample sizes) and
:mod:`~rlparity.metrics.objective.arrays.rejection` (rejection masks and the shares they reject)."""

from __future__ import annotations

from rlparity.metrics.objective.arrays.ess import (
    ess_of,
    ess_parts,
    merge_ess_parts,
    sequence_ess,
    sequences_ess,
    token_ess,
    weights_ess,
)
from rlparity.metrics.objective.arrays.rejection import (
    band_keep,
    kl_keep,
    kl_statistic,
    rejected_fraction,
    rejected_sequences,
    rejection_keep,
    sequences_rejected,
)
from rlparity.metrics.objective.arrays.tokens import (
    ValueWithCounts,
    finite_tokens,
    logprob_difference,
    real_tokens,
    sequence_log_ratio,
    share_of,
    share_parts,
    token_counts,
    token_mean,
)
from rlparity.metrics.objective.arrays.weights import (
    decoupled_weights,
    importance_weights,
    sequence_clip_fraction,
    sequences_clip_fraction,
    tis_weights,
    token_clip_fraction,
)

__all__ = [
    "ValueWithCounts", "band_keep", "decoupled_weights", "ess_of", "ess_parts", "finite_tokens", "importance_weights",
    "kl_keep", "kl_statistic", "logprob_difference", "merge_ess_parts", "real_tokens", "rejected_fraction",
    "rejected_sequences", "rejection_keep", "sequence_clip_fraction", "sequence_ess", "sequence_log_ratio",
    "sequences_clip_fraction", "sequences_ess", "sequences_rejected", "share_of", "share_parts", "tis_weights",
    "token_clip_fraction", "token_counts", "token_ess", "token_mean", "weights_ess",
]
