"""A scored trace from a :class:`~rlparity.score.Scorer`'s arrays (:meth:`~rlparity.score.Scorer.compute`,
or the shards of a distributed run merged): the statistics as ``(sequence, position)`` variables, the
routers' variables, what the trainer applied, its tokenization of the prompts, and the provenance
attrs (:func:`trainer_attrs`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from rlparity.score import routes
from rlparity.score.loading import dropout_of
from rlparity.score.prompts import tokenize_prompts
from rlparity.trace import token_checksum, validate
from rlparity.trace.schema import TOKEN_DIMS, annotate

__all__ = ["scored_trace", "trainer_attrs"]


def scored_trace(scorer: Any, trace: xr.Dataset, parts: dict[str, Any]) -> xr.Dataset:
    """``trace`` with ``scorer``'s ``parts`` as variables and attrs (:meth:`~rlparity.score.Scorer.assemble`).

    Parameters
    ----------
    scorer : rlparity.score.Scorer
        The scorer that computed ``parts``.
    trace : xarray.Dataset
        The trace that was computed.
    parts : dict
        ``result``, ``sampling``, ``skipped``, ``elapsed`` and ``check``.

    Returns
    -------
    xarray.Dataset
        A validated copy of ``trace`` with the trainer variables.
    """
    width = trace.sizes["position"]
    result = dict(parts["result"])
    out = trace.copy()
    routed = {k: result.pop(k) for k in ("trainer_routed_experts", "trainer_router_margin") if k in result}
    for k, v in result.items():
        full = np.full((v.shape[0], width), -1 if k == "trainer_token_rank" else np.nan, dtype=v.dtype)
        full[:, : v.shape[1]] = v[:, :width]
        out[k] = (TOKEN_DIMS, full)
    if routed:
        assert scorer.router is not None
        out = routes.with_router_vars(out, scorer.router, routed, width, parts["skipped"],
                                      router_dtype=scorer.settings.router_dtype,
                                      routing_replay=scorer.settings.routing_replay, dtype=scorer.dtype)
    for k, v in parts["sampling"].items():
        out[k] = (("sequence",), v)
    if scorer.tokenize_prompts:
        out = tokenize_prompts(out, scorer.tokenizer, add_special_tokens=scorer.special_tokens(trace))
    out.attrs.update(scorer.attrs(trace, parts["elapsed"], parts["check"]))
    return validate(annotate(out))


def trainer_attrs(scorer: Any, trace: xr.Dataset, elapsed: float, self_check: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """``scorer``'s provenance of a scoring of ``trace`` (:meth:`~rlparity.score.Scorer.attrs`).

    Parameters
    ----------
    scorer : rlparity.score.Scorer
        The scorer.
    trace : xarray.Dataset
        The trace that was scored.
    elapsed : float
        Seconds the scoring took.
    self_check : dict, optional
        The trainer's self-check, or None.

    Returns
    -------
    dict
        ``trainer`` and ``scored_token_checksum``, JSON-ready.
    """
    from rlparity.config.provenance import jsonable

    return jsonable({
        "trainer": {"model": scorer.model_name, "dtype": scorer.dtype, "head_dtype": scorer.head_dtype,
                    "fp32_gemm": scorer.fp32_gemm,
                    "device": scorer.device, "library": "transformers",
                    "topk_ties": "kept (vLLM rule: logits equal to the k-th largest survive)",
                    "prompt_tokenization": ({"add_special_tokens": scorer.special_tokens(trace),
                                             "chat_template": "apply_chat_template(tokenize=True, add_generation_prompt=True)"}
                                            if scorer.tokenize_prompts else None),
                    "settings": scorer.settings.model_dump(),
                    "training_mode": bool(scorer.settings.train_mode),
                    "dropout": dropout_of(scorer.module),
                    "shape": scorer.shape(),
                    "self_check": self_check,
                    "weight_checksums": scorer.weight_checksums() if scorer.settings.fingerprint else None,
                    "score_s": round(elapsed, 3)},
        "scored_token_checksum": token_checksum(trace),
    })
