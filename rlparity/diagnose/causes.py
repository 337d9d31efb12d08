"""The causes a diagnosis can name: one catalogue, shared by the findings (``Finding.cause``), the
attribution (:mod:`rlparity.diagnose.attribution`) and the fault library that injects each cause
into real engines and trainers (:mod:`rlparity.experiments.faults`).

A cause is what a user changes to fix the mismatch: a setting on the engine, the trainer or the
update path. Its ``kind`` says how it acts on the tokens, which is how the attribution measures
its share of the mismatch:

* ``semantic``: the two sides compute different distributions on every token (the rollout's
  logprobs come from another reading than the trainer's); its share is the mismatch removed by
  matching the readings;
* ``localized``: it acts on tokens one can point at (sequences that hit a stale prefix cache,
  tokens sampled on KV of older weights, tokens of one policy version); its share is their excess
  over the tokens no cause explains;
* ``global``: noise on every token (a lower-precision head, dropout); its share is the excess of
  the unexplained tokens over the floor. A lower-precision MoE router is global too (it moves every
  token's expert weights) and also claims the tokens it routes to other experts: it gets both parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlparity.diagnose.findings import Layer

Kind = Literal["semantic", "localized", "global"]


@dataclass(frozen=True)
class Cause:
    """One cause of a rollout/trainer mismatch: where it lives and how it acts.

    Parameters
    ----------
    key : str
        The cause's name (a key of :data:`CAUSES`, ``Finding.cause``).
    layer : Layer
        The layer it belongs to.
    kind : {"semantic", "localized", "global"}
        How it acts on the tokens, which is how the attribution measures its share (module
        docstring).
    side : {"engine", "trainer", "update", "both"}
        Where it lives: what the user changes to fix it.
    title : str
        One line saying what goes wrong.
    """

    key: str
    layer: Layer
    kind: Kind
    side: Literal["engine", "trainer", "update", "both"]
    title: str


CAUSES: dict[str, Cause] = {c.key: c for c in (
    Cause("raw_logprobs", Layer.SEMANTIC, "semantic", "engine",
          "the engine returns raw logprobs (before temperature, penalties, top-k/top-p)"),
    Cause("trainer_temperature", Layer.SEMANTIC, "global", "trainer",
          "the trainer divides the logits by another temperature than the engine sampled at"),
    Cause("trainer_top_k", Layer.SEMANTIC, "global", "trainer",
          "the trainer cuts another top-k / top-p set than the engine's sampler"),
    Cause("sampling_penalty", Layer.SEMANTIC, "global", "engine",
          "the engine applies a sampling penalty (repetition, presence, frequency) the trainer ignores"),
    Cause("prompt_token_mismatch", Layer.SEMANTIC, "localized", "both",
          "the trainer scores the response after other prompt ids than the engine saw (chat template, BOS)"),
    Cause("rollout_bf16_head", Layer.INFERENCE_PATH, "global", "engine",
          "the engine projects to logits in a lower precision than the trainer"),
    Cause("trainer_bf16_head", Layer.INFERENCE_PATH, "global", "trainer",
          "the trainer projects to logits in a lower precision than the engine"),
    Cause("bf16_head_rounding", Layer.INFERENCE_PATH, "global", "both",
          "one side's logits carry bfloat16 rounding the other's do not share (side unknown from the numbers)"),
    Cause("stale_prefix_cache", Layer.INFERENCE_PATH, "localized", "update",
          "prompts reuse prefix-cache KV computed by the weights before an update (no cache reset)"),
    Cause("kv_carried_over", Layer.INFERENCE_PATH, "localized", "update",
          "requests kept across an update continue on KV the old weights computed"),
    Cause("partial_weight_sync", Layer.INFERENCE_PATH, "localized", "update",
          "the engine did not receive every tensor of the new weights (a partial sync)"),
    Cause("trainer_stale_weights", Layer.INFERENCE_PATH, "localized", "trainer",
          "the trainer scores tokens with older weights than the engine sampled them with (a skipped sync)"),
    Cause("weights_differ", Layer.INFERENCE_PATH, "localized", "both",
          "the engine and the trainer hold different weights for one policy version (side unknown)"),
    Cause("mixed_versions", Layer.INFERENCE_PATH, "localized", "trainer",
          "tokens of several policy versions scored with one set of weights"),
    Cause("trainer_dropout", Layer.INFERENCE_PATH, "global", "trainer",
          "the trainer scores with dropout on (train mode): its logprobs change from run to run"),
    Cause("batch_variant_attention", Layer.INFERENCE_PATH, "global", "engine",
          "the engine's kernels give logprobs that depend on the batch a request runs in"),
    Cause("trainer_batch_variance", Layer.INFERENCE_PATH, "global", "trainer",
          "the trainer's kernels give logprobs that depend on the batch shape it scores in"),
    # mixture of experts: the tokens the engine and the trainer route to different experts
    Cause("moe_routing_disagreement", Layer.INFERENCE_PATH, "localized", "both",
          "the engine and the trainer route some tokens to different experts (routing flips at small router margins)"),
    Cause("trainer_bf16_router", Layer.INFERENCE_PATH, "global", "trainer",
          "the trainer computes its MoE routers in a lower precision (bf16) than the engine: routing flips"),
    Cause("rollout_bf16_router", Layer.INFERENCE_PATH, "global", "engine",
          "the engine computes its MoE routers in a lower precision (bf16) than the trainer: routing flips"),
)}


# causes that are the platform's floor rather than a setting someone got wrong: a fault matrix scores
# them apart (every arm of a GPU run carries them), see rlparity.diagnose.scoring
FLOOR_CAUSES = ("trainer_batch_variance", "batch_variant_attention")


__all__ = ["CAUSES", "FLOOR_CAUSES", "Cause", "Kind"]
