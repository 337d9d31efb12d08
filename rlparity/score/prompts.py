"""The trainer's own tokenization of prompts: chat messages through the chat template, or the prompt
text, to compare with the ids the engine was sent."""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.trace.prompts import chat_token_ids
from rlparity.trace.schema import annotate

__all__ = ["tokenize_prompts", "trainer_prompt_ids"]


def trainer_prompt_ids(tokenizer, text: str, messages_json: str = "", *,
                       add_special_tokens: bool = True) -> list[int] | None:
    """How the trainer tokenizes one prompt.

    Parameters
    ----------
    tokenizer : transformers tokenizer
        The trainer's tokenizer.
    text : str
        The prompt's text (may be empty).
    messages_json : str, default ""
        The prompt's chat messages as JSON; when given, they go through the chat template and
        ``text`` is not used.
    add_special_tokens : bool, default True
        Whether tokenizing ``text`` adds special tokens.

    Returns
    -------
    list of int or None
        The token ids; ``None`` when there is nothing to tokenize (an ids-only prompt).
    """
    import json

    if messages_json:
        return chat_token_ids(tokenizer, json.loads(messages_json))
    if text:
        return [int(t) for t in tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]
    return None


def tokenize_prompts(trace: xr.Dataset, tokenizer, *, add_special_tokens: bool = True) -> xr.Dataset:
    """Add the trainer's own tokenization of each prompt, to compare with the ids the engine was sent.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace; each prompt's ``prompt_messages`` (chat) or ``prompt_text`` is tokenized.
    tokenizer : transformers tokenizer
        The trainer's tokenizer.
    add_special_tokens : bool, default True
        Whether tokenizing text adds special tokens.

    Returns
    -------
    xarray.Dataset
        A copy with ``trainer_prompt_token_id`` (padded with -1) and ``trainer_prompt_length`` (-1
        where the prompt has no text).
    """
    texts = trace["prompt_text"].values if "prompt_text" in trace else [""] * trace.sizes["sequence"]
    msgs = trace["prompt_messages"].values if "prompt_messages" in trace else [""] * len(texts)
    rows = [trainer_prompt_ids(tokenizer, str(t), str(m), add_special_tokens=add_special_tokens)
            for t, m in zip(texts, msgs)]
    width = max([len(r) for r in rows if r is not None], default=0)
    ids = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        if r:
            ids[i, : len(r)] = r
    out = trace.copy()
    out["trainer_prompt_token_id"] = (("sequence", "trainer_prompt_position"), ids)
    out["trainer_prompt_length"] = (("sequence",), np.array([-1 if r is None else len(r) for r in rows],
                                                            dtype=np.int64))
    return annotate(out)
