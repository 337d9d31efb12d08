"""Building traces: :func:`from_rollouts` (ragged per-sequence rows, named by :class:`RolloutColumns`),
:func:`with_trainer` (a trace given the trainer's variables) and :func:`concat_sequences` (traces
joined along ``sequence``); each result annotated (and validated) against :mod:`rlparity.trace.schema`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs
from rlparity.config.settings import with_overrides
from rlparity.trace.record import arm_record
from rlparity.trace.schema import (
    ALL_VARS,
    PROMPT_DIMS,
    SCHEMA_VERSION,
    SEQ_DIMS,
    TOKEN_DIMS,
    TRAINER_VARS,
    TraceValidationError,
    annotate,
    pad_rows,
    token_checksum,
)
from rlparity.trace.validation import validate


@dataclass(frozen=True)
class RolloutColumns:
    """The optional per-sequence columns of :func:`from_rollouts`, with what a trace holds when one is not given.

    Per-sequence values are one per sequence; the sampling parameters may also be one value for all.

    Parameters
    ----------
    finish_reasons : sequence of str, optional
        Why each generation stopped (``length``, ``stop``, ``abort``); ``None`` records ``"unknown"``.
    policy_versions : sequence of sequence of int, optional
        The weight version of each token; ``None`` records 0.
    prompt_index : sequence of int, optional
        The index of each sequence's prompt; ``None`` records 0, 1, ...
    sample_index : sequence of int, optional
        The index of each sample among its prompt's; ``None`` records 0.
    temperature : float or sequence of float, default 1.0
        Sampling temperature.
    top_k : int or sequence of int, default 0
        Top-k (0 = off).
    top_p : float or sequence of float, default 1.0
        Top-p (1 = off).
    request_seed : int or sequence of int, default -1
        Per-request sampling seed (-1 = none).
    prompt_texts : sequence of str, optional
        The prompts as text; ``None`` records empty text.
    prompt_messages : sequence of str, optional
        Chat messages as JSON; ``None`` records empty text.
    response_texts : sequence of str, optional
        The detokenised responses; ``None`` records empty text.
    rewards : sequence of float, optional
        Sequence rewards; ``None`` records NaN (not scored).
    cached_prompt_tokens : sequence of int, optional
        Prompt tokens served from the prefix cache; ``None`` records -1 (not reported).
    """

    finish_reasons: Sequence[str] | None = None
    policy_versions: Sequence[Sequence[int]] | None = None
    prompt_index: Sequence[int] | None = None
    sample_index: Sequence[int] | None = None
    temperature: Sequence[float] | float = 1.0
    top_k: Sequence[int] | int = 0
    top_p: Sequence[float] | float = 1.0
    request_seed: Sequence[int] | int = -1
    prompt_texts: Sequence[str] | None = None
    prompt_messages: Sequence[str] | None = None
    response_texts: Sequence[str] | None = None
    rewards: Sequence[float] | None = None
    cached_prompt_tokens: Sequence[int] | None = None


def from_rollouts(
    *,
    prompt_token_ids: Sequence[Sequence[int]],
    token_ids: Sequence[Sequence[int]],
    rollout_logprobs: Sequence[Sequence[float]],
    columns: RolloutColumns | None = None,
    attrs: Mapping[str, Any] | None = None,
    **optional: Any,
) -> xr.Dataset:
    """Build a rollout trace from plain per-sequence lists (the ``from_dict`` of rlparity).

    Every capture backend and every importer of another framework's logs ends here, so all of
    them produce the same schema.

    Parameters
    ----------
    prompt_token_ids : sequence of sequence of int
        The prompt ids the engine saw, one list per sequence.
    token_ids : sequence of sequence of int
        The sampled response ids, one list per sequence.
    rollout_logprobs : sequence of sequence of float
        The engine's logprob of each sampled token (nats), one list per sequence, as long as its
        ``token_ids``.
    columns : RolloutColumns, optional
        The optional columns; ``None`` takes the defaults of :class:`RolloutColumns`.
    attrs : Mapping[str, Any], optional
        More attrs, added to the provenance attrs.
    **optional : Any
        Fields of :class:`RolloutColumns` as keywords (they replace those of ``columns``).

    Returns
    -------
    xarray.Dataset
        The trace, annotated and validated.

    Raises
    ------
    TraceValidationError
        The lists differ in length, a sequence has not one logprob per token, or the result breaks
        the schema.
    TypeError
        A keyword is no field of :class:`RolloutColumns`.
    """
    c = with_overrides(columns or RolloutColumns(), optional, "from_rollouts")
    finish_reasons, policy_versions, prompt_index, sample_index = (c.finish_reasons, c.policy_versions,
                                                                    c.prompt_index, c.sample_index)
    temperature, top_k, top_p, request_seed = c.temperature, c.top_k, c.top_p, c.request_seed
    prompt_texts, prompt_messages, response_texts = c.prompt_texts, c.prompt_messages, c.response_texts
    rewards, cached_prompt_tokens = c.rewards, c.cached_prompt_tokens
    n = len(token_ids)
    if len(prompt_token_ids) != n or len(rollout_logprobs) != n:
        raise TraceValidationError(
            f"got {len(prompt_token_ids)} prompts, {n} token lists and {len(rollout_logprobs)} "
            "logprob lists: pass one of each per sequence"
        )
    for i, (t, lp) in enumerate(zip(token_ids, rollout_logprobs)):
        if len(t) != len(lp):
            raise TraceValidationError(
                f"sequence {i}: {len(t)} tokens but {len(lp)} rollout logprobs; the engine must "
                "return one logprob per sampled token (request logprobs=0)"
            )

    def per_seq(value, dtype):
        arr = np.asarray(value, dtype=dtype)
        return np.full(n, arr, dtype=dtype) if arr.ndim == 0 else arr

    lengths = np.array([len(t) for t in token_ids], dtype=np.int64)
    tok = pad_rows(token_ids, -1, np.int64)
    mask = tok >= 0
    if policy_versions is None:
        pv = np.where(mask, 0, -1).astype(np.int64)
    else:
        pv = pad_rows(policy_versions, -1, np.int64)
    data = {
        "token_id": (TOKEN_DIMS, tok),
        "response_mask": (TOKEN_DIMS, mask),
        "rollout_logprob": (TOKEN_DIMS, pad_rows(rollout_logprobs, np.nan, np.float64)),
        "policy_version": (TOKEN_DIMS, pv),
        "prompt_token_id": (PROMPT_DIMS, pad_rows(prompt_token_ids, -1, np.int64)),
        "prompt_length": (SEQ_DIMS, np.array([len(p) for p in prompt_token_ids], dtype=np.int64)),
        "response_length": (SEQ_DIMS, lengths),
        "finish_reason": (SEQ_DIMS, np.array(list(finish_reasons) if finish_reasons is not None else ["unknown"] * n, dtype=str)),
        "prompt_index": (SEQ_DIMS, per_seq(np.arange(n) if prompt_index is None else prompt_index, np.int64)),
        "sample_index": (SEQ_DIMS, per_seq(0 if sample_index is None else sample_index, np.int64)),
        "temperature": (SEQ_DIMS, per_seq(temperature, np.float64)),
        "top_k": (SEQ_DIMS, per_seq(top_k, np.int64)),
        "top_p": (SEQ_DIMS, per_seq(top_p, np.float64)),
        "request_seed": (SEQ_DIMS, per_seq(request_seed, np.int64)),
        "prompt_text": (SEQ_DIMS, np.array(list(prompt_texts) if prompt_texts is not None else [""] * n, dtype=str)),
        "prompt_messages": (SEQ_DIMS, np.array(list(prompt_messages) if prompt_messages is not None else [""] * n, dtype=str)),
        "response_text": (SEQ_DIMS, np.array(list(response_texts) if response_texts is not None else [""] * n, dtype=str)),
        "reward": (SEQ_DIMS, per_seq(np.nan if rewards is None else rewards, np.float64)),
        "cached_prompt_tokens": (SEQ_DIMS, per_seq(-1 if cached_prompt_tokens is None else cached_prompt_tokens, np.int64)),
    }
    coords = {
        "sequence": np.arange(n),
        "position": np.arange(tok.shape[1]),
        "prompt_position": np.arange(data["prompt_token_id"][1].shape[1]),
    }
    ds = xr.Dataset(data, coords=coords, attrs=make_attrs(schema_version=SCHEMA_VERSION, **(attrs or {})))
    return validate(annotate(ds), where="trace built by from_rollouts")


def with_trainer(trace: xr.Dataset, arrays: Mapping[str, Any], attrs: Mapping[str, Any] | None = None
                 ) -> xr.Dataset:
    """A copy of ``trace`` with trainer-side variables added.

    Parameters
    ----------
    trace : xarray.Dataset
        A rollout trace.
    arrays : Mapping[str, Any]
        Schema variable name to an array shaped like its dims (token variables
        ``(sequence, position)``; logprobs in nats).
    attrs : Mapping[str, Any], optional
        Attrs to add (e.g. ``scored_token_checksum``).

    Returns
    -------
    xarray.Dataset
        The new trace, annotated and validated.

    Raises
    ------
    TraceValidationError
        A name is no trace variable, or the result breaks the schema.
    """
    out = trace.copy()
    for name, value in arrays.items():
        if name not in ALL_VARS:
            raise TraceValidationError(f"{name!r} is not a trace variable; known: {sorted(TRAINER_VARS)}")
        out[name] = (ALL_VARS[name][0], np.asarray(value))
    if attrs:
        out.attrs.update(attrs)
    return validate(annotate(out), where="trace given trainer variables (with_trainer)")


def concat_sequences(traces: Sequence[xr.Dataset]) -> xr.Dataset:
    """Join traces of the same arm along ``sequence`` (renumbered), padding positions as needed.

    The trainer side stays tied to the rollout (``scored_token_checksum``) only where every part was.

    Parameters
    ----------
    traces : sequence of xarray.Dataset
        The parts, in order.

    Returns
    -------
    xarray.Dataset
        The joined trace, annotated.

    Raises
    ------
    ValueError
        No trace given.
    """
    if not traces:
        raise ValueError("concat_sequences needs at least one trace")
    fill = {name: (-1 if ALL_VARS.get(name, ((), "f"))[1] == "i" else
                   (False if ALL_VARS.get(name, ((), "f"))[1] == "b" else
                    ("" if ALL_VARS.get(name, ((), "f"))[1] == "U" else np.nan)))
            for name in traces[0].data_vars}
    parts = [t.drop_vars("sequence") for t in traces]
    out = xr.concat(parts, dim="sequence", join="outer", fill_value=fill, combine_attrs="override")
    out = out.assign_coords(sequence=np.arange(out.sizes["sequence"]))
    for name, (_, kind, _, _) in ALL_VARS.items():
        if name in out and kind in "ib":
            out[name] = out[name].astype(traces[0][name].dtype)
    if "scored_token_checksum" in out.attrs:
        # the trainer side stays tied to the rollout only if every part was
        ok = all(arm_record(t).scored_token_checksum == token_checksum(t) for t in traces)
        out.attrs["scored_token_checksum"] = token_checksum(out) if ok else "parts-mismatched"
    return annotate(out)
