"""Prompts and requests: normalise what users pass, pair it with sampling settings and seeds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlparity.config.settings import SamplingSettings
from rlparity.trace.prompts import chat_token_ids

Prompt = str | Sequence[int] | Mapping[str, Any]


@dataclass
class Request:
    """One prompt with its sampling settings, normalised.

    Parameters
    ----------
    index : int
        The prompt's position in the capture (0-based).
    text : str
        The prompt's text ("" when given as token ids only).
    token_ids : list of int or None
        The prompt's token ids; ``None`` until a text-only prompt is tokenized by the engine
        (a chat prompt gets them from :func:`render_chat`).
    sampling : SamplingSettings
        The request's sampling settings.
    seed : int or None
        The request's seed (``sampling.seed + index``); ``None``: unseeded.
    messages : list of dict, optional
        The chat messages of a chat prompt; ``None`` otherwise.
    """

    index: int
    text: str
    token_ids: list[int] | None
    sampling: SamplingSettings
    seed: int | None
    messages: list[dict[str, Any]] | None = None


Normalized = tuple[str, "list[int] | None", "list[dict[str, Any]] | None"]


def normalize_prompts(prompts: Sequence[Prompt] | Prompt) -> list[Normalized]:
    """Normalise prompts: text, token ids, prompt dicts or chat messages.

    Accepts text, token ids, ``{"prompt": ...}`` / ``{"prompt_token_ids": [...]}`` dicts, or
    chat ``{"messages": [{"role": ..., "content": ...}, ...]}`` (rendered with the model's chat
    template by :func:`render_chat`).

    Parameters
    ----------
    prompts : Prompt or sequence of Prompt
        One prompt (a string or a dict) or a sequence of them.

    Returns
    -------
    list of tuple
        ``(text, token_ids, messages)`` per prompt (``None`` where not given).

    Raises
    ------
    ValueError
        If no prompt is given, a dict has none of the keys, messages are malformed, a token list
        is empty or a prompt is of another type.
    """
    if isinstance(prompts, (str, Mapping)):
        prompts = [prompts]
    out: list[Normalized] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append((p, None, None))
        elif isinstance(p, Mapping):
            if "messages" in p:
                msgs = p["messages"]
                if not isinstance(msgs, Sequence) or not all(isinstance(m, Mapping) and "content" in m for m in msgs):
                    raise ValueError(f"prompt {i}: 'messages' must be a list of {{'role', 'content'}} dicts")
                ids = list(map(int, p["prompt_token_ids"])) if "prompt_token_ids" in p else None
                out.append((str(p.get("prompt", "")), ids, [dict(m) for m in msgs]))
            elif "prompt_token_ids" in p:
                out.append((str(p.get("prompt", "")), list(map(int, p["prompt_token_ids"])), None))
            elif "prompt" in p:
                out.append((str(p["prompt"]), None, None))
            else:
                raise ValueError(f"prompt {i} is a dict without 'prompt', 'prompt_token_ids' or "
                                 f"'messages': {dict(p)!r}")
        else:
            try:
                ids = list(map(int, p))
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"prompt {i} is {type(p).__name__}; pass text, a list of token ids or a dict "
                    "with 'prompt_token_ids'"
                ) from err
            if not ids:
                raise ValueError(f"prompt {i} is an empty token list")
            out.append(("", ids, None))
    if not out:
        raise ValueError("no prompts given")
    return out


def make_requests(prompts: Sequence[Prompt] | Prompt,
                  sampling: SamplingSettings | Sequence[SamplingSettings]) -> list[Request]:
    """Pair prompts with sampling settings; request ``i`` gets seed ``sampling.seed + i``.

    Parameters
    ----------
    prompts : Prompt or sequence of Prompt
        What :func:`normalize_prompts` accepts.
    sampling : SamplingSettings or sequence of SamplingSettings
        One setting for all prompts, or one per prompt (temperature is per request, so a
        temperature sweep runs in one engine).

    Returns
    -------
    list of Request
        One request per prompt, in order.

    Raises
    ------
    ValueError
        If the prompts are invalid, or the number of sampling settings is neither one nor one per prompt.
    """
    items = normalize_prompts(prompts)
    if isinstance(sampling, SamplingSettings):
        per = [sampling] * len(items)
    else:
        per = list(sampling)
        if len(per) != len(items):
            raise ValueError(f"{len(items)} prompts but {len(per)} sampling settings: pass one, or one per prompt")
    return [
        Request(i, text, ids, s, None if s.seed is None else s.seed + i, msgs)
        for i, ((text, ids, msgs), s) in enumerate(zip(items, per))
    ]


def render_chat(requests: Sequence[Request], tokenizer) -> list[Request]:
    """Give chat requests their token ids (chat template, no second BOS) and rendered text.

    Parameters
    ----------
    requests : sequence of Request
        The requests; those with ``messages`` and no token ids are changed in place.
    tokenizer : transformers.PreTrainedTokenizerBase
        The model's tokenizer (its chat template).

    Returns
    -------
    sequence of Request
        ``requests`` itself.
    """
    for r in requests:
        if r.messages is not None and r.token_ids is None:
            r.token_ids = chat_token_ids(tokenizer, r.messages)
            if not r.text:
                r.text = tokenizer.apply_chat_template(list(r.messages), tokenize=False,
                                                       add_generation_prompt=True)
    return requests


def sampling_attrs(requests: Sequence[Request]) -> list[dict[str, Any]]:
    """Distinct sampling settings of a capture, for the trace attrs.

    Parameters
    ----------
    requests : sequence of Request
        The capture's requests.

    Returns
    -------
    list of dict
        Each distinct ``SamplingSettings.model_dump()``, in order of first use.
    """
    seen: list[dict[str, Any]] = []
    dumped: set[int] = set()  # settings objects already dumped (one object is often shared by every request)
    for r in requests:
        if id(r.sampling) in dumped:
            continue
        dumped.add(id(r.sampling))
        d = r.sampling.model_dump()
        if d not in seen:
            seen.append(d)
    return seen


__all__ = ["Normalized", "Prompt", "Request", "make_requests", "normalize_prompts", "render_chat", "sampling_attrs"]
