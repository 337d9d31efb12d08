"""The trace data model: one ``xarray.Dataset`` per arm, many arms in one ``xarray.DataTree``.

Dims
    ``sequence``          one sampled completion (prompt x sample)
    ``position``          response token index, 0-based, padded to the longest response
    ``prompt_position``   prompt token index, padded to the longest prompt

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
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs

SCHEMA_VERSION = 1
TOKEN_DIMS = ("sequence", "position")
SEQ_DIMS = ("sequence",)
PROMPT_DIMS = ("sequence", "prompt_position")

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
}
TRAINER_VARS: dict[str, tuple[tuple[str, ...], str, str | None, str]] = {
    "trainer_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability of the sampled token, full vocabulary, temperature 1 (pi_old, raw)"),
    "trainer_processed_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability after temperature/top-k/top-p, renormalised as vLLM's sampler (pi_old, processed)"),
    "trainer_entropy": (TOKEN_DIMS, "f", NATS, "entropy of the trainer's full-vocabulary distribution"),
    "trainer_processed_entropy": (TOKEN_DIMS, "f", NATS, "entropy of the trainer's processed distribution"),
    "trainer_max_logit": (TOKEN_DIMS, "f", None, "largest logit at the position (logit magnitude)"),
    "trainer_token_rank": (TOKEN_DIMS, "i", None, "rank of the sampled token in the trainer's logits (0 = argmax, -1 = padding)"),
    "trainer_log_kept_mass": (TOKEN_DIMS, "f", NATS, "log of the temperature-scaled probability mass top-k/top-p keep (0 = nothing cut); processed = tempered - this"),
    "trainer_prompt_token_id": (("sequence", "trainer_prompt_position"), "i", None, "the trainer's own tokenization of the prompt text / chat messages (-1 = padding)"),
    "trainer_prompt_length": (SEQ_DIMS, "i", "tokens", "length of the trainer's tokenization (-1 = nothing to tokenize: the prompt was ids only)"),
    "trainer_updated_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability of the sampled token after an optimizer step, full vocabulary, temperature 1 (pi_theta, raw)"),
    "trainer_updated_processed_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability after an optimizer step, temperature/top-k/top-p applied and renormalised (pi_theta, processed)"),
    "trainer_latest_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability with the latest weights, whatever version sampled the token, full vocabulary, temperature 1 (raw)"),
    "trainer_latest_processed_logprob": (TOKEN_DIMS, "f", NATS, "trainer log-probability with the latest weights, temperature/top-k/top-p applied and renormalised (processed)"),
    "advantage": (SEQ_DIMS, "f", None, "sequence advantage used by the optimizer step (reward normalised within its group; NaN = not trained)"),
}
ALL_VARS = {**ROLLOUT_VARS, **OPTIONAL_ROLLOUT_VARS, **TRAINER_VARS}


class TraceValidationError(ValueError):
    """A trace does not follow the schema; the message says what is wrong and how to fix it."""


def pad_rows(rows: Sequence[Sequence[Any]], fill: Any, dtype: Any, width: int | None = None) -> np.ndarray:
    """Ragged per-sequence rows -> a ``(len(rows), width)`` array padded with ``fill``.

    ``width`` defaults to the longest row; a row longer than ``width`` is an error.
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
    """Stamp ``long_name`` and ``units`` from the schema table on every known variable (in place)."""
    for name, var in ds.data_vars.items():
        if name in ALL_VARS:
            _, _, units, long_name = ALL_VARS[name]
            var.attrs.setdefault("long_name", long_name)
            if units:
                var.attrs.setdefault("units", units)
    return ds


def from_rollouts(
    *,
    prompt_token_ids: Sequence[Sequence[int]],
    token_ids: Sequence[Sequence[int]],
    rollout_logprobs: Sequence[Sequence[float]],
    finish_reasons: Sequence[str] | None = None,
    policy_versions: Sequence[Sequence[int]] | None = None,
    prompt_index: Sequence[int] | None = None,
    sample_index: Sequence[int] | None = None,
    temperature: Sequence[float] | float = 1.0,
    top_k: Sequence[int] | int = 0,
    top_p: Sequence[float] | float = 1.0,
    request_seed: Sequence[int] | int = -1,
    prompt_texts: Sequence[str] | None = None,
    prompt_messages: Sequence[str] | None = None,
    response_texts: Sequence[str] | None = None,
    rewards: Sequence[float] | None = None,
    cached_prompt_tokens: Sequence[int] | None = None,
    attrs: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """Build a rollout trace from plain per-sequence lists (the ``from_dict`` of rlparity).

    Every capture backend and every importer of another framework's logs ends here, so all of
    them produce the same schema.
    """
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
    return annotate(ds)


def with_trainer(trace: xr.Dataset, arrays: Mapping[str, Any], attrs: Mapping[str, Any] | None = None
                 ) -> xr.Dataset:
    """A copy of ``trace`` with trainer-side variables added: ``arrays`` maps a schema variable
    name to an array shaped like its dims (token variables ``(sequence, position)``)."""
    out = trace.copy()
    for name, value in arrays.items():
        if name not in ALL_VARS:
            raise TraceValidationError(f"{name!r} is not a trace variable; known: {sorted(TRAINER_VARS)}")
        out[name] = (ALL_VARS[name][0], np.asarray(value))
    if attrs:
        out.attrs.update(attrs)
    return annotate(out)


def has_trainer(ds: xr.Dataset) -> bool:
    """Whether the trainer side has been added (see :func:`rlparity.score.score`)."""
    return "trainer_logprob" in ds


def validate(ds: xr.Dataset, *, require_trainer: bool = False, where: str = "trace") -> xr.Dataset:
    """Check a trace against the schema; return it unchanged or raise :class:`TraceValidationError`."""
    problems: list[str] = []
    missing = [v for v in ROLLOUT_VARS if v not in ds.variables]
    if missing:
        problems.append(
            f"missing rollout variables {missing}: build traces with rlparity.capture or "
            "rlparity.trace.from_rollouts"
        )
    trainer_present = [v for v in TRAINER_VARS if v in ds.variables]
    if require_trainer and not trainer_present:
        problems.append("no trainer variables: run `rlparity score TRACE --model MODEL` first")
    elif trainer_present and "trainer_logprob" not in ds.variables:
        problems.append("trainer variables present but trainer_logprob missing: re-run rlparity score")
    for name in list(ROLLOUT_VARS) + trainer_present:
        if name not in ds.variables:
            continue
        dims = ALL_VARS[name][0]
        if ds[name].dims != dims:
            problems.append(f"{name} has dims {ds[name].dims}, expected {dims}")
    if problems:
        raise TraceValidationError(f"{where} is not a valid rlparity trace:\n- " + "\n- ".join(problems))

    mask = ds["response_mask"].values.astype(bool)
    tok = ds["token_id"].values
    lengths = ds["response_length"].values
    counted = mask.sum(axis=1)
    bad = np.flatnonzero(counted != lengths)
    if bad.size:
        problems.append(
            f"response_length disagrees with response_mask for sequences {bad[:10].tolist()} "
            f"(e.g. {int(lengths[bad[0]])} vs {int(counted[bad[0]])} tokens): the trace is misaligned"
        )
    if np.any(tok[mask] < 0) or np.any(tok[~mask] >= 0):
        problems.append("token_id has padding (-1) inside the response or ids beyond response_length")
    # real tokens must be a prefix: no holes
    if mask.shape[1] and np.any(mask[:, 1:] & ~mask[:, :-1]):
        problems.append("response_mask has holes: response tokens must be contiguous from position 0")
    lp = ds["rollout_logprob"].values
    if np.any(np.isnan(lp[mask])):
        n_nan = int(np.isnan(lp[mask]).sum())
        problems.append(f"rollout_logprob is NaN at {n_nan} response tokens: the engine returned no logprob there")
    if np.any(lp[mask] > 1e-6):
        problems.append("rollout_logprob has positive values: these are logits, not log-probabilities "
                        "(was the engine run with logprobs_mode=raw_logits/processed_logits?)")
    plen = ds["prompt_length"].values
    pcount = (ds["prompt_token_id"].values >= 0).sum(axis=1)
    badp = np.flatnonzero(plen != pcount)
    if badp.size:
        problems.append(f"prompt_length disagrees with prompt_token_id for sequences {badp[:10].tolist()}")
    if trainer_present:
        tlp = ds["trainer_logprob"].values
        if np.any(np.isnan(tlp[mask])):
            problems.append("trainer_logprob is NaN at response tokens: rescoring did not cover every "
                            "token (lengths misaligned between rollout and trainer)")
        scored = ds.attrs.get("scored_token_checksum")
        if scored is not None and scored != token_checksum(ds):
            problems.append(
                "token ids differ between rollout and trainer: the trainer scored other tokens than "
                "the engine sampled (checksum mismatch); re-run rlparity score on this trace"
            )
    if problems:
        raise TraceValidationError(f"{where} is not a valid rlparity trace:\n- " + "\n- ".join(problems))
    return ds


def trace_versions(ds: xr.Dataset) -> list[int]:
    """The policy versions that produced the trace's real tokens, ascending."""
    pv = ds["policy_version"].values
    return sorted({int(v) for v in np.unique(pv[ds["response_mask"].values.astype(bool)])})


def latest_version(ds: xr.Dataset) -> int:
    """The latest weights version of a trace: the engine's version when the capture ended
    (``attrs["latest_policy_version"]``), else the newest version among its tokens (0 if none)."""
    v = ds.attrs.get("latest_policy_version")
    if v is not None:
        return int(v)
    versions = trace_versions(ds)
    return max(versions) if versions else 0


def token_checksum(ds: xr.Dataset) -> str:
    """A stable fingerprint of the prompt and response token ids (used to tie trainer to rollout)."""
    import hashlib

    h = hashlib.sha256()
    h.update(np.ascontiguousarray(ds["prompt_token_id"].values, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(ds["token_id"].values, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def sequences(ds: xr.Dataset) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) per sequence, padding removed."""
    p = ds["prompt_token_id"].values
    t = ds["token_id"].values
    return [(pi[pi >= 0].tolist(), ti[ti >= 0].tolist()) for pi, ti in zip(p, t)]


def concat_sequences(traces: Sequence[xr.Dataset]) -> xr.Dataset:
    """Join traces of the same arm along ``sequence`` (renumbered), padding positions as needed."""
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
        ok = all(t.attrs.get("scored_token_checksum") == token_checksum(t) for t in traces)
        out.attrs["scored_token_checksum"] = token_checksum(out) if ok else "parts-mismatched"
    return annotate(out)
