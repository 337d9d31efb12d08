"""The trace data model: one ``xarray.Dataset`` per arm, many arms in one ``xarray.DataTree``.

Dims
    ``sequence``          one sampled completion (prompt x sample)
    ``position``          response token index, 0-based, padded to the longest response
    ``prompt_position``   prompt token index, padded to the longest prompt
    ``moe_layer``         a mixture-of-experts decoder layer (coordinate: its decoder-layer index)
    ``expert_slot``       one of the top-k experts a router selects per token (0 .. k-1; unordered)

Rollout side (from the engine): ``token_id``, ``response_mask``, ``rollout_logprob``,
``policy_version``, plus per-sequence ``prompt_token_id``, ``prompt_length``,
``response_length``, ``finish_reason``, sampling parameters and ``reward``.

Trainer side (added by :func:`rlparity.score.score`): ``trainer_logprob`` (full vocabulary,
temperature 1), ``trainer_processed_logprob`` (temperature, top-k, top-p applied and
renormalised as vLLM's sampler does), ``trainer_entropy``, ``trainer_processed_entropy``,
``trainer_max_logit``, ``trainer_token_rank``.

All log-probabilities and entropies are in nats. Padding is ``-1`` for ids and NaN for floats;
``response_mask`` says which entries are real.

Building a trace: :mod:`rlparity.trace.build`; checking one: :mod:`rlparity.trace.validation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.record import arm_record

SCHEMA_VERSION = 1
TOKEN_DIMS = ("sequence", "position")
SEQ_DIMS = ("sequence",)
PROMPT_DIMS = ("sequence", "prompt_position")
ROUTE_DIMS = ("sequence", "position", "moe_layer", "expert_slot")
PROMPT_ROUTE_DIMS = ("sequence", "prompt_position", "moe_layer", "expert_slot")
ROUTER_DIMS = ("sequence", "position", "moe_layer")

NATS = "nats"

# name -> (dims, dtype kind, units, long_name); "required" rollout variables first.
ROLLOUT_VARS: dict[str, tuple[tuple[str, ...], str, str | None, str]] = {
    "token_id": (TOKEN_DIMS, "i", None, "sampled token id (-1 = padding)"),
    "response_mask": (TOKEN_DIMS, "b", None, "true where a response token exists"),
    "rollout_logprob": (TOKEN_DIMS, "f", NATS, "log-probability of the sampled token reported by the rollout engine (mu)"),
    "policy_version": (TOKEN_DIMS, "i", None, "weight version that generated the token (-1 = padding)"),
    "prompt_token_id": (PROMPT_DIMS, "i", None, "prompt token id sent to the engine (-1 = padding)"),
    "prompt_length": (SEQ_DIMS, "i", "tokens", "number of prompt tokens"),
    "response_length": (SEQ_DIMS, "i", "tokens", "number of response tokens"),
    "finish_reason": (SEQ_DIMS, "U", None, "why generation stopped (length, stop, abort)"),
    "prompt_index": (SEQ_DIMS, "i", None, "index of the prompt in the capture's prompt list"),
    "sample_index": (SEQ_DIMS, "i", None, "index of the sample among the n samples of its prompt"),
    "temperature": (SEQ_DIMS, "f", None, "sampling temperature of the request"),
    "top_k": (SEQ_DIMS, "i", None, "top-k of the request (0 = off)"),
    "top_p": (SEQ_DIMS, "f", None, "top-p of the request (1 = off)"),
    "request_seed": (SEQ_DIMS, "i", None, "per-request sampling seed (-1 = none)"),
}
OPTIONAL_ROLLOUT_VARS: dict[str, tuple[tuple[str, ...], str, str | None, str]] = {
    "prompt_text": (SEQ_DIMS, "U", None, "prompt text as given (empty when ids were given)"),
    "prompt_messages": (SEQ_DIMS, "U", None, "chat messages as JSON when the prompt was a chat (empty otherwise)"),
    "response_text": (SEQ_DIMS, "U", None, "detokenised response text from the engine"),
    "reward": (SEQ_DIMS, "f", None, "sequence-level reward (NaN = not scored)"),
    "cached_prompt_tokens": (SEQ_DIMS, "i", "tokens", "prompt tokens the engine served from its prefix cache (-1 = not reported)"),
    # inflight weight updates (rlparity.capture.AsyncEngine; the offline Engine once weights were updated)
    "token_time": (TOKEN_DIMS, "f", "s", "when the token reached the client, seconds on the engine's clock (NaN = not recorded)"),
    "submit_time": (SEQ_DIMS, "f", "s", "when the request was submitted, seconds on the engine's clock"),
    "attempt": (SEQ_DIMS, "i", None, "0 = first submission; k = k-th resubmission of a request aborted by a weight update"),
    "prefix_cache_generation": (SEQ_DIMS, "i", None, "prefix-cache resets before the request's prefill (-1 = not recorded)"),
    "prefix_cache_stale": (SEQ_DIMS, "b", None, "prompt tokens came from a prefix cache that may hold KV of other weights (updated since its last reset)"),
    # sampling penalties of the request (recorded when any request used one; absent = none)
    "repetition_penalty": (SEQ_DIMS, "f", None, "repetition penalty of the request (1 = off)"),
    "presence_penalty": (SEQ_DIMS, "f", None, "presence penalty of the request (0 = off)"),
    "frequency_penalty": (SEQ_DIMS, "f", None, "frequency penalty of the request (0 = off)"),
    # mixture of experts (rlparity.capture.routing): the experts the engine's router selected
    "routed_experts": (ROUTE_DIMS, "i", None, "experts the engine's router selected for the input token that predicts "
                       "the response token (input position prompt_length - 1 + position), per MoE layer (-1 = none)"),
    "prompt_routed_experts": (PROMPT_ROUTE_DIMS, "i", None, "experts the engine's router selected for each prompt "
                              "token, per MoE layer (-1 = not computed: served from the prefix cache, or padding)"),
}
TRAINER_VARS: dict[str, tuple[tuple[str, ...], str, str | None, str]] = {
    "trainer_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability of the sampled token, full vocabulary, temperature 1 (pi_old, raw)"),
    "trainer_processed_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability after temperature/top-k/top-p, renormalised as vLLM's sampler (pi_old, processed)"),
    "trainer_entropy": (TOKEN_DIMS, "f", NATS, "entropy of the trainer's full-vocabulary distribution"),
    "trainer_processed_entropy": (TOKEN_DIMS, "f", NATS, "entropy of the trainer's processed distribution"),
    "trainer_max_logit": (TOKEN_DIMS, "f", None, "largest logit at the position (logit magnitude)"),
    "trainer_token_rank": (TOKEN_DIMS, "i", None, "rank of the sampled token in the trainer's logits (0 = argmax, -1 = padding)"),
    "trainer_log_kept_mass": (TOKEN_DIMS, "f", NATS, "log of the temperature-scaled probability mass top-k/top-p keep (0 = nothing cut); processed = tempered - this"),
    "trainer_cut_margin": (TOKEN_DIMS, "f", None, "smallest logit the top-k/top-p cut keeps minus the sampled token's logit (raw logit units; > 0 outside the kept set; NaN = nothing cut)"),
    "trainer_prompt_token_id": (("sequence", "trainer_prompt_position"), "i", None, "the trainer's own tokenization of the prompt text / chat messages (-1 = padding)"),
    "trainer_prompt_length": (SEQ_DIMS, "i", "tokens", "length of the trainer's tokenization (-1 = nothing to tokenize: the prompt was ids only)"),
    "trainer_updated_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability of the sampled token after an optimizer step, full vocabulary, temperature 1 (pi_theta, raw)"),
    "trainer_updated_processed_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability after an optimizer step, temperature/top-k/top-p applied and renormalised (pi_theta, processed)"),
    "trainer_latest_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability with the latest weights, whatever version sampled the token, full vocabulary, temperature 1 (raw)"),
    "trainer_latest_processed_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability with the latest weights, temperature/top-k/top-p applied and renormalised (processed)"),
    "trainer_temperature": (SEQ_DIMS, "f", None, "temperature the trainer applied for its processed reading (the engine's unless the trainer was set otherwise)"),
    "trainer_top_k": (SEQ_DIMS, "i", None, "top-k the trainer applied for its processed reading (0 = off)"),
    "trainer_top_p": (SEQ_DIMS, "f", None, "top-p the trainer applied for its processed reading (1 = off)"),
    # mixture of experts (rlparity.score.routing): the trainer's router on the same input tokens
    "trainer_routed_experts": (ROUTE_DIMS, "i", None, "experts the trainer's router selects for the input token that "
                               "predicts the response token, per MoE layer (-1 = padding)"),
    "trainer_router_margin": (ROUTER_DIMS, "f", "logit", "the trainer's k-th largest router logit minus its (k+1)-th "
                              "(router logit units; small = a routing decision near its boundary)"),
    "trainer_replay_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability with the engine's routes forced in every "
                               "MoE layer (routing replay, R3), full vocabulary, temperature 1 (raw)"),
    "trainer_replay_processed_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability with the engine's routes "
                                         "forced (routing replay, R3), temperature/top-k/top-p applied and renormalised"),
    "advantage": (SEQ_DIMS, "f", None, "sequence advantage used by the optimizer step (reward normalised within its group; NaN = not trained)"),
}
ALL_VARS = {**ROLLOUT_VARS, **OPTIONAL_ROLLOUT_VARS, **TRAINER_VARS}


class TraceValidationError(ValueError):
    """A trace does not follow the schema; the message says what is wrong and how to fix it."""


def pad_rows(rows: Sequence[Sequence[Any]], fill: Any, dtype: Any, width: int | None = None) -> np.ndarray:
    """Ragged per-sequence rows as a ``(len(rows), width)`` array padded with ``fill``.

    Parameters
    ----------
    rows : sequence of sequence
        One row per sequence.
    fill : Any
        The padding value (``-1`` for ids, NaN for floats).
    dtype : numpy dtype
        The array's dtype.
    width : int, optional
        Columns; ``None`` takes the longest row.

    Returns
    -------
    numpy.ndarray
        ``(len(rows), width)``.

    Raises
    ------
    ValueError
        A row is longer than ``width``.
    """
    longest = max((len(r) for r in rows), default=0)
    width = longest if width is None else int(width)
    if longest > width:
        raise ValueError(f"a row has {longest} entries, more than width={width}")
    if (rows and longest == width and np.dtype(dtype).kind in "biuf"
            and all(isinstance(r, (list, tuple, np.ndarray)) and len(r) == width for r in rows)):
        out = np.array(rows, dtype=dtype)  # no padding (equal rows, as with ignore_eos): one conversion
        if out.shape == (len(rows), width):
            return out
    out = np.full((len(rows), width), fill, dtype=dtype)
    for i, r in enumerate(rows):
        if len(r):
            out[i, : len(r)] = np.asarray(r, dtype=dtype)
    return out


def annotate(ds: xr.Dataset) -> xr.Dataset:
    """Stamp ``long_name`` and ``units`` from the schema table on every known variable (in place).

    Attrs already set are kept.

    Parameters
    ----------
    ds : xarray.Dataset
        A trace.

    Returns
    -------
    xarray.Dataset
        ``ds`` itself.
    """
    for name, var in ds.data_vars.items():
        if name in ALL_VARS:
            _, _, units, long_name = ALL_VARS[name]
            var.attrs.setdefault("long_name", long_name)
            if units:
                var.attrs.setdefault("units", units)
    return ds


TRAINER_READINGS = ("trainer_logprob", "trainer_processed_logprob")
# a log-softmax rounded to float32 stays below this; anything larger is not a log-probability
POSITIVE_TOLERANCE = 1e-6


def has_trainer(ds: xr.Dataset) -> bool:
    """Whether the trace is scored: it holds at least one trainer reading.

    ``trainer_logprob`` (raw) or ``trainer_processed_logprob`` (processed); imported dumps may carry
    only one.

    Parameters
    ----------
    ds : xarray.Dataset
        A trace.

    Returns
    -------
    bool
        True when a trainer reading is there.
    """
    return any(v in ds.variables for v in TRAINER_READINGS)


def trace_versions(ds: xr.Dataset) -> list[int]:
    """The policy versions that produced the trace's real tokens, ascending.

    Parameters
    ----------
    ds : xarray.Dataset
        A trace.

    Returns
    -------
    list[int]
        The distinct versions.
    """
    pv = ds["policy_version"].values
    return sorted({int(v) for v in np.unique(pv[ds["response_mask"].values.astype(bool)])})


def latest_version(ds: xr.Dataset) -> int:
    """The latest weights version of a trace.

    The engine's version when the capture ended (``attrs["latest_policy_version"]``), else the
    newest version among its tokens.

    Parameters
    ----------
    ds : xarray.Dataset
        A trace.

    Returns
    -------
    int
        The version; 0 for a trace without real tokens or record.
    """
    v = arm_record(ds).latest_policy_version
    if v is not None:
        return int(v)
    versions = trace_versions(ds)
    return max(versions) if versions else 0


CHECKSUM_MISMATCH = ("token ids differ between rollout and trainer: the trainer scored other tokens than the engine "
                     "sampled (checksum mismatch); re-run rlparity score on this trace")


def token_checksum(ds: xr.Dataset) -> str:
    """A stable fingerprint of the prompt and response token ids (used to tie trainer to rollout).

    Parameters
    ----------
    ds : xarray.Dataset
        A trace.

    Returns
    -------
    str
        The first 16 hex digits of the SHA-256 of the ids (int64, padding included).
    """
    import hashlib

    h = hashlib.sha256()
    h.update(np.ascontiguousarray(ds["prompt_token_id"].values, dtype=np.int64).data)
    h.update(np.ascontiguousarray(ds["token_id"].values, dtype=np.int64).data)
    return h.hexdigest()[:16]


def sequences(ds: xr.Dataset) -> list[tuple[list[int], list[int]]]:
    """The prompt and response ids of each sequence, padding removed.

    Parameters
    ----------
    ds : xarray.Dataset
        A trace.

    Returns
    -------
    list[tuple[list[int], list[int]]]
        ``(prompt ids, response ids)`` per sequence.
    """
    p = ds["prompt_token_id"].values
    t = ds["token_id"].values
    return [(pi[pi >= 0].tolist(), ti[ti >= 0].tolist()) for pi, ti in zip(p, t)]
