"""Where the two sides part: per-layer divergence profiles of real engines against the trainer (or
against another arm's engine), the scenarios that must be located, and the live weight check.

* :func:`profile_arm`: one arm's layer profile: each probe sequence (prompt + response ids) runs as
  a prefill through the engine with hooks on (:func:`rlparity.capture.layers.capture_layers`) and
  through the reference (the trainer, :func:`rlparity.score.layers.trainer_layer_states`, or the
  engine states of another arm), one sequence at a time; the result is the layer dataset of
  :mod:`rlparity.trace.layers` (per site and position, the RMS of the difference and of the state).
* :func:`verify_weights`: per-tensor checksums of the weights a running engine holds (read in its
  workers, fused tensors split back into checkpoint names) against the trainer's state dict or a
  checkpoint; the differences as the ``engine_weights_differ`` finding of
  :mod:`rlparity.diagnose.sync`.
* :func:`fingerprint_prompts`: greedy logprobs of fixed prompts through the engine against the
  trainer's (recorded per version: a check of the numbers beside the checksums).
* :func:`run_layers`: the scenarios of issue 25 on real engines, each a recipe of the fault
  library (:mod:`rlparity.experiments.faults`): ``clean``; ``partial_weight_sync`` (an update that
  leaves one decoder layer out); ``stale_prefix_cache`` (prompts prefilled by version 0, an update
  to version 1 without a cache reset); ``trainer_bf16_head`` and ``rollout_bf16_head`` (the head in
  bf16 on one side); ``batch_variant_attention`` (another attention backend: on a GPU only, vLLM's
  CPU build runs one attention path). Every arm is a scored trace carrying its profile against the
  trainer on one shared set of probe sequences; engine-side scenarios are also profiled against the
  clean arm's engine (``<arm>@clean-engine``: same capture, the reference is the clean engine, whose
  run-to-run floor is measured too). The floor against the trainer comes from a clean capture on
  other prompts.

The hooks need an eager engine: every engine here starts with ``enforce_eager=True``, so the
profiles describe vLLM's eager path (on a GPU, CUDA graphs bypass the hooks).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from pydantic import BaseModel, ConfigDict, Field

from rlparity.config.logs import progress_log
from rlparity.config.profiles import reference_engine
from rlparity.config.settings import Device, SamplingSettings
from rlparity.metrics.layers import floor_from, site_errors
from rlparity.trace.layers import layer_dataset, sites, vocab_columns, with_layers

SCENARIOS = ("clean", "partial_weight_sync", "stale_prefix_cache", "trainer_bf16_head", "rollout_bf16_head",
             "batch_variant_attention")
ENGINE_REFERENCE = "clean-engine"


def probe_sequences(trace: xr.Dataset) -> list[list[int]]:
    """Prompt + response ids of every sequence of a trace (what a layer capture runs).

    Parameters
    ----------
    trace : xarray.Dataset
        A trace.

    Returns
    -------
    list of list of int
        One id list per sequence (padding dropped).
    """
    from rlparity.trace import sequences

    return [p + r for p, r in sequences(trace)]


def _vocab_size(engine: Any) -> int:
    return int(engine.llm.llm_engine.vllm_config.model_config.get_vocab_size())


def engine_states(engine: Any, seqs: Sequence[Sequence[int]], *, vocab_ids: Sequence[int],
                  use_cache: bool = False) -> list[dict[str, Any]]:
    """The engine's layer states on ``seqs``, kept in memory (the reference of another arm).

    Parameters
    ----------
    engine : Engine
        A running eager offline engine (:func:`rlparity.capture.layers.capture_layers`).
    seqs : sequence of sequence of int
        The probe sequences.
    vocab_ids : sequence of int
        The vocabulary columns whose logits are kept.
    use_cache : bool, default False
        Let the prefills hit the prefix cache (default: salted, every position recomputed).

    Returns
    -------
    list of dict
        One capture per sequence, as :func:`rlparity.capture.layers.capture_layers` returns it.
    """
    from rlparity.capture.layers import capture_layers

    return [capture_layers(engine, [s], vocab_ids=vocab_ids, use_cache=use_cache)[0] for s in seqs]


def profile_arm(engine: Any, reference: Any, seqs: Sequence[Sequence[int]], *, vocab_ids: Sequence[int] | None = None,
                use_cache: bool = False, floor: xr.DataArray | np.ndarray | None = None,
                attrs: Mapping[str, Any] | None = None, states: Sequence[dict[str, Any]] | None = None) -> xr.Dataset:
    """The layer dataset of ``engine`` against ``reference`` on ``seqs`` (see the module docstring).

    Parameters
    ----------
    engine : Engine
        A running eager offline engine.
    reference : Scorer or sequence of dict
        A :class:`~rlparity.score.Scorer` (the trainer) or the engine states of another arm on the
        same ``seqs`` (:func:`engine_states`).
    seqs : sequence of sequence of int
        The probe sequences (at least one).
    vocab_ids : sequence of int, optional
        The vocabulary columns the ``lm_head`` site compares; ``None`` means
        :func:`rlparity.trace.layers.vocab_columns` of the engine's vocabulary.
    use_cache : bool, default False
        Let the prefills hit the engine's prefix cache (default: salted, every position recomputed).
    floor : xarray.DataArray or numpy.ndarray, optional
        A per-site floor stored with the profile.
    attrs : Mapping, optional
        Further attrs of the profile.
    states : sequence of dict, optional
        The engine's states already captured (then ``engine`` is not called).

    Returns
    -------
    xarray.Dataset
        The layer dataset of :mod:`rlparity.trace.layers`: per site and position the RMS of the
        difference and of the state, with the comparison's attrs.

    Raises
    ------
    ValueError
        If ``seqs`` is empty, or the reference holds states of another number of sequences.
    """
    from rlparity.capture.layers import capture_layers
    from rlparity.score.layers import trainer_layer_states

    seqs = [list(map(int, s)) for s in seqs]
    if not seqs:
        raise ValueError("no probe sequences: pass at least one prompt + response")
    if vocab_ids is None:
        vocab_ids = vocab_columns(_vocab_size(engine))
    trainer = hasattr(reference, "module")
    if not trainer and len(reference) != len(seqs):
        raise ValueError(f"the reference holds states of {len(reference)} sequences, the probe {len(seqs)}")
    width = max(len(s) for s in seqs)
    diffs, rms, cached = [], [], []
    t0 = time.perf_counter()
    for i, seq in enumerate(seqs):
        e = states[i] if states is not None else capture_layers(engine, [seq], vocab_ids=vocab_ids,
                                                                 use_cache=use_cache)[0]
        r = next(trainer_layer_states(reference, [seq], vocab_ids=vocab_ids)) if trainer else reference[i]
        d, s = site_errors(e, r, len(seq))
        pad = np.full((d.shape[0], width - len(seq)), np.nan)
        diffs.append(np.concatenate([d, pad], axis=1))
        rms.append(np.concatenate([s, pad], axis=1))
        cached.append(int(e["cached"]))
    n_layers = int(e["n_layers"])
    info = {"comparison": "trainer" if trainer else "engine", "path": "eager (forward hooks)",
            "engine_dtype": e.get("dtype"), "vocab_columns": len(vocab_ids), "use_cache": bool(use_cache),
            "n_sequences": len(seqs), "seconds": round(time.perf_counter() - t0, 3)}
    if trainer:
        info.update(trainer_head_dtype=reference.head_dtype, trainer_dtype=reference.dtype)
    info.update(attrs or {})
    return layer_dataset(sites(n_layers), np.stack(diffs, axis=1), np.stack(rms, axis=1), seqs, cached,
                         floor=None if floor is None else np.asarray(floor), attrs=info)


def verify_weights(engine: Any, trainer: Any, *, version: int | None = None, arm: str | None = None
                   ) -> dict[str, Any]:
    """Compare the weights a running engine holds with the trainer's, tensor by tensor.

    Parameters
    ----------
    engine : Engine
        A running offline engine (its workers are read: :func:`rlparity.capture.layers.live_checksums`).
    trainer : object
        A :class:`~rlparity.score.Scorer`, a transformers model, a state dict, a checkpoint
        directory or a ``{name: checksum}`` mapping.
    version : int, optional
        The policy version the finding names; ``None`` means the engine's.
    arm : str, optional
        The arm the finding names.

    Returns
    -------
    dict
        ``equal``, ``compare`` (as :func:`rlparity.trace.weights.compare_checksums`, plus the
        unmapped engine parameters), ``engine_seconds`` (reading the workers),
        ``probed_linear_layers``, ``n_engine_tensors`` and ``finding`` (the
        ``engine_weights_differ`` finding, or ``None``).

    Raises
    ------
    ValueError
        If ``trainer`` is a path that is not a local safetensors checkpoint (or too large to read).
    TypeError
        If ``trainer`` is of another type.
    """
    from rlparity.capture.layers import live_checksums
    from rlparity.capture.checkpoints import checkpoint_checksums
    from rlparity.diagnose.sync import engine_weights_differ
    from rlparity.trace.weights import checksums, compare_checksums

    live = live_checksums(engine)
    if hasattr(trainer, "weight_checksums"):
        theirs = trainer.weight_checksums()
    elif hasattr(trainer, "state_dict"):
        theirs = checksums(trainer.state_dict().items())
    elif isinstance(trainer, (str, os.PathLike)):
        theirs = checkpoint_checksums(trainer)
        if theirs is None:
            raise ValueError(f"{trainer} is not a local safetensors checkpoint (or too large to read): pass the "
                             "trainer's model or state dict")
    elif isinstance(trainer, Mapping) and all(isinstance(v, str) for v in trainer.values()):
        theirs = dict(trainer)
    elif isinstance(trainer, Mapping):
        theirs = checksums(trainer.items())
    else:
        raise TypeError(f"trainer {type(trainer).__name__}: pass a Scorer, a model, a state dict, a checkpoint "
                        "directory or {name: checksum}")
    cmp = compare_checksums(live["checksums"], theirs)
    if live.get("unmapped"):
        cmp["unmapped_engine_parameters"] = list(live["unmapped"])
    v = getattr(engine, "policy_version", 0) if version is None else int(version)
    finding = None if cmp["equal"] else engine_weights_differ(cmp, v, arm=arm, how="read live from the engine's workers")
    return {"equal": bool(cmp["equal"]), "compare": cmp, "engine_seconds": live.get("seconds"),
            "probed_linear_layers": live.get("probed"), "n_engine_tensors": len(live["checksums"]),
            "finding": finding}


FINGERPRINT_PROMPTS = 4


def fingerprint_prompts(engine: Any, trainer: Any, *, n: int = FINGERPRINT_PROMPTS, max_tokens: int = 8
                        ) -> dict[str, Any]:
    """Greedy logprobs of fixed prompts through the engine, rescored by the trainer.

    Recorded at each version, it shows a sync that changed the numbers without fingerprints of the
    tensors; its size is judged against a clean engine's (float rounding, not zero).

    Parameters
    ----------
    engine : Engine
        A running engine.
    trainer : Scorer
        The trainer side.
    n : int, default FINGERPRINT_PROMPTS
        How many prompts (the built-in task's, seed 0; 4 by default).
    max_tokens : int, default 8
        Greedy tokens per prompt.

    Returns
    -------
    dict
        ``mean_abs_d`` and ``max_abs_d`` (nats, over the finite raw log-ratios), ``n_tokens``,
        ``tokens`` (the greedy completions, to compare versions by), ``units`` and ``policy_version``.
    """
    from rlparity.metrics import log_ratio
    from rlparity.models import make_prompts

    trace = engine.capture(make_prompts(n, seed=0), SamplingSettings(temperature=0.0, max_tokens=max_tokens, seed=0),
                           arm="fingerprint", progress=False)
    d = np.abs(log_ratio(trainer.score(trace), "raw").values)
    ok = np.isfinite(d)
    return {"mean_abs_d": float(d[ok].mean()) if ok.any() else float("nan"),
            "max_abs_d": float(d[ok].max()) if ok.any() else float("nan"), "n_tokens": int(ok.sum()),
            "tokens": trace["token_id"].values.tolist(), "units": "nats", "policy_version": engine.policy_version}


# ------------------------------------------------------------------------------ scenarios
class LayerSettings(BaseModel):
    """Sizes and knobs of :func:`run_layers` (the defaults: CPU CI on the tiny model).

    Parameters
    ----------
    n_prompts : int, default 4
        Probe sequences (prompts sampled once by the clean engine).
    n_floor : int, default 4
        Sequences of the floor capture (other prompts).
    max_tokens : int, default 16
        Tokens per request.
    temperature : float, default 0.7
        The sampling temperature (> 0).
    top_k : int, default 20
        The sampling top-k (0 = off).
    seed : int, default 0
        Seeds the prompts, the requests and version 1.
    sigma : float, default 0.05
        Relative size of the update to version 1.
    partial_layer : int, default 1
        The decoder layer the partial sync leaves out.
    prefix_problems : int, default 32
        Solved problems in the shared prompt prefix (about 10 tokens each: the CPU build caches
        blocks of 128 tokens).
    vocab_columns : int, default 1024
        Vocabulary columns the ``lm_head`` site compares (at least 8).
    dtype : str, optional
        The body dtype on both sides; ``None`` means the checkpoint's.
    device : str, default "cpu"
        The trainer's device.
    other_attention_backend : str, default "TRITON_ATTN"
        The backend of ``batch_variant_attention``.
    engine : dict, optional
        Other :class:`~rlparity.config.settings.EngineSettings` fields for every engine.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_prompts: int = Field(4, ge=1, description="probe sequences (prompts sampled once by the clean engine)")
    n_floor: int = Field(4, ge=1, description="sequences of the floor capture (other prompts)")
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(0.7, gt=0.0)
    top_k: int = Field(20, ge=0)
    seed: int = 0
    sigma: float = Field(0.05, gt=0.0, description="relative size of the update to version 1")
    partial_layer: int = Field(1, ge=0, description="the decoder layer the partial sync leaves out")
    prefix_problems: int = Field(32, ge=1, description="solved problems in the shared prompt prefix (about 10 "
                                                       "tokens each: the CPU build caches blocks of 128 tokens)")
    vocab_columns: int = Field(1024, ge=8, description="vocabulary columns the lm_head site compares")
    dtype: str | None = Field(None, description="body dtype on both sides (None: the checkpoint's)")
    device: Device = "cpu"
    other_attention_backend: str = Field("TRITON_ATTN", description="the backend of batch_variant_attention")
    engine: dict[str, Any] = Field(default_factory=dict, description="other EngineSettings fields for every engine")


class _Run:
    """The state one :func:`run_layers` call shares between its scenarios (see there)."""

    def __init__(self, model: Path, s: LayerSettings, work: Path, log: Callable[[str], None],
                 on_arm: Callable[[str, xr.Dataset, dict[str, Any]], None] | None):
        from rlparity.capture.checkpoints import perturbed_checkpoint
        from rlparity.experiments.ablation import shared_prefix_prompts
        from rlparity.experiments.faults.matrix import _checkpoint_dtype
        from rlparity.score import Scorer

        self.s, self.work, self.log, self.on_arm = s, work, log, on_arm
        self.v0 = model
        self.v1 = perturbed_checkpoint(model, work / "v1", sigma=s.sigma, seed=s.seed)
        self.dtype = s.dtype or _checkpoint_dtype(model)
        self.prompts = shared_prefix_prompts(s.n_prompts, prefix_problems=s.prefix_problems, seed=s.seed)
        self.floor_prompts = shared_prefix_prompts(s.n_floor, prefix_problems=s.prefix_problems, seed=s.seed + 1)
        self.sampling = SamplingSettings(temperature=s.temperature, top_k=s.top_k, max_tokens=s.max_tokens,
                                         seed=s.seed)
        self.base = reference_engine(**{"dtype": self.dtype, "enable_prefix_caching": True, "enforce_eager": True,
                                        **s.engine})
        self.trainer = Scorer(str(self.v1), dtype=self.dtype, head_dtype="float32", device=s.device, progress=False)
        self.arms: dict[str, xr.Dataset] = {}
        self.record: dict[str, Any] = {
            "settings": s.model_dump(), "platform": "cuda" if s.device.startswith("cuda") else "cpu",
            "scenarios": {}, "not_run": {}, "path": "eager (enforce_eager=True): forward hooks do not fire in compiled "
                                                    "graphs"}
        self.attrs = {"probe": "the clean arm's sampled sequences (shared by every arm)"}

    def done(self, name: str, trace: xr.Dataset, rec: dict[str, Any]) -> None:
        self.arms[name] = trace
        self.record["scenarios"][name] = rec
        if self.on_arm is not None:
            self.on_arm(name, trace, self.record)

    def scored(self, trace: xr.Dataset, arm: str, scorer: Any = None) -> xr.Dataset:
        return (scorer or self.trainer).score(trace).assign_attrs(arm=arm, layer_scenario=arm)

    def profiles(self, eng: Any, name: str, trace: xr.Dataset, states: list[dict[str, Any]], rec: dict[str, Any], *,
                 use_cache: bool = False) -> None:
        """The arm against the trainer, and against the clean arm's engine."""
        lay = profile_arm(eng, self.trainer, self.probe, vocab_ids=self.vocab_ids, floor=self.floor, states=states,
                          use_cache=use_cache, attrs={**self.attrs, "scenario": name})
        ref = profile_arm(eng, self.clean_states, self.probe, vocab_ids=self.vocab_ids, floor=self.engine_floor,
                          states=states, use_cache=use_cache, attrs={**self.ref_attrs, "scenario": name})
        self.done(name, with_layers(self.scored(trace, name), lay), rec)
        self.done(f"{name}@{ENGINE_REFERENCE}", with_layers(self.arms[name], ref), {})

    # ---------------------------------------------------------------------------- the first engine
    def clean(self, eng: Any) -> None:
        """The floor (other prompts), the clean arm (its sequences: the probe), the engine's own floor."""
        t0 = time.perf_counter()
        self.vocab_ids = vocab_columns(_vocab_size(eng), self.s.vocab_columns)
        eng.update_weights(str(self.v1), 1, clear_cache=True)
        ftrace = eng.capture(self.floor_prompts, self.sampling, arm="floor", progress=False)
        self.floor = floor_from(profile_arm(eng, self.trainer, probe_sequences(ftrace), vocab_ids=self.vocab_ids))
        self.record["floor"] = {"source": f"clean capture of {self.s.n_floor} other prompts against the trainer",
                                "per_site": dict(zip(self.floor["site"].values.tolist(), self.floor.values.tolist()))}
        clean = eng.capture(self.prompts, self.sampling, arm="clean", progress=False)
        self.probe = probe_sequences(clean)
        self.clean_states = engine_states(eng, self.probe, vocab_ids=self.vocab_ids)
        again = engine_states(eng, self.probe, vocab_ids=self.vocab_ids)
        self.ref_attrs = {**self.attrs, "reference": ENGINE_REFERENCE,
                          "reference_head_dtype": eng.effective_config().get("head_dtype")}
        run_to_run = profile_arm(eng, self.clean_states, self.probe, vocab_ids=self.vocab_ids, states=again,
                                 attrs={**self.ref_attrs, "scenario": "clean (run to run)"})
        self.engine_floor = floor_from(run_to_run)
        self.record["engine_floor"] = {"source": "the clean engine run twice on the probe (run to run)",
                                       "max": float(np.nanmax(self.engine_floor.values))}
        lay = profile_arm(eng, self.trainer, self.probe, vocab_ids=self.vocab_ids, floor=self.floor,
                          states=self.clean_states, attrs={**self.attrs, "scenario": "clean"})
        check = verify_weights(eng, self.trainer, version=1, arm="clean")
        self.record["verify_weights_clean"] = {k: v for k, v in check.items() if k != "finding"}
        self.record["fingerprint_clean"] = fingerprint_prompts(eng, self.trainer)
        self.clean_trace = clean
        self.done("clean", with_layers(self.scored(clean, "clean"), lay),
                  {"seconds": round(time.perf_counter() - t0, 2)})
        self.done(f"clean@{ENGINE_REFERENCE}", with_layers(self.arms["clean"], run_to_run.assign(
            layer_floor=("site", self.engine_floor.values))), {})

    def trainer_bf16_head(self, eng: Any) -> dict[str, Any]:
        from rlparity.score import Scorer

        bf16 = Scorer(str(self.v1), dtype=self.dtype, head_dtype="bfloat16", device=self.s.device, progress=False)
        lay = profile_arm(eng, bf16, self.probe, vocab_ids=self.vocab_ids, floor=self.floor, states=self.clean_states,
                          attrs={**self.attrs, "scenario": "trainer_bf16_head"})
        self.done("trainer_bf16_head", with_layers(self.scored(self.clean_trace, "trainer_bf16_head", bf16), lay), {})
        return {}

    def partial_weight_sync(self, eng: Any) -> dict[str, Any]:
        from rlparity.experiments.faults.matrix import partial_checkpoint

        layer = self.s.partial_layer
        part = partial_checkpoint(self.v1, self.work / f"v1-without-layer-{layer}", layer=layer)
        eng.update_weights(str(self.v0), 0, clear_cache=True)
        eng.update_weights(str(part), 1, clear_cache=True)
        try:
            check = verify_weights(eng, self.trainer, version=1, arm="partial_weight_sync")
            fingerprint = fingerprint_prompts(eng, self.trainer)
            trace = eng.capture(self.prompts, self.sampling, arm="partial_weight_sync", progress=False)
            states = engine_states(eng, self.probe, vocab_ids=self.vocab_ids)
            self.profiles(eng, "partial_weight_sync", trace, states, {
                "layer_left_out": layer, "verify_weights": {k: v for k, v in check.items() if k != "finding"},
                "fingerprint": fingerprint})
        finally:
            eng.update_weights(str(self.v1), 1, clear_cache=True)
        return {}

    def stale_prefix_cache(self, eng: Any) -> dict[str, Any]:
        eng.update_weights(str(self.v0), 0, clear_cache=True)
        eng.capture(self.prompts, self.sampling.model_copy(update={"max_tokens": 1}), arm="prefill", progress=False)
        eng.update_weights(str(self.v1), 1, clear_cache=False)
        trace = eng.capture(self.prompts, self.sampling, arm="stale_prefix_cache", progress=False)
        states = engine_states(eng, self.probe, vocab_ids=self.vocab_ids, use_cache=True)
        self.profiles(eng, "stale_prefix_cache", trace, states, {"cached_positions": [int(x["cached"]) for x in states]},
                      use_cache=True)
        return {}

    # ---------------------------------------------------------------------------- engines of their own
    def other_engine(self, name: str, change: dict[str, Any]) -> None:
        from rlparity.capture import Engine

        with Engine(str(self.v1), self.base.replace(**change)) as eng:
            backend = eng.effective_config().get("attention_backend")
            self.log(f"{name}: engine started in {eng.startup_s:.1f} s (attention backend {backend})")
            if "attention_backend" in change and backend == self.clean_backend:
                self.record["not_run"][name] = (f"the engine resolved attention_backend={change['attention_backend']} "
                                                f"to {backend}, the clean engine's backend")
                return
            trace = eng.capture(self.prompts, self.sampling, arm=name, progress=False)
            states = engine_states(eng, self.probe, vocab_ids=self.vocab_ids)
            self.profiles(eng, name, trace, states, {"attention_backend": backend,
                                                     "clean_attention_backend": self.clean_backend})


def run_layers(model: str | os.PathLike, scenarios: Sequence[str] | None = None, settings: LayerSettings | None = None,
               *, workdir: str | os.PathLike | None = None, log: Callable[[str], None] = progress_log,
               on_arm: Callable[[str, xr.Dataset, dict[str, Any]], None] | None = None,
               deadline_s: float | None = None) -> tuple[dict[str, xr.Dataset], dict[str, Any]]:
    """Run the layer scenarios on real engines; return the arms and a record of what was done.

    A scenario that fails is recorded in ``record["not_run"]`` and the others go on.

    Parameters
    ----------
    model : str or os.PathLike
        A local checkpoint (version 0).
    scenarios : sequence of str, optional
        Names of :data:`SCENARIOS`; ``None`` means every one (those this platform cannot run are
        recorded as not run, with why).
    settings : LayerSettings, optional
        Sizes and knobs; ``None`` means ``LayerSettings()``.
    workdir : str or os.PathLike, optional
        Where version 1 and the partial update are written; ``None`` means ``<model>-layers``
        beside the model.
    log : callable, default progress_log
        Called with one line per step.
    on_arm : callable, optional
        ``on_arm(name, trace, record)``, called as each arm is ready (a script can write its
        results after every step).
    deadline_s : float, optional
        No further engine starts after this many seconds (the rest is recorded as not run).

    Returns
    -------
    tuple of (dict of str to xarray.Dataset, dict)
        ``({arm: scored trace with its layer profile}, record)``: per scenario what was done and
        measured (``verify_weights`` of the partial sync and of the clean engine, the floors, what
        could not run and why, seconds).

    Raises
    ------
    ValueError
        If a scenario is unknown.
    """
    from rlparity.capture import Engine
    from rlparity.capture.pool import shared_pool
    from rlparity.experiments.faults.recipes import FAULTS

    s = settings or LayerSettings()
    wanted = list(scenarios) if scenarios is not None else list(SCENARIOS)
    unknown = [w for w in wanted if w not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    v0 = Path(model)
    run = _Run(v0, s, Path(workdir) if workdir else v0.with_name(f"{v0.name}-layers"), log, on_arm)
    platform = run.record["platform"]
    shared_pool().close()
    t_all = time.perf_counter()

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - one scenario failing must not lose the others
            run.record["not_run"][name] = f"failed: {type(err).__name__}: {err}"
            log(f"{name}: failed ({type(err).__name__}: {err})")
            return
        if name in run.record["scenarios"]:
            run.record["scenarios"][name].update({"what": FAULTS[name].what if name in FAULTS else "",
                                                  "seconds": round(time.perf_counter() - t0, 2)})

    with Engine(str(v0), run.base) as eng:
        log(f"engine (eager, prefix caching, fp32 head) started in {eng.startup_s:.1f} s")
        run.clean(eng)  # every other arm needs the clean floor, probe and engine states
        run.clean_backend = eng.effective_config().get("attention_backend")
        for name in ("trainer_bf16_head", "partial_weight_sync", "stale_prefix_cache"):
            if name in wanted:
                attempt(name, lambda name=name: getattr(run, name)(eng))
    # the GPU-only recipe first: it is what a CPU run cannot show
    for name, change in (("batch_variant_attention", {"attention_backend": s.other_attention_backend}),
                         ("rollout_bf16_head", {"head_dtype": "bfloat16"})):
        if name not in wanted:
            continue
        if platform not in FAULTS[name].platforms:
            run.record["not_run"][name] = FAULTS[name].not_on
            log(f"{name}: not run on {platform} ({FAULTS[name].not_on})")
        elif deadline_s is not None and time.perf_counter() - t_all > deadline_s:
            run.record["not_run"][name] = f"time budget: {deadline_s:.0f} s spent before its engine could start"
        else:
            attempt(name, lambda name=name, change=change: run.other_engine(name, change))
    run.record["seconds"] = round(time.perf_counter() - t_all, 1)
    return run.arms, run.record


__all__ = ["ENGINE_REFERENCE", "FINGERPRINT_PROMPTS", "SCENARIOS", "LayerSettings", "engine_states",
           "fingerprint_prompts", "probe_sequences", "profile_arm", "run_layers", "verify_weights"]
