"""The trainer side of the objective layer: one real optimizer step on a captured trace.

* :func:`train_step`: GSPO / PPO / GRPO loss on the captured tokens with group-normalised
  advantages, one optimizer step of a transformers causal LM, pi_theta rescored with
  :class:`rlparity.score.Scorer`; corrections (token weights, rejection masks) come in as arrays.
* :func:`arithmetic_reward`, :func:`group_advantages`: rewards of the tiny model's task and GRPO
  advantages.
* :func:`generate_trace`: samples with transformers ``generate`` (no vLLM), for tests and demos.
"""

from rlparity.train.losses import LOSSES, clip_range, sequence_terms
from rlparity.train.reward import arithmetic_reward, group_advantages, open_problem
from rlparity.train.sample import generate_trace
from rlparity.train.step import StepResult, StepSettings, train_step

__all__ = ["LOSSES", "StepResult", "StepSettings", "arithmetic_reward", "clip_range", "generate_trace", "group_advantages",
           "open_problem", "sequence_terms", "train_step"]
