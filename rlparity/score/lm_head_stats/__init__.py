"""The trainer's LM-head statistics per response token (torch and numpy only).

:func:`~rlparity.score.lm_head_stats.fast.head_stats` projects hidden states through the LM head in chunks of rows and returns, per
row (token), in nats:

* ``trainer_logprob``: log-softmax of the sampled token over the full vocabulary, temperature 1
  (vLLM's ``raw_logprobs``);
* ``trainer_processed_logprob``: the same token under vLLM's sampler distribution (temperature,
  then top-k with ties at the boundary kept, then top-p, renormalised; ``-inf`` when the token is
  outside the kept set; greedy rows read the full-vocabulary log-softmax);
* ``trainer_entropy`` / ``trainer_processed_entropy``: entropies of both distributions;
* ``trainer_max_logit``, ``trainer_token_rank`` (tokens with a strictly larger logit) and
  ``trainer_log_kept_mass`` (log of the probability mass, at the temperature, that top-k / top-p
  keep; 0 when nothing is cut).

How it stays at the speed of a bare forward (issue 16):

* the full-vocabulary statistics come from one fused reduction per chunk (max, two sums of
  exponentials at temperature 1 and at the row's temperature, the rank count), compiled with
  ``torch.compile`` on CUDA, written with in-place operations elsewhere;
* the processed statistics come from one ``topk`` of the largest ``k`` plus a few more logits:
  the kept set, its log-sum-exp and its entropy are computed on those ``k`` values only. The extra
  candidates show whether ties at the k-th value continue past the window; such a row (and a
  top-p row without top-k, which needs the whole sorted row) takes the full-vocabulary reference
  path, so the kept set is always exactly vLLM's;
* on CUDA an fp32 head over a bf16 / fp16 body multiplies the 16-bit hidden states and weights
  (exact in fp32) with fp32 accumulation and fp32 output, without a float copy of the weight;
* every statistic stays on the device until one host copy per call.

:func:`~rlparity.score.lm_head_stats.reference.head_stats_reference` is the straightforward implementation (several full-vocabulary
passes per statistic); the tests check that both agree, on the same logits, to 1e-5 nats with each
other and with an independent float64 computation. The logits can differ with ``fp32_gemm`` (see
:func:`~rlparity.score.lm_head_stats.projection.project`).

One topic a module: :mod:`~rlparity.score.lm_head_stats.sampler` (vLLM's sampler transform),
:mod:`~rlparity.score.lm_head_stats.projection` (the logits), :mod:`~rlparity.score.lm_head_stats.reference`
(the straightforward statistics), :mod:`~rlparity.score.lm_head_stats.reductions` (the fused
full-vocabulary sums, the window of the largest logits), :mod:`~rlparity.score.lm_head_stats.window`
(the processed statistics from a window) and :mod:`~rlparity.score.lm_head_stats.fast` (the fast statistics);
every public name is importable from here.

This package imports nothing from rlparity and its modules import each other relatively, so a
benchmark can load it on a machine that has only torch and numpy (``benchmarks/rescoring.py``
loads the folder as a package of its own).
"""

from __future__ import annotations

from .fast import head_stats
from .projection import FP32_GEMMS, project
from .reductions import COMPILE_MIN_VOCAB, block_size, row_max_and_window
from .reference import head_stats_reference
from .sampler import SAMPLING_EPS, STATS, cut_margin, processed_logits
from .window import TOPK_SLACK

__all__ = ["COMPILE_MIN_VOCAB", "FP32_GEMMS", "SAMPLING_EPS", "STATS", "TOPK_SLACK", "block_size", "cut_margin",
           "head_stats", "head_stats_reference", "processed_logits", "project", "row_max_and_window"]
