"""The bisection's run: the baseline and the floor, one engine per knob, the pairs, the layers.

:func:`bisect` builds a :class:`Bisection` from its options (one :class:`BisectOptions`) and runs it:
every arm goes through one method, which records each arm as ``ran``,
``not_applicable`` or ``skipped`` with why, within the budget of engine starts and the deadline.
Part of :mod:`rlparity.experiments.bisect`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import xarray as xr

from rlparity.config.settings import EngineSettings, with_overrides
from rlparity.experiments.ablation import _error_chain, _honoured, resolved_reason
from rlparity.experiments.bisect.knobs import BASELINE, DEFAULT_KNOBS, FLOOR, LAYER_STARTS, PAIRS, BisectKnob, \
    _knob, _settings_for
from rlparity.experiments.bisect.layers import localise
from rlparity.experiments.bisect.pairs import pair_name, pair_plan, winner
from rlparity.trace import arm_name, arm_record


@dataclass(frozen=True)
class BisectOptions:
    """What :func:`bisect` tries: which knobs, within which budget, on which replay path, whether pairs
    and the layers follow.

    Parameters
    ----------
    knobs : sequence of str or BisectKnob, default DEFAULT_KNOBS
        The knobs, in the order their engines start (the budget cuts the tail).
    budget : int, optional
        Most engine starts tried (a start the engine refuses counts), the baseline's, the pairs' and
        the layer hand-off's included (at least 1; an engine already live in the pool costs none;
        with ``layers`` the hand-off's :data:`LAYER_STARTS` are kept back from the pairs); ``None``:
        no limit.
    mode : {"auto", "prefill", "decode"}, default "auto"
        The replay path (:func:`rlparity.capture.replay.replay_modes`).
    pairs : {"auto", "always", "never"}, default "auto"
        Pairs of knobs (:func:`~rlparity.experiments.bisect.pairs.pair_plan`).
    share : float, optional
        The share of the gap one knob must close; ``None``: ``defaults().bisect_explained_share``.
    layers : bool, default False
        Hand the winning arm's worst tokens to the per-layer localisation
        (:func:`~rlparity.experiments.bisect.layers.localise`).
    layer_tokens : int, optional
        How many worst tokens; ``None``: ``defaults().replay_layers_tokens``.
    deadline_s : float, optional
        No engine starts after this many seconds from the start (what is left is listed as skipped);
        a GPU call of bounded length.
    progress : bool, default False
        vLLM's progress bars.
    """

    knobs: Sequence[str | BisectKnob] = DEFAULT_KNOBS
    budget: int | None = None
    mode: str = "auto"
    pairs: str = "auto"
    share: float | None = None
    layers: bool = False
    layer_tokens: int | None = None
    deadline_s: float | None = None
    progress: bool = False


class Bisection:
    """One bisection of ``trace``'s tokens: the arms replayed so far, the plan, the engine starts.

    Built once and run once (:meth:`run`); the checks that need no engine are made when it is built.

    Parameters
    ----------
    model : str or os.PathLike
        The model the trace was captured with.
    trace : xarray.Dataset
        The source arm; with trainer numbers (a scored trace) the pair rule can be judged.
    options : BisectOptions
        What is tried.
    settings : EngineSettings, optional
        The capture's settings; ``None`` reads them from the trace
        (:func:`rlparity.capture.replay.capture_settings`).
    pool : EnginePool, optional
        Where engines come from; ``None``: a pool of its own, closed at the end of :meth:`run`.
    log : callable, optional
        Called with one line per engine start.

    Raises
    ------
    ValueError
        If the trace records no settings and none are given, the budget is below 1, a knob, the
        mode or ``pairs`` is unknown.
    """

    def __init__(self, model: str | os.PathLike, trace: xr.Dataset, options: BisectOptions, *,
                 settings: EngineSettings | None = None, pool=None, log: Callable[[str], None] | None = None):
        from rlparity.capture.pool import EnginePool
        from rlparity.capture.replay import capture_settings, replay_modes

        o = options
        if o.budget is not None and o.budget < 1:
            raise ValueError(f"--budget {o.budget}: the baseline needs one engine start; give at least 1")
        if o.pairs not in PAIRS:
            raise ValueError(f"--pairs {o.pairs!r}: use {', '.join(PAIRS)}")
        self.knobs = [_knob(k) for k in o.knobs]
        ref = settings or capture_settings(trace)
        if ref is None:
            raise ValueError("the trace records no engine settings (attrs engine_requested): give them (--engine "
                             "JSON or --profile NAME)")
        modes, self.why_not = replay_modes(str(model), ref, "auto" if o.mode == "auto" else o.mode)
        self.model, self.trace, self.options, self.ref, self.use = model, trace, o, ref, modes[0]
        self.own = pool is None
        self.pool = pool or EnginePool()
        self.say = log or (lambda m: None)
        self.t0, self.starts0 = time.perf_counter(), self.pool.starts
        self.arms: dict[str, xr.Dataset] = {}
        self.plan: list[dict[str, Any]] = []
        self.attempts = 0  # engine starts tried (one that fails costs its time too): what the budget bounds
        self.chosen: dict[str, tuple[EngineSettings, bool]] = {}  # arm -> (settings, warm)
        self.values: dict[str, Any] = {}  # knob -> the value it was flipped to alone
        self.ref_eff: dict[str, Any] = {}
        self.pair_rec: dict[str, Any] = {"needed": False, "why": "not reached"}
        self.layer_rec: dict[str, Any] | None = None

    def run(self) -> tuple[dict[str, xr.Dataset], dict[str, Any]]:
        """The baseline and the floor, the single knobs, the pairs, the layers; then the record.

        Returns
        -------
        tuple of (dict of str to xarray.Dataset, dict)
            The arms and the record, as :func:`bisect` returns them (the record also in every arm's
            ``attrs["bisect"]``).
        """
        try:
            self._baseline()
            self._singles()
            self._pairs()
            self._layers()
        finally:
            if self.own:
                self.pool.close()
        record = self._record()
        for ds in self.arms.values():
            ds.attrs["bisect"] = record
        return self.arms, record

    def _late(self) -> bool:
        deadline = self.options.deadline_s
        return deadline is not None and time.perf_counter() - self.t0 > deadline

    def _baseline(self) -> None:
        """The capture's settings replayed twice on one engine: the baseline and the floor."""
        from rlparity.capture.replay import replay, replay_engine_settings

        self.say(f"bisect: baseline engine ({self.use} replay)")
        settings = replay_engine_settings(self.ref, self.trace, self.use)
        self.attempts += 0 if self.pool.holds(self.model, settings) else 1
        eng = self.pool.get(self.model, settings)
        for name in (BASELINE, FLOOR):
            self.arms[name] = replay(eng, self.trace, mode=self.use, arm=name, progress=self.options.progress)
        self.ref_eff = arm_record(self.arms[BASELINE]).effective.to_attrs()
        self.chosen[BASELINE] = (self.ref, False)

    def _singles(self) -> None:
        """One arm per knob, that knob flipped on the capture's settings."""
        for k in self.knobs:
            entry: dict[str, Any] = {"knob": k.name, "field": k.knob.field, "description": k.knob.description,
                                     "reference_value": self.ref_eff.get(k.knob.key,
                                                                         getattr(self.ref, k.knob.field, None))}
            try:
                s, value = _settings_for(k, self.ref, self.ref_eff)
            except ValueError as err:
                self.plan.append({**entry, "value": k.knob.value, "status": "not_applicable", "reason": str(err)})
                continue
            self.values[k.name] = value
            self._run_arm(f"knob_{k.name}", [(k, value)], s, {**entry, "value": value})

    def _pairs(self) -> None:
        """The pairs :func:`~rlparity.experiments.bisect.pairs.pair_plan` picks from the singles' rows, within what is left of the budget."""
        from rlparity.metrics.replay import knob_table

        o = self.options
        singles = [f"knob_{k.name}" for k in self.knobs if f"knob_{k.name}" in self.arms]
        rows = [{**r, "knob": r["knob"].removeprefix("knob_")}
                for r in knob_table(self.arms, baseline=BASELINE, floor=FLOOR, knobs=singles, top=0)]
        reserve = LAYER_STARTS if o.layers else 0
        left = None if o.budget is None else max(o.budget - self.attempts - reserve, 0)
        self.pair_rec = pair_plan(rows, {k.name: k.knob.field for k in self.knobs}, budget_left=left, share=o.share,
                                  pairs=o.pairs)
        by_name = {k.name: k for k in self.knobs}
        for a, b in self.pair_rec["run"]:
            self._run_pair(by_name[a], by_name[b])
        for sk in self.pair_rec["skipped"]:
            self.plan.append({"knob": sk["pair"], "pair": list(sk["knobs"]), "status": "skipped",
                              "reason": sk["reason"]})

    def _run_pair(self, ka: BisectKnob, kb: BisectKnob) -> None:
        a, b = ka.name, kb.name
        sa, _ = _settings_for(ka, self.ref, self.ref_eff)
        s, _ = _settings_for(kb, sa, self.ref_eff)
        s = s.replace(**{kb.knob.field: self.values[b]})  # b's value as it was flipped alone
        entry = {"knob": pair_name(a, b), "field": f"{ka.knob.field}+{kb.knob.field}",
                 "description": f"{ka.knob.description}; {kb.knob.description}",
                 "value": [self.values[a], self.values[b]], "pair": [a, b]}
        self._run_arm(f"pair_{pair_name(a, b)}", [(ka, self.values[a]), (kb, self.values[b])], s, entry)

    def _layers(self) -> None:
        o = self.options
        if o.layers and self._late():
            self.layer_rec = {"status": "skipped",
                              "reason": f"deadline: {o.deadline_s:g} s spent before the layer hand-off"}
        elif o.layers:
            self.layer_rec = self._hand_off()
            self.attempts += self.layer_rec.get("engine_start_attempts", 0)

    def _hand_off(self) -> dict[str, Any]:
        """The winner's worst tokens to :func:`~rlparity.experiments.bisect.layers.localise`, within the budget (``engine_start_attempts`` counted)."""
        best = winner(self.arms)
        if best is None:
            return {"status": "not_run", "reason": "no knob or pair moved any token beyond the replay floor",
                    "engine_start_attempts": 0}
        name, row = best
        s, warm = self.chosen[name]
        budget, pool = self.options.budget, self.pool
        need = sum(not pool.holds(self.model, x.replace(enforce_eager=True)) for x in (self.ref, s))
        if budget is not None and self.attempts + need > budget:
            return {"status": "skipped", "arm": name, "engine_start_attempts": 0,
                    "reason": f"--budget {budget}: {need} engine start(s) needed, {max(budget - self.attempts, 0)} "
                              "left"}
        label = name.removeprefix("knob_").removeprefix("pair_")
        try:
            rec = localise(self.model, self.arms[name], self.arms[BASELINE], settings=s, reference=self.ref,
                           warm=warm, tokens=self.options.layer_tokens, pool=pool, label=label, log=self.say)
        except Exception as err:  # noqa: BLE001 - the bisection's result stands; the record says why
            pool.close()
            return {"status": "failed", "arm": name, "reason": _error_chain(err), "engine_start_attempts": need}
        return {**rec, "arm": name, "explained": row.get("explained"), "floor_units": row.get("floor_units"),
                "basis": row["basis"], "engine_start_attempts": rec.get("engine_starts", need)}

    def _refused(self, parts: Sequence[tuple[BisectKnob, Any]], s: EngineSettings) -> dict[str, str] | None:
        """Why an arm that needs an engine start does not get one: vLLM resolves the knob away, the
        budget or the deadline is spent; ``None`` when it starts."""
        o = self.options
        pre = next((r for k, v in parts for r in [resolved_reason(str(self.model), k.knob, s, v)] if r), None)
        if pre is not None:
            return {"status": "not_applicable", "reason": pre}
        if o.budget is not None and self.attempts >= o.budget:
            return {"status": "skipped", "reason": f"--budget {o.budget}: the engine starts were spent before this arm"}
        if self._late():
            return {"status": "skipped", "reason": f"deadline: {o.deadline_s:g} s spent before this arm"}
        return None

    def _run_arm(self, name: str, parts: Sequence[tuple[BisectKnob, Any]], s: EngineSettings,
                 entry: dict[str, Any]) -> None:
        """Replay the trace under ``s`` (the knobs ``parts`` flipped) as the arm ``name``; the plan
        records ``entry`` as ``ran``, ``not_applicable`` or ``skipped`` with why."""
        from rlparity.capture.replay import replay, replay_engine_settings

        engine_settings = replay_engine_settings(s, self.trace, self.use)
        needs_start = not self.pool.holds(self.model, engine_settings)
        refused = self._refused(parts, s) if needs_start else None
        if refused is not None:
            self.plan.append({**entry, **refused})
            return
        warm = any(k.warm for k, _ in parts)
        try:
            if needs_start:
                self.attempts += 1
                self.say(f"bisect: engine for {name}")
            eng = self.pool.get(self.model, engine_settings)
            eff = eng.effective_config()
            reason = next((r for k, v in parts for r in [_honoured(k.knob, v, eff, self.ref_eff)] if r), None)
            if reason is not None:
                self.plan.append({**entry, "status": "not_applicable", "reason": reason})
                return
            self.arms[name] = replay(eng, self.trace, mode=self.use, warm=warm, arm=name,
                                     progress=self.options.progress)
        except Exception as err:  # the engine refused the setting: recorded, not dropped
            self.pool.close()
            self.plan.append({**entry, "status": "not_applicable",
                              "reason": f"the engine did not run with {entry['field']}={entry.get('value')!r}: "
                                        f"{_error_chain(err)}"})
            return
        self.chosen[name] = (s, warm)
        note = ("a prefill replay never reads the prefix cache unless warm (vLLM skips it for prompt_logprobs): "
                "this arm differs from the baseline only by what the cache setting changes otherwise"
                if self.use == "prefill" and not warm and any(k.knob.field == "enable_prefix_caching" for k, _ in parts)
                else "")
        self.plan.append({**entry, "status": "ran", "reason": "", "note": note})

    def _record(self) -> dict[str, Any]:
        o = self.options
        return {"mode": self.use, "modes_not_run": self.why_not, "settings": self.ref.model_dump(), "budget": o.budget,
                "engine_starts": self.pool.starts - self.starts0, "engine_start_attempts": self.attempts,
                "wall_s": round(time.perf_counter() - self.t0, 3),
                "knobs": [{**asdict(k.knob), "warm": k.warm} for k in self.knobs], "plan": self.plan,
                "deadline_s": o.deadline_s, "source_arm": str(arm_name(self.trace, "trace")),
                "pairs": self.pair_rec,
                "layers": self.layer_rec if o.layers else {
                    "status": "not_asked", "reason": "bisect --layers hands the winner's worst tokens to rlparity "
                                                     "layers"}}


def bisect(model: str | os.PathLike, trace: xr.Dataset, options: BisectOptions | None = None, *,
           settings: EngineSettings | None = None, pool=None, log: Callable[[str], None] | None = None,
           **overrides: Any) -> tuple[dict[str, xr.Dataset], dict[str, Any]]:
    r"""Replay ``trace``'s tokens under its own settings twice, then once per knob, then pairs where no
    knob explains the gap, then (``layers``) localise the winner's worst tokens; return the arms and the plan.

    Parameters
    ----------
    model : str or os.PathLike
        The model the trace was captured with.
    trace : xarray.Dataset
        The source arm (a capture, a run's step, an import); with trainer numbers (a scored trace)
        the pair rule can be judged.
    options : BisectOptions, optional
        The knobs, the budget, the replay path, the pairs, the layers, the deadline; ``None`` means
        ``BisectOptions()`` (every knob, no budget, no layers).
    settings : EngineSettings, optional
        The capture's settings; ``None`` reads them from the trace
        (:func:`rlparity.capture.replay.capture_settings`).
    pool : EnginePool, optional
        Where engines come from; ``None``: a pool of its own, closed at the end.
    log : callable, optional
        Called with one line per engine start.
    \*\*overrides
        Fields of :class:`BisectOptions` (``knobs=``, ``budget=``, ``mode=``, ``pairs=``, ``share=``,
        ``layers=``, ``layer_tokens=``, ``deadline_s=``, ``progress=``), replacing those of ``options``.

    Returns
    -------
    tuple of (dict of str to xarray.Dataset, dict)
        The arms (``replay_baseline``, ``replay_floor``, ``knob_<name>`` per knob that ran,
        ``pair_<a>+<b>`` per pair that ran) and the record: mode, settings, ``plan`` (one entry per
        knob and pair: ``ran``, ``not_applicable`` or ``skipped``, with the reason), ``pairs``
        (:func:`~rlparity.experiments.bisect.pairs.pair_plan`'s decision), ``layers``
        (:func:`~rlparity.experiments.bisect.layers.localise`'s result, or why not),
        ``engine_starts`` (started), ``engine_start_attempts`` (tried: what the budget bounds) and
        ``wall_s``. Also in every arm's ``attrs["bisect"]``.

    Raises
    ------
    ValueError
        If the trace records no settings and none are given, the budget is below 1, a knob, the
        mode or ``pairs`` is unknown.
    TypeError
        If an override is not a field of :class:`BisectOptions`.
    """
    o = with_overrides(options or BisectOptions(), overrides, "bisect")
    return Bisection(model, trace, o, settings=settings, pool=pool, log=log).run()


__all__ = ["BisectOptions", "Bisection", "bisect"]
