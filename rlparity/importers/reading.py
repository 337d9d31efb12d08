"""The trainer reading a framework's own logprobs stand for (:class:`TrainerSpec`,
:func:`decide_reading`): processed, raw, or none."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


TRAINER_READINGS = ("processed", "raw", "none")
READING_VARIABLES = {
    "processed": ("trainer_processed_logprob", "trainer_processed_entropy"),
    "raw": ("trainer_logprob", "trainer_entropy"),
}


@dataclass(frozen=True)
class TrainerSpec:
    """How a framework computes the trainer logprobs it dumps.

    Parameters
    ----------
    field : str
        The dump's field that holds them.
    applies : frozenset of str
        The sampler steps its trainer applies to the logits before the log-softmax
        (``temperature``, ``top_k``, ``top_p``, renormalised).
    source : str
        The public file read to decide it.
    note : str, default ""
        A remark recorded in the trainer attrs.
    """

    field: str
    applies: frozenset[str]
    source: str
    note: str = ""


def decide_reading(spec: TrainerSpec, uniform: Mapping[str, Any], override: str | None) -> str:
    """Which schema reading the framework's trainer logprobs are.

    A trainer that applies the sampling temperature computes the processed reading whenever the
    sampler cut nothing it does not cut itself; sequences where it does not are counted and noted
    (see :meth:`ArmBuilder.trainer_attrs <rlparity.importers.builder.ArmBuilder.trainer_attrs>`).

    Parameters
    ----------
    spec : TrainerSpec
        How the framework's trainer computes them.
    uniform : Mapping
        The sampling values every sequence of the file shares (:meth:`SamplingResolver.uniform <rlparity.importers.sampling.SamplingResolver.uniform>`).
    override : str or None
        The user's ``trainer_reading``; ``None``: decided here.

    Returns
    -------
    str
        ``"processed"``, ``"raw"``, ``"both"`` (temperature 1 and no top-k/top-p, known for the
        whole file: the two coincide) or ``"none"`` (the user dropped them).

    Raises
    ------
    ValueError
        If ``override`` is not one of ``processed``, ``raw``, ``none``.
    """
    if override is not None:
        if override not in TRAINER_READINGS:
            raise ValueError(f"trainer_reading={override!r}; use one of {TRAINER_READINGS} (or leave it unset)")
        return override
    t, k, p = uniform.get("temperature"), uniform.get("top_k"), uniform.get("top_p")
    identity = t is not None and not math.isnan(t) and abs(t - 1.0) < 1e-9 and k == 0 and p is not None and p >= 1.0
    if identity:
        return "both"
    if "temperature" not in spec.applies:
        return "raw"
    return "processed"
