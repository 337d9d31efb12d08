"""The scoring model's vocabulary against a trace's token ids: a trace sampled with another model is
refused before any forward."""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.trace import arm_record

__all__ = ["VocabularyError", "check_vocabulary"]


class VocabularyError(ValueError):
    """A trace holds token ids the scoring model has no row for (another model sampled it)."""


def check_vocabulary(trace: xr.Dataset, size: int, model: str) -> None:
    """Refuse a trace whose prompt or response token ids are ``>= size``, the vocabulary of ``model``.

    Parameters
    ----------
    trace : xarray.Dataset
        The trace with ``prompt_token_id`` and ``token_id``.
    size : int
        The number of rows of the model's vocabulary.
    model : str
        The model's name, for the message.

    Raises
    ------
    VocabularyError
        Naming the ids, the sequences they are in and the model.
    """
    ids = np.concatenate([trace["prompt_token_id"].values.ravel(), trace["token_id"].values.ravel()])
    bad = np.unique(ids[ids >= size])
    if bad.size:
        rows = np.flatnonzero((trace["prompt_token_id"].values >= size).any(axis=1)
                              | (trace["token_id"].values >= size).any(axis=1))
        arm = arm_record(trace).arm or "the trace"
        raise VocabularyError(
            f"arm {arm!r}: token id(s) {bad[:8].tolist()}{' ...' if bad.size > 8 else ''} ({int(bad.size)} distinct, in "
            f"{rows.size} sequence(s), first {rows[:5].tolist()}) are beyond the vocabulary of {model} ({size} "
            "tokens): the trace was sampled with another model or tokenizer; score it with the model that "
            "generated it (--model)")
