"""A bisection on a capture with a planted fault: what chapter 2 shows and ``scripts/bisect_example.py``
records (issue 38).

A capture is made under the ``pipelinerl-parity`` profile with one setting planted (``bf16_head``: the
LM head in bfloat16, as an engine whose head follows the body's dtype would run it), scored by the
trainer (float32 head), and handed to :func:`rlparity.experiments.bisect.bisect`: its tokens are
replayed under the capture's own settings twice (the replay floor), then one knob at a time, and the
winner's worst tokens go to the per-layer localisation. The planted knob must come first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

PLANTS = {"bf16_head": {"head_dtype": "bfloat16"}}


def planted_bisect(model: str | os.PathLike, *, plant: str = "bf16_head", dtype: str = "float32",
                   n_prompts: int = 8, max_tokens: int = 16, knobs: Sequence[str] | None = None,
                   budget: int | None = None, pairs: str = "auto", layers: bool = True,
                   layer_tokens: int | None = None, device: str = "cpu", pool=None,
                   log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Capture with a planted setting, score, bisect; return the bisection's report with the capture's record.

    Parameters
    ----------
    model : str or os.PathLike
        The model (a local checkpoint).
    plant : str, default "bf16_head"
        The planted setting (:data:`PLANTS`).
    dtype : str, default "float32"
        The body's dtype on both sides.
    n_prompts, max_tokens : int, default 8, 16
        The capture's size (``rlparity.models.make_prompts`` prompts, temperature 0.7, top-k 20, seed 0).
    knobs : sequence of str, optional
        The knobs (:data:`rlparity.experiments.bisect.KNOBS`); ``None``: all, in their default order.
    budget : int, optional
        Most engine starts of the bisection (the capture's engine replays the baseline and costs none).
    pairs : {"auto", "always", "never"}, default "auto"
        Pairs of knobs (:func:`rlparity.experiments.bisect.pair_plan`).
    layers : bool, default True
        Hand the winner's worst tokens to the per-layer localisation.
    layer_tokens : int, optional
        How many; ``None``: ``defaults().replay_layers_tokens``.
    device : str, default "cpu"
        The trainer's device.
    pool : EnginePool, optional
        Where engines come from; ``None``: a pool of its own, closed at the end.
    log : callable, optional
        Called with one line per engine start.

    Returns
    -------
    dict
        ``bisect`` (:func:`rlparity.experiments.bisect.report`, with token texts), ``capture`` (the
        plant, the settings, the sampling, the sizes, seconds and the capture's engine start) and
        ``elapsed_s``.

    Raises
    ------
    ValueError
        For an unknown plant.
    """
    if plant not in PLANTS:
        raise ValueError(f"plant {plant!r}: use one of {', '.join(PLANTS)}")
    from transformers import AutoTokenizer

    from rlparity.capture.pool import EnginePool
    from rlparity.config.profiles import load_profile
    from rlparity.config.settings import SamplingSettings
    from rlparity.experiments.bisect import DEFAULT_KNOBS, bisect, report
    from rlparity.models import make_prompts
    from rlparity.score import Scorer

    t0 = time.perf_counter()
    settings = load_profile("pipelinerl-parity").replace(dtype=dtype, **PLANTS[plant])
    sampling = SamplingSettings(temperature=0.7, top_k=20, max_tokens=max_tokens, seed=0)
    own = pool is None
    pool = pool or EnginePool()
    try:
        starts = pool.starts
        trace = pool.get(str(model), settings).capture(make_prompts(n_prompts, seed=0), sampling, arm="capture",
                                                       progress=False)
        capture = {"plant": plant, "planted": PLANTS[plant], "settings": settings.model_dump(mode="json"),
                   "sampling": sampling.model_dump(mode="json"), "n_prompts": n_prompts, "max_tokens": max_tokens,
                   "n_tokens": int(trace["response_mask"].sum()), "engine_starts": pool.starts - starts,
                   "seconds": round(time.perf_counter() - t0, 2), "trainer": {"dtype": dtype, "head_dtype": "float32"}}
        trace = Scorer(str(model), dtype=dtype, head_dtype="float32", device=device, progress=False).score(trace)
        arms, record = bisect(str(model), trace, knobs=list(knobs or DEFAULT_KNOBS), budget=budget, pool=pool,
                              pairs=pairs, layers=layers, layer_tokens=layer_tokens, log=log)
    finally:
        if own:
            pool.close()
    rep = report(arms, trace, record, tokenizer=AutoTokenizer.from_pretrained(str(model)))
    return {"bisect": rep, "capture": capture, "elapsed_s": round(time.perf_counter() - t0, 2)}


__all__ = ["PLANTS", "planted_bisect"]
