"""The objective layer: three policies, their ratios, the corrections trainers apply to them, and
the health of the importance weights (each definition in its function's docstring).

Three policies per response token:

* mu = ``rollout_logprob``: the engine that sampled the token (behaviour policy);
* pi_old = the trainer at the rollout's weights: ``trainer_processed_logprob``
  (``trainer="processed"``) or ``trainer_logprob`` (``trainer="raw"``); ``trainer=None`` (every
  function's default) is ``defaults().trainer``;
* pi_theta = the trainer after an optimizer step: ``trainer_updated_processed_logprob`` /
  ``trainer_updated_logprob`` (written by :func:`rlparity.train.train_step`).

Three pairs, each with ``d = log numerator - log denominator`` per token (nats) and
``rho = exp(d)``:

* ``backend``: (pi_old, mu), d = log pi_old - log mu: the backend mismatch, and the weight a
  decoupled trainer uses to correct for it;
* ``update``: (pi_theta, pi_old), d = log pi_theta - log pi_old: the policy change PPO / GSPO clip;
* ``bypass``: (pi_theta, mu), d = log pi_theta - log mu: the two-policy form of a trainer that
  never recomputes pi_old (the decoupled weight pi_old/mu x pi_theta/pi_old equals it exactly
  when nothing is truncated).

Layers, as in ArviZ: a numpy core whose functions take ``d`` (any shape, response positions along
``axis``, default the last) and a boolean ``mask`` of real tokens (``None``: every non-NaN entry),
then a thin xarray layer on traces whose reductions take ``dim=`` (``None``: everything,
``"position"``: one value per sequence, ``"sequence"``: one value per position).

A lazy trace (``rlparity.trace.open_arms(store, chunks=N)``) is reduced block by block with
bounded memory: every reduction is written as parts that merge across blocks of whole sequences
(:func:`share_parts`, :func:`ess_parts`, per-sequence values), read through
:func:`rlparity.trace.blocks` (validated, the store's CRC record checked); per-token results of a
lazy trace are lazy (dask).

Tokens a policy gives probability 0 (``d = -inf`` or ``+inf``, or NaN where both do) are never
averaged away. Token-level results leave such a token out and count it (``n_excluded``);
sequence-level results leave out the whole sequence, whose product or geometric ratio is 0 or
infinite, and count it. A rejection mask never keeps an excluded token. Every core reduction
returns :class:`ValueWithCounts` (value, how many entries it used, how many it excluded); the xarray
layer puts ``n_used`` / ``n_excluded`` on the result as coordinates and names the pair and the
direction in its attrs.

All thresholds default to :data:`OBJECTIVE_DEFAULTS`.

One topic a module: :mod:`~rlparity.metrics.objective.settings` (rule names, thresholds),
:mod:`~rlparity.metrics.objective.arrays` (the numpy core),
:mod:`~rlparity.metrics.objective.pairs` (the policies and pairs on a trace, read whole or block by block),
:mod:`~rlparity.metrics.objective.traces` (the xarray layer: the reductions with ``dim=``) and
:mod:`~rlparity.metrics.objective.table` (:func:`objective_summary`); every public name is
importable from here.
"""

from __future__ import annotations

from rlparity.metrics.objective.arrays import (
    ValueWithCounts,
    band_keep,
    decoupled_weights,
    ess_of,
    ess_parts,
    finite_tokens,
    importance_weights,
    kl_keep,
    kl_statistic,
    logprob_difference,
    merge_ess_parts,
    real_tokens,
    rejected_fraction,
    rejected_sequences,
    rejection_keep,
    sequence_clip_fraction,
    sequence_ess,
    sequence_log_ratio,
    sequences_clip_fraction,
    sequences_ess,
    sequences_rejected,
    share_of,
    share_parts,
    tis_weights,
    token_clip_fraction,
    token_counts,
    token_ess,
    token_mean,
    weights_ess,
)
from rlparity.metrics.objective.pairs import (
    PAIRS,
    POLICY_NAMES,
    POLICY_VARIABLES,
    available_pairs,
    pair_blocks,
    pair_direction,
    pair_log_ratio,
    pair_sequences,
    policy_logprob,
    policy_variable,
    trace_blocks,
)
from rlparity.metrics.objective.settings import (
    BAND_RULES,
    KL_RULES,
    OBJECTIVE_DEFAULTS,
    RULES,
    Kind,
    PairName,
)
from rlparity.metrics.objective.table import objective_summary
from rlparity.metrics.objective.traces import (
    clip_fraction,
    decoupled,
    effective_sample_size,
    is_weights,
    masked_fraction,
    ratio,
)

__all__ = [
    "BAND_RULES", "KL_RULES", "OBJECTIVE_DEFAULTS", "PAIRS", "POLICY_NAMES", "POLICY_VARIABLES", "RULES", "Kind",
    "ValueWithCounts", "PairName",
    "available_pairs", "band_keep", "clip_fraction", "decoupled", "decoupled_weights", "effective_sample_size",
    "ess_of", "ess_parts", "finite_tokens",
    "importance_weights", "is_weights", "kl_keep", "kl_statistic", "logprob_difference", "masked_fraction",
    "merge_ess_parts", "objective_summary", "pair_blocks", "pair_direction", "pair_log_ratio", "pair_sequences",
    "policy_logprob", "policy_variable", "ratio", "real_tokens", "rejected_fraction", "rejected_sequences",
    "rejection_keep", "sequence_clip_fraction", "sequence_ess", "sequence_log_ratio", "sequences_clip_fraction",
    "sequences_ess", "sequences_rejected", "share_of", "share_parts", "tis_weights", "token_clip_fraction",
    "token_counts", "token_ess", "token_mean", "trace_blocks", "weights_ess",
]
