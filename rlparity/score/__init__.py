"""Trainer-side rescoring with transformers: recompute the rollout's tokens as a trainer would.

For every response token the trainer computes, from the same prompt + response ids:

* ``trainer_logprob``: log-softmax over the full vocabulary at temperature 1 (what vLLM calls
  ``raw_logprobs``; pi_old in the objective);
* ``trainer_processed_logprob``: the distribution vLLM's sampler draws from: logits / temperature,
  then top-k, then top-p, renormalised (what ``processed_logprobs`` returns). Ties at the top-k
  boundary are **kept**, exactly as vLLM does: every token whose logit equals the k-th largest
  survives, so more than k tokens can remain. Top-p masks, in ascending order, the tokens whose
  cumulative probability is ``<= 1 - top_p`` and always keeps the most likely one. A sampled token
  outside the trainer's kept set gets ``-inf``: counted by the metrics, never averaged away.
  Greedy requests (temperature < 1e-5) get the full-vocabulary log-softmax, as in vLLM.
* entropies of both distributions, the largest logit and the sampled token's rank.

The LM head runs in ``head_dtype`` (``float32`` as trainers do, or ``bfloat16``) and is applied in
chunks of ``chunk_tokens`` rows, so peak memory is ``chunk_tokens x vocab`` whatever the sequence
length. The statistics come from :func:`rlparity.score.lm_head_stats.head_stats` (one fused pass over the
vocabulary and a top-k window): on the same logits they are within 1e-5 nats of the reference
``head_stats_reference`` and of an independent float64 computation (``tests/test_score_fast.py``).
On an H200 the float32 head rescoring runs at 0.88x the throughput of a bare bf16 forward
(``benchmarks/README.md``).

The logits themselves depend on ``fp32_gemm``. With ``"auto"`` (the default) a float32 head over a
bf16/fp16 body on CUDA multiplies the 16-bit values on the tensor cores with float32 accumulation:
the logits differ from a float32 SGEMM's in the order of the additions (about 3e-5 on logits of
size 13, as close to the exact product), and where a token sits at an exact tie with the k-th
logit, or at the top-p edge, such a difference moves it in or out of the kept set: that row's
processed statistics then change by up to about 1/k (2e-2 nats seen on a random-weight model on an
H200). ``"cast"`` keeps cuBLAS's float32 SGEMM (the reference's logits; 0.46x instead of 0.88x
throughput there). Elsewhere (CPU, or a float32 body) the two are the same computation
(``tests/test_gpu.py`` checks both on CUDA against float64).

The package's modules: :mod:`~rlparity.score.scorer` (the :class:`Scorer` and :func:`score`) and
what it runs: :mod:`~rlparity.score.loading` (the trainer's model, its dropout),
:mod:`~rlparity.score.batching` (micro-batches, the body forward's rows, the head's inputs),
:mod:`~rlparity.score.lm_head_stats` (the LM-head statistics), :mod:`~rlparity.score.routing` (the MoE
routers' hooks) and :mod:`~rlparity.score.routes` (their routes as arrays and variables),
:mod:`~rlparity.score.selfcheck` (the trainer's floor), :mod:`~rlparity.score.fingerprint` (weight
checksums), :mod:`~rlparity.score.prompts` (the trainer's tokenization) and
:mod:`~rlparity.score.vocabulary`; beside it :mod:`~rlparity.score.versions` (:func:`score_versions`,
each token by its own policy version), :mod:`~rlparity.score.distributed` (across ranks) and
:mod:`~rlparity.score.layers` (per-layer states).
"""

from __future__ import annotations

from rlparity.config.settings import TrainerSettings
from rlparity.score.lm_head_stats import (
    FP32_GEMMS,
    SAMPLING_EPS,
    STATS,
    head_stats,
    head_stats_reference,
    processed_logits,
    project,
)
from rlparity.score.loading import dropout_of, set_dropout
from rlparity.score.prompts import tokenize_prompts, trainer_prompt_ids
from rlparity.score.scorer import Scorer, score
from rlparity.score.versions import score_versions
from rlparity.score.vocabulary import VocabularyError, check_vocabulary

__all__ = ["FP32_GEMMS", "SAMPLING_EPS", "STATS", "Scorer", "TrainerSettings", "VocabularyError", "check_vocabulary",
           "dropout_of", "head_stats", "head_stats_reference", "processed_logits", "project", "score", "score_versions",
           "set_dropout", "tokenize_prompts", "trainer_prompt_ids"]
