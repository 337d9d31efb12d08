"""The RL runner: :func:`rl_run` starts one engine per profile and runs each ratio denominator's
steps on it (rollout, pi_old per version, one optimizer step, the weights pushed into the running
engine); see :mod:`rlparity.experiments.rl` for the loop."""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.config.logs import progress_log
from rlparity.config.settings import EngineSettings, SamplingSettings, with_overrides
from rlparity.experiments.rl_profiles import (
    OLD_POLICIES,
    _profile_name,
    rl_profile,
    run_name,
    step_prompts,
    step_sampling,
)
from rlparity.metrics.rl import step_arm
from rlparity.record import Recorder, StepRecord
from rlparity.trace import with_factors

MIDRUN_FAULTS = ("raw_logprobs",)  # the faults the runner can switch on at a step of a running engine
TRAINER_HEAD = "float32"  # the trainer's LM-head precision (recorded in the run store: the doctor's baseline key)


@dataclass(frozen=True)
class RLRunSettings:
    """The settings of :func:`rl_run`, one place for their defaults.

    ``None`` is ``rlparity.config.defaults().rl``'s value (``seed``: ``defaults().seed``), read
    when the run starts (:meth:`resolved`).

    Parameters
    ----------
    steps : int, optional
        Optimizer steps per run (>= 1).
    loss : str, optional
        The loss: ``"gspo"``, ``"ppo"`` or ``"grpo"``.
    old_policy : str or sequence of str, optional
        The denominator of the loss's ratio: one of ``"pi_old"`` (the trainer's recomputed reading)
        and ``"mu"`` (the engine's logprobs), or several, one run each.
    n_prompts : int, optional
        Prompts per step (>= 1).
    n_samples : int, optional
        Samples per prompt (>= 2: the advantage is normalised over them).
    max_tokens : int, optional
        Tokens per sample (>= 1).
    lr : float, optional
        The AdamW learning rate.
    seed : int, optional
        Fixes the prompts and sampling seeds of every step, the same for every run.
    dtype : str, optional
        The body dtype pinned on both sides.
    pause_mode : str, optional
        The pause mode of the weight updates.
    clear_cache : bool, optional
        Whether the updates reset the prefix cache.
    async_rollouts : bool, default False
        Sample step k+1's rollouts while step k trains (one step of lag).
    device : str, default "cpu"
        The trainer's device.
    batch_size : int, default 64
        The trainer's batch size.
    fault : {"raw_logprobs"}, optional
        A fault planted from step ``fault_from_step`` on (the ground truth of the doctor's
        mid-run test, in ``attrs["rl"]["fault"]``): ``raw_logprobs`` switches the running engine
        to report raw logprobs (:meth:`rlparity.capture.AsyncEngine.set_logprobs_mode`) before that
        step's rollouts are submitted, on a profile that reports processed ones; each run starts
        with the profile's own mode.
    fault_from_step : int, optional
        The first step with the fault (0 <= N < steps); required with ``fault``.
    """

    steps: int | None = None
    loss: str | None = None
    old_policy: str | Sequence[str] | None = None
    n_prompts: int | None = None
    n_samples: int | None = None
    max_tokens: int | None = None
    lr: float | None = None
    seed: int | None = None
    dtype: str | None = None
    pause_mode: str | None = None
    clear_cache: bool | None = None
    async_rollouts: bool = False
    device: str = "cpu"
    batch_size: int = 64
    fault: str | None = None
    fault_from_step: int | None = None

    def resolved(self) -> RLRunSettings:
        """Every ``None`` filled in from the defaults, numbers as numbers, ``old_policy`` a tuple.

        Returns
        -------
        RLRunSettings
            The resolved settings.

        Raises
        ------
        ValueError
            If a value is out of range (the message says what to give): an unknown or repeated
            ``old_policy``, an unknown loss, ``steps``, ``n_prompts`` or ``max_tokens`` below 1,
            ``n_samples`` below 2, an unknown ``fault`` or a ``fault_from_step`` missing or outside
            the run.
        """
        from rlparity.train import LOSSES

        d = defaults().rl
        steps = d.steps if self.steps is None else int(self.steps)
        loss = self.loss or d.loss
        old_policy = self.old_policy
        olds = list(d.old_policy if old_policy is None else [old_policy] if isinstance(old_policy, str) else old_policy)
        bad = [o for o in olds if o not in OLD_POLICIES]
        if bad or not olds or len(set(olds)) != len(olds):
            raise ValueError(f"old_policy={old_policy!r}; use 'pi_old' (recomputed by the trainer), 'mu' (the "
                             "engine's logprobs, PipelineRL) or both, each once")
        n_prompts = d.n_prompts if self.n_prompts is None else int(self.n_prompts)
        n_samples = d.n_samples if self.n_samples is None else int(self.n_samples)
        max_tokens = d.max_tokens if self.max_tokens is None else int(self.max_tokens)
        lr = d.lr if self.lr is None else float(self.lr)
        seed = defaults().seed if self.seed is None else int(self.seed)
        dtype = self.dtype or d.dtype
        pause_mode = self.pause_mode or d.pause_mode
        clear_cache = d.clear_cache if self.clear_cache is None else bool(self.clear_cache)
        if loss not in LOSSES:
            raise ValueError(f"loss={loss!r}; use one of {', '.join(LOSSES)}")
        if steps < 1 or n_prompts < 1 or max_tokens < 1:
            raise ValueError(f"steps={steps}, n_prompts={n_prompts}, max_tokens={max_tokens}: each must be >= 1")
        if n_samples < 2:
            raise ValueError(f"n_samples={n_samples}: the advantage is normalised over each prompt's samples, "
                             "so take at least 2")
        fault, from_step = self.fault, self.fault_from_step
        if fault is not None and fault not in MIDRUN_FAULTS:
            raise ValueError(f"fault={fault!r}; the runner plants one of {', '.join(MIDRUN_FAULTS)} mid-run")
        if (fault is None) != (from_step is None) or (from_step is not None and not 0 <= int(from_step) < steps):
            raise ValueError(f"fault={fault!r}, fault_from_step={from_step!r}: give both, with 0 <= fault_from_step "
                             f"< steps ({steps}), or neither")
        return RLRunSettings(steps=steps, loss=loss, old_policy=tuple(olds), n_prompts=n_prompts, n_samples=n_samples,
                             max_tokens=max_tokens, lr=lr, seed=seed, dtype=dtype, pause_mode=pause_mode,
                             clear_cache=clear_cache, async_rollouts=self.async_rollouts, device=self.device,
                             batch_size=self.batch_size, fault=fault,
                             fault_from_step=None if from_step is None else int(from_step))



def _run_steps(eng, model: str, name: str, index: int, *, profile: str, old_policy: str, settings: RLRunSettings,
               sampling: SamplingSettings | None, ckpt: Path, bar, recorder: Recorder | None = None
               ) -> dict[str, xr.Dataset]:
    """The steps of one run on its profile's running engine (at version 0, the initial weights),
    with a fresh trainer and optimizer; returns ``{arm: trace}``. ``settings``: resolved
    (:meth:`RLRunSettings.resolved`). With a ``recorder``, every step is recorded through it, as a
    user's loop records (:meth:`rlparity.record.Recorder.step`)."""
    import torch

    from rlparity.capture.checkpoints import write_state_dict
    from rlparity.config.provenance import jsonable
    from rlparity.score import Scorer, score_versions
    from rlparity.train import arithmetic_reward, train_step

    s = settings
    steps, loss, n_prompts, n_samples, max_tokens, lr = s.steps, s.loss, s.n_prompts, s.n_samples, s.max_tokens, s.lr
    dtype, pause_mode, clear_cache, seed = s.dtype, s.pause_mode, s.clear_cache, s.seed
    async_rollouts, device, batch_size = s.async_rollouts, s.device, s.batch_size
    trainer = Scorer(model, dtype=dtype, head_dtype=TRAINER_HEAD, device=device, batch_size=batch_size,
                     progress=False)
    module = trainer.module
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    out: dict[str, xr.Dataset] = {}
    previous: Any = None  # the trainer's weights of the version before (async: to score lagged tokens)
    pending = None

    def submit(k: int):
        if s.fault == "raw_logprobs" and k == s.fault_from_step:  # nothing in flight: every token from k on
            eng.set_logprobs_mode("raw_logprobs")
        return eng.capture_async(step_prompts(k, n_prompts, seed),
                                 step_sampling(k, n_prompts, n_samples, max_tokens, seed, sampling),
                                 arm=step_arm(name, k))

    for k in range(steps):
        t_step = time.perf_counter()
        arm = step_arm(name, k)
        if pending is None:
            pending = submit(k)
        trace = pending.result(timeout=1800)
        pending = None
        t_have = time.perf_counter()
        if async_rollouts and k + 1 < steps:
            pending = submit(k + 1)  # sampled by version k while step k trains: one step of lag
        trace.attrs["latest_policy_version"] = k  # the trainer's version for this batch
        scorers = {k: trainer}
        if previous is not None:
            scorers[k - 1] = Scorer(previous, dtype=dtype, head_dtype=TRAINER_HEAD, device=device,
                                    batch_size=batch_size, progress=False, tokenize_prompts=False)
        versions = {int(v) for v in trace["policy_version"].values[trace["response_mask"].values.astype(bool)]}
        scored = score_versions(trace, {v: s for v, s in scorers.items() if v in versions | {k}}, latest=k)
        previous = copy.deepcopy(module) if async_rollouts else None
        result = train_step(module, scored, rewards=arithmetic_reward, loss=loss, optimizer=optimizer,
                            dtype=dtype, device=device, batch_size=batch_size,
                            old_logprob=scored["rollout_logprob"].values if old_policy == "mu" else None)
        trainer.weights_changed()  # the step moved the weights it scores with: fingerprint them again
        t_trained = time.perf_counter()
        live = recorder.step(StepRecord.from_trace(result.trace, trainer=recorder.trainer_side), step=k) \
            if recorder is not None else None
        write_state_dict(module.state_dict(), ckpt)
        update = eng.update_weights(str(ckpt), k + 1, mode=pause_mode, clear_cache=clear_cache)
        t_end = time.perf_counter()
        stepped = with_factors(result.trace, profile=profile, old_policy=old_policy, step=k)
        stepped.attrs["arm"] = arm
        stepped.attrs["rl"] = jsonable({
            "run": name, "profile": profile, "profile_index": index, "step": k, "loss": loss, "lr": lr,
            "old_policy": old_policy, "async_rollouts": bool(async_rollouts), "trainer_version": k,
            "versions_sampled": sorted(versions), "pause_mode": pause_mode, "clear_cache": bool(clear_cache),
            "seed": seed, "sizes": {"n_prompts": n_prompts, "n_samples": n_samples, "max_tokens": max_tokens},
            "train_step": {kk: v for kk, v in result.metrics.items() if isinstance(v, (int, float, str, bool))},
            "update": {kk: update.get(kk) for kk in ("version_before", "version", "mode", "clear_cache", "cache_reset",
                                                     "pause_s", "tensors", "load_method", "in_flight")},
            "seconds": {"rollout": round(t_have - t_step, 4), "train": round(t_trained - t_have, 4),
                        "update": round(t_end - t_trained, 4), "wall": round(t_end - t_step, 4)},
            "engine_startup_s": eng.startup_s,
            "alarms": [str(a) for a in live.alarms] if live is not None else None,
            "fault": None if s.fault is None else {"cause": s.fault, "from_step": s.fault_from_step,
                                                   "on": k >= s.fault_from_step},
        }, strict=True)  # strict JSON in the store: a NaN or infinite step metric becomes null
        out[arm] = stepped
        if bar is not None:
            bar.set_postfix(reward=f"{result.metrics['reward_mean']:.3f}", refresh=False)
            bar.update(1)
    return out


def rl_run(model: str | os.PathLike, profiles: Sequence[str | EngineSettings] | None = None,
           steps: int | None = None, *, settings: RLRunSettings | None = None, sampling: SamplingSettings | None = None,
           engine: Mapping[str, Any] | None = None, checkpoint_dir: str | os.PathLike | None = None,
           progress: bool = False, log: Callable[[str], Any] = progress_log,
           record_dir: str | os.PathLike | None = None, **overrides: Any) -> dict[str, xr.Dataset]:
    r"""Online RL on the tiny model's arithmetic task under each profile; return every step's trace.

    Each ratio denominator is a run of its own on the profile's engine, from the initial weights
    (loaded back into the running engine, cache reset) with a fresh trainer and optimizer; with
    several, runs are named ``<profile>+<old_policy>`` (:func:`~rlparity.experiments.rl_profiles.run_name`). Starts one engine per
    profile, each closed before the next (closing the shared pool first). The run's settings are
    the fields of :class:`RLRunSettings`: give them one by one as keywords, or as
    ``settings=RLRunSettings(...)`` (keywords given beside it replace its fields).

    Parameters
    ----------
    model : str or os.PathLike
        A local checkpoint: the initial weights of every run.
    profiles : sequence of str or EngineSettings, optional
        Names (:func:`~rlparity.experiments.rl_profiles.rl_profile`) or settings; ``None`` means ``defaults().rl.profiles``.
    steps : int, optional
        Steps per run; replaces ``settings.steps`` when given.
    settings : RLRunSettings, optional
        The run's settings; ``None`` means ``RLRunSettings()`` (the defaults).
    sampling : SamplingSettings, optional
        Temperature / top-k / top-p; ``None`` means :func:`rlparity.config.default_sampling`.
    engine : Mapping, optional
        Other :class:`~rlparity.config.settings.EngineSettings` fields for every profile (e.g. ``gpu_memory_utilization``).
    checkpoint_dir : str or os.PathLike, optional
        Where each step's weights are written before the engine reads them; ``None`` means a
        temporary folder, removed at the end.
    progress : bool, default False
        One tqdm bar per run, one tick per step.
    log : callable, default progress_log
        Called with one line per engine and run.
    record_dir : str or os.PathLike, optional
        Record every run through :class:`rlparity.record.Recorder` (the recorder a user's loop
        uses), one run store ``record_dir/<run>.zarr`` each; its alarms go to ``attrs["rl"]["alarms"]``.
    \*\*overrides
        Fields of :class:`RLRunSettings` (``loss``, ``old_policy``, ``n_prompts``, ``n_samples``,
        ``max_tokens``, ``lr``, ``seed``, ``dtype``, ``pause_mode``, ``clear_cache``,
        ``async_rollouts``, ``device``, ``batch_size``, ``fault``, ``fault_from_step``).

    Returns
    -------
    dict of str to xarray.Dataset
        ``{"<run>@step_NNN": trace}`` in run order; curves: :func:`rlparity.metrics.rl.rl_curves`.

    Raises
    ------
    ValueError
        If no profile is given, a profile name repeats, or a setting is out of range
        (:meth:`RLRunSettings.resolved`).
    TypeError
        If an override is not a field of :class:`RLRunSettings`.
    """
    from rlparity.capture.async_engine import AsyncEngine
    from rlparity.capture.pool import shared_pool

    given = with_overrides(settings or RLRunSettings(), overrides, "rl_run")
    rs = (given if steps is None else dataclasses.replace(given, steps=steps)).resolved()
    profiles = list(defaults().rl.profiles if profiles is None else profiles)
    steps, olds, dtype = rs.steps, list(rs.old_policy), rs.dtype
    if not profiles:
        raise ValueError("no profiles: pass names such as ('pipelinerl-parity', 'vllm-v1-defaults')")
    names = [_profile_name(p, i) for i, p in enumerate(profiles)]
    if len(set(names)) != len(names):
        raise ValueError(f"profiles {names} repeat a name: each profile runs once")
    engines = {n: rl_profile(p).replace(dtype=dtype, **dict(engine or {})) for n, p in zip(names, profiles)}
    several = len(olds) > 1
    if rs.fault == "raw_logprobs":
        raw = [n for n in names if engines[n].logprobs_mode != "processed_logprobs"]
        if raw:
            raise ValueError(f"fault='raw_logprobs' on {', '.join(raw)}, whose engine does not report processed "
                             "logprobs: plant it on a parity profile (e.g. 'pipelinerl-parity')")
    for n in names:
        step_arm(run_name(n, olds[-1], several), 0)  # names must make valid arm names, before any engine starts
    model = str(model)
    tmp = None
    if checkpoint_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="rlparity-rl-"))
        root = tmp
    else:
        root = Path(checkpoint_dir)
    shared_pool().close()
    arms: dict[str, xr.Dataset] = {}
    try:
        for i, name in enumerate(names):
            t0 = time.perf_counter()
            with AsyncEngine(model, engines[name]) as eng:
                log(f"{name}: engine started in {eng.startup_s:.1f} s ({time.perf_counter() - t0:.1f} s "
                    "with the wait for the engine lock)")
                for j, op in enumerate(olds):
                    run = run_name(name, op, several)
                    if j:  # back to the initial weights, version 0, with a fresh prefix cache
                        eng.update_weights(model, 0, mode="wait", clear_cache=True)
                    bar = None
                    if progress:
                        from tqdm.auto import tqdm

                        bar = tqdm(total=steps, desc=run, unit="step", leave=True)
                    t_run = time.perf_counter()
                    recorder = None if record_dir is None else Recorder(
                        Path(record_dir) / f"{run}.zarr", model=model, engine=engines[name].model_dump(mode="json"),
                        attrs={"rl_run": run, "profile": name, "old_policy": op,
                               "trainer": {"library": "transformers", "dtype": dtype, "head_dtype": TRAINER_HEAD,
                                           "device": rs.device}})
                    if j and rs.fault == "raw_logprobs":  # the run before switched it
                        eng.set_logprobs_mode(engines[name].logprobs_mode)
                    try:
                        arms.update(_run_steps(eng, model, run, i * len(olds) + j, profile=name, old_policy=op,
                                               settings=rs, sampling=sampling, ckpt=root / run, bar=bar,
                                               recorder=recorder))
                    finally:
                        if bar is not None:
                            bar.close()
                        if recorder is not None:
                            recorder.close()
                    log(f"{run}: {steps} steps in {time.perf_counter() - t_run:.1f} s")
                t_close = time.perf_counter()
            log(f"{name}: engine closed in {time.perf_counter() - t_close:.1f} s; {time.perf_counter() - t0:.1f} s "
                "in all")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return arms
