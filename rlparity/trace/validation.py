"""Trace validation: :func:`validate` checks a trace against the schema (:mod:`rlparity.trace.schema`)
and raises one :class:`~rlparity.trace.schema.TraceValidationError` listing every problem, each with
its fix; :func:`route_id_problem` checks recorded expert ids."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.record import ArmRecord, ArmRecordError
from rlparity.trace.schema import (
    ALL_VARS,
    CHECKSUM_MISMATCH,
    POSITIVE_TOLERANCE,
    ROLLOUT_VARS,
    SCHEMA_VERSION,
    TOKEN_DIMS,
    TRAINER_READINGS,
    TRAINER_VARS,
    TraceValidationError,
    token_checksum,
)


# token variables where NaN on a real token has a meaning (not an error)
NAN_MEANS = {"trainer_cut_margin": "nothing was cut (no top-k/top-p at that position)"}
LOGPROB_VARS = ("rollout_logprob", *TRAINER_READINGS)
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
ROUTE_VARS = ("routed_experts", "prompt_routed_experts", "trainer_routed_experts")

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
    """Check a trace against the schema; return it unchanged or raise :class:`~rlparity.trace.schema.TraceValidationError`.

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
