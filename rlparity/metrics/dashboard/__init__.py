"""Our numbers under the peers' own dashboard names, with the peers' own formulas, so a user can
put an rlparity trace next to their verl / PipelineRL / prime-rl / slime / TRL / NeMo-RL run.

Each ``<peer>_metrics`` function takes plain arrays ``(log_train, log_rollout, mask)`` (nats,
``(sequence, position)``) and reproduces one peer's code, cited in its docstring with the commit
read: which pair, which aggregation (mean over tokens, or mean over sequences of per-sequence
means), which clamps. :func:`as_dashboard` feeds them from a trace.

Which pair. Every peer here compares a trainer reading with the rollout engine's logprob mu.
verl, slime, TRL and NeMo-RL recompute the trainer at the rollout's weights (pi_old): the
backend pair (pi_old, mu). prime-rl ("trainer" vs "inference") and PipelineRL ("new" vs "old")
never recompute pi_old: their "old" / "inference" logprobs are the ones vLLM returned (mu), and
"new" / "trainer" is the trainer's current weights. On the first micro-batch of a step at lag 0
that is pi_old (the backend pair); after an optimizer step it is pi_theta (the bypass pair
(pi_theta, mu)). ``as_dashboard(policy="old" | "theta")`` picks which trainer reading stands in
for the peer's; the pair and direction are recorded on the result.

Tokens a policy gives probability 0 are removed from the mask before any peer formula runs (the
peers would turn them into infinities or clamp them silently) and counted on the result
(``n_excluded``).

A lazy trace (``open_arms(store, chunks=N)``) is streamed: every formula is written so dask can
reduce it chunk by chunk (see the note in :mod:`~rlparity.metrics.dashboard.formulas`), and all the metrics of a
dashboard, its counts and the gap beside the floors come from one ``dask.compute``. Its arm is
validated whole first, once, as the eager open validates it
(:func:`rlparity.trace.storage.lazy.ensure_validated`). The chunks are then read by dask straight from
zarr and checked as :func:`rlparity.trace.blocks` checks them: the same computation takes each
chunk's CRC-32 (:func:`rlparity.trace.storage.lazy.chunk_digests`), and the chunks' CRCs combined in order
must equal the store's record for every variable the dashboard read (prime-rl's ``advantage``,
read whole, against its own: :func:`rlparity.trace.storage.lazy.load_variable`), or
:class:`rlparity.trace.StoreDamagedError` is raised instead of a number.

One topic a module, every public name importable from here: :mod:`~rlparity.metrics.dashboard.formulas`
(what the peers' formulas share: the masked statistics dask can stream, their evaluation),
:mod:`~rlparity.metrics.dashboard.verl` (verl's), :mod:`~rlparity.metrics.dashboard.peers` (the
others': PipelineRL, prime-rl, slime, TRL, NeMo-RL) and :mod:`~rlparity.metrics.dashboard.traces`
(the peers by name, :func:`as_dashboard`, :func:`peer_metrics`).
"""

from __future__ import annotations

from rlparity.metrics.dashboard.peers import (
    nemo_rl_metrics,
    pipelinerl_metrics,
    prime_rl_metrics,
    slime_metrics,
    trl_metrics,
)
from rlparity.metrics.dashboard.traces import DASHBOARDS, SOURCES, DashboardMetrics, as_dashboard, peer_metrics
from rlparity.metrics.dashboard.verl import verl_metrics

__all__ = ["DASHBOARDS", "SOURCES", "DashboardMetrics", "as_dashboard", "nemo_rl_metrics", "peer_metrics",
           "pipelinerl_metrics", "prime_rl_metrics", "slime_metrics", "trl_metrics", "verl_metrics"]
