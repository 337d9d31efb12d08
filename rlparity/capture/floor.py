"""The engine's own floor: how much the batch a request runs in moves the engine's logprobs.

:func:`engine_floor` samples some requests of a batched capture again, each alone, with the same
request seeds, and compares the logprobs of the tokens both runs sampled alike (up to the first
token that differs). A batch-invariant engine gives 0; vLLM's default kernels on a GPU do not
(the attention split and GEMM tiles follow the batch). The statistic has the form of the trainer's
self-check (:meth:`rlparity.score.Scorer.score`, ``attrs["trainer"]["self_check"]``), so a diagnosis
reads both floors side by side (:mod:`rlparity.diagnose.trainer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.settings import SamplingSettings
from rlparity.trace.floor import spread


def engine_floor(eng, prompts: Sequence, sampling: SamplingSettings, batched: xr.Dataset) -> dict[str, Any]:
    """The engine's batch spread: the same requests sampled alone against in a batch.

    ``prompts`` are the first requests of the capture ``batched`` (made by ``eng`` with
    ``sampling``), each sampled again alone with the seed it had in the batch; the logprobs of the
    tokens both runs sampled alike (up to the first token that differs) are compared.

    Parameters
    ----------
    eng : Engine or AsyncEngine
        The engine that made ``batched`` (any object with rlparity's ``capture``).
    prompts : sequence of Prompt
        The first requests of the batched capture, in its order.
    sampling : SamplingSettings
        The sampling of the batched capture; request ``i`` is sampled again with seed
        ``sampling.seed + i`` (no seed when ``sampling.seed`` is ``None``).
    batched : xarray.Dataset
        The batched capture's trace.

    Returns
    -------
    dict
        ``batch_shape`` (:func:`rlparity.trace.floor.spread` of the two runs' logprobs, nats),
        ``n_sequences``, ``n_sequences_diverged`` (sequences whose tokens differ somewhere),
        ``shape_main`` and ``shape_check`` (the two batch shapes, in words).
    """
    a_all, b_all, n_diverged = [], [], 0
    for i, p in enumerate(prompts):
        seed = None if sampling.seed is None else sampling.seed + i
        one = eng.capture([p], sampling.model_copy(update={"seed": seed}), arm="engine_floor", progress=False)
        a_tok, b_tok = batched["token_id"].values[i], one["token_id"].values[0]
        n = min(int((a_tok >= 0).sum()), int((b_tok >= 0).sum()))
        same = np.cumprod(a_tok[:n] == b_tok[:n]).astype(bool)
        n_diverged += int(not same.all())
        a_all.append(batched["rollout_logprob"].values[i, :n][same])
        b_all.append(one["rollout_logprob"].values[0, :n][same])
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0))  # noqa: E731
    return {"batch_shape": spread(cat(a_all), cat(b_all)), "n_sequences": len(prompts),
            "n_sequences_diverged": n_diverged, "shape_main": f"a batch of {batched.sizes['sequence']}",
            "shape_check": "batch 1, same request seeds"}


__all__ = ["engine_floor"]
