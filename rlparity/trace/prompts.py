"""How a prompt becomes token ids: the chat template rule both sides must follow.

The trace stores a prompt as the ids the engine saw (``prompt_token_id``) and, when known, as the
text (``prompt_text``) or chat messages (``prompt_messages``, JSON). The engine (capture) and the
trainer (score) must turn chat messages into ids the same way; this module is that one rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr


def chat_token_ids(tokenizer, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, generation prompt added.

    What ``LLM.chat`` and a trainer's ``apply_chat_template(tokenize=True)`` produce.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        A tokenizer with a chat template.
    messages : sequence of Mapping[str, Any]
        Chat messages (``{"role": ..., "content": ...}``).

    Returns
    -------
    list[int]
        The prompt's token ids.

    Raises
    ------
    ValueError
        The tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat prompts need a tokenizer with a chat template; this model has none: "
                         "pass text or token ids, or set tokenizer.chat_template")
    out = tokenizer.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=True)
    ids = out["input_ids"] if isinstance(out, Mapping) else out
    return [int(t) for t in ids]


def prompt_mismatch_sequences(trace: xr.Dataset) -> np.ndarray:
    """Per sequence: whether the engine's prompt ids differ from the trainer's tokenization.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm (with ``trainer_prompt_token_id`` when the trainer tokenized the prompts).

    Returns
    -------
    numpy.ndarray
        ``(sequence,)`` bool; all False without the trainer's tokenization.
    """
    n = trace.sizes["sequence"]
    if "trainer_prompt_token_id" not in trace:
        return np.zeros(n, dtype=bool)
    eng, tr = trace["prompt_token_id"].values, trace["trainer_prompt_token_id"].values
    tlen, elen = trace["trainer_prompt_length"].values, trace["prompt_length"].values
    out = np.zeros(n, dtype=bool)
    for i in np.flatnonzero(tlen >= 0):
        out[i] = eng[i, : elen[i]].tolist() != tr[i, : tlen[i]].tolist()
    return out


__all__ = ["chat_token_ids", "prompt_mismatch_sequences"]
