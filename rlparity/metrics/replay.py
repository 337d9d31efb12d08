"""Arms that hold the same tokens, compared token by token: the replay floor and each knob's shift.

A *replayed* arm (:func:`rlparity.capture.replay.replay`) holds the tokens of its source arm
with the engine's logprobs of them under some settings. Two replays under the same settings give
the **replay floor** (what the engine changes on its own); a replay with one knob flipped, against
the baseline replay, gives the knob's **shift**. With ``delta = logprob(arm) - logprob(baseline)``
over the real tokens (nats):

* ``mean_abs``: mean ``|delta|``; ``max_abs``: the largest;
* ``share_moved``: the share of tokens with ``|delta|`` above the floor's largest ``|delta|``
  (at least ``defaults().replay_floor_min``): moved beyond anything the floor showed;
* ``floor_units``: ``mean_abs`` over the floor's ``mean_abs`` (at least ``replay_floor_min``: a
  deterministic engine replays to exactly 0, and its unit is then that minimum, said in
  ``floor_is_min``).

:func:`knob_table` ranks the knobs by ``floor_units`` (ties by ``share_moved``). Everything works on
the stored arms; nothing here runs an engine.

Against the trainer (every replayed arm carries the source's trainer numbers): :func:`trainer_gap`
is an arm's mean ``|trainer - rollout_logprob|`` in the capture's semantic, and a knob's
``explained`` share is ``1 - trainer_gap(knob) / trainer_gap(baseline)``: the part of the gap
against the trainer that flipping the knob closes (1: the knob brings the engine to the trainer;
0: no closer; negative: further away). :func:`interaction` is what a pair of knobs does beyond the
sum of the two alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace import arm_name, arm_record, token_checksum


def same_tokens(a: xr.Dataset, b: xr.Dataset, what: str = "arm") -> None:
    """Raise unless ``a`` and ``b`` hold the same prompt and response tokens.

    Parameters
    ----------
    a, b : xarray.Dataset
        Two arms.
    what : str, default "arm"
        What ``a`` is, for the message.

    Raises
    ------
    ValueError
        The token ids differ (a replay of another trace, or a fresh capture).
    """
    if a.sizes.get("sequence") != b.sizes.get("sequence") or token_checksum(a) != token_checksum(b):
        raise ValueError(f"{what} {arm_name(a, '?')!r} holds other tokens than {arm_name(b, '?')!r}: "
                         "compare replays of the same trace (rlparity replay)")


def token_delta(arm: xr.Dataset, baseline: xr.Dataset) -> np.ndarray:
    """``rollout_logprob(arm) - rollout_logprob(baseline)`` per token, NaN at padding.

    Parameters
    ----------
    arm, baseline : xarray.Dataset
        Two arms of the same tokens (:func:`same_tokens`).

    Returns
    -------
    numpy.ndarray
        ``(sequence, position)`` float64; a token both give ``-inf`` has delta 0; one only one
        side gives ``-inf`` has delta ``+-inf``.
    """
    same_tokens(arm, baseline)
    a = np.asarray(arm["rollout_logprob"].values, dtype=np.float64)
    b = np.asarray(baseline["rollout_logprob"].values, dtype=np.float64)
    mask = np.asarray(baseline["response_mask"].values, dtype=bool)
    with np.errstate(invalid="ignore"):
        d = np.where(a == b, 0.0, a - b)
    return np.where(mask, d, np.nan)


def shift(delta: np.ndarray, *, floor_mean_abs: float = 0.0, floor_max_abs: float = 0.0,
          floor_min: float | None = None) -> dict[str, Any]:
    """How far one arm's logprobs sit from the baseline's, in nats and in replay-floor units.

    Parameters
    ----------
    delta : numpy.ndarray
        Per-token deltas (:func:`token_delta`); NaN entries (padding) are left out.
    floor_mean_abs, floor_max_abs : float, default 0.0
        The replay floor's mean and largest ``|delta|`` (nats).
    floor_min : float, optional
        The smallest unit; ``None`` means ``defaults().replay_floor_min``.

    Returns
    -------
    dict
        ``n_tokens``, ``mean_abs``, ``max_abs``, ``share_moved`` (``|delta|`` above
        ``moved_above``), ``moved_above`` (nats), ``n_moved``, ``floor_units`` (``mean_abs`` over
        the unit), ``unit`` (nats) and ``floor_is_min`` (the floor was below ``floor_min``).
    """
    if floor_min is None:
        from rlparity.config.defaults import defaults

        floor_min = defaults().replay_floor_min
    x = np.abs(np.asarray(delta, dtype=np.float64))
    x = x[~np.isnan(x)]
    unit = max(float(floor_mean_abs), float(floor_min))
    above = max(float(floor_max_abs), float(floor_min))
    n = int(x.size)
    mean = float(x.mean()) if n else float("nan")
    moved = int((x > above).sum())
    return {"n_tokens": n, "mean_abs": mean, "max_abs": float(x.max()) if n else float("nan"),
            "share_moved": moved / n if n else float("nan"), "n_moved": moved, "moved_above": above,
            "floor_units": mean / unit if n else float("nan"), "unit": unit,
            "floor_is_min": bool(float(floor_mean_abs) < float(floor_min))}


def top_tokens(arm: xr.Dataset, baseline: xr.Dataset, n: int | None = None) -> list[dict[str, Any]]:
    """The tokens ``arm`` moves most from ``baseline`` (largest ``|delta|`` first).

    Parameters
    ----------
    arm, baseline : xarray.Dataset
        Two arms of the same tokens.
    n : int, optional
        How many; ``None`` means ``defaults().replay_top_tokens``.

    Returns
    -------
    list of dict
        ``sequence``, ``position``, ``token_id``, ``delta``, ``logprob`` (the arm's) and
        ``baseline_logprob``, for tokens with ``|delta| > 0`` only.
    """
    if n is None:
        from rlparity.config.defaults import defaults

        n = defaults().replay_top_tokens
    d = token_delta(arm, baseline)
    mag = np.where(np.isnan(d), -1.0, np.abs(d))
    flat = np.argsort(-mag, axis=None, kind="stable")[:n]
    out = []
    tok = arm["token_id"].values
    a, b = arm["rollout_logprob"].values, baseline["rollout_logprob"].values
    for f in flat:
        i, j = np.unravel_index(f, d.shape)
        if not mag[i, j] > 0:
            break
        out.append({"sequence": int(arm["sequence"].values[i]) if "sequence" in arm.coords else int(i),
                    "position": int(j), "token_id": int(tok[i, j]), "delta": float(d[i, j]),
                    "logprob": float(a[i, j]), "baseline_logprob": float(b[i, j])})
    return out


def replay_floor(first: xr.Dataset, second: xr.Dataset) -> dict[str, Any]:
    """The replay floor: the same tokens replayed twice under the same settings.

    Parameters
    ----------
    first, second : xarray.Dataset
        The two replays.

    Returns
    -------
    dict
        :func:`shift` of the second against the first with no floor (``floor_units`` is then in
        units of ``replay_floor_min``).
    """
    return shift(token_delta(second, first))


def capture_gap(arm: xr.Dataset, source: xr.Dataset) -> dict[str, Any]:
    """How far a replayed arm sits from the logprobs the capture itself reported.

    Parameters
    ----------
    arm : xarray.Dataset
        A replay of ``source``.
    source : xarray.Dataset
        The captured arm.

    Returns
    -------
    dict
        :func:`shift` of ``arm`` against ``source`` with no floor (``mean_abs``, ``max_abs`` in nats).
    """
    return shift(token_delta(arm, source))


def trainer_gap(arm: xr.Dataset) -> float | None:
    """An arm's mean ``|trainer - rollout_logprob|`` (nats) over tokens where both are finite.

    The trainer reading matching the arm's ``logprobs_mode`` (``trainer_processed_logprob`` for a
    processed capture, ``trainer_logprob`` for a raw one).

    Parameters
    ----------
    arm : xarray.Dataset
        A captured or replayed arm.

    Returns
    -------
    float or None
        The gap; ``None`` when the arm has no trainer reading of that semantic (not scored).
    """
    rec = arm_record(arm)
    mode = (rec.replay or {}).get("logprobs_mode") or rec.effective.logprobs_mode or "raw_logprobs"
    var = "trainer_processed_logprob" if mode == "processed_logprobs" else "trainer_logprob"
    if var not in arm:
        return None
    t = np.asarray(arm[var].values, dtype=np.float64)
    r = np.asarray(arm["rollout_logprob"].values, dtype=np.float64)
    ok = np.asarray(arm["response_mask"].values, dtype=bool) & np.isfinite(t) & np.isfinite(r)
    return float(np.abs(t - r)[ok].mean()) if ok.any() else None


def explained_share(gap: float | None, baseline_gap: float | None) -> float | None:
    """The share of the baseline's gap against the trainer that an arm closes: ``1 - gap / baseline_gap``.

    Parameters
    ----------
    gap, baseline_gap : float or None
        :func:`trainer_gap` of the arm and of the baseline replay.

    Returns
    -------
    float or None
        ``None`` without trainer numbers or with a baseline gap of 0 (nothing to explain).
    """
    if gap is None or baseline_gap is None or not baseline_gap > 0:
        return None
    return 1.0 - float(gap) / float(baseline_gap)


def interaction(pair: xr.Dataset, a: xr.Dataset, b: xr.Dataset, baseline: xr.Dataset) -> float:
    """Mean ``|delta(pair) - delta(a) - delta(b)|`` (nats): what two knobs do together beyond their sum.

    Parameters
    ----------
    pair, a, b, baseline : xarray.Dataset
        The arm with both knobs flipped, each knob alone, and the baseline replay (same tokens).

    Returns
    -------
    float
        0 when the two knobs' shifts add up token by token.
    """
    x = token_delta(pair, baseline) - token_delta(a, baseline) - token_delta(b, baseline)
    x = np.abs(x[np.isfinite(x)])
    return float(x.mean()) if x.size else float("nan")


def knob_table(arms: Mapping[str, xr.Dataset], *, baseline: str, floor: str, source: xr.Dataset | None = None,
               knobs: Sequence[str] | None = None, top: int | None = None) -> list[dict[str, Any]]:
    """Each knob's shift of the user's tokens against the baseline replay, in replay-floor units, ranked.

    Parameters
    ----------
    arms : Mapping of str to xarray.Dataset
        Replayed arms of the same tokens: the baseline, its repeat and one per knob.
    baseline : str
        The baseline replay's arm (the capture's own settings).
    floor : str
        The repeat of the baseline (same settings): the floor.
    source : xarray.Dataset, optional
        The captured arm: each row also gets ``capture_mean_abs`` (how far that arm sits from the
        captured logprobs; the knob that brings a replay back to the capture explains the capture).
    knobs : sequence of str, optional
        The knob arms, in any order; ``None`` means every arm but ``baseline`` and ``floor``.
    top : int, optional
        Tokens named per knob (:func:`top_tokens`).

    Returns
    -------
    list of dict
        One row per knob, largest ``floor_units`` first (ties: larger ``share_moved``, then the
        name): ``knob``, the :func:`shift` fields, ``rank`` (1 = moves the tokens most),
        ``top_tokens``, ``capture_mean_abs`` where ``source`` is given, and ``trainer_gap`` and
        ``explained`` (:func:`explained_share`; ``None`` without trainer numbers).

    Raises
    ------
    KeyError
        ``baseline``, ``floor`` or a knob is no arm.
    """
    for name in (baseline, floor, *(knobs or ())):
        if name not in arms:
            raise KeyError(f"no arm {name!r}; arms: {', '.join(arms)}")
    base = arms[baseline]
    f = replay_floor(base, arms[floor])
    names = [k for k in (knobs if knobs is not None else arms) if k not in (baseline, floor)]
    rows = []
    base_gap = trainer_gap(base)
    for k in names:
        row = {"knob": k, **shift(token_delta(arms[k], base), floor_mean_abs=f["mean_abs"],
                                  floor_max_abs=f["max_abs"]),
               "top_tokens": top_tokens(arms[k], base, top)}
        row["trainer_gap"] = trainer_gap(arms[k])
        row["explained"] = explained_share(row["trainer_gap"], base_gap)
        if source is not None:
            row["capture_mean_abs"] = capture_gap(arms[k], source)["mean_abs"]
        rows.append(row)
    rows.sort(key=lambda r: (-_finite(r["floor_units"]), -_finite(r["share_moved"]), r["knob"]))
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    return rows


def _finite(x: float) -> float:
    return -1.0 if x != x else float(x)


_ROW_VARS = ("floor_units", "explained", "mean_abs", "max_abs", "share_moved", "n_moved", "capture_mean_abs",
             "trainer_gap")


def bisect_table(report: Mapping[str, Any], *more: Mapping[str, Any]) -> xr.Dataset:
    """A bisection's report as one ranked table: a row per knob or pair, ran ones first.

    The rows that ran keep their shift (:func:`knob_table`'s fields) and are ranked again by
    ``floor_units`` (ties: larger ``share_moved``, then the name), so the reports of several calls
    that replayed the same tokens under the same floor (two GPU calls, each with part of the knobs)
    rank together; the entries that did not run follow with their status and reason (one that ran
    in another report is left out). A report without trainer numbers (or written before they were
    kept) has ``explained`` NaN.

    Parameters
    ----------
    report : Mapping
        :func:`rlparity.experiments.bisect.report` (or its JSON): ``knobs``, ``not_run``, ``floor``,
        ``replay_vs_capture`` and ``mode``; ``winner``, ``trainer_gap`` and ``layers`` where recorded.
    *more : Mapping
        Further reports of the same tokens (same ``n_tokens``, floor unit and mode).

    Returns
    -------
    xarray.Dataset
        Dimension ``knob``: ``rank`` (1 = moves the tokens most; 0 for rows that did not run),
        ``kind`` (``knob`` or ``pair``), ``status`` (``ran``, ``not_applicable``, ``skipped``),
        ``reason``, ``worst_token`` (the text or id of the token moved most, with its delta) and the
        floats ``floor_units``, ``explained``, ``mean_abs``, ``max_abs`` (nats), ``share_moved``,
        ``n_moved``, ``capture_mean_abs``, ``trainer_gap`` (NaN where not run or not recorded).
        Attrs: ``mode``, ``unit`` (the floor unit, nats), ``floor_mean_abs``, ``floor_max_abs``,
        ``replay_mean_abs`` and ``replay_max_abs`` (replay against capture), ``n_tokens``,
        ``winner`` (the arm, or None), ``trainer_gap_capture``, ``trainer_gap_replay``,
        ``engine_starts`` and ``wall_s`` (summed over the reports), ``reports``.

    Raises
    ------
    ValueError
        If a report misses ``knobs`` or ``floor``, or the reports hold other tokens, floors or modes.
    """
    reports = (report, *more)
    for i, rep in enumerate(reports):
        missing = [k for k in ("knobs", "floor", "replay_vs_capture") if k not in rep]
        if missing:
            raise ValueError(f"report {i} has no {', '.join(missing)}: give rlparity.experiments.bisect.report's "
                             "result (or its JSON)")
    first = reports[0]
    unit = _unit(first)
    for i, rep in enumerate(reports[1:], 1):
        same = (rep["floor"].get("n_tokens"), _unit(rep), rep.get("mode")) == \
            (first["floor"].get("n_tokens"), unit, first.get("mode"))
        if not same:
            raise ValueError(f"report {i} replayed {rep['floor'].get('n_tokens')} tokens ({rep.get('mode')}, unit "
                             f"{_unit(rep)}) against report 0's {first['floor'].get('n_tokens')} ({first.get('mode')}, "
                             f"unit {unit}): only reports of the same tokens and floor rank together")
    rows = [r for rep in reports for r in rep["knobs"]]
    names = [str(r["knob"]) for r in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"a knob ran in two reports ({', '.join(sorted({n for n in names if names.count(n) > 1}))}): "
                         "its two shifts cannot share one row")
    rows.sort(key=lambda r: (-_finite(_float(r.get("floor_units"))), -_finite(_float(r.get("share_moved"))),
                             str(r["knob"])))
    seen = set(names)
    rest = []
    for rep in reports:
        for p in rep.get("not_run") or ():
            if p["knob"] not in seen:
                seen.add(p["knob"])
                rest.append(p)
    n = len(rows) + len(rest)
    data: dict[str, Any] = {v: np.full(n, np.nan) for v in _ROW_VARS}
    for i, r in enumerate(rows):
        for v in _ROW_VARS:
            data[v][i] = _float(r.get(v))
    kind = [r.get("kind") or ("pair" if "+" in str(r["knob"]) else "knob") for r in rows] + \
        ["pair" if "+" in str(p["knob"]) else "knob" for p in rest]
    worst = [_worst(r.get("top_tokens") or ()) for r in rows] + [""] * len(rest)
    ds = xr.Dataset({v: ("knob", data[v]) for v in _ROW_VARS},
                    coords={"knob": [str(r["knob"]) for r in rows] + [str(p["knob"]) for p in rest]})
    ds["rank"] = ("knob", np.array(list(range(1, len(rows) + 1)) + [0] * len(rest), dtype=np.int64))
    ds["kind"] = ("knob", np.array(kind, dtype=object).astype(str))
    ds["status"] = ("knob", np.array(["ran"] * len(rows) + [str(p["status"]) for p in rest], dtype=object).astype(str))
    ds["reason"] = ("knob", np.array([""] * len(rows) + [str(p.get("reason") or "") for p in rest],
                                     dtype=object).astype(str))
    ds["worst_token"] = ("knob", np.array(worst, dtype=object).astype(str))
    gap = first.get("trainer_gap") or {}
    ds.attrs = {"mode": first.get("mode"), "unit": unit, "floor_mean_abs": _float(first["floor"].get("mean_abs")),
                "floor_max_abs": _float(first["floor"].get("max_abs")),
                "replay_mean_abs": _float(first["replay_vs_capture"].get("mean_abs")),
                "replay_max_abs": _float(first["replay_vs_capture"].get("max_abs")),
                "n_tokens": first["floor"].get("n_tokens"),
                "winner": (first.get("winner") or {}).get("arm") if len(reports) == 1 else None,
                "trainer_gap_capture": _float(gap.get("capture")), "trainer_gap_replay": _float(gap.get("baseline")),
                "engine_starts": sum(int(rep.get("engine_starts") or 0) for rep in reports),
                "wall_s": float(sum(_float(rep.get("wall_s")) for rep in reports)), "reports": len(reports)}
    return ds


def _unit(rep: Mapping[str, Any]) -> float:
    """The floor unit of a report (nats): its rows' ``unit``; the floor's mean (at least
    ``replay_floor_min``) where no row ran."""
    if rep["knobs"]:
        return _float(rep["knobs"][0].get("unit"))
    from rlparity.config.defaults import defaults

    return max(_float(rep["floor"].get("mean_abs")), defaults().replay_floor_min)


def _float(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _worst(tokens: Sequence[Mapping[str, Any]]) -> str:
    if not tokens:
        return ""
    t = tokens[0]
    return f"{t.get('token_text', t['token_id'])!r} {float(t['delta']):+.3g}"


__all__ = ["bisect_table", "capture_gap", "explained_share", "interaction", "knob_table", "replay_floor", "same_tokens",
           "shift", "token_delta", "top_tokens", "trainer_gap"]
