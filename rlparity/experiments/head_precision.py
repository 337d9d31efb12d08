"""The LM-head precision experiment: rollout head dtype x trainer head dtype.

The same prompts (same seeds) are sampled once per rollout head dtype (vLLM
``hf_overrides={"head_dtype": ...}``) and every rollout is rescored once per trainer head dtype.
The body runs in one pinned ``dtype`` on both sides (default bfloat16: vLLM's CPU build runs
``dtype="auto"`` as bfloat16 anyway), so the cells differ only in the precision of the final
projection to logits. Logprobs are ``processed_logprobs`` in every cell, so no semantic mismatch
mixes in.

:func:`head_matrix` runs the experiment and returns ``{arm: trace}`` with arms named
``rollout-<dtype>_trainer-<dtype>`` (:func:`rlparity.metrics.head_precision.arm_name`); the tables are in
:mod:`rlparity.metrics.head_precision`, the findings in :mod:`rlparity.diagnose.head_precision`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import xarray as xr

from rlparity.config.defaults import default_sampling
from rlparity.config.settings import FLOAT_DTYPES, EngineSettings, SamplingSettings, dtype_name, normalize_dtype
from rlparity.metrics.head_precision import DEFAULT_HEADS, arm_name
from rlparity.trace import arm_record, with_factors

HEAD_DTYPES = FLOAT_DTYPES


def _check_dtypes(values: Sequence[str] | str, what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    out = tuple(normalize_dtype(v, what=what) for v in values)
    if not out:
        raise ValueError(f"{what}: give at least one dtype")
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: repeated dtype in {values!r}")
    return out


def head_matrix(model: str | os.PathLike, prompts: Sequence, sampling: SamplingSettings | None = None, *,
                rollout_head: Sequence[str] = DEFAULT_HEADS, trainer_head: Sequence[str] = DEFAULT_HEADS,
                dtype: str = "bfloat16", device: str = "cpu", engine: EngineSettings | None = None,
                pool=None, scorers: Mapping[str, Any] | None = None, batch_size: int = 16,
                progress: bool = False) -> dict[str, xr.Dataset]:
    """Capture prompts once per rollout head dtype and rescore each rollout once per trainer head dtype.

    Engines come from ``pool``, one per rollout head dtype; the last one stays live in the pool
    (close it when done). ``logprobs_mode`` is always ``processed_logprobs``.

    Parameters
    ----------
    model : str or os.PathLike
        The model both sides load.
    prompts : sequence
        The prompts (at least one).
    sampling : SamplingSettings, optional
        The same in every cell; ``None`` means temperature 0.7, top-k 20, 24 tokens, seed 0
        (request i uses seed i).
    rollout_head : sequence of str, default DEFAULT_HEADS
        The engine's LM-head dtypes (distinct).
    trainer_head : sequence of str, default DEFAULT_HEADS
        The trainer's LM-head dtypes (distinct).
    dtype : str, default "bfloat16"
        Pins the body precision on both sides (engine ``dtype`` and ``Scorer(dtype=...)``), so
        only the head differs between cells.
    device : str, default "cpu"
        The trainer's device (``cpu``, ``cuda``); vLLM picks its platform itself.
    engine : EngineSettings, optional
        Other engine settings; ``None`` means ``EngineSettings()``.
    pool : EnginePool, optional
        Where engines come from; ``None`` means the shared pool.
    scorers : Mapping of str to Scorer, optional
        Ready :class:`rlparity.score.Scorer` objects by trainer head dtype (their body dtype must
        equal ``dtype``); the missing ones are built.
    batch_size : int, default 16
        The batch size of the scorers built here.
    progress : bool, default False
        Show progress bars.

    Returns
    -------
    dict of str to xarray.Dataset
        ``{arm_name(r, t): scored trace}`` with factors ``rollout_head`` and ``trainer_head``.

    Raises
    ------
    ValueError
        If a dtype is unknown or repeated, no prompt is given, or a given scorer has other dtypes.
    RuntimeError
        If the engine reports another head or body dtype than asked.
    """
    from rlparity.capture.pool import shared_pool
    from rlparity.score import Scorer

    rollout_head = _check_dtypes(rollout_head, "rollout head dtype")
    trainer_head = _check_dtypes(trainer_head, "trainer head dtype")
    dtype = normalize_dtype(dtype, what="body dtype")
    if not len(prompts):
        raise ValueError("head_matrix needs at least one prompt")
    sampling = sampling or default_sampling()
    base = engine or EngineSettings()
    pool = pool or shared_pool()
    scorers = dict(scorers or {})
    for th in trainer_head:
        sc = scorers.get(th)
        if sc is None:
            scorers[th] = Scorer(model, dtype=dtype, head_dtype=th, device=device,
                                 batch_size=batch_size, progress=progress)
        elif (sc.dtype, sc.head_dtype) != (dtype, th):
            raise ValueError(f"scorer for trainer head {th} has dtype={sc.dtype}, "
                             f"head_dtype={sc.head_dtype}; expected {dtype}/{th}")
    arms: dict[str, xr.Dataset] = {}
    for rh in rollout_head:
        settings = base.replace(logprobs_mode="processed_logprobs", head_dtype=rh, dtype=dtype)
        eng = pool.get(model, settings)
        rollout = eng.capture(list(prompts), sampling, arm=f"rollout-{rh}", progress=progress)
        eff = arm_record(rollout).effective
        if eff.head_dtype not in (None, rh) or eff.dtype not in (None, dtype):
            raise RuntimeError(f"asked the engine for head {rh} / body {dtype}, it reports head "
                               f"{eff.head_dtype} / body {eff.dtype}")
        for th in trainer_head:
            sc = scorers[th]
            scored = sc.score(rollout)
            name = arm_name(rh, th)
            scored.attrs["arm"] = name
            with_factors(scored, rollout_head=rh, trainer_head=th)
            scored.attrs["head_experiment"] = {
                "rollout_head": rh, "trainer_head": th, "body_dtype": dtype, "device": device,
                "trainer_body_dtype_effective": dtype_name(next(sc.module.parameters()).dtype),
                "trainer_head_weight_dtype": dtype_name(sc.head_weight.dtype),
            }
            arms[name] = scored
    return arms


__all__ = ["DEFAULT_HEADS", "HEAD_DTYPES", "head_matrix"]
