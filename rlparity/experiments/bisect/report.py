"""The bisection's report: the replay against the capture, the floor, the ranked knobs and pairs,
the winner, the trainer gap and the layers (what ``rlparity bisect --json`` prints). Part of
:mod:`rlparity.experiments.bisect`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import xarray as xr

from rlparity.experiments.bisect.knobs import BASELINE, FLOOR
from rlparity.experiments.bisect.pairs import winner


def _capture_state(capture: float | None, baseline: float | None,
                   replays: Mapping[str, float | None] | None = None, unit: float = 0.0) -> dict[str, Any]:
    """The capture's gap against the trainer and the baseline replay's: where the replay under the
    capture's own settings already closes most of it, the gap lives in the engine's state at capture
    time (a stale prefix cache, other weights), not in a setting a knob can flip.

    "Most" is counted against what any replay reached (``replays``: each arm's gap against the
    trainer), not against zero: a bf16 body leaves every replay a gap of its own (on an H200, 0.013
    nats of a stale capture's 0.023), which no knob closes and which is not the capture's state.
    ``closed_of_reachable`` is the share of ``capture - lowest`` that the baseline replay closes; a
    replay that moves the gap by no more than ``unit`` (the replay floor's unit, nats) closes none of
    it (an unplanted H200 capture: 2e-8 nats, where every replay sits within 1e-7 of it).
    """
    from rlparity.config.defaults import defaults
    from rlparity.metrics.replay import explained_share

    closed = explained_share(baseline, capture)
    share = defaults().bisect_explained_share
    reached = {a: float(g) for a, g in (replays or {}).items() if g is not None}
    if baseline is not None:
        reached.setdefault(BASELINE, float(baseline))
    lowest_arm = min(reached, key=reached.get) if reached else None
    lowest = reached[lowest_arm] if lowest_arm is not None else None
    reachable = None if capture is None or lowest is None else float(capture) - lowest
    moved = None if closed is None else float(capture) - float(baseline)
    of_reachable = None if moved is None or not (reachable is not None and reachable > 0) \
        else (moved / reachable if moved > unit else 0.0)
    verdict = None if of_reachable is None else (
        f"the replay under the capture's own settings closes {of_reachable:.3g} of the capture's gap above the "
        f"lowest any replay reached ({lowest:.3g} nats, {lowest_arm}): the gap is in the engine's state at capture "
        "time (a stale prefix cache, other weights), not in a setting"
        if of_reachable >= share else "the replay under the capture's own settings keeps the capture's gap: a "
                                      "setting (the knobs) can explain it")
    return {"capture": capture, "baseline": baseline, "closed_by_replay": closed, "lowest": lowest,
            "lowest_arm": lowest_arm, "closed_of_reachable": of_reachable, "verdict": verdict}


def capture_state(rep: Mapping[str, Any]) -> dict[str, Any]:
    """The trainer-gap verdict of a stored bisect report (:func:`report`'s dict or its JSON), by the
    current rule: the capture's gap, the baseline replay's, and every knob's and pair's row
    (``trainer_gap``), as :func:`report` counts them. For reports written before the rule counted
    against the lowest gap any replay reached.

    Parameters
    ----------
    rep : Mapping
        A bisect report with ``trainer_gap`` and ``knobs``.

    Returns
    -------
    dict
        ``capture``, ``baseline``, ``closed_by_replay``, ``lowest``, ``lowest_arm``,
        ``closed_of_reachable`` and ``verdict`` (``None`` without trainer numbers).
    """
    gap = rep.get("trainer_gap") or {}
    rows = {r["arm"]: r.get("trainer_gap") for r in rep.get("knobs") or [] if "arm" in r}
    return _capture_state(gap.get("capture"), gap.get("baseline"), rows, (rep.get("floor") or {}).get("unit") or 0.0)


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
        (:func:`~rlparity.experiments.bisect.pairs.winner`), ``pairs`` (the decision) and
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
    floor = replay_floor(arms[BASELINE], arms[FLOOR])
    if tokenizer is not None:
        for r in rows:
            for t in r["top_tokens"]:
                t["token_text"] = tokenizer.decode([t["token_id"]])
    return {"mode": record["mode"], "modes_not_run": record.get("modes_not_run", {}),
            "replay_vs_capture": capture_gap(arms[BASELINE], source),
            "floor": floor, "knobs": rows,
            "not_run": [p for p in record["plan"] if p["status"] != "ran"],
            "engine_starts": record["engine_starts"],
            "engine_start_attempts": record.get("engine_start_attempts"), "budget": record.get("budget"),
            "wall_s": record["wall_s"],
            "trainer_gap": _capture_state(trainer_gap(source), trainer_gap(arms[BASELINE]),
                                          {a: trainer_gap(arms[a]) for a in arms if a != FLOOR}, floor["unit"]),
            "winner": None if best is None else {"arm": best[0], "explained": best[1]["explained"],
                                                 "basis": best[1]["basis"], "floor_units": best[1]["floor_units"]},
            "pairs": record.get("pairs"), "layers": record.get("layers")}


__all__ = ["capture_state", "report"]
