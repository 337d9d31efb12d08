"""The knobs of the bisection: each an engine setting flipped on the baseline, or a warm prefix cache.

The names of the two baseline arms (:data:`BASELINE`, :data:`FLOOR`), the knobs (:data:`KNOBS`) and
each knob's settings against the capture's (the reference). Part of :mod:`rlparity.experiments.bisect`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlparity.config.settings import EngineSettings
from rlparity.experiments.ablation import KNOBS as ABLATION_KNOBS, Knob, knob_settings

BASELINE = "replay_baseline"
FLOOR = "replay_floor"
WARM = "prefix_cache_warm"
PAIRS = ("auto", "always", "never")
LAYER_STARTS = 2  # the hand-off's engines: the baseline and the winner, both eager


@dataclass(frozen=True)
class BisectKnob:
    """One knob of the bisection: an engine setting to change, or a warm prefix cache.

    Parameters
    ----------
    knob : Knob
        The setting (:class:`rlparity.experiments.ablation.Knob`); for ``warm`` the prefix cache is
        switched on.
    warm : bool, default False
        Replay against a warm prefix cache (the prompts prefilled first) instead of a cold one.
    toggle : tuple, optional
        Two values: the knob takes the second where the reference has the first or leaves the choice to
        the model or the engine, else the first (``head_dtype``; ``attention_backend``: a capture made with
        another kernel than FlashAttention is replayed with FlashAttention, the default).
    """

    knob: Knob
    warm: bool = False
    toggle: tuple[Any, Any] | None = None

    @property
    def name(self) -> str:
        """The knob's name (also its arm's: ``knob_<name>``)."""
        return self.knob.name


KNOBS: dict[str, BisectKnob] = {k.name: k for k in (
    BisectKnob(ABLATION_KNOBS["prefix_caching"]),
    BisectKnob(Knob(WARM, "enable_prefix_caching", True, "prompts prefilled first: the replay reads their KV from "
                    "the prefix cache"), warm=True),
    BisectKnob(ABLATION_KNOBS["async_scheduling"]),
    BisectKnob(ABLATION_KNOBS["eager"]),
    BisectKnob(Knob("max_num_seqs", "max_num_seqs", 1, "one sequence at a time (batch 1)")),
    BisectKnob(ABLATION_KNOBS["chunked_prefill"]),
    BisectKnob(Knob("head_precision", "head_dtype", None, "LM head in the other precision (float32 / bfloat16)"),
               toggle=("float32", "bfloat16")),
    BisectKnob(Knob("attention_backend", "attention_backend", None, "the other attention kernel (FlashAttention "
                    "if the capture ran another, else FlexAttention)"), toggle=("FLASH_ATTN", "FLEX_ATTENTION")),
    BisectKnob(ABLATION_KNOBS["batch_invariant"]),
)}
DEFAULT_KNOBS = tuple(KNOBS)


def _knob(k: str | BisectKnob) -> BisectKnob:
    if isinstance(k, BisectKnob):
        return k
    if k not in KNOBS:
        raise ValueError(f"unknown knob {k!r}; knobs: {', '.join(KNOBS)}")
    return KNOBS[k]


def _settings_for(k: BisectKnob, ref: EngineSettings, ref_eff: Mapping[str, Any]) -> tuple[EngineSettings, Any]:
    if k.toggle is not None:
        current = ref_eff.get(k.knob.key) or getattr(ref, k.knob.field)
        first = str(current).upper() == str(k.toggle[0]).upper() or current in (None, "model", "auto")
        value = k.toggle[1] if first else k.toggle[0]
        return ref.replace(**{k.knob.field: value}), value
    return knob_settings(k.knob, ref, ref_eff)


__all__ = ["BASELINE", "DEFAULT_KNOBS", "FLOOR", "KNOBS", "LAYER_STARTS", "PAIRS", "BisectKnob"]
