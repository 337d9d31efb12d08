"""Stop tokens: does the engine stop at the tokens its own finished responses end with?

A response that finished with ``stop`` ends with the token the engine stopped at (vLLM keeps an
EOS or a stop id as the last response token). The trainer's side (its masks, rewards and the
length it scores) assumes a response ends at the tokenizer's EOS. When the engine stops at one id
on some requests and runs past the same id on others (``ignore_eos``, ``min_tokens``, per-request
``stop_token_ids``, a ``generation_config`` with several EOS ids that only one side knows), the two
sides disagree on where responses end. Read from the tokens alone: no setting is needed.

* ``stop_token_inside_response`` (warning): an id that ends at least ``stop_min_sequences``
  ``stop`` responses (together the ids that end 90% of them, at most three) also stands inside
  other responses, before their last token;
* ``stop_tokens_consistent`` (information): every response stops at its first such id.

Nothing is said with fewer ``stop`` responses, or when their last ids are too varied to be stop ids
(stop strings end on ordinary tokens).

This module is also the smallest example of a topic (:mod:`rlparity.diagnose.topic`): its checks,
its finding codes and its place in the method, in one file.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import xarray as xr

from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.topic import FIX_NONE, NOT_RECORDED, FindingCode, Topic, code
from rlparity.trace import arm_record

# the stop ids: the fewest last ids that end this share of the `stop` responses, if there are at most STOP_MAX_IDS
STOP_COVER = 0.9
STOP_MAX_IDS = 3
STOP_MIN_SEQUENCES = 4
FIX_STOP = ("give the engine and the trainer the same end-of-response ids: the engine's stop_token_ids / "
            "generation_config EOS ids and the tokenizer's eos_token_id the trainer masks and rewards with; do not "
            "sample with ignore_eos or min_tokens in RL unless the trainer ends responses the same way")


def stop_ids(trace: xr.Dataset) -> tuple[list[int], int]:
    """The ids the engine stopped at (``[]`` when they cannot be told) and how many ``stop``
    responses there are.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm (``token_id``, ``response_mask``, ``finish_reason``).

    Returns
    -------
    tuple of (list of int, int)
        The fewest last ids that end :data:`STOP_COVER` of the ``stop`` responses when there are at
        most :data:`STOP_MAX_IDS` of them and at least :data:`STOP_MIN_SEQUENCES` responses; the
        number of ``stop`` responses.
    """
    if "finish_reason" not in trace:
        return [], 0
    lengths = trace["response_mask"].values.astype(bool).sum(axis=1)
    stopped = (trace["finish_reason"].values.astype(str) == "stop") & (lengths > 0)
    n = int(stopped.sum())
    if n < STOP_MIN_SEQUENCES:
        return [], n
    tokens = trace["token_id"].values
    last = Counter(int(tokens[i, lengths[i] - 1]) for i in np.flatnonzero(stopped))
    ids, covered = [], 0
    for tok, k in last.most_common():
        ids.append(tok)
        covered += k
        if covered >= STOP_COVER * n:
            break
    return (ids if len(ids) <= STOP_MAX_IDS else []), n


def stop_token_parity(trace: xr.Dataset) -> Finding | None:
    """Whether responses run past an id the engine stops at elsewhere (module docstring).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.

    Returns
    -------
    Finding or None
        ``stop_token_inside_response`` or ``stop_tokens_consistent``; ``None`` when the stop ids
        cannot be told.
    """
    ids, n_stop = stop_ids(trace)
    if not ids:
        return None
    mask = trace["response_mask"].values.astype(bool)
    lengths = mask.sum(axis=1)
    tokens = trace["token_id"].values
    before_end = mask & (np.arange(mask.shape[1])[None, :] < (lengths - 1)[:, None])
    inside = before_end & np.isin(tokens, ids)
    rows = np.flatnonzero(inside.any(axis=1))
    arm = arm_record(trace).arm
    ev = {"stop_ids": ids, "n_stop_responses": n_stop, "n_responses": int((lengths > 0).sum()),
          "n_responses_past_a_stop_id": int(rows.size), "n_tokens_inside": int(inside.sum()),
          "sequences": rows[:20].tolist(),
          "first_positions": [int(np.flatnonzero(inside[i])[0]) for i in rows[:20]]}
    if rows.size == 0:
        return Finding(Layer.SEMANTIC, "stop_tokens_consistent", Severity.INFO,
                       f"every response stops at its first stop id ({ids}, the last token of {n_stop} `stop` "
                       "responses)", ev, FIX_NONE, arm)
    finish = Counter(trace["finish_reason"].values.astype(str)[rows].tolist())
    return Finding(Layer.SEMANTIC, "stop_token_inside_response", Severity.WARNING,
                   f"{rows.size} of {ev['n_responses']} responses run past a token the engine stops at elsewhere "
                   f"({ids} ends {n_stop} `stop` responses; {ev['n_tokens_inside']} such tokens stand inside "
                   f"responses; their finish reasons: {dict(finish)}): the engine and the trainer may not agree "
                   "where a response ends", ev, FIX_STOP, arm)


def trace_findings(trace: xr.Dataset, options=None, prior=(), *, evidence=None) -> list[Finding]:
    """The stop-token check on one arm (:func:`stop_token_parity`).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    options : DiagnoseOptions, optional
        Unused.
    prior : sequence of Finding
        Unused.
    evidence : ArmEvidence, optional
        Unused.

    Returns
    -------
    list of Finding
    """
    f = stop_token_parity(trace)
    return [f] if f is not None else []


CODES: tuple[FindingCode, ...] = (
    code("stop_token_inside_response", Layer.SEMANTIC, (Severity.WARNING,),
         "Responses run past a token the engine stops at on other requests: the engine ignores its stop id on some "
         "requests (ignore_eos, min_tokens, per-request stop ids, several EOS ids), so the engine and the trainer "
         "may not agree where a response ends (its masks, rewards and length).", FIX_STOP, "stop_tokens",
         rule="the stop ids: the fewest last ids covering `STOP_COVER` of the `stop` responses (at most "
              "`STOP_MAX_IDS`, from at least `STOP_MIN_SEQUENCES`); one of them inside a response, before its last token",
         thresholds=("rlparity.diagnose.stop_tokens:STOP_COVER", "rlparity.diagnose.stop_tokens:STOP_MAX_IDS",
                     "rlparity.diagnose.stop_tokens:STOP_MIN_SEQUENCES"),
         calibrated_on=NOT_RECORDED + " (counts of tokens: no numeric noise to calibrate against)"),
    code("stop_tokens_consistent", Layer.SEMANTIC, (Severity.INFO,),
         "Every response stops at its first stop id (the ids the `stop` responses end with).", FIX_NONE, "stop_tokens",
         rule="as stop_token_inside_response, with no stop id inside a response"),
)

TOPIC = Topic("stop_tokens", 18, CODES, trace_findings)

__all__ = ["STOP_COVER", "STOP_MAX_IDS", "STOP_MIN_SEQUENCES", "stop_ids", "stop_token_parity", "trace_findings"]
