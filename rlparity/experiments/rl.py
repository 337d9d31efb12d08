"""A small online RL run per engine profile: what a backend mismatch does to the curves of a run.

Per profile, :func:`rl_run` starts one real ``AsyncLLM`` (:class:`rlparity.capture.AsyncEngine`)
under that profile and one trainer (transformers, fp32 LM head, AdamW) from the same initial
weights, then loops, for ``steps`` steps:

1. **rollout**: ``n_prompts`` arithmetic prompts x ``n_samples`` samples; the prompts and seeds
   of step k are the same for every profile (:func:`step_prompts`, :func:`step_sampling`);
2. **pi_old**: the trainer's in-memory model rescores every token with the weights that sampled
   it (:func:`rlparity.score.score_versions`; no reload from disk) and with its current weights
   (``trainer_latest_*``: what a trainer that ignores versions sees);
3. **step**: one optimizer step with the objective layer's code (:func:`rlparity.train.train_step`,
   reward :func:`rlparity.train.arithmetic_reward`, advantages normalised over each prompt's
   samples); the optimizer state persists across steps;
4. **update**: the new weights are saved as safetensors and pushed into the running engine with
   the inflight path (:meth:`rlparity.capture.AsyncEngine.update_weights`: pause ``mode`` (keep),
   load through the worker extension, optionally reset the prefix cache, set the policy version
   k+1, resume). Tokens carry the version that sampled them.

Asynchrony (``async_rollouts=True``, PipelineRL-style, one step of lag): the rollouts of step k+1
are started with :meth:`~rlparity.capture.AsyncEngine.capture_async` *before* step k trains, so
the engine samples them with the weights of version k while the trainer computes version k+1; the
update is pushed while they may still be in flight (``keep``: they resume on the new weights;
their tokens carry both versions). Step k+1 then trains on a batch sampled (mostly) by version
k: lag 1. To score those tokens at their own version, the trainer keeps a copy of its weights of
the previous version for one step.

Profiles (:data:`RL_PROFILES`): ``pipelinerl-parity``, ``vllm-v1-defaults`` (raw logprobs, prefix
caching and async scheduling on) and ``parity-bf16-head`` (the parity profile with the rollout LM
head in bf16). The body dtype is pinned to the trainer's on every profile (``dtype``), so the
profiles differ in what they name. One engine runs at a time (each is closed before the next
profile starts).

The loss's ratio denominator (``old_policy``): ``"pi_old"``, the trainer's own reading recomputed
at the sampling weights (verl, slime: the backend mismatch never reaches the update), or ``"mu"``,
the engine's logprobs as they came (PipelineRL, prime-rl: the mismatch enters the clip). Several
denominators run one after the other on each profile's engine, each from the initial weights
(loaded back into the running engine, the prefix cache reset) with a fresh trainer and optimizer;
their runs are named ``<profile>+<old_policy>``.

:func:`rl_run` returns ``{"<run>@step_NNN": trace}`` (labels by :func:`rlparity.metrics.rl.step_arm`;
factors ``profile``, ``old_policy``, ``step`` in each trace's attrs),
each trace scored (pi_old per version, pi_theta, ``reward``, ``advantage``) with what the runner
did and its timings in ``attrs["rl"]``. The curves are computed from those traces by
:func:`rlparity.metrics.rl.rl_curves`, drawn by :func:`rlparity.plot.rl.plot_rl_curves`.

From a shell (one call on a GPU host with ``RLPARITY_ENGINE_LOCK=off``)::

    rlparity experiment rl --out DIR [--device cuda] [--steps N] [--async-rollouts] [--flat]

writes ``DIR/rl.json`` (the curves and the contrast with the parity profile; first), then
``DIR/rl.zarr`` (every step's trace) and the same store as flat files, ``DIR/rl.zarr.tar.gz`` (or
``.part00``, ``.part01``... of at most 15 MiB: :func:`pack`), then the findings of every run's first
step (added to ``rl.json``) and ``DIR/rl_curves.csv``; nothing outside ``DIR`` but a temporary
checkpoint folder, removed at the end.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.config.defaults import RLDefaults, default_sampling, defaults
from rlparity.config.settings import EngineSettings, SamplingSettings
from rlparity.metrics.rl import step_arm
from rlparity.trace import with_factors

# derived profiles: name -> (built-in profile, changes)
DERIVED_PROFILES: dict[str, tuple[str, dict[str, Any]]] = {
    "parity-bf16-head": ("pipelinerl-parity", {"head_dtype": "bfloat16"}),
}
RL_PROFILES = tuple(RLDefaults().profiles)  # the built-in ones (RLPARITY_DEFAULTS is read when a run starts)


def rl_profile(name: str | EngineSettings) -> EngineSettings:
    """The :class:`EngineSettings` of a profile of the run: a built-in name or YAML path
    (:func:`rlparity.config.load_profile`), or a derived one of :data:`DERIVED_PROFILES`
    (``parity-bf16-head`` = ``pipelinerl-parity`` with ``head_dtype="bfloat16"``)."""
    from rlparity.config.profiles import load_profile

    if isinstance(name, EngineSettings):
        return name
    if name in DERIVED_PROFILES:
        base, changes = DERIVED_PROFILES[name]
        return load_profile(base).replace(**changes)
    try:
        return load_profile(name)
    except ValueError as err:
        raise ValueError(f"{err}; derived profiles of the RL run: {', '.join(DERIVED_PROFILES)}") from None


def step_prompts(step: int, n_prompts: int, seed: int = 0) -> list[str]:
    """The prompts of step ``step``: :func:`rlparity.models.make_prompts` with seed
    ``seed * 100_003 + step``, the same for every profile."""
    from rlparity.models import make_prompts

    return make_prompts(n_prompts, seed=seed * 100_003 + step)


def step_sampling(step: int, n_prompts: int, n_samples: int, max_tokens: int, seed: int = 0,
                  sampling: SamplingSettings | None = None) -> SamplingSettings:
    """The sampling of step ``step``: ``sampling`` (default :func:`rlparity.config.default_sampling`)
    with ``n = n_samples``, ``max_tokens`` and base seed ``seed + step * n_prompts`` (request i of the
    step uses base + i: no two requests of a run share a seed)."""
    base = sampling or default_sampling()
    return base.model_copy(update={"n": int(n_samples), "max_tokens": int(max_tokens),
                                   "seed": int(seed) + int(step) * int(n_prompts)})


OLD_POLICIES = ("pi_old", "mu")


def _profile_name(p: str | EngineSettings, i: int) -> str:
    return p if isinstance(p, str) else f"profile_{i}"


def run_name(profile: str, old_policy: str, several: bool) -> str:
    """The name of one run in the curves and the store: the profile's name, or
    ``<profile>+<old_policy>`` when one call runs several ratio denominators (``vllm-v1-defaults+mu``)."""
    return f"{profile}+{old_policy}" if several else profile


def _run_steps(eng, model: str, name: str, index: int, *, profile: str, steps: int, loss: str, old_policy: str,
               n_prompts: int, n_samples: int, max_tokens: int, lr: float, async_rollouts: bool, device: str,
               seed: int, dtype: str, sampling: SamplingSettings | None, pause_mode: str, clear_cache: bool,
               ckpt: Path, batch_size: int, bar) -> dict[str, xr.Dataset]:
    """The steps of one run on its profile's running engine (at version 0, the initial weights),
    with a fresh trainer and optimizer; returns ``{arm: trace}``."""
    import torch

    from rlparity.capture.weights import write_state_dict
    from rlparity.config.provenance import jsonable
    from rlparity.score import Scorer, score_versions
    from rlparity.train import arithmetic_reward, train_step

    trainer = Scorer(model, dtype=dtype, head_dtype="float32", device=device, batch_size=batch_size,
                     progress=False)
    module = trainer.module
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    out: dict[str, xr.Dataset] = {}
    previous: Any = None  # the trainer's weights of the version before (async: to score lagged tokens)
    pending = None

    def submit(k: int):
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
            scorers[k - 1] = Scorer(previous, dtype=dtype, head_dtype="float32", device=device,
                                    batch_size=batch_size, progress=False, tokenize_prompts=False)
        versions = {int(v) for v in trace["policy_version"].values[trace["response_mask"].values.astype(bool)]}
        scored = score_versions(trace, {v: s for v, s in scorers.items() if v in versions | {k}}, latest=k)
        previous = copy.deepcopy(module) if async_rollouts else None
        result = train_step(module, scored, rewards=arithmetic_reward, loss=loss, optimizer=optimizer,
                            dtype=dtype, device=device, batch_size=batch_size,
                            old_logprob=scored["rollout_logprob"].values if old_policy == "mu" else None)
        t_trained = time.perf_counter()
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
        }, strict=True)  # strict JSON in the store: a NaN or infinite step metric becomes null
        out[arm] = stepped
        if bar is not None:
            bar.set_postfix(reward=f"{result.metrics['reward_mean']:.3f}", refresh=False)
            bar.update(1)
    return out


def rl_run(model: str | os.PathLike, profiles: Sequence[str | EngineSettings] | None = None,
           steps: int | None = None, *, loss: str | None = None, old_policy: str | Sequence[str] | None = None,
           n_prompts: int | None = None, n_samples: int | None = None, max_tokens: int | None = None,
           lr: float | None = None, async_rollouts: bool = False, device: str = "cpu", seed: int | None = None,
           dtype: str | None = None, sampling: SamplingSettings | None = None, pause_mode: str | None = None,
           clear_cache: bool | None = None, engine: Mapping[str, Any] | None = None,
           checkpoint_dir: str | os.PathLike | None = None, batch_size: int = 64, progress: bool = False,
           log: Callable[[str], Any] = print) -> dict[str, xr.Dataset]:
    """Online RL on the tiny model's arithmetic task under each profile; return every step's trace.

    ``model``: a local checkpoint (the initial weights of every run). ``profiles``: names
    (:func:`rl_profile`) or :class:`EngineSettings`. ``old_policy``: the denominator of the loss's
    ratio, one or several of ``"pi_old"`` (the trainer's recomputed reading at the sampling weights,
    as verl and slime do: the backend mismatch never reaches the update) and ``"mu"`` (the engine's
    logprobs, never recomputed, as PipelineRL and prime-rl do: the mismatch enters the clip). Each
    ratio denominator is a run of its own on the profile's engine, from the initial weights (loaded
    back into the running engine, cache reset) with a fresh trainer and optimizer; with several,
    runs are named ``<profile>+<old_policy>`` (:func:`run_name`).

    ``steps``, ``loss`` (``"gspo"``, ``"ppo"``, ``"grpo"``), ``n_prompts`` x ``n_samples`` per step,
    ``max_tokens``, ``lr`` (AdamW), ``pause_mode`` and ``clear_cache`` of the updates and the body
    ``dtype`` pinned on both sides default to ``rlparity.config.defaults().rl``; ``seed`` (default
    ``defaults().seed``) fixes the prompts and sampling seeds of every step, the same for every run;
    ``sampling`` the temperature / top-k / top-p (default :func:`rlparity.config.default_sampling`).
    ``async_rollouts``: generate step k+1's rollouts while step k trains (one step of lag; see the
    module's docstring). ``engine``: other :class:`EngineSettings` fields for every profile (e.g.
    ``gpu_memory_utilization``). ``device``: the trainer's. ``checkpoint_dir``: where each step's
    weights are written before the engine reads them (default a temporary folder, removed at the
    end). ``progress``: one tqdm bar per run, one tick per step.

    Returns ``{"<run>@step_NNN": trace}`` in run order; curves: :func:`rlparity.metrics.rl.rl_curves`.
    Starts one engine per profile, each closed before the next (closing the shared pool first).
    """
    from rlparity.capture.async_engine import AsyncEngine
    from rlparity.capture.pool import shared_pool
    from rlparity.train import LOSSES

    d = defaults().rl
    profiles = list(d.profiles if profiles is None else profiles)
    steps = d.steps if steps is None else int(steps)
    loss = loss or d.loss
    olds = list(d.old_policy if old_policy is None else [old_policy] if isinstance(old_policy, str) else old_policy)
    bad = [o for o in olds if o not in OLD_POLICIES]
    if bad or not olds or len(set(olds)) != len(olds):
        raise ValueError(f"old_policy={old_policy!r}; use 'pi_old' (recomputed by the trainer), 'mu' (the "
                         "engine's logprobs, PipelineRL) or both, each once")
    n_prompts = d.n_prompts if n_prompts is None else int(n_prompts)
    n_samples = d.n_samples if n_samples is None else int(n_samples)
    max_tokens = d.max_tokens if max_tokens is None else int(max_tokens)
    lr = d.lr if lr is None else float(lr)
    seed = defaults().seed if seed is None else int(seed)
    dtype = dtype or d.dtype
    pause_mode = pause_mode or d.pause_mode
    clear_cache = d.clear_cache if clear_cache is None else bool(clear_cache)
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r}; use one of {', '.join(LOSSES)}")
    if steps < 1 or n_prompts < 1 or max_tokens < 1:
        raise ValueError(f"steps={steps}, n_prompts={n_prompts}, max_tokens={max_tokens}: each must be >= 1")
    if n_samples < 2:
        raise ValueError(f"n_samples={n_samples}: the advantage is normalised over each prompt's samples, "
                         "so take at least 2")
    if not profiles:
        raise ValueError("no profiles: pass names such as ('pipelinerl-parity', 'vllm-v1-defaults')")
    names = [_profile_name(p, i) for i, p in enumerate(profiles)]
    if len(set(names)) != len(names):
        raise ValueError(f"profiles {names} repeat a name: each profile runs once")
    settings = {n: rl_profile(p).replace(dtype=dtype, **dict(engine or {})) for n, p in zip(names, profiles)}
    several = len(olds) > 1
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
            with AsyncEngine(model, settings[name]) as eng:
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
                    try:
                        arms.update(_run_steps(
                            eng, model, run, i * len(olds) + j, profile=name, steps=steps, loss=loss, old_policy=op,
                            n_prompts=n_prompts, n_samples=n_samples, max_tokens=max_tokens, lr=lr,
                            async_rollouts=async_rollouts, device=device, seed=seed, dtype=dtype, sampling=sampling,
                            pause_mode=pause_mode, clear_cache=clear_cache, ckpt=root / run, batch_size=batch_size,
                            bar=bar))
                    finally:
                        if bar is not None:
                            bar.close()
                    log(f"{run}: {steps} steps in {time.perf_counter() - t_run:.1f} s")
                t_close = time.perf_counter()
            log(f"{name}: engine closed in {time.perf_counter() - t_close:.1f} s; {time.perf_counter() - t0:.1f} s "
                "in all")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return arms


def diagnose_first_steps(arms: Mapping[str, xr.Dataset]):
    """:func:`rlparity.diagnose.diagnose` of the first step of every run (any other step: pick its
    arms from the store the same way)."""
    from rlparity.diagnose import diagnose
    from rlparity.metrics.rl import run_steps

    steps = {a: step for a, (_, step) in run_steps(arms).items()}
    first = min(steps.values())
    return diagnose({a: ds for a, ds in arms.items() if steps[a] == first},
                    title=f"RL run: step {first} of every run")


def summarize(arms: Mapping[str, xr.Dataset], *, reference: str | None = None, findings: bool = True
              ) -> dict[str, Any]:
    """The run's numbers as plain data: the curves (:func:`rlparity.metrics.rl.curves_records`),
    each run against the ``reference`` profile's run of the same ratio denominator (default the
    first profile; :func:`rlparity.metrics.rl.profile_contrast`) and, with ``findings``, the findings
    of the first step of every run (:func:`diagnose_first_steps`)."""
    from rlparity.metrics import rl as mrl

    curves = mrl.rl_curves(arms)
    res = {"curves": mrl.curves_records(curves), "contrast": mrl.profile_contrast(curves, reference)}
    if findings:
        report = diagnose_first_steps(arms)
        res.update({"findings": report.to_dict()["findings"], "verdict": report.verdict})
    return res


def pack(store: str | os.PathLike, out: str | os.PathLike, *, max_part_bytes: int = 15 * 2**20) -> list[Path]:
    """``store`` as one gzipped tar in ``out`` (``rl.zarr.tar.gz``), split into parts of at most
    ``max_part_bytes`` (``rl.zarr.tar.gz.part00``, ...; ``cat rl.zarr.tar.gz.part* | tar xz`` joins
    them) so a transfer that takes a few flat files of bounded size carries the whole store."""
    import tarfile

    store, out = Path(store), Path(out)
    whole = out / f"{store.name}.tar.gz"
    for old in out.glob(f"{whole.name}.part*"):
        old.unlink()
    with tarfile.open(whole, "w:gz") as tar:
        tar.add(store, arcname=store.name)
    if whole.stat().st_size <= max_part_bytes:
        return [whole]
    parts = []
    with whole.open("rb") as fh:
        while chunk := fh.read(max_part_bytes):
            part = out / f"{whole.name}.part{len(parts):02d}"
            part.write_bytes(chunk)
            parts.append(part)
    whole.unlink()
    return parts


def make_example(stores: Sequence[str | os.PathLike], path: str | os.PathLike, *, keep_steps: str = "ends",
                 description: str | None = None, command: str | None = None,
                 device_name: str | None = None) -> Path:
    """One example store from the stores of one or more runs (e.g. one ``rlparity
    experiment rl --profile P`` call per profile on a GPU host): the curves of every step of
    every run (:func:`rlparity.metrics.rl.rl_curves` on all of them, kept as the root attr
    ``rl_curves``, read back with :func:`rlparity.metrics.rl.curves_from_records`) and the contrast
    with the first store's profile (``contrast``), while only the first and last step of each run
    are kept as compact traces (``keep_steps="ends"``; ``"all"`` keeps every step), so the example
    stays small enough to ship. The runs must start from the same weights (the same
    ``model_fingerprint``) or the store is refused."""
    from rlparity.config.provenance import jsonable
    from rlparity.datasets import compact
    from rlparity.metrics import rl as mrl
    from rlparity.trace import open_arms, save

    if keep_steps not in ("ends", "all"):
        raise ValueError(f"keep_steps={keep_steps!r}: use 'ends' (first and last step of each run) or 'all'")
    arms: dict[str, xr.Dataset] = {}
    for store in stores:
        got = open_arms(store)
        clash = sorted(set(got) & set(arms))
        if clash:
            raise ValueError(f"{store} repeats run steps already read ({clash[:3]}...): give each run once")
        arms.update(got)
    prints = {str(ds.attrs.get("model_fingerprint")) for ds in arms.values()}
    if len(prints) != 1:
        raise ValueError(f"the runs start from different weights (model fingerprints {sorted(prints)}): "
                         "compare runs of one model only")
    parsed = mrl.run_steps(arms)
    runs = list(dict.fromkeys(run for run, _ in parsed.values()))
    curves = mrl.rl_curves(arms, profiles=runs)
    last = {run: max(s for r, s in parsed.values() if r == run) for run in runs}
    kept = {a: ds for a, ds in arms.items() if keep_steps == "all" or parsed[a][1] in (0, last[parsed[a][0]])}
    first = next(iter(arms.values()))
    versions = first.attrs.get("versions") or {}
    prov = {"description": description or (
                f"online GSPO on the tiny model's arithmetic task, {len(curves['step'])} steps per run, runs "
                f"{', '.join(runs)}; curves of every step in the root attr rl_curves, traces of the first and "
                "last step of each run"),
            "device": str((first.attrs.get("trainer") or {}).get("device", "")),
            "device_name": device_name or "",
            **{k: versions.get(k) for k in ("vllm", "torch", "transformers")},
            "date": str(first.attrs.get("created_at", ""))[:10], "model": str(first.attrs.get("model", "")),
            "model_fingerprint": prints.pop(), "sizes": (first.attrs.get("rl") or {}).get("sizes", {}),
            "command": command or "rlparity experiment rl --out DIR --profile P (one call per profile)"}
    tree = xr.DataTree.from_dict({f"/{k}": compact(v) for k, v in kept.items()})
    tree.attrs = jsonable({"example": prov, "rl_curves": mrl.curves_records(curves),
                           "contrast": mrl.profile_contrast(curves)}, strict=True)
    return save(tree, path)


__all__ = ["DERIVED_PROFILES", "OLD_POLICIES", "RL_PROFILES", "diagnose_first_steps", "make_example", "pack",
           "rl_profile", "rl_run", "run_name", "step_prompts", "step_sampling", "summarize"]
