"""The hand-off to the layers: where the tokens the winning arm moves most part, site by site.

:func:`localise` runs the sequences that hold the winner's worst tokens through an eager engine under
the baseline settings (twice: its run-to-run floor) and under the winning settings; the first site
(:mod:`rlparity.trace.layers`) whose relative error leaves its floor is where they part.
``bisect(..., layers=True)`` calls it on :func:`~rlparity.experiments.bisect.pairs.winner`'s arm,
within the budget. Part of :mod:`rlparity.experiments.bisect`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.settings import EngineSettings
from rlparity.trace import arm_name


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
    from rlparity.config.defaults import defaults
    from rlparity.metrics.replay import top_tokens

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
    probe = _Probe.of(worst, baseline)
    own = pool is None
    pool = pool or EnginePool()
    starts0 = pool.starts
    try:
        prof, floor = _profile(model, probe, (reference, settings), warm=warm, name=name, pool=pool,
                               say=log or (lambda m: None))
    finally:
        out["engine_starts"] = pool.starts - starts0
        if own:
            pool.close()
    return _parts_at(prof, floor, probe, worst, out=out, name=name, t0=t0)


@dataclass(frozen=True)
class _Probe:
    """The sequences (rows of the baseline) holding the worst tokens, each cut after its last such token."""

    seqs: Sequence[tuple[Sequence[int], Sequence[int]]]
    index: Mapping[int, int] | None
    rows: list[int]
    tokens: list[list[int]]

    @classmethod
    def of(cls, worst: Sequence[Mapping[str, Any]], baseline: xr.Dataset) -> _Probe:
        from rlparity.trace import sequences

        seqs = sequences(baseline)
        index = {int(s): i for i, s in enumerate(baseline["sequence"].values)} if "sequence" in baseline.coords \
            else None
        rows = sorted({index[t["sequence"]] if index else t["sequence"] for t in worst})
        last = {i: max(t["position"] for t in worst if (index[t["sequence"]] if index else t["sequence"]) == i)
                for i in rows}
        return cls(seqs, index, rows, [list(seqs[i][0]) + list(seqs[i][1][: last[i] + 1]) for i in rows])

    def row(self, token: Mapping[str, Any]) -> int:
        return self.index[token["sequence"]] if self.index else token["sequence"]


def _profile(model, probe: _Probe, sides: tuple[EngineSettings, EngineSettings], *, warm: bool, name: str, pool,
             say: Callable[[str], None]) -> tuple[xr.Dataset, xr.DataArray]:
    """The probe through an eager engine under the reference (twice: the floor per site) and one under
    the winner's settings (``sides``: reference, winner); the winner's profile and the floor."""
    from rlparity.capture.replay import warm_cache
    from rlparity.experiments.layers import _vocab_size, engine_states, profile_arm
    from rlparity.metrics.layers import floor_from
    from rlparity.trace.layers import vocab_columns

    reference, settings = sides
    say(f"layers: eager engine under the baseline settings ({len(probe.tokens)} sequences)")
    eng = pool.get(model, reference.replace(enforce_eager=True))
    vocab_ids = vocab_columns(_vocab_size(eng))
    ref_states = engine_states(eng, probe.tokens, vocab_ids=vocab_ids)
    again = engine_states(eng, probe.tokens, vocab_ids=vocab_ids)
    floor = floor_from(profile_arm(eng, ref_states, probe.tokens, vocab_ids=vocab_ids, states=again))
    say(f"layers: eager engine under {name}")
    eng = pool.get(model, settings.replace(enforce_eager=True))
    if warm:
        warm_cache(eng.llm, [list(probe.seqs[i][0]) for i in probe.rows], False)
    states = engine_states(eng, probe.tokens, vocab_ids=vocab_ids, use_cache=warm)
    prof = profile_arm(eng, ref_states, probe.tokens, vocab_ids=vocab_ids, floor=floor, states=states,
                       use_cache=warm, attrs={"reference": "baseline settings (eager)", "scenario": name})
    return prof, floor


def _parts_at(prof: xr.Dataset, floor: xr.DataArray, probe: _Probe, worst: Sequence[Mapping[str, Any]], *,
              out: dict[str, Any], name: str, t0: float) -> dict[str, Any]:
    """:func:`localise`'s record (``out`` so far, begun at ``t0``) from the winner's profile: per token the
    first site past its floor, the site most of them part at, and the sentence."""
    from rlparity.metrics.layers import divergence_table, first_divergence, relative_error
    from rlparity.trace.layers import site_label, site_list

    first = first_divergence(prof)
    per_pos = relative_error(prof, dim=()).values
    thr = divergence_table(prof)["threshold"].values
    labels = [site_label(lay, mod) for lay, mod in site_list(prof)]
    named = []
    for t in worst:
        i = probe.row(t)
        k, p = probe.rows.index(i), len(probe.seqs[i][0]) + t["position"] - 1
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


__all__ = ["localise"]
