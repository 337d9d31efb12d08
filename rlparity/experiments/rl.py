"""A small online RL run per engine profile: what a backend mismatch does to the curves of a run.

Per profile, :func:`rl_run` starts one real ``AsyncLLM`` (:class:`rlparity.capture.AsyncEngine`)
under that profile and one trainer (transformers, fp32 LM head, AdamW) from the same initial
weights, then loops, for ``steps`` steps:

1. **rollout**: ``n_prompts`` arithmetic prompts x ``n_samples`` samples; the prompts and seeds
   of step k are the same for every profile (:func:`step_prompts`, :func:`step_sampling`);
2. **pi_old**: the trainer's in-memory model rescores every token with the weights that sampled
   it (:func:`rlparity.score.score_versions`; no reload from disk) and with its current weights
   (``trainer_latest_*``: what a trainer that ignores versions sees);
3. **step**: one optimizer step with the objective layer's code (:func:`rlparity.train.train_step`,
   reward :func:`rlparity.train.arithmetic_reward`, advantages normalised over each prompt's
   samples); the optimizer state persists across steps;
4. **update**: the new weights are saved as safetensors and pushed into the running engine with
   the inflight path (:meth:`rlparity.capture.AsyncEngine.update_weights`: pause ``mode`` (keep),
   load through the worker extension, optionally reset the prefix cache, set the policy version
   k+1, resume). Tokens carry the version that sampled them.

Asynchrony (``async_rollouts=True``, PipelineRL-style, one step of lag): the rollouts of step k+1
are started with :meth:`~rlparity.capture.AsyncEngine.capture_async` *before* step k trains, so
the engine samples them with the weights of version k while the trainer computes version k+1; the
update is pushed while they may still be in flight (``keep``: they resume on the new weights;
their tokens carry both versions). Step k+1 then trains on a batch sampled (mostly) by version
k: lag 1. To score those tokens at their own version, the trainer keeps a copy of its weights of
the previous version for one step.

Profiles (:data:`RL_PROFILES`): ``pipelinerl-parity``, ``vllm-v1-defaults`` (raw logprobs, prefix
caching and async scheduling on) and ``parity-bf16-head`` (the parity profile with the rollout LM
head in bf16). The body dtype is pinned to the trainer's on every profile (``dtype``), so the
profiles differ in what they name. One engine runs at a time (each is closed before the next
profile starts).

The loss's ratio denominator (``old_policy``): ``"pi_old"``, the trainer's own reading recomputed
at the sampling weights (verl, slime: the backend mismatch never reaches the update), or ``"mu"``,
the engine's logprobs as they came (PipelineRL, prime-rl: the mismatch enters the clip). Several
denominators run one after the other on each profile's engine, each from the initial weights
(loaded back into the running engine, the prefix cache reset) with a fresh trainer and optimizer;
their runs are named ``<profile>+<old_policy>``.

:func:`rl_run` returns ``{"<run>@step_NNN": trace}`` (labels by :func:`rlparity.metrics.rl.step_arm`;
factors ``profile``, ``old_policy``, ``step`` in each trace's attrs),
each trace scored (pi_old per version, pi_theta, ``reward``, ``advantage``) with what the runner
did and its timings in ``attrs["rl"]``. The curves are computed from those traces by
:func:`rlparity.metrics.rl.rl_curves`, drawn by :func:`rlparity.plot.rl.plot_rl_curves`.

From a shell (one call on a GPU host with ``RLPARITY_ENGINE_LOCK=off``)::

    rlparity experiment rl --out DIR [--device cuda] [--steps N] [--async-rollouts] [--flat]

writes ``DIR/rl.json`` (the curves and the contrast with the parity profile; first), then
``DIR/rl.zarr`` (every step's trace) and the same store as flat files, ``DIR/rl.zarr.tar.gz`` (or
``.part00``, ``.part01``... of at most 15 MiB: :func:`pack`), then the findings of every run's first
step (added to ``rl.json``) and ``DIR/rl_curves.csv``; nothing outside ``DIR`` but a temporary
checkpoint folder, removed at the end.
"""

from __future__ import annotations

from rlparity.experiments.rl_example import make_example, pack
from rlparity.experiments.rl_profiles import (
    DERIVED_PROFILES,
    OLD_POLICIES,
    RL_PROFILES,
    rl_profile,
    run_name,
    step_prompts,
    step_sampling,
)
from rlparity.experiments.rl_runner import RLRunSettings, rl_run
from rlparity.experiments.rl_summary import diagnose_first_steps, summarize

__all__ = ["DERIVED_PROFILES", "OLD_POLICIES", "RL_PROFILES", "RLRunSettings", "diagnose_first_steps", "make_example", "pack",
           "rl_profile", "rl_run", "run_name", "step_prompts", "step_sampling", "summarize"]

