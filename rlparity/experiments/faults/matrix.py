"""The fault matrix: every arm (a set of causes of :mod:`rlparity.experiments.faults.recipes`)
captured on a real vLLM engine and scored by the real trainer, to prove the diagnosis names them.

Every arm of the matrix runs one protocol on a real ``AsyncLLM``: version 0 with a fresh prefix
cache; a prefill-only pass over the prompts (the cache holds version-0 KV, as after an earlier RL
step); prompts sampled by version 0; prompts in flight across an update to version 1 (a real weight
change, :func:`rlparity.capture.checkpoints.perturbed_checkpoint`); prompts sampled after the update,
with the same long prefix. The clean arm pauses with ``wait`` and resets the cache, so every token
is computed by the weights that sampled it. The trainer scores every token at its own version
(:func:`rlparity.score.score_versions`). Arms that differ only on the trainer side share one capture;
one engine starts per engine setting.

The ground truth is in each arm's ``attrs["faults"]`` (``causes``, the recipe); the diagnosis never
reads it. :func:`rlparity.diagnose.scoring.score_matrix` compares the report with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import xarray as xr
from pydantic import BaseModel, ConfigDict, Field

from rlparity.capture.floor import engine_floor
from rlparity.config.logs import progress_log
from rlparity.config.profiles import reference_engine
from rlparity.config.settings import Device, SamplingSettings, TrainerSettings
from rlparity.experiments.faults.recipes import FAULTS, Plan, compose, default_arms


class MatrixSettings(BaseModel):
    """Sizes and knobs of a fault matrix run (the defaults: CPU CI on the tiny models).

    Parameters
    ----------
    n_prompts : int, default 4
        Prompts per phase (before, across and after the update); at least 2.
    max_tokens : int, default 16
        Tokens per request (at least 4).
    temperature : float, default 0.7
        The sampling temperature (> 0).
    top_k : int, default 20
        The sampling top-k (0 = off).
    seed : int, default 0
        Seeds the prompts, the requests and the version-1 perturbation.
    sigma : float, default 0.05
        Relative size of the update to version 1 (:func:`rlparity.capture.checkpoints.perturbed_checkpoint`).
    update_after : float, default 1/3
        Share of the in-flight tokens streamed before the update (0 < x < 1).
    inflight_tokens : int, optional
        ``max_tokens`` of the requests in flight across the update (``None``: ``max_tokens``); on a
        GPU the default is over before a pause lands, so KV carried over the update needs longer
        requests there.
    dtype : str, optional
        The body dtype on both sides; ``None`` means the checkpoint's.
    device : str, default "cpu"
        The trainer's device (``cuda...`` also selects the GPU causes).
    batch_size : int, default 16
        The trainer's batch size.
    engine : dict, optional
        Other :class:`~rlparity.config.settings.EngineSettings` fields for every engine.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_prompts: int = Field(4, ge=2, description="prompts per phase (before, across and after the update)")
    max_tokens: int = Field(16, ge=4)
    temperature: float = Field(0.7, gt=0.0)
    top_k: int = Field(20, ge=0)
    seed: int = 0
    sigma: float = Field(0.05, gt=0.0, description="relative size of the update to version 1")
    update_after: float = Field(1 / 3, gt=0.0, lt=1.0, description="share of in-flight tokens before the update")
    inflight_tokens: int | None = Field(None, ge=4, description="max_tokens of the requests in flight across the "
                                        "update (None: max_tokens); on a GPU the default is over before a pause "
                                        "lands, so KV carried over the update needs longer requests there")
    dtype: str | None = Field(None, description="body dtype on both sides (None: the checkpoint's)")
    device: Device = "cpu"
    batch_size: int = 16
    engine: dict[str, Any] = Field(default_factory=dict, description="other EngineSettings fields for every engine")


def _checkpoints(model: Path, out: Path, sigma: float, seed: int, partial: int | None) -> dict[str, Path]:
    from rlparity.capture.checkpoints import perturbed_checkpoint

    v1 = perturbed_checkpoint(model, out / "v1", sigma=sigma, seed=seed)
    paths = {"v0": model, "v1": v1}
    if partial is not None:
        paths["v1_partial"] = partial_checkpoint(v1, out / f"v1-without-layer-{partial}", layer=partial)
    return paths


def partial_checkpoint(model: str | os.PathLike, out: str | os.PathLike, *, layer: int) -> Path:
    """A copy of a checkpoint without the tensors of one decoder layer.

    Loading it as an update leaves that layer's older weights in place (a partial sync). Reused
    when ``out`` already holds one.

    Parameters
    ----------
    model : str or os.PathLike
        A local checkpoint directory.
    out : str or os.PathLike
        Where the copy goes.
    layer : int
        The decoder layer left out (tensors named ``.layers.<layer>.``).

    Returns
    -------
    pathlib.Path
        ``out``.

    Raises
    ------
    ValueError
        If the checkpoint has no tensor of that layer.
    """
    from safetensors.torch import save_file

    from rlparity.capture.checkpoints import iter_safetensors, safetensors_files

    src, dst = Path(model), Path(out)
    marker = dst / "rlparity_partial.json"
    if marker.exists():
        return dst
    dst.mkdir(parents=True, exist_ok=True)
    import json
    import shutil

    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, dst / f.name)
    left_out = []
    for f in safetensors_files(src):
        keep = {}
        for name, t in iter_safetensors(f):
            if f".layers.{layer}." in name:
                left_out.append(name)
                continue
            keep[name] = t.contiguous()
        save_file(keep, str(dst / f.name), metadata={"format": "pt"})
    if not left_out:
        raise ValueError(f"{src} has no tensors of decoder layer {layer}: pick a layer the model has")
    marker.write_text(json.dumps({"source": str(src), "layer": layer, "left_out": left_out}, indent=1))
    return dst


def _capture(eng, plan: Plan, phases: Mapping[str, list], sampling: SamplingSettings, ckpt: Mapping[str, Path],
             first: bool, threshold: int, inflight_tokens: int) -> xr.Dataset:
    """One arm's protocol on a running engine (see the module docstring)."""
    from rlparity.trace import concat_sequences

    up = plan.update
    if not first:  # back to version 0, cache reset
        eng.update_weights(str(ckpt["v0"]), 0, mode="wait", clear_cache=True)
    t_start = eng.clock()
    eng.capture(phases["before"], sampling.model_copy(update={"max_tokens": 1}), arm=plan.arm)
    before = eng.capture(phases["before"], sampling, arm=plan.arm)
    floor = engine_floor(eng, phases["before"][:2], sampling, before)  # the engine's own batch spread
    fut = eng.capture_async(phases["inflight"], sampling.model_copy(update={"max_tokens": inflight_tokens}),
                            arm=plan.arm)
    reached = eng.wait_tokens(threshold, timeout=600)
    source = ckpt["v1_partial"] if up.get("partial") is not None else ckpt["v1"]
    update = eng.update_weights(str(source), 1, mode=up.get("mode", "wait"), clear_cache=up.get("clear_cache", True))
    inflight = fut.result(timeout=1200)
    if up.get("reset_after_inflight") and not up.get("clear_cache", True):
        eng.reset_prefix_cache()
    after = eng.capture(phases["after"], sampling, arm=plan.arm)
    trace = concat_sequences([before, inflight, after])
    trace.attrs.update({"weight_updates": eng.weights.log(t_start, eng.clock()), "latest_policy_version": 1,
                        "engine_weight_checksums": eng.weights.checksum_attrs(), "engine_floor": floor,
                        "fault_protocol": {"update": update, "threshold_tokens": threshold, "threshold_reached": reached,
                                           "phases": {k: len(v) for k, v in phases.items()}}})
    return trace


# what a fault-matrix example store holds (its provenance description)
MATRIX_DESCRIPTION = ("every cause of the fault library alone and in pairs, on real engines, with the ground "
                      "truth in each arm's attrs")

def run_matrix(model: str | os.PathLike, arms: Sequence[Iterable[str]] | None = None,
               settings: MatrixSettings | None = None, *, workdir: str | os.PathLike | None = None,
               log: Callable[[str], None] = progress_log) -> dict[str, xr.Dataset]:
    """Capture and score every arm of the fault matrix on real engines.

    Parameters
    ----------
    model : str or os.PathLike
        A local checkpoint directory (version 0).
    arms : sequence of iterable of str, optional
        The arms, a set of causes each; ``None`` means :func:`~rlparity.experiments.faults.recipes.default_arms` for the platform and
        model. Arms with a cause the platform (or a dense model) cannot run are skipped and logged.
    settings : MatrixSettings, optional
        Sizes and knobs; ``None`` means ``MatrixSettings()``.
    workdir : str or os.PathLike, optional
        Where version 1 and the partial update are written; ``None`` means ``<model>-faults``
        beside the model.
    log : callable, default progress_log
        Called with one line per engine and arm.

    Returns
    -------
    dict of str to xarray.Dataset
        ``{arm: scored trace}``, the ground truth in ``attrs["faults"]``.

    Raises
    ------
    ValueError
        If an arm names an unknown cause or two conflicting ones.
    """
    s = settings or MatrixSettings()
    return run_matrix_repeats(model, arms, s, seeds=(s.seed,), workdir=workdir, log=log)[s.seed]


def run_matrix_repeats(model: str | os.PathLike, arms: Sequence[Iterable[str]] | None = None,
                       settings: MatrixSettings | None = None, *, seeds: Sequence[int] = (0,),
                       workdir: str | os.PathLike | None = None,
                       log: Callable[[str], None] = progress_log) -> dict[int, dict[str, xr.Dataset]]:
    """The fault matrix once per seed, each engine started once for every seed.

    Each seed draws its own prompts, sampling seeds and version-1 perturbation (``settings.seed``
    is replaced); an engine runs the captures of every seed in turn, as it runs the arms of one
    matrix (version 0 reloaded and the cache reset before each). What :func:`run_matrix` runs for
    one seed; the repeats measure how stable each verdict is (``scripts/verdict_stability.py``).

    Parameters
    ----------
    model : str or os.PathLike
        A local checkpoint directory (version 0).
    arms : sequence of iterable of str, optional
        The arms (:func:`run_matrix`).
    settings : MatrixSettings, optional
        Sizes and knobs; ``None`` means ``MatrixSettings()``.
    seeds : sequence of int, default (0,)
        One matrix per seed.
    workdir : str or os.PathLike, optional
        Where the versions are written (one folder ``seed-<k>`` per seed when there are several).
    log : callable, default progress_log
        Called with one line per engine and arm.

    Returns
    -------
    dict of int to dict of str to xarray.Dataset
        ``{seed: {arm: scored trace}}``.

    Raises
    ------
    ValueError
        If an arm names an unknown cause or two conflicting ones.
    """
    from rlparity.capture.async_engine import AsyncEngine
    from rlparity.capture.pool import shared_pool
    from rlparity.experiments.ablation import shared_prefix_prompts
    from rlparity.score import Scorer, score_versions

    from rlparity.models import is_moe

    s0 = settings or MatrixSettings()
    platform = "cuda" if s0.device.startswith("cuda") else "cpu"
    moe = is_moe(model)
    wanted = [tuple(a) for a in (arms if arms is not None else default_arms(platform=platform, moe=moe))]
    plans = [compose(a) for a in wanted]
    skipped = {p.arm: [c for c in p.causes if platform not in FAULTS[c].platforms or (FAULTS[c].moe and not moe)]
               for p in plans}
    plans = [p for p in plans if not skipped[p.arm]]
    v0 = Path(model)
    work = Path(workdir) if workdir else v0.with_name(f"{v0.name}-faults")
    partial = next((p.update["partial"] for p in plans if p.update.get("partial") is not None), None)
    per_seed = {}
    for seed in seeds:
        s = s0.model_copy(update={"seed": seed})
        prompts = shared_prefix_prompts(3 * s.n_prompts, seed=s.seed)
        per_seed[seed] = (s, _checkpoints(v0, work if len(seeds) == 1 else work / f"seed-{seed}", s.sigma, s.seed,
                                          partial),
                          {"before": prompts[: s.n_prompts], "inflight": prompts[s.n_prompts: 2 * s.n_prompts],
                           "after": prompts[2 * s.n_prompts:]})
    inflight_tokens = s0.inflight_tokens or s0.max_tokens
    threshold = max(1, int(s0.update_after * s0.n_prompts * inflight_tokens))
    dtype = s0.dtype or _checkpoint_dtype(v0)
    scorers: dict[tuple, Scorer] = {}

    def scorer(path: Path, plan: Plan) -> Scorer:
        kw = {k: v for k, v in plan.scorer.items() if k != "stale_weights"}
        key = (str(path), dtype, repr(sorted(kw.items())), repr(sorted(plan.trainer.items())))
        if key not in scorers:
            scorers[key] = Scorer(str(path), dtype=dtype, head_dtype=kw.pop("head_dtype", "float32"), device=s0.device,
                                  batch_size=s0.batch_size, progress=False, settings=TrainerSettings(**plan.trainer),
                                  **kw)
        return scorers[key]

    shared_pool().close()
    out: dict[int, dict[str, xr.Dataset]] = {seed: {} for seed in seeds}
    by_engine: dict[str, list[Plan]] = {}
    for p in plans:
        by_engine.setdefault(p.engine_key(), []).append(p)
    for group in by_engine.values():
        base = {"dtype": dtype, "enable_prefix_caching": True, "capture_routing": True if moe else None}
        settings_ = reference_engine(**{**base, **s0.engine, **group[0].engine})
        t0 = time.perf_counter()
        captures: dict[tuple[int, str], xr.Dataset] = {}
        with AsyncEngine(str(v0), settings_) as eng:
            log(f"engine {group[0].engine or 'base'} started in {eng.startup_s:.1f} s")
            for seed in seeds:
                s, ckpt, phases = per_seed[seed]
                for p in sorted(group, key=lambda p: p.capture_key()):
                    if (seed, p.capture_key()) not in captures:
                        sampling = SamplingSettings(temperature=s.temperature, top_k=s.top_k, max_tokens=s.max_tokens,
                                                    seed=s.seed, **p.sampling)
                        captures[seed, p.capture_key()] = _capture(eng, p, phases, sampling, ckpt, not captures,
                                                                   threshold, inflight_tokens)
        for seed in seeds:
            s, ckpt, _ = per_seed[seed]
            for p in group:
                trace = captures[seed, p.capture_key()]
                v1_trainer = ckpt["v0"] if p.scorer.get("stale_weights") else ckpt["v1"]
                scored = score_versions(trace, {0: scorer(ckpt["v0"], p), 1: scorer(v1_trainer, p)}, latest=1)
                scored.attrs.update({"arm": p.arm, "faults": {
                    "causes": list(p.causes), "recipe": p.model_dump(), "what": {c: FAULTS[c].what for c in p.causes},
                    "platform": platform, "settings": s.model_dump()}})
                out[seed][p.arm] = scored
                log(f"  {p.arm}{f' (seed {seed})' if len(seeds) > 1 else ''}: {scored.sizes['sequence']} sequences")
        log(f"engine {group[0].engine or 'base'}: {time.perf_counter() - t0:.1f} s in all")
    if any(skipped.values()):
        log("not run on " + platform + ": " + "; ".join(
            f"{a} ({'needs a mixture-of-experts model' if FAULTS[c[0]].moe and not moe else FAULTS[c[0]].not_on})"
            for a, c in skipped.items() if c))
    return out


def _checkpoint_dtype(model: Path) -> str:
    import json

    cfg = json.loads((model / "config.json").read_text())
    dt = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
    return dt if dt in ("float32", "bfloat16", "float16") else "float32"
