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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs
from rlparity.config.settings import with_overrides
from rlparity.trace.record import ArmRecord, ArmRecordError, arm_record

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


TRAINER_READINGS = ("trainer_logprob", "trainer_processed_logprob")
# token variables where NaN on a real token has a meaning (not an error)
NAN_MEANS = {"trainer_cut_margin": "nothing was cut (no top-k/top-p at that position)"}
LOGPROB_VARS = ("rollout_logprob", *TRAINER_READINGS)
# a log-softmax rounded to float32 stays below this; anything larger is not a log-probability
POSITIVE_TOLERANCE = 1e-6
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

_RESCORE = "re-run `rlparity score TRACE --model MODEL` (in float32 if the model overflows in lower precision)"
_FIX_NAN = {
    "rollout_logprob": "the engine returned no logprob there: capture with logprobs enabled (vLLM logprobs=0), "
                       "or fix the importer so every response token carries its rollout logprob",
    "trainer_logprob": "rescoring did not cover every token (rollout and trainer lengths misaligned) or the "
                       f"forward pass produced NaN: {_RESCORE}",
}
_FIX_NAN["trainer_processed_logprob"] = _FIX_NAN["trainer_logprob"]
_FIX_POSINF = ("a log-probability cannot be +inf: the logits overflowed (float16?) or the values are not "
               "log-probabilities; capture / rescore in float32")
_FIX_NEGINF = {
    "rollout_logprob": "the engine gave probability 0 to a token it sampled itself, so its logprobs do not "
                       "describe its sampler (check logprobs_mode), or an importer kept a masked placeholder; "
                       "only a trainer reading may be -inf (a token outside the trainer's kept set)",
}
_FIX_POSITIVE = ("these are not log-probabilities (logits or probabilities stored instead?): store the "
                 "log-softmax of the sampled token in nats (<= 0)")


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


def _sequences_of(bad: np.ndarray) -> str:
    """The sequences (rows) where ``bad`` holds, the first few of them."""
    rows = np.flatnonzero(bad.any(axis=1))
    if rows.size <= 8:
        return str(rows.tolist())
    return f"[{', '.join(map(str, rows[:7].tolist()))}, ...] ({rows.size} sequences)"


def _dtype_problem(name: str, dtype: np.dtype, kind: str, values: Any) -> str | None:
    """Why ``dtype`` is not allowed for schema kind ``kind`` ('f', 'i', 'b', 'U'), or None."""
    if kind == "f":
        if dtype == np.float16:
            return (f"{name} is float16, too coarse for log-probabilities (3 significant digits: a value "
                    f"near -10 is off by up to 0.004 nats, more than the mismatches rlparity measures): "
                    f"store float32 or float64 (the float16 values cannot be repaired: recapture/rescore)")
        if dtype not in FLOAT_DTYPES:
            return (f"{name} has dtype {dtype}, expected float32 or float64: convert it with "
                    f"ds[{name!r}] = ds[{name!r}].astype('float64')")
    elif kind == "i":
        if dtype.kind == "i":
            return None
        if dtype.kind == "u":
            why = "unsigned integers cannot hold the padding value -1"
        elif dtype.kind == "f":
            why = "integers stored as floats are inexact above 2**24 (float32) and can be fractional"
        elif dtype.kind in "UOST":
            why = "these are strings"
        else:
            why = f"{dtype} is not an integer type"
        return (f"{name} has dtype {dtype}, expected a signed integer (int32/int64; -1 = padding): {why}; "
                f"convert with ds[{name!r}] = ds[{name!r}].astype('int64') after checking the values are "
                "whole numbers")
    elif kind == "b":
        if dtype.kind != "b":
            return (f"{name} has dtype {dtype}, expected bool: convert with "
                    f"ds[{name!r}] = ds[{name!r}].astype(bool)")
    elif kind == "U":
        if dtype.kind in "UT":
            return None
        if dtype.kind == "O" and all(isinstance(x, str) for x in np.asarray(values).ravel()):
            return None
        return (f"{name} has dtype {dtype}, expected text (str): convert with "
                f"ds[{name!r}] = ds[{name!r}].astype(str)")
    return None


def _schema_version_problem(ds: xr.Dataset) -> str | None:
    if "schema_version" not in ds.attrs:
        return (f"it has no schema_version attribute; this release of rlparity reads schema_version "
                f"{SCHEMA_VERSION}: build traces with rlparity.trace.from_rollouts (or set "
                f"ds.attrs['schema_version'] = {SCHEMA_VERSION} if the data follows this schema)")
    v = ds.attrs["schema_version"]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        return (f"its schema_version is {v!r}, not a version number; this release of rlparity reads "
                f"schema_version {SCHEMA_VERSION}: set ds.attrs['schema_version'] = {SCHEMA_VERSION} if the "
                "data follows this schema")
    if int(v) > SCHEMA_VERSION:
        return (f"it has schema_version {int(v)}, written by a newer rlparity; this release reads "
                f"schema_version {SCHEMA_VERSION}: upgrade rlparity (pip install -U rlparity)")
    if int(v) != SCHEMA_VERSION:
        return (f"it has schema_version {int(v)}, which no rlparity release wrote; this release reads "
                f"schema_version {SCHEMA_VERSION}")
    return None


def _raise(where: str, problems: list[str]) -> None:
    if len(problems) == 1:
        raise TraceValidationError(f"{where} is not a valid rlparity trace: {problems[0]}")
    raise TraceValidationError(f"{where} is not a valid rlparity trace ({len(problems)} problems):\n- "
                               + "\n- ".join(problems))


def _token_float_problems(name: str, v: np.ndarray, mask: np.ndarray, n_real: int) -> list[str]:
    """Non-finite and (for logprobs) positive values of a token variable on real tokens."""
    out: list[str] = []
    # -inf is legal in any trainer logprob reading (pi_old, pi_theta, the latest weights): a token
    # outside the trainer's kept set; NaN is legal where the schema gives it a meaning
    reading = name.startswith("trainer_") and name.endswith("logprob")
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(v)
        bad = ~finite
        if name in NAN_MEANS:
            bad &= ~np.isnan(v)
        bad &= mask
        if bad.any():
            nan = mask & np.isnan(v)
            posinf = mask & (v == np.inf)
            neginf = bad & ~nan & ~posinf
            fix_nan = _FIX_NAN.get(name, f"rescoring produced NaN: {_RESCORE}")
            fix_neg = _FIX_NEGINF.get(name, f"this statistic cannot be -inf: {_RESCORE}")
            kinds = [(nan, "NaN", fix_nan), (posinf, "+inf", _FIX_POSINF if name in LOGPROB_VARS
                                             else f"this statistic cannot be +inf: {_RESCORE}")]
            if not reading:  # -inf is legal in a trainer reading: a token outside the trainer's set
                kinds.append((neginf, "-inf", fix_neg))
            for where_bad, what, fix in kinds:
                k = int(where_bad.sum())
                if k:
                    out.append(f"{name} is {what} at {k} of {n_real} response tokens "
                               f"(sequences {_sequences_of(where_bad)}): {fix}")
        if name in LOGPROB_VARS:
            pos = v > POSITIVE_TOLERANCE  # NaN compares False; +inf is reported above
            pos &= mask
            if pos.any():
                pos &= finite
                k = int(pos.sum())
                if k:
                    out.append(f"{name} is positive at {k} of {n_real} response tokens (max "
                               f"{float(v[pos].max()):+.4g}, sequences {_sequences_of(pos)}): {_FIX_POSITIVE}")
    return out


def validate(ds: xr.Dataset, *, require_trainer: bool = False, where: str = "trace") -> xr.Dataset:
    """Check a trace against the schema; return it unchanged or raise :class:`TraceValidationError`.

    Checked: ``schema_version`` (this release reads :data:`SCHEMA_VERSION`); the rollout variables
    are present; every known variable has its dims and a dtype of its schema kind (float32/float64
    for floats, float16 refused; signed integers; bool; text); lengths, masks and padding agree;
    every float on a real token (``response_mask`` true) is finite, except ``-inf`` in a trainer
    reading (``trainer_logprob`` / ``trainer_processed_logprob``: a token outside the trainer's
    set, legal and counted by the metrics); no log-probability is positive (> 1e-6 nats); the
    trainer scored the tokens the engine sampled (token checksum).

    Vectorised numpy: about 0.2 s for 7.5M tokens on one core, so it runs at every boundary
    (construct, save, load, score).

    Parameters
    ----------
    ds : xarray.Dataset
        The trace.
    require_trainer : bool, default False
        The judging boundary (metrics, verdicts): also require a trainer reading and at least one
        response token (nothing to judge otherwise).
    where : str, default "trace"
        What the trace is, starting the error message.

    Returns
    -------
    xarray.Dataset
        ``ds``, unchanged.

    Raises
    ------
    TraceValidationError
        Every problem found, each with how to fix it.
    """
    problem = _schema_version_problem(ds)
    if problem:
        _raise(where, [problem])
    try:
        rec = ArmRecord.from_attrs(ds.attrs)
    except ArmRecordError as err:
        _raise(where, [str(err)])
    problems: list[str] = []
    missing = [v for v in ROLLOUT_VARS if v not in ds.variables]
    if missing:
        problems.append(
            f"missing rollout variables {missing}: build traces with rlparity.capture or "
            "rlparity.trace.from_rollouts"
        )
    readings = [v for v in TRAINER_READINGS if v in ds.variables]
    trainer_present = [v for v in TRAINER_VARS if v in ds.variables]
    if require_trainer and not readings:
        problems.append("it is not scored (no trainer_logprob or trainer_processed_logprob): run "
                        "`rlparity score TRACE --model MODEL` first")
    elif trainer_present and not readings:
        problems.append(f"trainer variables {trainer_present} present but neither trainer reading "
                        "(trainer_logprob, trainer_processed_logprob): re-run `rlparity score`")
    if require_trainer and "response_mask" in ds.variables and not np.any(ds["response_mask"].values):
        problems.append(f"it holds no response tokens ({ds.sizes.get('sequence', 0)} sequences, every "
                        "response empty): nothing to judge; capture with max_tokens > 0 and at least one prompt")
    for name in ALL_VARS:
        if name not in ds.variables:
            continue
        dims, kind, _, _ = ALL_VARS[name]
        var = ds.variables[name]
        if var.dims != dims:
            problems.append(f"{name} has dims {var.dims}, expected {dims}")
            continue
        why = _dtype_problem(name, var.dtype, kind, var.values if var.dtype.kind == "O" else None)
        if why:
            problems.append(why)
    if problems:
        _raise(where, problems)

    mask = ds["response_mask"].values
    tok = ds["token_id"].values
    lengths = ds["response_length"].values
    n_real = int(mask.sum())
    counted = mask.sum(axis=1)
    bad = np.flatnonzero(counted != lengths)
    if bad.size:
        problems.append(
            f"response_length disagrees with response_mask for sequences {bad[:10].tolist()} "
            f"(e.g. {int(lengths[bad[0]])} vs {int(counted[bad[0]])} tokens): the trace is misaligned"
        )
    if np.any((tok < 0) & mask) or np.any((tok >= 0) & ~mask):
        problems.append("token_id has padding (-1) inside the response or ids beyond response_length")
    # real tokens must be a prefix: no holes
    if mask.shape[1] and np.any(mask[:, 1:] & ~mask[:, :-1]):
        problems.append("response_mask has holes: response tokens must be contiguous from position 0")
    plen = ds["prompt_length"].values
    pcount = (ds["prompt_token_id"].values >= 0).sum(axis=1)
    badp = np.flatnonzero(plen != pcount)
    if badp.size:
        problems.append(f"prompt_length disagrees with prompt_token_id for sequences {badp[:10].tolist()}")
    for name, (dims, kind, _, _) in ALL_VARS.items():
        if kind == "f" and dims == TOKEN_DIMS and name in ds.variables:
            problems.extend(_token_float_problems(name, ds[name].values, mask, n_real))
    problems.extend(_sequence_float_problems(ds))
    n_experts = max(int((r or {}).get("num_experts") or 0) for r in (rec.routing_capture, rec.trainer_router))
    for name in ROUTE_VARS:
        if name in ds.variables:
            why = route_id_problem(name, ds[name].values, n_experts or None)
            if why:
                problems.append(why)
    if trainer_present:
        scored = rec.scored_token_checksum
        if scored is not None and scored != token_checksum(ds):
            problems.append(CHECKSUM_MISMATCH)
    if problems:
        _raise(where, problems)
    return ds


ROUTE_VARS = ("routed_experts", "prompt_routed_experts", "trainer_routed_experts")


def route_id_problem(name: str, ids: np.ndarray, num_experts: int | None = None) -> str | None:
    """What is wrong with recorded expert ids, or ``None``: an id is ``-1`` (not recorded) or an
    expert of the model, ``0 .. num_experts - 1`` (unknown ``num_experts``: only ``>= -1`` is checked).

    Parameters
    ----------
    name : str
        The variable, for the message.
    ids : numpy.ndarray
        Expert ids.
    num_experts : int, optional
        The model's experts per MoE layer.

    Returns
    -------
    str or None
        One line naming how many ids are out of range and the range, or ``None``.
    """
    ids = np.asarray(ids)
    hi = num_experts if num_experts else None
    bad = (ids < -1) | ((ids >= hi) if hi is not None else False)
    k = int(np.count_nonzero(bad))
    if not k:
        return None
    rng = f"0 .. {hi - 1}" if hi is not None else "0 and up"
    return (f"{name} holds {k} expert id(s) outside {rng} (e.g. {int(ids[bad].flat[0])}; -1 = not recorded): "
            "an id names no expert of the model; record the routes again from the model that sampled them")


def _sequence_float_problems(ds: xr.Dataset) -> list[str]:
    """Per-sequence sampling parameters in range; a reward may be NaN (not scored), never inf."""
    out: list[str] = []
    with np.errstate(invalid="ignore"):
        # NaN = not recorded (an imported dump that lacks it: rlparity asks, never invents)
        t = ds["temperature"].values
        k = int((np.isinf(t) | (t < 0)).sum())
        if k:
            out.append(f"temperature is infinite or negative for {k} of {t.size} sequences: "
                       "record the sampling temperature of each request (>= 0; NaN = not recorded)")
        p = ds["top_p"].values
        k = int((np.isinf(p) | (p <= 0) | (p > 1)).sum())
        if k:
            out.append(f"top_p is outside (0, 1] for {k} of {p.size} sequences: record each request's "
                       "top_p (1 = off; NaN = not recorded)")
        if "reward" in ds.variables:
            r = ds["reward"].values
            k = int(np.isinf(r).sum())
            if k:
                out.append(f"reward is infinite for {k} of {r.size} sequences: store a finite reward, "
                           "or NaN for not scored")
    return out


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
