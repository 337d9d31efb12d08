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
    """Every prompt at every temperature: (prompt index per request, sampling per request)."""
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

    ``engine`` holds the other engine settings (default: fp32 LM head, as the trainer); ``scorer``
    defaults to an fp32 :class:`rlparity.score.Scorer`; ``pool`` to the shared engine pool.
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
    """Prompts as ``{"prompt": text, "prompt_token_ids": ids}`` tokenized with the given
    special-token setting: how a pipeline that tokenizes before the engine sends them."""
    return [{"prompt": p, "prompt_token_ids": tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"]}
            for p in prompts]
