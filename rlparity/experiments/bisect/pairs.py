"""The pairs of knobs and the winner, both judged by the share of the gap an arm closes.

A single knob *explains* the gap when flipping it closes at least ``defaults().bisect_explained_share``
of the baseline replay's gap against the trainer (:func:`rlparity.metrics.replay.explained_share`);
where none does, :func:`pair_plan` picks the pairs of knobs to flip together, and :func:`winner` the
arm whose worst tokens go to the layers. No engine here. Part of :mod:`rlparity.experiments.bisect`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import xarray as xr

from rlparity.experiments.bisect.knobs import BASELINE, FLOOR, PAIRS


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

    cand = sorted(((a, b) for i, a in enumerate(moved) for b in moved[i + 1:]), key=_pair_key)
    out["run"], out["skipped"] = _schedule(cand, fields, budget_left)
    return {**out, "needed": True, "why": f"{lead}: {len(out['run'])} pair(s) of {len(cand)} run"}


def _pair_key(pair: tuple[Mapping[str, Any], Mapping[str, Any]]) -> tuple:
    """The order pairs run in: the summed ``explained`` (largest first), the summed ``floor_units``, the names."""
    a, b = pair
    return (-(_num(a.get("explained")) + _num(b.get("explained"))),
            -(_num(a.get("floor_units")) + _num(b.get("floor_units"))), a["knob"], b["knob"])


def _schedule(cand: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]], fields: Mapping[str, str],
              budget_left: int | None) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """The pairs of ``cand`` (in order) that run within ``budget_left``, and the skipped ones with why."""
    run: list[list[str]] = []
    skipped: list[dict[str, Any]] = []
    left = budget_left
    for a, b in cand:
        name = pair_name(a["knob"], b["knob"])
        if fields.get(a["knob"]) is not None and fields.get(a["knob"]) == fields.get(b["knob"]):
            skipped.append({"pair": name, "knobs": [a["knob"], b["knob"]],
                            "reason": f"both set {fields[a['knob']]}: one engine setting cannot take two values"})
        elif left is not None and left <= 0:
            skipped.append({"pair": name, "knobs": [a["knob"], b["knob"]],
                            "reason": "--budget: no engine starts left for this pair"})
        else:
            run.append([a["knob"], b["knob"]])
            left = None if left is None else left - 1
    return run, skipped


def _num(x: Any) -> float:
    return 0.0 if x is None or x != x else float(x)


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


__all__ = ["pair_name", "pair_plan", "winner"]
