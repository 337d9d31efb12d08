"""Rewards and group-normalised advantages.

* :func:`arithmetic_reward`: a checker for the tiny model's arithmetic task
  (:mod:`rlparity.models`): the problem the prompt leaves open plus every problem the response
  writes, scored by :func:`rlparity.models.score_answers`.
* :func:`group_advantages`: GRPO's advantage, each sequence's reward minus its group's mean,
  divided by the group's standard deviation; a group is the n samples of one prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import xarray as xr

from rlparity.models import score_answers


def open_problem(prompt_text: str) -> str:
    """The unfinished problem a prompt ends with (``"14+8=22;39-9="`` -> ``"39-9="``).

    Parameters
    ----------
    prompt_text : str
        The prompt's text; problems are separated by ``;``.

    Returns
    -------
    str
        The text after the last ``;`` (the whole prompt when it has none).
    """
    return prompt_text.rsplit(";", 1)[-1] if ";" in prompt_text else prompt_text


def arithmetic_reward(trace: xr.Dataset, *, which: Literal["all", "first"] = "all") -> np.ndarray:
    """Per-sequence reward of the tiny model's arithmetic task, in [0, 1].

    The text scored is the prompt's open problem followed by the response (``response_text``),
    scored by :func:`rlparity.models.score_answers`. A response with no complete problem scores 0.

    Parameters
    ----------
    trace : xarray.Dataset
        A rollout trace with ``response_text`` (and ``prompt_text``; without it the prompt is
        taken as empty).
    which : {"all", "first"}, default "all"
        ``"all"``: the share of complete problems (``a op b = c;``) whose answer is right;
        ``"first"``: 1 if the problem the prompt opened is answered right, else 0.

    Returns
    -------
    numpy.ndarray
        One float reward per sequence.

    Raises
    ------
    ValueError
        If the trace has no ``response_text``, or ``which`` is neither ``"all"`` nor ``"first"``.
    """
    if "response_text" not in trace:
        raise ValueError("the trace has no response_text: capture with rlparity (it stores the detokenised "
                         "response) or pass rewards=... yourself")
    prompts = trace["prompt_text"].values if "prompt_text" in trace else [""] * trace.sizes["sequence"]
    out = []
    for p, r in zip(prompts, trace["response_text"].values):
        text = open_problem(str(p)) + str(r)
        if which == "all":
            out.append(score_answers(text))
        elif which == "first":
            first = text.split(";", 1)[0] + ";"
            out.append(float(score_answers(first) == 1.0))
        else:
            raise ValueError(f"which={which!r}; use 'all' or 'first'")
    return np.asarray(out, dtype=float)


def group_advantages(rewards: Sequence[float], groups: Sequence, *, scale: Literal["std", "none"] = "std",
                     eps: float = 1e-6) -> np.ndarray:
    """GRPO advantages: ``(r_i - mean_g) / (std_g + eps)`` within each group.

    ``std`` is taken with n - 1, as TRL and verl compute it. A group of one sample, or whose
    rewards are all equal, gets advantage 0.

    Parameters
    ----------
    rewards : sequence of float
        One reward per sequence; all finite.
    groups : sequence
        One group key per sequence (a group is the n samples of one prompt), same length as
        ``rewards``.
    scale : {"std", "none"}, default "std"
        ``"std"``: divide by the group's standard deviation plus ``eps``; ``"none"``: only subtract
        the group mean (Dr. GRPO).
    eps : float, default 1e-6
        Added to the standard deviation before dividing.

    Returns
    -------
    numpy.ndarray
        One advantage per sequence (1-d float).

    Raises
    ------
    ValueError
        If ``rewards`` and ``groups`` are not 1-d of one length, a reward is not finite, or
        ``scale`` is unknown.
    """
    r = np.asarray(rewards, dtype=float)
    g = np.asarray(groups)
    if r.shape != g.shape or r.ndim != 1:
        raise ValueError(f"rewards {r.shape} and groups {g.shape} must be 1-d of one length (one per sequence)")
    if not np.isfinite(r).all():
        raise ValueError(f"{int((~np.isfinite(r)).sum())} rewards are not finite: score every sequence")
    if scale not in ("std", "none"):
        raise ValueError(f"scale={scale!r}; use 'std' or 'none'")
    adv = np.zeros_like(r)
    for key in np.unique(g):
        idx = np.flatnonzero(g == key)
        if idx.size < 2:
            continue
        x = r[idx] - r[idx].mean()
        adv[idx] = x / (r[idx].std(ddof=1) + eps) if scale == "std" else x
    return adv


__all__ = ["arithmetic_reward", "group_advantages", "open_problem"]
