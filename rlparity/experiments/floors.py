"""Floors: what parity can be on this hardware.

:func:`floor_run` captures prompts once with a real vLLM engine, measures the engine's own batch
spread (:func:`rlparity.capture.floor.engine_floor`), and rescores the same tokens under the trainer
shapes real trainers use (:data:`SHAPES`: batch 1 / 16 / 64, packed rows, shuffled micro-batches,
train mode, eager attention, gradient checkpointing, and rlparity's batch-invariant mode). Every arm
is the same rollout with the trainer side of one shape; :func:`rlparity.metrics.floors.floor_table`
puts each shape's floor beside the backend gap, and the diagnosis reads the floors of every arm
(``trainer_not_batch_invariant``, ``engine_not_batch_invariant``).

From a shell: ``rlparity floor MODEL`` (or ``rlparity experiment floors --out DIR``; on a GPU
host ``--device cuda --dtype bfloat16``, with ``--shape 1.5b`` for a random model of Qwen2-1.5B's
shape built on the device).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import xarray as xr

from rlparity.config.logs import progress_log
from rlparity.config.profiles import reference_engine
from rlparity.config.settings import EngineSettings, SamplingSettings, TrainerSettings

# name -> Scorer batch size and TrainerSettings fields
SHAPES: dict[str, dict[str, Any]] = {
    "batch1": {"batch_size": 1},
    "batch16": {"batch_size": 16},
    "batch64": {"batch_size": 64},
    "packed16": {"batch_size": 16, "layout": "packed"},
    "shuffled16": {"batch_size": 16, "order": "shuffled"},
    "train16": {"batch_size": 16, "train_mode": True},
    "eager16": {"batch_size": 16, "attn_implementation": "eager"},
    "checkpointing16": {"batch_size": 16, "gradient_checkpointing": True},
    "batch_invariant": {"batch_invariant": True},
    # the same mode with the sequences in another order: its floor against batch_invariant is the
    # mode's own (0 when the kernels are deterministic at a fixed shape)
    "batch_invariant_shuffled": {"batch_invariant": True, "order": "shuffled"},
}
REFERENCE = "batch1"


def scorer_for(model: str, shape: Mapping[str, Any], *, dtype: str, device: str, head_dtype: str = "float32"):
    """The :class:`~rlparity.score.Scorer` of one trainer shape.

    Parameters
    ----------
    model : str
        The model.
    shape : Mapping
        An entry of :data:`SHAPES`: ``batch_size`` (default 16) and :class:`~rlparity.config.settings.TrainerSettings` fields.
    dtype : str
        The trainer's body dtype.
    device : str
        The trainer's device.
    head_dtype : str, default "float32"
        The trainer's LM-head dtype.

    Returns
    -------
    rlparity.score.Scorer
        A scorer without progress bars.
    """
    from rlparity.score import Scorer

    spec = dict(shape)
    batch = spec.pop("batch_size", 16)
    return Scorer(model, dtype=dtype, head_dtype=head_dtype, device=device, batch_size=batch, progress=False,
                  settings=TrainerSettings(**spec))


def floor_run(model: str | os.PathLike, prompts: Sequence, sampling: SamplingSettings | None = None, *,
              shapes: Mapping[str, Mapping[str, Any]] | None = None, engine: EngineSettings | None = None,
              dtype: str = "float32", device: str = "cpu", probe: int = 4,
              log: Callable[[str], None] = progress_log) -> dict[str, xr.Dataset]:
    """Capture prompts once and rescore the rollout under every trainer shape.

    The capture runs an offline engine (processed logprobs, fp32 head, the body in ``dtype``); the
    engine's batch spread is probed on the first ``probe`` prompts
    (:func:`rlparity.capture.floor.engine_floor`).

    Parameters
    ----------
    model : str or os.PathLike
        The model both sides load.
    prompts : sequence
        The prompts.
    sampling : SamplingSettings, optional
        ``None`` means temperature 0.7, top-k 20, 32 tokens, seed 0.
    shapes : Mapping, optional
        ``{name: shape}``; ``None`` means :data:`SHAPES`.
    engine : EngineSettings, optional
        ``None`` means processed logprobs, fp32 head, body in ``dtype``, the vLLM generation
        config, no prefix caching.
    dtype : str, default "float32"
        The body dtype of the engine (by default) and of every trainer shape.
    device : str, default "cpu"
        The trainer's device.
    probe : int, default 4
        Prompts sampled again alone for the engine's batch spread.
    log : callable, default progress_log
        Called with one line per step.

    Returns
    -------
    dict of str to xarray.Dataset
        ``{shape: scored trace}``, the engine floor in every arm's ``attrs["engine_floor"]``.
    """
    from rlparity.capture import Engine
    from rlparity.capture.floor import engine_floor
    from rlparity.capture.pool import shared_pool

    shapes = dict(shapes or SHAPES)
    sampling = sampling or SamplingSettings(temperature=0.7, top_k=20, max_tokens=32, seed=0)
    settings = engine or reference_engine(dtype=dtype, enable_prefix_caching=False)
    shared_pool().close()
    with Engine(str(model), settings) as eng:
        rollout = eng.capture(list(prompts), sampling, arm="floors", progress=False)
        floor = engine_floor(eng, list(prompts)[:probe], sampling, rollout)
        log(f"captured {rollout.sizes['sequence']} sequences; engine batch spread "
            f"{floor['batch_shape']['mean_abs']:.3g} nats mean |x|")
    rollout.attrs["engine_floor"] = floor
    arms = {}
    for name, shape in shapes.items():
        t0 = time.perf_counter()
        scored = scorer_for(str(model), shape, dtype=dtype, device=device).score(rollout)
        scored.attrs.update({"arm": name, "floor_shape": name})
        arms[name] = scored
        log(f"  {name}: scored in {time.perf_counter() - t0:.2f} s")
    return arms


__all__ = ["REFERENCE", "SHAPES", "floor_run", "scorer_for"]
