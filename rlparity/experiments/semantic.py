"""The semantic experiment: the same prompts under ``processed_logprobs`` and ``raw_logprobs``,
each at several temperatures in one engine (temperature is per request), rescored by the
trainer. Returns ``{arm: trace}`` with one arm per logprobs mode."""

from __future__ import annotations

import os
from collections.abc import Sequence

import xarray as xr

from rlparity.config.settings import EngineSettings, SamplingSettings

MODES = ("processed_logprobs", "raw_logprobs")


def sweep_sampling(n_prompts: int, temperatures: Sequence[float], *, top_k: int = 0, top_p: float = 1.0,
                   max_tokens: int = 24, seed: int = 0) -> tuple[list[int], list[SamplingSettings]]:
    """Every prompt at every temperature, as one batch of requests.

    Parameters
    ----------
    n_prompts : int
        How many prompts.
    temperatures : sequence of float
        The temperatures; all prompts run at each, in order.
    top_k : int, default 0
        The sampling top-k (0 = off).
    top_p : float, default 1.0
        The sampling top-p (1 = off).
    max_tokens : int, default 24
        Tokens per request.
    seed : int, default 0
        The base seed of every request's sampling.

    Returns
    -------
    tuple of (list of int, list of SamplingSettings)
        ``(prompt index per request, sampling per request)``.
    """
    index, sampling = [], []
    for t in temperatures:
        for i in range(n_prompts):
            index.append(i)
            sampling.append(SamplingSettings(temperature=t, top_k=top_k, top_p=top_p,
                                             max_tokens=max_tokens, seed=seed))
    return index, sampling


def semantic_experiment(model: str | os.PathLike, prompts: Sequence, *,
                        temperatures: Sequence[float] = (0.5, 0.7, 1.0, 1.3), top_k: int = 20,
                        top_p: float = 1.0, max_tokens: int = 24, seed: int = 0,
                        modes: Sequence[str] = MODES, engine: EngineSettings | None = None,
                        scorer=None, pool=None, progress: bool = False) -> dict[str, xr.Dataset]:
    """Capture ``prompts`` x ``temperatures`` once per logprobs mode and rescore every arm.

    Parameters
    ----------
    model : str or os.PathLike
        The model both sides load.
    prompts : sequence
        The prompts.
    temperatures : sequence of float, default (0.5, 0.7, 1.0, 1.3)
        The temperatures (per request, one engine per mode).
    top_k : int, default 20
        The sampling top-k (0 = off).
    top_p : float, default 1.0
        The sampling top-p (1 = off).
    max_tokens : int, default 24
        Tokens per request.
    seed : int, default 0
        The base seed of the requests.
    modes : sequence of str, default MODES
        The logprobs modes, one arm each (``processed_logprobs``, ``raw_logprobs``).
    engine : EngineSettings, optional
        The other engine settings; ``None`` means an fp32 LM head, as the trainer's.
    scorer : rlparity.score.Scorer, optional
        The trainer side; ``None`` means an fp32 body and head.
    pool : EnginePool, optional
        Where engines come from; ``None`` means the shared pool.
    progress : bool, default False
        Show progress bars.

    Returns
    -------
    dict of str to xarray.Dataset
        One scored trace per logprobs mode.
    """
    from rlparity.capture.pool import shared_pool
    from rlparity.score import Scorer

    base = engine or EngineSettings(head_dtype="float32")
    pool = pool or shared_pool()
    scorer = scorer or Scorer(model, dtype="float32", head_dtype="float32", progress=progress)
    index, sampling = sweep_sampling(len(prompts), temperatures, top_k=top_k, top_p=top_p,
                                     max_tokens=max_tokens, seed=seed)
    requests = [prompts[i] for i in index]
    arms = {}
    for mode in modes:
        eng = pool.get(model, base.replace(logprobs_mode=mode))
        trace = eng.capture(requests, sampling, arm=mode, progress=progress)
        arms[mode] = scorer.score(trace)
    return arms


def prompts_with_ids(tokenizer, prompts: Sequence[str], *, add_special_tokens: bool) -> list[dict]:
    """Prompts with their token ids, tokenized the way a pipeline that tokenizes before the engine sends them.

    Parameters
    ----------
    tokenizer : transformers.PreTrainedTokenizerBase
        The tokenizer.
    prompts : sequence of str
        The prompt texts.
    add_special_tokens : bool
        Whether the tokenizer adds its special tokens (BOS).

    Returns
    -------
    list of dict
        ``{"prompt": text, "prompt_token_ids": ids}`` per prompt.
    """
    return [{"prompt": p, "prompt_token_ids": tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"]}
            for p in prompts]
