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
starts is recorded as skipped.

**Pairs** (:func:`pair_plan`): a single knob *explains* the gap when flipping it closes at least
``defaults().bisect_explained_share`` of the baseline replay's gap against the trainer
(:func:`rlparity.metrics.replay.explained_share`). Where none does, the knobs that moved at least
one token beyond the replay floor's largest ``|delta|`` are flipped two at a time, the pairs whose
two knobs close most of the gap first (then the larger summed shift), within what is left of the
budget; pairs of knobs that set the same engine field, and pairs past the budget, are listed as
skipped with why. Without trainer numbers the rule cannot be judged: pairs run only when forced.

**Layers** (:func:`localise`, ``bisect(..., layers=True)``): the winning arm's worst tokens go to
the per-layer localisation: the sequences that hold them run through an eager engine under the
baseline settings (twice: its run-to-run floor) and under the winning settings, and the first site
(:mod:`rlparity.trace.layers`) whose relative error leaves its floor is where they part.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.settings import EngineSettings
from rlparity.trace import arm_name, arm_record
from rlparity.experiments.ablation import KNOBS as ABLATION_KNOBS, Knob, _error_chain, _honoured, knob_settings, \
    resolved_reason

BASELINE = "replay_baseline"
FLOOR = "replay_floor"
WARM = "prefix_cache_warm"
PAIRS = ("auto", "always", "never")
LAYER_STARTS = 2  # the hand-off's engines: the baseline and the winner, both eager


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


def pair_name(a: str, b: str) -> str:
    """The name of the pair of knobs ``a`` and ``b`` (also its arm's: ``pair_<a>+<b>``).

    Parameters
    ----------
    a, b : str
        The two knobs' names, in the order the pair was planned.

    Returns
    -------
    str
        ``"<a>+<b>"``.
    """
    return f"{a}+{b}"


def pair_plan(rows: Sequence[Mapping[str, Any]], fields: Mapping[str, str], *, budget_left: int | None,
              share: float | None = None, pairs: str = "auto") -> dict[str, Any]:
    """Whether pairs of knobs are bisected, and which pairs run within the budget (no engine).

    The rule: a single knob explains the gap when its ``explained`` share (the part of the baseline
    replay's gap against the trainer its flip closes) is at least ``share``; otherwise the knobs
    that moved at least one token beyond the replay floor (``n_moved > 0``) are paired. Pairs run
    in order of the two knobs' summed ``explained`` (largest first; without trainer numbers 0), then
    the summed ``floor_units``, then the names; a pair of two knobs that set the same engine field
    is skipped (one setting cannot take two values), and pairs past ``budget_left`` are skipped.

    Parameters
    ----------
    rows : sequence of Mapping
        The single knobs' rows (:func:`rlparity.metrics.replay.knob_table`, ``knob`` the knob's name):
        ``knob``, ``explained`` (float or None), ``n_moved``, ``floor_units``.
    fields : Mapping of str to str
        Each knob's engine field.
    budget_left : int or None
        Engine starts left for pairs (one per pair); ``None``: no limit.
    share : float, optional
        The share a knob must close to explain the gap; ``None`` means
        ``defaults().bisect_explained_share``.
    pairs : {"auto", "always", "never"}, default "auto"
        ``auto``: by the rule; ``always``: pair the knobs that moved whatever the rule says (also
        without trainer numbers); ``never``: no pairs.

    Returns
    -------
    dict
        ``needed`` (bool), ``why`` (one line), ``rule``, ``share``, ``best`` (the single knob closing
        most: ``{"knob", "explained"}`` or None), ``candidates`` (the knobs that moved), ``run`` (the
        pairs to start, ``[a, b]`` in order) and ``skipped`` (``{"pair", "reason"}``).

    Raises
    ------
    ValueError
        For an unknown ``pairs``.
    """
    if pairs not in PAIRS:
        raise ValueError(f"--pairs {pairs!r}: use {', '.join(PAIRS)}")
    if share is None:
        from rlparity.config.defaults import defaults

        share = defaults().bisect_explained_share
    rule = (f"pairs run when no single knob closes at least {share:g} of the baseline replay's gap against the "
            "trainer (defaults().bisect_explained_share)")
    scored = [r for r in rows if r.get("explained") is not None]
    best = max(scored, key=lambda r: (r["explained"], r["knob"]), default=None)
    out: dict[str, Any] = {"rule": rule, "share": share, "needed": False, "candidates": [], "run": [], "skipped": [],
                           "best": None if best is None else {"knob": best["knob"], "explained": best["explained"]}}
    if pairs == "never":
        return {**out, "why": "--pairs never"}
    if pairs == "auto":
        if not scored:
            return {**out, "why": "no trainer numbers (score the trace first): the rule cannot be judged; "
                                  "--pairs always pairs the knobs that moved anyway"}
        if best["explained"] >= share:
            return {**out, "why": f"{best['knob']} alone closes {best['explained']:.3g} of the gap (>= {share:g})"}
    moved = [r for r in rows if (r.get("n_moved") or 0) > 0]
    out["candidates"] = [r["knob"] for r in moved]
    lead = (f"no single knob closes {share:g} of the gap (best {best['knob']}: {best['explained']:.3g})"
            if pairs == "auto" else "--pairs always")
    if len(moved) < 2:
        return {**out, "why": f"{lead}, but {len(moved)} knob(s) moved any token beyond the floor: nothing to pair"}

    def key(pair):
        a, b = pair
        return (-(_num(a.get("explained")) + _num(b.get("explained"))),
                -(_num(a.get("floor_units")) + _num(b.get("floor_units"))), a["knob"], b["knob"])

    cand = sorted(((a, b) for i, a in enumerate(moved) for b in moved[i + 1:]), key=key)
    left = budget_left
    for a, b in cand:
        name = pair_name(a["knob"], b["knob"])
        if fields.get(a["knob"]) is not None and fields.get(a["knob"]) == fields.get(b["knob"]):
            out["skipped"].append({"pair": name, "knobs": [a["knob"], b["knob"]],
                                   "reason": f"both set {fields[a['knob']]}: one engine setting cannot take two values"})
        elif left is not None and left <= 0:
            out["skipped"].append({"pair": name, "knobs": [a["knob"], b["knob"]],
                                   "reason": "--budget: no engine starts left for this pair"})
        else:
            out["run"].append([a["knob"], b["knob"]])
            left = None if left is None else left - 1
    return {**out, "needed": True, "why": f"{lead}: {len(out['run'])} pair(s) of {len(cand)} run"}


def _num(x: Any) -> float:
    return 0.0 if x is None or x != x else float(x)


def bisect(model: str | os.PathLike, trace: xr.Dataset, *, settings: EngineSettings | None = None,
           knobs: Sequence[str | BisectKnob] = DEFAULT_KNOBS, budget: int | None = None, mode: str = "auto",
           pairs: str = "auto", share: float | None = None, layers: bool = False, layer_tokens: int | None = None,
           deadline_s: float | None = None, pool=None, progress: bool = False, log: Callable[[str], None] | None = None
           ) -> tuple[dict[str, xr.Dataset], dict[str, Any]]:
    """Replay ``trace``'s tokens under its own settings twice, then once per knob, then pairs where no
    knob explains the gap, then (``layers``) localise the winner's worst tokens; return the arms and the plan.

    Parameters
    ----------
    model : str or os.PathLike
        The model the trace was captured with.
    trace : xarray.Dataset
        The source arm (a capture, a run's step, an import); with trainer numbers (a scored trace)
        the pair rule can be judged.
    settings : EngineSettings, optional
        The capture's settings; ``None`` reads them from the trace
        (:func:`rlparity.capture.replay.capture_settings`).
    knobs : sequence of str or BisectKnob, default DEFAULT_KNOBS
        The knobs, in the order their engines start (the budget cuts the tail).
    budget : int, optional
        Most engine starts tried (a start the engine refuses counts), the baseline's, the pairs' and
        the layer hand-off's included (at least 1; an engine already live in ``pool`` costs none;
        with ``layers`` the hand-off's :data:`LAYER_STARTS` are kept back from the pairs); ``None``:
        no limit.
    mode : {"auto", "prefill", "decode"}, default "auto"
        The replay path (:func:`rlparity.capture.replay.replay_modes`).
    pairs : {"auto", "always", "never"}, default "auto"
        Pairs of knobs (:func:`pair_plan`).
    share : float, optional
        The share of the gap one knob must close; ``None``: ``defaults().bisect_explained_share``.
    layers : bool, default False
        Hand the winning arm's worst tokens to the per-layer localisation (:func:`localise`).
    layer_tokens : int, optional
        How many worst tokens; ``None``: ``defaults().replay_layers_tokens``.
    deadline_s : float, optional
        No engine starts after this many seconds from the call (what is left is listed as skipped);
        a GPU call of bounded length.
    pool : EnginePool, optional
        Where engines come from; ``None``: a pool of its own, closed at the end.
    progress : bool, default False
        vLLM's progress bars.
    log : callable, optional
        Called with one line per engine start.

    Returns
    -------
    tuple of (dict of str to xarray.Dataset, dict)
        The arms (``replay_baseline``, ``replay_floor``, ``knob_<name>`` per knob that ran,
        ``pair_<a>+<b>`` per pair that ran) and the record: mode, settings, ``plan`` (one entry per
        knob and pair: ``ran``, ``not_applicable`` or ``skipped``, with the reason), ``pairs``
        (:func:`pair_plan`'s decision), ``layers`` (:func:`localise`'s result, or why not),
        ``engine_starts`` (started), ``engine_start_attempts`` (tried: what the budget bounds) and
        ``wall_s``. Also in every arm's ``attrs["bisect"]``.

    Raises
    ------
    ValueError
        If the trace records no settings and none are given, the budget is below 1, a knob, the
        mode or ``pairs`` is unknown.
    """
    from rlparity.capture.pool import EnginePool
    from rlparity.capture.replay import capture_settings, replay, replay_engine_settings, replay_modes
    from rlparity.metrics.replay import knob_table

    if budget is not None and budget < 1:
        raise ValueError(f"--budget {budget}: the baseline needs one engine start; give at least 1")
    if pairs not in PAIRS:
        raise ValueError(f"--pairs {pairs!r}: use {', '.join(PAIRS)}")
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
    attempts = 0  # engine starts tried (one that fails costs its time too): what the budget bounds
    chosen: dict[str, tuple[EngineSettings, bool]] = {}  # arm -> (settings, warm)

    def late() -> bool:
        return deadline_s is not None and time.perf_counter() - t0 > deadline_s

    def run_arm(name: str, parts: Sequence[tuple[BisectKnob, Any]], s: EngineSettings, entry: dict[str, Any],
                ref_eff: Mapping[str, Any]) -> None:
        nonlocal attempts
        needs_start = not pool.holds(model, replay_engine_settings(s, trace, use))
        pre = next((r for k, v in parts for r in [resolved_reason(str(model), k.knob, s, v)] if r), None) \
            if needs_start else None
        if pre is not None:
            plan.append({**entry, "status": "not_applicable", "reason": pre})
            return
        if needs_start and budget is not None and attempts >= budget:
            plan.append({**entry, "status": "skipped",
                         "reason": f"--budget {budget}: the engine starts were spent before this arm"})
            return
        if needs_start and late():
            plan.append({**entry, "status": "skipped", "reason": f"deadline: {deadline_s:g} s spent before this arm"})
            return
        warm = any(k.warm for k, _ in parts)
        try:
            if needs_start:
                attempts += 1
                say(f"bisect: engine for {name}")
            eng = pool.get(model, replay_engine_settings(s, trace, use))
            eff = eng.effective_config()
            reason = next((r for k, v in parts for r in [_honoured(k.knob, v, eff, ref_eff)] if r), None)
            if reason is not None:
                plan.append({**entry, "status": "not_applicable", "reason": reason})
                return
            arms[name] = replay(eng, trace, mode=use, warm=warm, arm=name, progress=progress)
        except Exception as err:  # the engine refused the setting: recorded, not dropped
            pool.close()
            plan.append({**entry, "status": "not_applicable",
                         "reason": f"the engine did not run with {entry['field']}={entry.get('value')!r}: "
                                   f"{_error_chain(err)}"})
            return
        chosen[name] = (s, warm)
        note = ("a prefill replay never reads the prefix cache unless warm (vLLM skips it for prompt_logprobs): "
                "this arm differs from the baseline only by what the cache setting changes otherwise"
                if use == "prefill" and not warm and any(k.knob.field == "enable_prefix_caching" for k, _ in parts)
                else "")
        plan.append({**entry, "status": "ran", "reason": "", "note": note})

    pair_rec: dict[str, Any] = {"needed": False, "why": "not reached"}
    layer_rec: dict[str, Any] | None = None
    try:
        say(f"bisect: baseline engine ({use} replay)")
        attempts += 0 if pool.holds(model, replay_engine_settings(ref, trace, use)) else 1
        eng = pool.get(model, replay_engine_settings(ref, trace, use))
        arms[BASELINE] = replay(eng, trace, mode=use, arm=BASELINE, progress=progress)
        arms[FLOOR] = replay(eng, trace, mode=use, arm=FLOOR, progress=progress)
        ref_eff = arm_record(arms[BASELINE]).effective.to_attrs()
        chosen[BASELINE] = (ref, False)
        values: dict[str, Any] = {}
        for k in knob_list:
            entry: dict[str, Any] = {"knob": k.name, "field": k.knob.field, "description": k.knob.description,
                                     "reference_value": ref_eff.get(k.knob.key, getattr(ref, k.knob.field, None))}
            try:
                s, value = _settings_for(k, ref, ref_eff)
            except ValueError as err:
                plan.append({**entry, "value": k.knob.value, "status": "not_applicable", "reason": str(err)})
                continue
            values[k.name] = value
            run_arm(f"knob_{k.name}", [(k, value)], s, {**entry, "value": value}, ref_eff)
        # pairs: the singles' rows decide
        singles = [f"knob_{k.name}" for k in knob_list if f"knob_{k.name}" in arms]
        rows = [{**r, "knob": r["knob"].removeprefix("knob_")}
                for r in knob_table(arms, baseline=BASELINE, floor=FLOOR, knobs=singles, top=0)]
        reserve = LAYER_STARTS if layers else 0
        left = None if budget is None else max(budget - attempts - reserve, 0)
        by_name = {k.name: k for k in knob_list}
        pair_rec = pair_plan(rows, {k.name: k.knob.field for k in knob_list}, budget_left=left, share=share,
                             pairs=pairs)
        for a, b in pair_rec["run"]:
            ka, kb = by_name[a], by_name[b]
            sa, _ = _settings_for(ka, ref, ref_eff)
            s, _ = _settings_for(kb, sa, ref_eff)
            s = s.replace(**{kb.knob.field: values[b]})  # b's value as it was flipped alone
            entry = {"knob": pair_name(a, b), "field": f"{ka.knob.field}+{kb.knob.field}",
                     "description": f"{ka.knob.description}; {kb.knob.description}",
                     "value": [values[a], values[b]], "pair": [a, b]}
            run_arm(f"pair_{pair_name(a, b)}", [(ka, values[a]), (kb, values[b])], s, entry, ref_eff)
        for sk in pair_rec["skipped"]:
            plan.append({"knob": sk["pair"], "pair": list(sk["knobs"]), "status": "skipped",
                         "reason": sk["reason"]})
        if layers and late():
            layer_rec = {"status": "skipped", "reason": f"deadline: {deadline_s:g} s spent before the layer hand-off"}
        elif layers:
            layer_rec = _hand_off(model, trace, arms, chosen, ref, pool, budget, attempts, layer_tokens, say)
            attempts += layer_rec.get("engine_start_attempts", 0)
    finally:
        if own:
            pool.close()
    record = {"mode": use, "modes_not_run": why_not, "settings": ref.model_dump(), "budget": budget,
              "engine_starts": pool.starts - starts0, "engine_start_attempts": attempts,
              "wall_s": round(time.perf_counter() - t0, 3),
              "knobs": [{**asdict(k.knob), "warm": k.warm} for k in knob_list], "plan": plan,
              "deadline_s": deadline_s, "source_arm": str(arm_name(trace, "trace")), "pairs": pair_rec,
              "layers": layer_rec if layers else {"status": "not_asked", "reason": "bisect --layers hands the winner's "
                                                                                  "worst tokens to rlparity layers"}}
    for ds in arms.values():
        ds.attrs["bisect"] = record
    return arms, record


def winner(arms: Mapping[str, xr.Dataset]) -> tuple[str, dict[str, Any]] | None:
    """The arm whose worst tokens go to the layers: of the arms that moved at least one token beyond
    the replay floor, the one closing most of the gap against the trainer where it closes any
    (``basis`` ``explained``), else the one moving the tokens most in floor units (``basis``
    ``shift``: no arm closes the gap, so the largest mover is localised; ties: the name).

    Parameters
    ----------
    arms : Mapping of str to xarray.Dataset
        :func:`bisect`'s arms.

    Returns
    -------
    tuple of (str, dict) or None
        The arm's name and its :func:`rlparity.metrics.replay.knob_table` row (with ``basis``);
        ``None`` when no knob arm moved any token.
    """
    from rlparity.metrics.replay import knob_table

    names = [a for a in arms if a not in (BASELINE, FLOOR)]
    rows = [r for r in knob_table(arms, baseline=BASELINE, floor=FLOOR, knobs=names, top=0) if r["n_moved"] > 0] \
        if names else []
    if not rows:
        return None
    closing = [r for r in rows if _num(r["explained"]) > 0]
    if closing:
        best = max(closing, key=lambda r: (r["explained"], r["knob"]))
        return best["knob"], {**best, "basis": "explained"}
    return rows[0]["knob"], {**rows[0], "basis": "shift"}


def _where(layer: int, module: str) -> str:
    return {"embedding": "the embeddings", "final_norm": "the final norm", "lm_head": "the LM head"}.get(
        module, f"layer {layer}'s {module.replace('_', ' ')}")


def localise(model: str | os.PathLike, arm: xr.Dataset, baseline: xr.Dataset, *, settings: EngineSettings,
             reference: EngineSettings, warm: bool = False, tokens: int | None = None, pool=None,
             label: str | None = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Where the tokens ``arm`` moves most from ``baseline`` part, layer by layer (two eager engines).

    The sequences holding the worst tokens (:func:`rlparity.metrics.replay.top_tokens`), cut after
    their last such token, run as prefills with hooks on (:func:`rlparity.experiments.layers.profile_arm`)
    through an eager engine under ``reference`` (twice: the run-to-run floor per site) and one under
    ``settings`` (after prefilling the prompts when ``warm``, and then reading the cache). The first
    site in data-flow order that leaves its floor (:func:`rlparity.metrics.layers.first_divergence`)
    is where the two settings part; per token, the first site whose relative error at the position
    that predicts it (the one before) leaves the floor.

    Parameters
    ----------
    model : str or os.PathLike
        The model.
    arm, baseline : xarray.Dataset
        Two replayed arms of the same tokens (the winner and the baseline replay).
    settings, reference : EngineSettings
        Their engine settings (``enforce_eager`` is set on both).
    warm : bool, default False
        The winner read a warm prefix cache.
    tokens : int, optional
        How many worst tokens; ``None`` means ``defaults().replay_layers_tokens``.
    pool : EnginePool, optional
        Where the engines come from; ``None``: a pool of its own, closed at the end.
    label : str, optional
        The winner's name in the sentence.
    log : callable, optional
        Called with one line per engine.

    Returns
    -------
    dict
        ``status`` (``localised``, ``within_floor``, ``nothing_moved`` or ``not_localisable`` with
        ``reason``), ``tokens`` (the worst tokens with ``site``: where each parts), ``n_tokens``,
        ``parts_at`` (the site most of them part at), ``first_divergence`` (pooled over the probe),
        ``sites`` (tokens per site), ``sentence``, ``engine_starts`` and ``seconds``.
    """
    from rlparity.capture.pool import EnginePool
    from rlparity.capture.replay import warm_cache
    from rlparity.config.defaults import defaults
    from rlparity.experiments.layers import _vocab_size, engine_states, profile_arm
    from rlparity.metrics.layers import divergence_table, first_divergence, floor_from, relative_error
    from rlparity.metrics.replay import top_tokens
    from rlparity.trace import sequences
    from rlparity.trace.layers import site_label, site_list, vocab_columns

    t0 = time.perf_counter()
    n = defaults().replay_layers_tokens if tokens is None else int(tokens)
    name = label or str(arm_name(arm, "the arm"))
    worst = top_tokens(arm, baseline, n)
    out: dict[str, Any] = {"arm": name, "n_tokens": len(worst), "engine_starts": 0}
    if not worst:
        return {**out, "status": "nothing_moved", "reason": f"{name} moves no token from the baseline replay",
                "seconds": 0.0}
    if settings.enforce_eager is False and reference.enforce_eager is not False or \
            reference.enforce_eager is False and settings.enforce_eager is not False:
        return {**out, "status": "not_localisable", "tokens": worst, "seconds": 0.0,
                "reason": f"{name} changes eager against compiled: the layer hooks fire only in eager engines, so "
                          "both sides would run the same (eager) path"}
    own = pool is None
    pool = pool or EnginePool()
    say = log or (lambda m: None)
    seqs = sequences(baseline)
    index = {int(s): i for i, s in enumerate(baseline["sequence"].values)} if "sequence" in baseline.coords else None
    rows = sorted({index[t["sequence"]] if index else t["sequence"] for t in worst})
    last = {i: max(t["position"] for t in worst if (index[t["sequence"]] if index else t["sequence"]) == i)
            for i in rows}
    probe = [list(seqs[i][0]) + list(seqs[i][1][: last[i] + 1]) for i in rows]
    starts0 = pool.starts
    try:
        say(f"layers: eager engine under the baseline settings ({len(probe)} sequences)")
        eng = pool.get(model, reference.replace(enforce_eager=True))
        vocab_ids = vocab_columns(_vocab_size(eng))
        ref_states = engine_states(eng, probe, vocab_ids=vocab_ids)
        again = engine_states(eng, probe, vocab_ids=vocab_ids)
        floor = floor_from(profile_arm(eng, ref_states, probe, vocab_ids=vocab_ids, states=again))
        say(f"layers: eager engine under {name}")
        eng = pool.get(model, settings.replace(enforce_eager=True))
        if warm:
            warm_cache(eng.llm, [list(seqs[i][0]) for i in rows], False)
        states = engine_states(eng, probe, vocab_ids=vocab_ids, use_cache=warm)
        prof = profile_arm(eng, ref_states, probe, vocab_ids=vocab_ids, floor=floor, states=states, use_cache=warm,
                           attrs={"reference": "baseline settings (eager)", "scenario": name})
    finally:
        out["engine_starts"] = pool.starts - starts0
        if own:
            pool.close()
    first = first_divergence(prof)
    per_pos = relative_error(prof, dim=()).values
    thr = divergence_table(prof)["threshold"].values
    labels = [site_label(lay, mod) for lay, mod in site_list(prof)]
    named = []
    for t in worst:
        i = index[t["sequence"]] if index else t["sequence"]
        k, p = rows.index(i), len(seqs[i][0]) + t["position"] - 1
        over = [s for s in range(len(labels)) if np.isfinite(per_pos[s, k, p]) and per_pos[s, k, p] > thr[s]]
        named.append({**t, "site": labels[over[0]] if over else None,
                      "relative_error": {labels[s]: float(per_pos[s, k, p]) for s in over[:1]}})
    counts: dict[str, int] = {}
    for t in named:
        counts[t["site"] or "within floor"] = counts.get(t["site"] or "within floor", 0) + 1
    top_site = max((s for s in counts if s != "within floor"), key=lambda s: (counts[s], -labels.index(s)),
                   default=None)
    out.update(tokens=named, sites=counts, first_divergence=None if first is None else
               {k: first[k] for k in ("site", "layer", "module", "relative_error", "floor", "threshold")},
               floor_per_site=dict(zip(labels, floor.values.tolist())), seconds=round(time.perf_counter() - t0, 2))
    if top_site is None:
        return {**out, "status": "within_floor", "parts_at": None,
                "sentence": f"{name} moves these {len(named)} tokens, but no site's states leave the eager engine's "
                            "run-to-run floor at the positions that predict them (a compiled-path effect?)"}
    lay, mod = site_list(prof)[labels.index(top_site)]
    return {**out, "status": "localised", "parts_at": top_site,
            "sentence": f"{name} moves these {len(named)} tokens; {counts[top_site]} of them part at "
                        f"{_where(lay, mod)} ({top_site})"}


def _hand_off(model, trace, arms, chosen, ref, pool, budget, attempts, tokens, say) -> dict[str, Any]:
    """The winner's worst tokens to :func:`localise`, within the budget (``engine_start_attempts`` counted)."""
    best = winner(arms)
    if best is None:
        return {"status": "not_run", "reason": "no knob or pair moved any token beyond the replay floor",
                "engine_start_attempts": 0}
    name, row = best
    s, warm = chosen[name]
    need = sum(not pool.holds(model, x.replace(enforce_eager=True)) for x in (ref, s))
    if budget is not None and attempts + need > budget:
        return {"status": "skipped", "arm": name, "engine_start_attempts": 0,
                "reason": f"--budget {budget}: {need} engine start(s) needed, {max(budget - attempts, 0)} left"}
    label = name.removeprefix("knob_").removeprefix("pair_")
    try:
        rec = localise(model, arms[name], arms[BASELINE], settings=s, reference=ref, warm=warm, tokens=tokens,
                       pool=pool, label=label, log=say)
    except Exception as err:  # noqa: BLE001 - the bisection's result stands; the record says why
        pool.close()
        return {"status": "failed", "arm": name, "reason": _error_chain(err), "engine_start_attempts": need}
    return {**rec, "arm": name, "explained": row.get("explained"), "floor_units": row.get("floor_units"),
            "basis": row["basis"],
            "engine_start_attempts": rec.get("engine_starts", need)}


def _capture_state(capture: float | None, baseline: float | None) -> dict[str, Any]:
    """The capture's gap against the trainer and the baseline replay's: where the replay under the
    capture's own settings already closes most of it, the gap lives in the engine's state at capture
    time (a stale prefix cache, other weights), not in a setting a knob can flip."""
    from rlparity.config.defaults import defaults
    from rlparity.metrics.replay import explained_share

    closed = explained_share(baseline, capture)
    share = defaults().bisect_explained_share
    verdict = None if closed is None else (
        f"the replay under the capture's own settings closes {closed:.3g} of the capture's gap: the gap is in the "
        "engine's state at capture time (a stale prefix cache, other weights), not in a setting"
        if closed >= share else "the replay under the capture's own settings keeps the capture's gap: a setting "
                                "(the knobs) can explain it")
    return {"capture": capture, "baseline": baseline, "closed_by_replay": closed, "verdict": verdict}


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
        :func:`rlparity.metrics.replay.knob_table`, ``knob`` the knob's name and ``arm`` its arm),
        ``not_run`` (the plan's other entries),
        ``engine_starts``, ``engine_start_attempts``, ``budget``, ``wall_s``, ``trainer_gap`` (of the
        capture and of the baseline replay, the share the replay closes and the verdict), ``winner``
        (:func:`winner`), ``pairs`` (the decision) and
        ``layers`` (the hand-off). A pair's row (``kind`` ``pair``) also has ``interaction`` (nats) and
        ``interaction_floor_units`` (:func:`rlparity.metrics.replay.interaction`).
    """
    from rlparity.metrics.replay import capture_gap, interaction, knob_table, replay_floor, trainer_gap

    rows = knob_table(arms, baseline=BASELINE, floor=FLOOR, source=source, top=top)
    for r in rows:  # the arm knob_<name> is the knob <name>; pair_<a>+<b> the pair a+b
        arm = r["knob"]
        r["arm"], r["knob"] = arm, arm.removeprefix("knob_").removeprefix("pair_")
        r["kind"] = "pair" if arm.startswith("pair_") else "knob"
        if r["kind"] == "pair":
            a, b = (f"knob_{x}" for x in r["knob"].split("+", 1))
            if a in arms and b in arms:
                r["interaction"] = interaction(arms[arm], arms[a], arms[b], arms[BASELINE])
                r["interaction_floor_units"] = r["interaction"] / r["unit"]
    best = winner(arms)
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
            "trainer_gap": _capture_state(trainer_gap(source), trainer_gap(arms[BASELINE])),
            "winner": None if best is None else {"arm": best[0], "explained": best[1]["explained"],
                                                 "basis": best[1]["basis"], "floor_units": best[1]["floor_units"]},
            "pairs": record.get("pairs"), "layers": record.get("layers")}


__all__ = ["BASELINE", "DEFAULT_KNOBS", "FLOOR", "KNOBS", "LAYER_STARTS", "PAIRS", "BisectKnob", "bisect", "localise",
           "pair_name", "pair_plan", "report", "winner"]
