"""Bisect on the user's own tokens: replay them under the capture's settings, then one knob at a time.

From the capture's own engine settings (recorded in the trace, or given), the trace's tokens are
replayed twice under those settings (the baseline and the **replay floor**: what the engine
changes on its own), then once per knob with that single setting flipped. Every replayed arm holds
the same tokens and the source's trainer numbers, so each knob's shift is measured on exactly the
user's tokens (:func:`rlparity.metrics.replay.knob_table`), in units of the floor, with the tokens it
moves most.

Knobs (:data:`KNOBS`) reuse the inference-path ablation's (:mod:`rlparity.experiments.ablation`):
prefix caching on/off and a warm against a cold cache, async scheduling, eager against compiled,
one sequence at a time (``max_num_seqs=1``), chunked prefill, the LM head's precision (float32
against bfloat16), another attention backend and batch-invariant kernels. A knob the platform does
not honour (vLLM resolves it away, the engine refuses it, or the running engine reports the
reference value) is recorded as not applicable with the reason; one past the ``budget`` of engine
starts is recorded as skipped. Pairs of knobs are not bisected yet (the record says so).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import xarray as xr

from rlparity.config.settings import EngineSettings
from rlparity.experiments.ablation import KNOBS as ABLATION_KNOBS, Knob, _error_chain, _honoured, knob_settings, \
    resolved_reason

BASELINE = "replay_baseline"
FLOOR = "replay_floor"
WARM = "prefix_cache_warm"
PAIRS_TODO = ("pairs of knobs are not bisected yet: where no single knob explains the gap, flip two at a time by hand "
              "(rlparity replay --engine ...)")


@dataclass(frozen=True)
class BisectKnob:
    """One knob of the bisection: an engine setting to change, or a warm prefix cache.

    Parameters
    ----------
    knob : Knob
        The setting (:class:`rlparity.experiments.ablation.Knob`); for ``warm`` the prefix cache is
        switched on.
    warm : bool, default False
        Replay against a warm prefix cache (the prompts prefilled first) instead of a cold one.
    toggle : tuple, optional
        Two values: the knob takes the one the reference does not have (``head_dtype``).
    """

    knob: Knob
    warm: bool = False
    toggle: tuple[Any, Any] | None = None

    @property
    def name(self) -> str:
        """The knob's name (also its arm's: ``knob_<name>``)."""
        return self.knob.name


KNOBS: dict[str, BisectKnob] = {k.name: k for k in (
    BisectKnob(ABLATION_KNOBS["prefix_caching"]),
    BisectKnob(Knob(WARM, "enable_prefix_caching", True, "prompts prefilled first: the replay reads their KV from "
                    "the prefix cache"), warm=True),
    BisectKnob(ABLATION_KNOBS["async_scheduling"]),
    BisectKnob(ABLATION_KNOBS["eager"]),
    BisectKnob(Knob("max_num_seqs", "max_num_seqs", 1, "one sequence at a time (batch 1)")),
    BisectKnob(ABLATION_KNOBS["chunked_prefill"]),
    BisectKnob(Knob("head_precision", "head_dtype", None, "LM head in the other precision (float32 / bfloat16)"),
               toggle=("float32", "bfloat16")),
    BisectKnob(ABLATION_KNOBS["attention_backend"]),
    BisectKnob(ABLATION_KNOBS["batch_invariant"]),
)}
DEFAULT_KNOBS = tuple(KNOBS)


def _knob(k: str | BisectKnob) -> BisectKnob:
    if isinstance(k, BisectKnob):
        return k
    if k not in KNOBS:
        raise ValueError(f"unknown knob {k!r}; knobs: {', '.join(KNOBS)}")
    return KNOBS[k]


def _settings_for(k: BisectKnob, ref: EngineSettings, ref_eff: Mapping[str, Any]) -> tuple[EngineSettings, Any]:
    if k.toggle is not None:
        current = ref_eff.get(k.knob.key) or getattr(ref, k.knob.field)
        value = k.toggle[1] if str(current) == str(k.toggle[0]) or current in (None, "model") else k.toggle[0]
        return ref.replace(**{k.knob.field: value}), value
    return knob_settings(k.knob, ref, ref_eff)


def bisect(model: str | os.PathLike, trace: xr.Dataset, *, settings: EngineSettings | None = None,
           knobs: Sequence[str | BisectKnob] = DEFAULT_KNOBS, budget: int | None = None, mode: str = "auto",
           pool=None, progress: bool = False, log: Callable[[str], None] | None = None
           ) -> tuple[dict[str, xr.Dataset], dict[str, Any]]:
    """Replay ``trace``'s tokens under its own settings twice, then once per knob; return the arms and the plan.

    Parameters
    ----------
    model : str or os.PathLike
        The model the trace was captured with.
    trace : xarray.Dataset
        The source arm (a capture, a run's step, an import).
    settings : EngineSettings, optional
        The capture's settings; ``None`` reads them from the trace
        (:func:`rlparity.capture.replay.capture_settings`).
    knobs : sequence of str or BisectKnob, default DEFAULT_KNOBS
        The knobs, in the order their engines start (the budget cuts the tail).
    budget : int, optional
        Most engine starts tried (a start the engine refuses counts), the baseline's included (at
        least 1; a baseline engine already live in ``pool`` costs none); ``None``: no limit.
    mode : {"auto", "prefill", "decode"}, default "auto"
        The replay path (:func:`rlparity.capture.replay.replay_modes`).
    pool : EnginePool, optional
        Where engines come from; ``None``: a pool of its own, closed at the end.
    progress : bool, default False
        vLLM's progress bars.
    log : callable, optional
        Called with one line per engine start.

    Returns
    -------
    tuple of (dict of str to xarray.Dataset, dict)
        The arms (``replay_baseline``, ``replay_floor``, ``knob_<name>`` per knob that ran) and the
        record: mode, settings, ``plan`` (one entry per knob: ``ran``, ``not_applicable`` or
        ``skipped``, with the reason), ``engine_starts`` (started), ``engine_start_attempts`` (tried: what
        the budget bounds), ``wall_s`` and the pairs TODO. Also in
        every arm's ``attrs["bisect"]``.

    Raises
    ------
    ValueError
        If the trace records no settings and none are given, the budget is below 1, a knob or the
        mode is unknown.
    """
    from rlparity.capture.pool import EnginePool
    from rlparity.capture.replay import capture_settings, replay, replay_engine_settings, replay_modes

    if budget is not None and budget < 1:
        raise ValueError(f"--budget {budget}: the baseline needs one engine start; give at least 1")
    knob_list = [_knob(k) for k in knobs]
    ref = settings or capture_settings(trace)
    if ref is None:
        raise ValueError("the trace records no engine settings (attrs engine_requested): give them (--engine JSON "
                         "or --profile NAME)")
    modes, why_not = replay_modes(str(model), ref, "auto" if mode == "auto" else mode)
    use = modes[0]
    own = pool is None
    pool = pool or EnginePool()
    say = log or (lambda m: None)
    t0, starts0 = time.perf_counter(), pool.starts
    arms: dict[str, xr.Dataset] = {}
    plan: list[dict[str, Any]] = []

    def engine(s: EngineSettings):
        return pool.get(model, replay_engine_settings(s, trace, use))

    attempts = 0  # engine starts tried (one that fails costs its time too): what the budget bounds
    try:
        say(f"bisect: baseline engine ({use} replay)")
        attempts += 0 if pool.holds(model, replay_engine_settings(ref, trace, use)) else 1
        eng = engine(ref)
        arms[BASELINE] = replay(eng, trace, mode=use, arm=BASELINE, progress=progress)
        arms[FLOOR] = replay(eng, trace, mode=use, arm=FLOOR, progress=progress)
        ref_eff = arms[BASELINE].attrs["engine_effective"]
        for k in knob_list:
            entry: dict[str, Any] = {"knob": k.name, "field": k.knob.field, "description": k.knob.description,
                                     "reference_value": ref_eff.get(k.knob.key, getattr(ref, k.knob.field, None))}
            try:
                s, value = _settings_for(k, ref, ref_eff)
            except ValueError as err:
                plan.append({**entry, "value": k.knob.value, "status": "not_applicable", "reason": str(err)})
                continue
            entry["value"] = value
            needs_start = not pool.holds(model, replay_engine_settings(s, trace, use))
            pre = resolved_reason(str(model), k.knob, s, value) if needs_start else None
            if pre is None and needs_start and budget is not None and attempts >= budget:
                plan.append({**entry, "status": "skipped",
                             "reason": f"--budget {budget}: the engine starts were spent before this knob"})
                continue
            if pre is not None:
                plan.append({**entry, "status": "not_applicable", "reason": pre})
                continue
            try:
                if needs_start:
                    attempts += 1
                    say(f"bisect: engine for {k.name}={value!r}")
                eng = engine(s)
                eff = eng.effective_config()
                reason = _honoured(k.knob, value, eff, ref_eff)
                if reason is not None:
                    plan.append({**entry, "status": "not_applicable", "reason": reason})
                    continue
                arms[f"knob_{k.name}"] = replay(eng, trace, mode=use, warm=k.warm, arm=f"knob_{k.name}",
                                                progress=progress)
            except Exception as err:  # the engine refused the setting: recorded, not dropped
                pool.close()
                plan.append({**entry, "status": "not_applicable",
                             "reason": f"the engine did not run with {k.knob.field}={value!r}: {_error_chain(err)}"})
                continue
            note = ("a prefill replay never reads the prefix cache unless warm (vLLM skips it for prompt_logprobs): "
                    "this arm differs from the baseline only by what the cache setting changes otherwise"
                    if use == "prefill" and k.knob.field == "enable_prefix_caching" and not k.warm else "")
            plan.append({**entry, "status": "ran", "reason": "", "note": note})
    finally:
        if own:
            pool.close()
    record = {"mode": use, "modes_not_run": why_not, "settings": ref.model_dump(), "budget": budget,
              "engine_starts": pool.starts - starts0, "engine_start_attempts": attempts,
              "wall_s": round(time.perf_counter() - t0, 3),
              "knobs": [{**asdict(k.knob), "warm": k.warm} for k in knob_list], "plan": plan,
              "source_arm": str(trace.attrs.get("arm", "trace")), "pairs": PAIRS_TODO}
    for ds in arms.values():
        ds.attrs["bisect"] = record
    return arms, record


def report(arms: Mapping[str, xr.Dataset], source: xr.Dataset, record: Mapping[str, Any], *,
           tokenizer: Any = None, top: int | None = None) -> dict[str, Any]:
    """The bisection's report: replay against capture, the floor, and the ranked knobs.

    Parameters
    ----------
    arms : Mapping of str to xarray.Dataset
        What :func:`bisect` returned.
    source : xarray.Dataset
        The captured arm.
    record : Mapping
        :func:`bisect`'s record.
    tokenizer : transformers tokenizer, optional
        Names each top token's text (``token_text``).
    top : int, optional
        Tokens per knob; ``None`` means ``defaults().replay_top_tokens``.

    Returns
    -------
    dict
        ``mode``, ``replay_vs_capture`` (:func:`rlparity.metrics.replay.capture_gap` of the
        baseline), ``floor`` (:func:`rlparity.metrics.replay.replay_floor`), ``knobs`` (ranked rows of
        :func:`rlparity.metrics.replay.knob_table`, ``knob`` the knob's name and ``arm`` its arm), ``not_run`` (the plan's other entries),
        ``engine_starts``, ``engine_start_attempts``, ``budget``, ``wall_s``, ``pairs``.
    """
    from rlparity.metrics.replay import capture_gap, knob_table, replay_floor

    rows = knob_table(arms, baseline=BASELINE, floor=FLOOR, source=source, top=top)
    for r in rows:  # the arm knob_<name> is the knob <name>
        r["arm"], r["knob"] = r["knob"], r["knob"].removeprefix("knob_")
    if tokenizer is not None:
        for r in rows:
            for t in r["top_tokens"]:
                t["token_text"] = tokenizer.decode([t["token_id"]])
    return {"mode": record["mode"], "modes_not_run": record.get("modes_not_run", {}),
            "replay_vs_capture": capture_gap(arms[BASELINE], source),
            "floor": replay_floor(arms[BASELINE], arms[FLOOR]), "knobs": rows,
            "not_run": [p for p in record["plan"] if p["status"] != "ran"],
            "engine_starts": record["engine_starts"],
            "engine_start_attempts": record.get("engine_start_attempts"), "budget": record.get("budget"),
            "wall_s": record["wall_s"],
            "pairs": record.get("pairs")}


__all__ = ["BASELINE", "DEFAULT_KNOBS", "FLOOR", "KNOBS", "BisectKnob", "bisect", "report"]
