"""The inference-path ablation: change one engine setting at a time, same prompts, same seeds.

From a reference profile (default ``pipelinerl-parity``) every *knob* starts one engine with that
single setting changed, captures the same prompts with the same request seeds and rescores with
the same trainer. A knob the platform cannot honour (the engine refuses to start, or the running
engine reports it kept the reference value, e.g. cascade attention or another attention backend
on CPU) is recorded as *not applicable* with the reason, never dropped.

* :func:`ablation` runs it and returns ``{arm: trace}`` (arm ``reference`` plus one per knob that
  ran); the plan, with the not-applicable knobs and their reasons, is in every arm's
  ``attrs["ablation"]`` so the store alone rebuilds the table.
* :func:`batch_composition` probes determinism by batch composition: the same prompt at
  temperature 0 in batches of different sizes (dims ``batch_size``, ``position``).

Prompts share a long common prefix (:func:`shared_prefix_prompts`) and each engine first sees a
short warm-up pass over the same prompts, so prefix caching has cached blocks to hit, as it
has when an RL loop samples the same prompts again.

The tables (:func:`rlparity.metrics.ablation.ablation_table`, ...) and the findings
(:mod:`rlparity.diagnose.path`) work on the stored arms; this module only runs engines.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import library_versions
from rlparity.config.defaults import default_sampling, defaults
from rlparity.config.settings import EngineSettings, SamplingSettings
from rlparity.metrics.ablation import REFERENCE
from rlparity.trace import arm_record


@dataclass(frozen=True)
class Knob:
    """One engine setting to change: ``field`` of :class:`~rlparity.config.settings.EngineSettings` set to ``value``.

    Parameters
    ----------
    name : str
        The knob's name, also the arm's.
    field : str
        The :class:`~rlparity.config.settings.EngineSettings` field it changes.
    value : object, optional
        The value to set; ``None`` flips a boolean against the reference engine's effective value.
    description : str, default ""
        What the knob changes, in words.
    effective_key : str, optional
        The key of the effective configuration that shows whether the engine honoured it;
        ``None`` means ``field``.
    """

    name: str
    field: str
    value: Any = None
    description: str = ""
    effective_key: str | None = None

    @property
    def key(self) -> str:
        """The effective-configuration key that shows the knob was honoured (``effective_key``, else ``field``)."""
        return self.effective_key or self.field


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("prefix_caching", "enable_prefix_caching", None, "reuse cached KV blocks of shared prefixes"),
    Knob("async_scheduling", "async_scheduling", None, "overlap scheduling with the previous step"),
    Knob("cascade_attention", "disable_cascade_attn", None, "cascade attention for shared prefixes (GPU)"),
    Knob("attention_backend", "attention_backend", "FLEX_ATTENTION", "another attention kernel"),
    Knob("eager", "enforce_eager", None, "eager vs compiled (torch.compile / CUDA graphs)"),
    Knob("batch_invariant", "batch_invariant", True, "batch-invariant kernels (VLLM_BATCH_INVARIANT=1)"),
    Knob("max_num_seqs", "max_num_seqs", 2, "batch size cap: other batch composition"),
    Knob("chunked_prefill", "enable_chunked_prefill", None, "split prefills across steps"),
)}
DEFAULT_KNOBS = tuple(KNOBS)


def shared_prefix_prompts(n: int, *, prefix_problems: int = 32, seed: int = 0) -> list[str]:
    """Task prompts that share a long common prefix and each end in a different open problem.

    The prefix lets prefix caching and cascade attention work on shared full KV blocks (vLLM's CPU
    backend uses blocks of 128 tokens; a prefix shorter than one block is never cached).

    Parameters
    ----------
    n : int
        How many prompts.
    prefix_problems : int, default 32
        Solved problems in the shared prefix (about 10 characters = tokens each for the tiny model).
    seed : int, default 0
        Seeds the problems (:func:`rlparity.models.make_problem`).

    Returns
    -------
    list of str
        ``n`` prompts: the prefix, one solved problem of its own, and an open problem ending in ``=``.
    """
    import random

    from rlparity.models import make_problem

    rng = random.Random(seed)
    prefix = "".join(make_problem(rng) for _ in range(prefix_problems))
    out = []
    for _ in range(n):
        own = make_problem(rng)
        nxt = make_problem(rng)
        out.append(prefix + own + nxt[: nxt.index("=") + 1])
    return out


def _effective_value(eff: Mapping[str, Any], knob: Knob) -> Any:
    v = eff.get(knob.key)
    return v.upper() if isinstance(v, str) and knob.field == "attention_backend" else v


def knob_settings(knob: Knob, reference: EngineSettings, reference_effective: Mapping[str, Any]
                  ) -> tuple[EngineSettings, Any]:
    """The reference settings with ``knob`` changed, and the value it was changed to.

    Parameters
    ----------
    knob : Knob
        The knob.
    reference : EngineSettings
        The reference settings.
    reference_effective : Mapping
        The reference engine's effective configuration (what a ``value=None`` knob flips).

    Returns
    -------
    tuple of (EngineSettings, object)
        ``(settings, value)``.

    Raises
    ------
    ValueError
        If the knob flips a value that is not a boolean.
    """
    value = knob.value
    if value is None:
        current = reference_effective.get(knob.key, getattr(reference, knob.field))
        if not isinstance(current, bool):
            raise ValueError(f"knob {knob.name}: cannot flip {knob.key}={current!r} (not a boolean); "
                             "give the knob an explicit value")
        value = not current
    return reference.replace(**{knob.field: value}), value


def _takes(knob: Knob, value: Any, eff: Mapping[str, Any]) -> tuple[bool, Any]:
    """Whether the effective configuration ``eff`` has ``knob`` at ``value``, and what it has."""
    got = _effective_value(eff, knob)
    return got == (value.upper() if isinstance(value, str) and knob.field == "attention_backend" else value), got


def _honoured(knob: Knob, value: Any, eff: Mapping[str, Any], ref_eff: Mapping[str, Any]) -> str | None:
    """``None`` if the engine runs with ``value``; else why the knob is not applicable."""
    if knob.key not in eff:
        return f"the engine does not report {knob.key}, so the change cannot be verified"
    ok, got = _takes(knob, value, eff)
    if ok:
        return None
    return (f"asked for {knob.field}={value!r}, the running engine reports {knob.key}={got!r} "
            f"(reference: {_effective_value(ref_eff, knob)!r}): this platform does not honour it")


def _error_chain(err: BaseException) -> str:
    """The messages of an exception and its causes (vLLM wraps the worker's error)."""
    parts, seen = [], set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        parts.append(traceback.format_exception_only(type(e), e)[-1].strip())
        e = e.__cause__ or e.__context__
    return " <- ".join(parts)[:600]


def resolved_reason(model: str, knob: Knob, settings: EngineSettings, value: Any) -> str | None:
    """Why vLLM's own configuration step already drops the knob on this platform.

    The step is ``EngineArgs.create_engine_config``; no engine is started.

    Parameters
    ----------
    model : str
        The model.
    knob : Knob
        The knob.
    settings : EngineSettings
        The settings with the knob changed.
    value : object
        The value the knob was set to.

    Returns
    -------
    str or None
        The reason; ``None`` if vLLM keeps the value, cannot resolve the settings (the real start
        will say why), or the check does not apply (settings given through the environment are only
        visible in a started engine).
    """
    if settings.env():
        return None
    from rlparity.capture.audit import resolve_kwargs
    from rlparity.capture.engine_config import cpu_engine_kwargs

    try:
        eff = resolve_kwargs({**cpu_engine_kwargs(settings), "model": model, **settings.to_engine_kwargs()})
    except Exception:
        return None  # let the real start say what is wrong
    ok, got = _takes(knob, value, eff)
    if knob.key in eff and not ok:
        return (f"vLLM {library_versions()['vllm'] or '?'} resolves {knob.field}={value!r} to {knob.key}={got!r} on this platform "
                "(EngineArgs.create_engine_config, before any engine starts): not honoured here")
    return None


@dataclass(frozen=True)
class BatchProbe:
    """The batch-composition probe each arm's engine runs (:func:`batch_composition`).

    Parameters
    ----------
    sizes : sequence of int, default (1, 2, 4, 8)
        The batch sizes; empty: no probe.
    prompt : str, optional
        The probed prompt; ``None`` means the first prompt of the ablation. The rest of each batch
        is filled with the other prompts.
    max_tokens : int, default 16
        Tokens per request.
    """

    sizes: Sequence[int] = (1, 2, 4, 8)
    prompt: str | None = None
    max_tokens: int = 16


def _warm(engine, prompts, sampling: SamplingSettings) -> None:
    """A prefill-only pass over the prompts (fills the prefix cache, as an earlier RL step would)."""
    engine.capture(list(prompts), sampling.model_copy(update={"max_tokens": 1}), progress=False)


def ablation(model: str | os.PathLike, prompts: Sequence, sampling: SamplingSettings | None = None, *,
             reference: str | os.PathLike | EngineSettings | None = None,
             knobs: Sequence[str | Knob] = DEFAULT_KNOBS, engine: Mapping[str, Any] | None = None,
             scorer=None, pool=None, warmup: bool = True, batch: BatchProbe | None = BatchProbe(),
             progress: bool = False, budget_s: float | None = None) -> dict[str, xr.Dataset]:
    """Run the reference and one arm per knob; return ``{arm: scored trace}``.

    Engines come from ``pool``, one at a time. The plan, with the knobs that were not applicable
    and why, is in every arm's ``attrs["ablation"]``.

    Parameters
    ----------
    model : str or os.PathLike
        The model both the engines and the scorer load.
    prompts : sequence
        The prompts every arm captures (at least one; see :func:`shared_prefix_prompts`).
    sampling : SamplingSettings, optional
        The sampling of every arm; ``None`` means :func:`rlparity.config.defaults.default_sampling`.
    reference : str, os.PathLike or EngineSettings, optional
        A profile name, a YAML path or settings; ``None`` means the default profile
        (:func:`rlparity.config.defaults`, ``pipelinerl-parity``).
    knobs : sequence of str or Knob, default DEFAULT_KNOBS
        Names of built-in knobs (:data:`KNOBS`) or :class:`Knob` objects.
    engine : Mapping, optional
        Overrides applied to the reference for every arm (e.g. ``{"dtype": "float32"}`` to pin the
        body to the trainer's precision so the path differences are not buried under the dtype gap).
    scorer : rlparity.score.Scorer, optional
        The trainer side; ``None`` means an fp32 body and head.
    pool : EnginePool, optional
        Where engines come from; ``None`` means the shared pool.
    warmup : bool, default True
        Run a prefill-only pass over the prompts first, so prefix caching has blocks to hit, as it
        has when an RL loop samples the same prompts again.
    batch : BatchProbe or None, default BatchProbe()
        Every arm's engine also runs :func:`batch_composition` (stored in the arm as ``batch_*``
        variables); ``None``: no probe.
    progress : bool, default False
        Show progress bars.
    budget_s : float, optional
        A knob whose engine would start after this many seconds of the run is not started: it
        keeps its row as not applicable, the reason saying the budget ran out (a GPU call with a
        hard time limit returns the arms that ran instead of nothing). ``None``: no limit.

    Returns
    -------
    dict of str to xarray.Dataset
        Arm ``reference`` plus one per knob that ran, each scored.

    Raises
    ------
    ValueError
        If no prompt is given or a knob name is unknown.
    """
    from rlparity.capture.pool import shared_pool
    from rlparity.config.profiles import load_profile
    from rlparity.score import Scorer

    if not len(prompts):
        raise ValueError("ablation needs at least one prompt")
    knob_list = _knob_list(knobs)
    reference = defaults().profile if reference is None else reference
    ref_settings = load_profile(reference)
    if engine:
        ref_settings = ref_settings.replace(**dict(engine))
    sampling = sampling or default_sampling()
    pool = pool or shared_pool()
    scorer = scorer or Scorer(model, dtype="float32", head_dtype="float32", progress=progress)
    ref_name = reference if isinstance(reference, str) else getattr(reference, "name", "settings")
    runner = _ArmRunner(model, prompts, sampling, pool, scorer, warmup, batch, progress)

    arms: dict[str, xr.Dataset] = {}
    t0 = time.perf_counter()
    ref_trace, ref_eff = runner.run(REFERENCE, ref_settings)
    arms[REFERENCE] = ref_trace
    plan: list[dict[str, Any]] = [{"arm": REFERENCE, "knob": REFERENCE, "field": "", "value": "", "reference_value": "",
                                   "status": "ran", "reason": f"profile {ref_name} with {dict(engine or {})}"}]
    for knob in knob_list:
        entry, trace = _knob_arm(runner, knob, ref_settings, ref_eff, budget_s, t0)
        plan.append(entry)
        if trace is not None:
            arms[knob.name] = trace
    record = {"reference": str(ref_name), "overrides": dict(engine or {}), "warmup": warmup,
              "knobs": [asdict(k) for k in knob_list], "plan": plan}
    for name, tr in arms.items():
        tr.attrs["arm"] = name
        tr.attrs["ablation"] = {**record, "knob": name}
    return arms


def _knob_list(knobs: Sequence[str | Knob]) -> list[Knob]:
    """The knobs, built-in ones by name; an unknown name is an error."""
    knob_list = []
    for k in knobs:
        if isinstance(k, Knob):
            knob_list.append(k)
        elif k in KNOBS:
            knob_list.append(KNOBS[k])
        else:
            raise ValueError(f"unknown knob {k!r}; built-in knobs: {', '.join(KNOBS)} "
                             "(or pass rlparity.experiments.ablation.Knob(...))")
    return knob_list


@dataclass(frozen=True)
class _ArmRunner:
    """How every arm of an ablation is captured: its engine from ``pool``, the warm-up, the capture,
    the batch probe, then the trainer's scoring."""

    model: Any
    prompts: Sequence
    sampling: SamplingSettings
    pool: Any
    scorer: Any
    warmup: bool
    batch: BatchProbe | None
    progress: bool

    def run(self, arm: str, settings: EngineSettings) -> tuple[xr.Dataset, dict]:
        """The scored trace of ``arm`` under ``settings`` and the engine's effective settings."""
        prompts, sampling, batch = self.prompts, self.sampling, self.batch
        eng = self.pool.get(self.model, settings)
        if self.warmup:
            _warm(eng, prompts, sampling)
        tr = eng.capture(list(prompts), sampling, arm=arm, progress=self.progress)
        if batch is not None and batch.sizes:
            bc = batch_composition(eng, batch.prompt or prompts[0], batch_sizes=batch.sizes,
                                   fillers=prompts[1:], max_tokens=batch.max_tokens)
            tr = tr.assign({f"batch_{k}": v for k, v in bc.data_vars.items()})
            tr = tr.assign_coords(bc.coords)
        return self.scorer.score(tr), arm_record(tr).effective.to_attrs()


def _knob_arm(runner: _ArmRunner, knob: Knob, ref_settings: EngineSettings, ref_eff: Mapping[str, Any],
              budget_s: float | None, t0: float) -> tuple[dict[str, Any], xr.Dataset | None]:
    """One knob's row of the plan and its scored trace (``None`` where it did not run: not
    applicable, dropped by vLLM's configuration, out of the time budget, refused by the engine, or
    not honoured)."""
    entry = {"arm": knob.name, "knob": knob.name, "field": knob.field, "description": knob.description,
             "reference_value": _effective_value(ref_eff, knob)}
    try:
        settings, value = knob_settings(knob, ref_settings, ref_eff)
    except ValueError as err:
        return {**entry, "value": knob.value, "status": "not_applicable", "reason": str(err)}, None
    entry["value"] = value
    pre = resolved_reason(str(runner.model), knob, settings, value)
    if pre is None and budget_s is not None and time.perf_counter() - t0 > budget_s:
        pre = f"not run: the run's time budget of {budget_s:g} s ran out before this knob's engine started"
    if pre is not None:
        return {**entry, "status": "not_applicable", "reason": pre}, None
    try:
        trace, eff = runner.run(knob.name, settings)
    except Exception as err:  # the engine refused the setting: recorded, not dropped
        runner.pool.close()
        return {**entry, "status": "not_applicable",
                "reason": f"the engine did not start with {knob.field}={value!r}: {_error_chain(err)} "
                          "(the engine log above has the worker's traceback)"}, None
    reason = _honoured(knob, value, eff, ref_eff)
    if reason is not None:
        return {**entry, "status": "not_applicable", "reason": reason}, None
    return {**entry, "status": "ran", "reason": ""}, trace


# ------------------------------------------------------------------------------ batch composition
def batch_composition(engine, prompt, *, batch_sizes: Sequence[int] = (1, 2, 4, 8), fillers: Sequence = (),
                      max_tokens: int = 16) -> xr.Dataset:
    """The same prompt at temperature 0 inside batches of each size: the greedy tokens and logprobs it gets in each.

    In a batch-invariant engine every row is identical.

    Parameters
    ----------
    engine : Engine
        The engine (anything with rlparity's ``capture``).
    prompt : Prompt
        The probed prompt.
    batch_sizes : sequence of int, default (1, 2, 4, 8)
        The batch sizes (deduplicated, sorted).
    fillers : sequence, optional
        The other requests of each batch, cycled; empty means ``prompt`` itself.
    max_tokens : int, default 16
        Tokens per request.

    Returns
    -------
    xarray.Dataset
        ``token_id`` and ``logprob`` (nats), dims ``batch_size`` and ``batch_position``
        (-1 / NaN past the end).

    Raises
    ------
    ValueError
        If a batch size is below 1 or none is given.
    """
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
    fill = list(fillers) or [prompt]
    greedy = SamplingSettings(temperature=0.0, max_tokens=max_tokens, seed=0)
    tokens = np.full((len(sizes), max_tokens), -1, dtype=np.int64)
    logps = np.full((len(sizes), max_tokens), np.nan)
    for i, b in enumerate(sizes):
        batch = [prompt] + [fill[j % len(fill)] for j in range(b - 1)]
        tr = engine.capture(batch, greedy, progress=False)
        row = int(np.flatnonzero(tr["prompt_index"].values == 0)[0])
        m = tr["response_mask"].values[row].astype(bool)
        n = min(int(m.sum()), max_tokens)
        tokens[i, :n] = tr["token_id"].values[row][m][:n]
        logps[i, :n] = tr["rollout_logprob"].values[row][m][:n]
    return xr.Dataset(
        {"token_id": (("batch_size", "batch_position"), tokens),
         "logprob": (("batch_size", "batch_position"), logps, {"units": "nats"})},
        coords={"batch_size": sizes, "batch_position": np.arange(max_tokens)},
    )


__all__ = ["DEFAULT_KNOBS", "KNOBS", "REFERENCE", "BatchProbe", "Knob", "ablation", "batch_composition", "knob_settings",
           "resolved_reason", "shared_prefix_prompts"]
