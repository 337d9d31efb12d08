"""The mixture-of-experts experiment: router agreement between the rollout engine and the trainer,
and routing replay, on real engines.

One capture per engine setting (real vLLM, the engine's routes recorded: ``capture_routing=True``),
rescored by a real transformers trainer that records its own routers and, with the engine's routes
forced (routing replay, R3), rescores again (``routing_replay="also"``). Arms:

* ``moe``: both sides as configured (``dtype``), nothing injected;
* one arm per router fault of :data:`rlparity.experiments.faults.FAULTS` asked for (default
  ``trainer_bf16_router``: the same capture, the trainer's routers in bfloat16), ground truth in
  ``attrs["faults"]`` as in the fault matrix;
* ``dense``: a dense model under the same engine settings (``capture_routing=True`` captures nothing
  there), the comparison the diagnosis must stay quiet on.

The numbers are in :mod:`rlparity.metrics.routing` (per-layer agreement, flips, mismatch of flipped
vs unflipped tokens, replay ratio); the finding in :mod:`rlparity.diagnose.routing`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import xarray as xr
from pydantic import BaseModel, ConfigDict, Field

from rlparity.config.logs import progress_log
from rlparity.config.profiles import reference_engine
from rlparity.config.settings import Device, EngineSettings, SamplingSettings, TrainerSettings
from rlparity.experiments.faults.recipes import FAULTS, compose
from rlparity.trace import arm_record

MOE_ARM = "moe"
DENSE_ARM = "dense"


class MoESettings(BaseModel):
    """Sizes and knobs of the MoE experiment (defaults: CPU CI on ``tiny-moe``).

    Parameters
    ----------
    n_prompts : int, default 16
        Prompts (the built-in task's).
    max_tokens : int, default 24
        Tokens per request.
    temperature : float, default 0.7
        The sampling temperature (> 0).
    top_k : int, default 20
        The sampling top-k (0 = off).
    seed : int, default 0
        Seeds the prompts and the requests.
    dtype : str, default "float32"
        The body dtype on both sides.
    device : str, default "cpu"
        The trainer's device (``cuda...`` also selects the GPU faults).
    batch_size : int, default 16
        The trainer's batch size.
    faults : tuple of str, default ("trainer_bf16_router",)
        Router faults of :data:`rlparity.experiments.faults.FAULTS`, one arm each.
    replay : bool, default True
        Rescore with the engine's routes forced (``trainer_replay_*`` readings).
    engine : dict, optional
        Other :class:`~rlparity.config.settings.EngineSettings` fields for every engine.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_prompts: int = Field(16, ge=1)
    max_tokens: int = Field(24, ge=1)
    temperature: float = Field(0.7, gt=0.0)
    top_k: int = Field(20, ge=0)
    seed: int = 0
    dtype: str = Field("float32", description="body dtype on both sides")
    device: Device = "cpu"
    batch_size: int = 16
    faults: tuple[str, ...] = Field(("trainer_bf16_router",), description="router faults, one arm each")
    replay: bool = Field(True, description="rescore with the engine's routes forced (trainer_replay_* readings)")
    engine: dict[str, Any] = Field(default_factory=dict, description="other EngineSettings fields for every engine")


def engine_settings(s: MoESettings, **changes: Any) -> EngineSettings:
    r"""The engine settings of every arm.

    Processed logprobs, float32 heads, no prefix cache (every prompt token computed, so every route
    recorded), routes captured.

    Parameters
    ----------
    s : MoESettings
        The experiment's settings (``dtype`` and ``engine`` are applied).
    \*\*changes
        Further :class:`~rlparity.config.settings.EngineSettings` fields (a fault's engine recipe), applied last.

    Returns
    -------
    EngineSettings
        The settings.
    """
    base = {"dtype": s.dtype, "enable_prefix_caching": False, "capture_routing": True}
    return reference_engine(**{**base, **s.engine, **changes})


def moe_run(model: str | os.PathLike, dense: str | os.PathLike | None = None, settings: MoESettings | None = None,
            *, pool=None, log: Callable[[str], None] = progress_log) -> dict[str, xr.Dataset]:
    """Capture and score every arm (see the module docstring); return ``{arm: scored trace}``.

    Engines come from ``pool``, one per engine setting.

    Parameters
    ----------
    model : str or os.PathLike
        The mixture-of-experts model.
    dense : str or os.PathLike, optional
        A dense model for the ``dense`` arm; ``None``: no dense arm.
    settings : MoESettings, optional
        Sizes and knobs; ``None`` means ``MoESettings()``.
    pool : EnginePool, optional
        Where engines come from; ``None`` means the shared pool.
    log : callable, default progress_log
        Called with one line per capture and arm.

    Returns
    -------
    dict of str to xarray.Dataset
        ``moe``, ``moe+<fault>`` per fault this platform can run, and ``dense`` when given; the
        faults this platform cannot run are listed in ``attrs["moe_experiment"]["not_run"]``.

    Raises
    ------
    ValueError
        If a fault is not a router fault.
    """
    from rlparity.capture.pool import shared_pool
    from rlparity.models import make_prompts
    from rlparity.score import Scorer

    s = settings or MoESettings()
    pool = pool or shared_pool()
    platform = "cuda" if s.device.startswith("cuda") else "cpu"
    unknown = [f for f in s.faults if f not in FAULTS or not FAULTS[f].moe]
    if unknown:
        raise ValueError(f"{unknown} are not router faults; choose among "
                         f"{[k for k, f in FAULTS.items() if f.moe]}")
    plans = [compose(())] + [compose((f,)) for f in s.faults if platform in FAULTS[f].platforms]
    not_run = {f: FAULTS[f].not_on for f in s.faults if platform not in FAULTS[f].platforms}
    prompts = make_prompts(s.n_prompts, seed=s.seed)
    sampling = SamplingSettings(temperature=s.temperature, top_k=s.top_k, max_tokens=s.max_tokens, seed=s.seed)
    out: dict[str, xr.Dataset] = {}
    captures: dict[str, xr.Dataset] = {}
    replay = "also" if s.replay else "off"
    for p in plans:
        key = p.engine_key()
        if key not in captures:
            t0 = time.perf_counter()
            eng = pool.get(str(model), engine_settings(s, **p.engine))
            captures[key] = eng.capture(prompts, sampling, arm=MOE_ARM, progress=False)
            log(f"captured {p.engine or 'base'} in {time.perf_counter() - t0:.1f} s "
                f"({(arm_record(captures[key]).routing_capture or {}).get('method')})")
        trainer = TrainerSettings(**{**p.trainer, "routing_replay": replay})
        scorer = Scorer(str(model), dtype=s.dtype, head_dtype="float32", device=s.device, batch_size=s.batch_size,
                        progress=False, settings=trainer)
        arm = MOE_ARM if not p.causes else f"{MOE_ARM}+{p.arm}"
        scored = scorer.score(captures[key])
        scored.attrs.update({"arm": arm, "faults": {"causes": list(p.causes), "recipe": p.model_dump(),
                                                    "platform": platform},
                             "moe_experiment": {**s.model_dump(), "not_run": not_run}})
        out[arm] = scored
        log(f"  {arm}: scored")
    if dense is not None:
        out[DENSE_ARM] = dense_arm(dense, s, pool=pool)
        log(f"  {DENSE_ARM}: scored")
    return out


def dense_arm(dense: str | os.PathLike, settings: MoESettings | None = None, *, pool=None) -> xr.Dataset:
    """The dense comparison: a dense model captured and scored under the MoE arms' settings.

    ``capture_routing=True`` captures nothing on a dense model.

    Parameters
    ----------
    dense : str or os.PathLike
        The dense model.
    settings : MoESettings, optional
        ``None`` means ``MoESettings()``.
    pool : EnginePool, optional
        Where the engine comes from; ``None`` means the shared pool.

    Returns
    -------
    xarray.Dataset
        The scored trace, arm ``dense``.
    """
    from rlparity.capture.pool import shared_pool
    from rlparity.models import make_prompts
    from rlparity.score import Scorer

    s = settings or MoESettings()
    pool = pool or shared_pool()
    sampling = SamplingSettings(temperature=s.temperature, top_k=s.top_k, max_tokens=s.max_tokens, seed=s.seed)
    cap = pool.get(str(dense), engine_settings(s)).capture(make_prompts(s.n_prompts, seed=s.seed), sampling,
                                                          arm=DENSE_ARM, progress=False)
    scored = Scorer(str(dense), dtype=s.dtype, head_dtype="float32", device=s.device, batch_size=s.batch_size,
                    progress=False).score(cap)
    platform = "cuda" if s.device.startswith("cuda") else "cpu"
    scored.attrs.update({"arm": DENSE_ARM, "faults": {"causes": [], "platform": platform},
                         "moe_experiment": s.model_dump()})
    return scored


__all__ = ["DENSE_ARM", "MOE_ARM", "MoESettings", "dense_arm", "engine_settings", "moe_run"]
