"""One colour per profile or arm name, the same in every figure.

Every plot function that draws one trace per arm, run or engine profile takes its colour from
:func:`color`, so a name keeps its colour from one figure to the next (the CPU and the H200 figures
of a chapter included):

* the names the book uses throughout have fixed colours (:data:`KNOWN`): the parity reading and
  profile blue, raw logprobs and vLLM's defaults red, the bf16 head orange;
* any other name gets a colour from :data:`QUALITATIVE` picked by a stable hash of the name
  (``blake2b``, the same in every process); when another name already holds that colour in this
  session, the next free one (so the arms of one figure stay apart until the palette runs out).

A profile-and-denominator label (``"pipelinerl-parity+mu"``) takes its profile's colour
(:func:`base_name`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

# D3's category10, then its light variants (category20's second halves): 20 colours
QUALITATIVE: tuple[str, ...] = (
    "#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#aec7e8", "#ff9896", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5",
)
BLUE, RED, ORANGE = "#1f77b4", "#d62728", "#ff7f0e"
KNOWN: dict[str, str] = {
    # engine profiles (rlparity.config.profiles, the online RL run)
    "pipelinerl-parity": BLUE, "vllm-v1-defaults": RED, "parity-bf16-head": ORANGE,
    # logprob readings and the semantic / objective chapters' arms
    "processed_logprobs": BLUE, "processed": BLUE, "parity": BLUE,
    "raw_logprobs": RED, "raw": RED,
}
_ASSIGNED: dict[str, str] = {}


def base_name(name: str) -> str:
    """The part of a label that picks its colour.

    Parameters
    ----------
    name : str
        A label, e.g. ``"pipelinerl-parity+mu"`` or ``"parity (after one step)"``.

    Returns
    -------
    str
        The head before ``+`` or `` (`` when that head is a :data:`KNOWN` name
        (``"pipelinerl-parity"``, ``"parity"``), else ``name`` unchanged.
    """
    name = str(name)
    for sep in ("+", " ("):
        head = name.split(sep, 1)[0]
        if head in KNOWN:
            return head
    return name


def _slot(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big") % len(QUALITATIVE)


def color(name: str) -> str:
    """The colour of ``name`` (a profile, an arm, a run label).

    Fixed for :data:`KNOWN` names, else a stable hash into :data:`QUALITATIVE`, moved to the next
    colour no other name holds in this session (shared once all are held).

    Parameters
    ----------
    name : str
        The label; :func:`base_name` picks the part that decides.

    Returns
    -------
    str
        A hex colour (``"#1f77b4"``).
    """
    key = base_name(name)
    if key in KNOWN:
        return KNOWN[key]
    if key in _ASSIGNED:
        return _ASSIGNED[key]
    held = set(_ASSIGNED.values()) | set(KNOWN.values())
    start = _slot(key)
    for k in range(len(QUALITATIVE)):
        c = QUALITATIVE[(start + k) % len(QUALITATIVE)]
        if c not in held:
            break
    else:  # every colour is held: share the hashed one
        c = QUALITATIVE[start]
    _ASSIGNED[key] = c
    return c


def colors(names: Iterable[str]) -> dict[str, str]:
    """The colours of several names, in order.

    Parameters
    ----------
    names : iterable of str
        The labels.

    Returns
    -------
    dict of str to str
        ``{name: color(name)}``.
    """
    return {n: color(n) for n in names}


__all__ = ["KNOWN", "QUALITATIVE", "base_name", "color", "colors"]
