"""The doctor's page (:mod:`rlparity.diagnose.doctor`): one run's text lines and its tables as rows.

Each function reads the fields of a :class:`rlparity.diagnose.doctor.RunDoctor` it is given (its
``steps``, ``lags``, ``alarms``, ``step_causes``, ``windows``, ``first_named``, ``normal``, ``views``,
``counterfactual``), as :mod:`rlparity.plot.doctor` does: the text lines make
:func:`rlparity.diagnose.doctor.run_page`, the tables are the rows the notebook shows
(``RunDoctor.alarm_timeline()``, ``window_table()``, ``growth_table()``, ``placement_table()``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from rlparity.metrics import baselines as mb
from rlparity.metrics import run as mr

MAX_STEP_ROWS = 30  # the page lists every step up to this many, else one row per window


# ------------------------------------------------------------------------------ the page as text

def _f(x: Any, fmt: str = ".3g") -> str:
    return "-" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, fmt)


def _mismatch_rows(label: str, rows: list[tuple[str, dict[str, Any], str, str]]) -> list[str]:
    out = [f"  {label:>9}  {'tokens':>7}  {'mean|d|':>9}  {'k3':>9}  {'len':>6}  {'-log mu':>7}  {'mu<0.1':>6}  "
           f"{'lag':>5}  {'floors tr/eng':>15}  alarms / cause"]
    for key, r, floors, note in rows:
        out.append(f"  {key:>9}  {int(r['n_tokens']):>7}  {_f(r['abs_log_ratio_mean'], '.4g'):>9}  "
                   f"{_f(r['kl_k3'], '.3g'):>9}  {_f(r['response_length_mean'], '.1f'):>6}  "
                   f"{_f(r['neg_log_mu_mean'], '.3f'):>7}  {_f(r['low_prob_share'], '.3f'):>6}  "
                   f"{_f(r['lag_mean'], '.2f'):>5}  {floors:>15}  {note}")
    return out


def table_lines(steps: xr.Dataset, lags: xr.Dataset, alarms: list[dict[str, Any]],
                step_causes: Mapping[int, Mapping[str, Any]], windows: list[dict[str, Any]]) -> list[str]:
    """The mismatch per step (per window for a long run), the floors, the lags and the alarms.

    Parameters
    ----------
    steps, lags : xarray.Dataset
        ``RunDoctor.steps`` (:func:`rlparity.metrics.run.step_table`) and ``RunDoctor.lags``
        (:func:`rlparity.metrics.run.lag_table`).
    alarms : list of dict
        ``RunDoctor.alarms``.
    step_causes : Mapping[int, Mapping[str, Any]]
        ``RunDoctor.step_causes``.
    windows : list of dict
        ``RunDoctor.windows``.

    Returns
    -------
    list of str
        The page's lines.
    """
    ks = [int(k) for k in steps["step"].values]
    alarms_at: dict[int, list[str]] = {}
    for a in alarms:
        alarms_at.setdefault(a["step"], []).append(f"{a['code']}({a['level'][0]})")
    rows = []
    if len(ks) <= MAX_STEP_ROWS:
        for i, k in enumerate(ks):
            row = {v: float(steps[v].values[i]) for v in steps.data_vars}
            head = step_causes[k]["headline"]
            note = " ".join(alarms_at.get(k, [])) + (f" -> {head['cause']}" if head else "")
            rows.append((str(k), row, f"{_f(row['trainer_floor'])}/{_f(row['engine_floor'])}", note.strip() or "ok"))
        lines = ["  mismatch per step:", *_mismatch_rows("step", rows)]
    else:
        for w in windows:
            sel = steps.sel(step=w["steps"])
            floors = f"{_f(float(sel['trainer_floor'].mean()))}/{_f(float(sel['engine_floor'].mean()))}"
            n_alarms = sum(len(alarms_at.get(k, [])) for k in w["steps"])
            note = (f"{n_alarms} alarms " if n_alarms else "") + (f"-> {w['headline']['cause']}" if w["headline"] else "")
            rows.append((f"{w['start']}-{w['end']}", w, floors, note.strip() or "ok"))
        lines = [f"  mismatch per window ({len(ks)} steps; every step in --json):", *_mismatch_rows("steps", rows)]
    if not np.isfinite(steps["trainer_floor"].values).any() and not np.isfinite(steps["engine_floor"].values).any():
        lines.append("  floors: none recorded (no trainer self-check, no engine batch floor): `rlparity experiment "
                     "floors` measures them")
    lag_n, lag_d = lags["n_tokens"].values, lags["abs_log_ratio_mean"].values
    used = [j for j in range(lag_n.shape[1]) if lag_n[:, j].sum() > 0]
    if used and (len(used) > 1 or used[0] != 0):
        top = int(lags.attrs["lag_max"])
        lines.append("  mean |d| by policy lag (tokens):  " + "  ".join(
            f"lag {j}{'+' if j == top else ''}: {_f(float(np.nansum(lag_d[:, j] * lag_n[:, j]) / lag_n[:, j].sum()), '.4g')}"
            f" ({int(lag_n[:, j].sum())})" for j in used))
    elif used:
        lines.append("  policy lag: every token on-policy (lag 0)")
    else:
        lines.append("  policy lag: unknown (the run records no version per token)")
    counts = Counter((a["code"], a["level"]) for a in alarms)
    lines.append("  alarms: " + ("; ".join(
        f"{code} ({level}) at {n} steps from step {min(a['step'] for a in alarms if a['code'] == code)}"
        for (code, level), n in counts.items()) or "none recorded"))
    return lines


def cause_lines(windows: list[dict[str, Any]], first_named: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The cause of every window and the first step naming each cause.

    Parameters
    ----------
    windows : list of dict
        ``RunDoctor.windows``.
    first_named : Mapping[str, Mapping[str, Any]]
        ``RunDoctor.first_named``.

    Returns
    -------
    list of str
        The page's lines.
    """
    lines = ["  cause per window (each step diagnosed alone; the headline named on most of the window's steps):"]
    for w in windows:
        n = len(w["steps"])
        if w["headline"] is None:
            extra = f" (findings without a cause: {', '.join(w['other_findings'])})" if w["other_findings"] else ""
            lines.append(f"    steps {w['start']}-{w['end']} ({n} recorded): no cause named{extra}")
            continue
        h = w["headline"]
        share = f", explains {h['share']:.0%} of the excess" if h.get("share") else ""
        more = [c for c in w["causes"] if c != h["cause"]] + list(w["other_findings"])
        lines.append(f"    steps {w['start']}-{w['end']} ({n} recorded): {h['cause']} on {h['steps']}/{n} steps "
                     f"({h['layer']}/{h['finding']}, {h['severity']}{share})" + (f"; also {', '.join(more)}" if more else ""))
    if first_named:
        lines.append("  first named: " + "; ".join(f"{c} at step {v['step']} (window {v['window'][0]}-{v['window'][1]})"
                                               for c, v in first_named.items()))
    return lines


def growth_lines(windows: list[dict[str, Any]]) -> list[str]:
    """The decomposition of every window's change of mean ``|d|`` against the first window.

    Parameters
    ----------
    windows : list of dict
        ``RunDoctor.windows``.

    Returns
    -------
    list of str
        The page's lines; none when no window has a decomposition.
    """
    grown = [w for w in windows if w["growth"] is not None]
    if not grown:
        return []
    base = windows[0]
    lines = [f"  why it changes: mean |d| of each window minus steps {base['start']}-{base['end']} "
             f"({_f(base['abs_log_ratio_mean'], '.4g')}), split by shift-share, 95% bootstrap over sequences:",
             f"    {'steps':>9}  {'change':>9}  " + "  ".join(f"{p:>22}" for p in (*mr.PARTS, "residual"))]
    for w in grown:
        g = w["growth"]
        cells = [f"{g['parts'][p]['value']:+.2e} [{g['parts'][p]['low']:+.1e},{g['parts'][p]['high']:+.1e}]"
                 for p in (*mr.PARTS, "residual")]
        lines.append(f"    {w['start']:>4}-{w['end']:<4}  {g['change']:+.2e}  " + "  ".join(f"{c:>22}" for c in cells))
    merged = {(grp, int(c), int(to)) for w in grown for grp, m in w["growth"]["merged"].items() for c, to in m.items()}
    if merged:
        lines.append("    not in the base window, counted in the nearest category it holds (their own excess goes to "
                     "the residual): " + ", ".join(f"{grp} {c} -> {to}" for grp, c, to in sorted(merged)))
    return lines


def normal_lines(normal: Mapping[str, Any]) -> list[str]:
    """Where the first and the last step fall in the baseline table.

    Parameters
    ----------
    normal : Mapping[str, Any]
        ``RunDoctor.normal``.

    Returns
    -------
    list of str
        The page's lines; none without a baseline table.
    """
    if not normal.get("steps"):
        return []
    ks = sorted(normal["steps"], key=int)
    lines = ["  is it normal (the baseline table of clean batches shipped with rlparity):"]
    for k in dict.fromkeys([ks[0], ks[-1]]):
        p = normal["steps"][k]["abs_log_ratio_mean"]
        lines.append(f"    step {k}: mean |d| {_f(p['value'], '.4g')} is {p['text']}")
    return lines


def view_lines(views: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """The last step's sequence-level view and top tokens.

    Parameters
    ----------
    views : Mapping[int, Mapping[str, Any]]
        ``RunDoctor.views``.

    Returns
    -------
    list of str
        The page's lines; none without a view.
    """
    if not views:
        return []
    k = max(views)
    v = views[k]
    bands = ", ".join(f"{b}: {_f(v['token_share'][b], '.3f')} tok / {_f(v['sequence_share'][b], '.3f')} seq"
                      for b in v["token_share"])
    lines = [f"  step {k} inside ratio bands (rho = pi_old/mu): {bands}; |d| > ln 2: "
             f"{_f(v['above_ln2_token_share'], '.3g')} tok / {_f(v['above_ln2_sequence_share'], '.3g')} seq; "
             f"per-sequence mean |d| median {_f(v['sequence_mean_abs_median'], '.3g')}, "
             f"max {_f(v['sequence_mean_abs_max'], '.3g')}"]
    tops = v["top_tokens"][:5]
    if tops:
        lines.append("    top tokens by k3: " + "; ".join(
            f"seq {t['sequence']} pos {t['position']} " + (f"{t['text']!r} " if t["text"] is not None else
                                                         f"id {t['token_id']} ")
            + f"d {_f(t['d'], '+.3g')}" for t in tops))
    return lines


def counterfactual_lines(counterfactual: Mapping[str, Any]) -> list[str]:
    """What each correction would do on the step the doctor picked.

    Parameters
    ----------
    counterfactual : Mapping[str, Any]
        ``RunDoctor.counterfactual``.

    Returns
    -------
    list of str
        The page's lines; none without a counterfactual.
    """
    c = counterfactual
    if not c:
        return []
    lines = [f"  does it matter: each correction on step {c['step']} (drops, ESS of the weights it applies; "
             "gradients: rlparity doctor --model PATH):"]
    for row in c["rows"]:
        hide = f"; would hide {', '.join(row['hides'])}" if row["hides"] else ""
        grad = (f"; gradient cos {row['cosine_vs_parity']:.4f} vs parity, {row['cosine_vs_full_is']:.4f} vs full IS, "
                f"norm x{row['norm_ratio_vs_parity']:.3f}" if "cosine_vs_parity" in row else "")
        lines.append(f"    {row['correction']:>20}: drops {_f(row['dropped_token_share'], '.3f')} tok, "
                     f"{_f(row['dropped_sequence_share'], '.3f')} seq; ESS {_f(row['ess'], '.3f')}{grad}{hide}")
    return lines



# ------------------------------------------------------------------------------ the page as tables

def alarm_timeline(alarms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The recorder's alarms, one row per alarm code: its level, the steps it fired on and their spans.

    Parameters
    ----------
    alarms : list of dict
        ``{"step", "code", "level"}`` per alarm (``RunDoctor.alarms``).

    Returns
    -------
    list of dict
        ``{"alarm", "level", "first", "steps", "spans", "n_steps"}`` in the order the alarms first fired.
    """
    rows: dict[tuple[str, str], list[int]] = {}
    for a in sorted(alarms, key=lambda a: a["step"]):
        rows.setdefault((a["code"], a["level"]), []).append(int(a["step"]))
    return [{"alarm": code, "level": level, "first": min(ks), "steps": sorted(set(ks)), "spans": spans(ks),
             "n_steps": len(set(ks))} for (code, level), ks in rows.items()]


def window_table(windows: list[dict[str, Any]], step_causes: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The cause of each window, one row per window.

    Parameters
    ----------
    windows : list of dict
        ``RunDoctor.windows``.
    step_causes : Mapping[int, Mapping[str, Any]]
        ``RunDoctor.step_causes``: per step, its ``causes``.

    Returns
    -------
    list of dict
        ``steps`` (``"4-7"``), ``recorded``, ``cause`` (the headline's, ``None`` when none),
        ``on_steps`` (the window's steps naming it), ``finding`` (``layer/name``), ``severity``,
        ``mean_abs_d`` (the window's, nats), ``other_causes`` and ``other_findings`` (findings
        without a cause).
    """
    out = []
    for w in windows:
        h = w["headline"]
        on = [k for k in w["steps"] if h is not None and h["cause"] in step_causes[k]["causes"]]
        out.append({"steps": f"{w['start']}-{w['end']}", "recorded": len(w["steps"]),
                    "cause": None if h is None else h["cause"], "on_steps": on,
                    "finding": None if h is None else f"{h['layer']}/{h['finding']}",
                    "severity": None if h is None else h["severity"],
                    "mean_abs_d": float(w["abs_log_ratio_mean"]),
                    "other_causes": [c for c in w["causes"] if h is None or c != h["cause"]],
                    "other_findings": list(w["other_findings"])})
    return out


def growth_table(windows: list[dict[str, Any]], target: str = "abs_d") -> list[dict[str, Any]]:
    """The decomposition of each window's change against the first window, one row per window.

    Parameters
    ----------
    windows : list of dict
        ``RunDoctor.windows``.
    target : {"abs_d", "k3"}, default "abs_d"
        Mean ``|d|`` (``growth``) or the k3 term (``growth_k3``).

    Returns
    -------
    list of dict
        ``steps``, ``change`` (nats) and per part of :data:`rlparity.metrics.run.PARTS` and
        ``residual`` its value with ``<part>_low`` / ``<part>_high`` (the bootstrap interval),
        then ``check`` (the parts' sum minus the change); windows without a decomposition are left out.

    Raises
    ------
    ValueError
        If ``target`` is another value.
    """
    if target not in ("abs_d", "k3"):
        raise ValueError(f"target={target!r}: use 'abs_d' (mean |d|) or 'k3'")
    key = "growth" if target == "abs_d" else "growth_k3"
    out = []
    for w in windows:
        g = w[key]
        if g is None:
            continue
        row: dict[str, Any] = {"steps": f"{w['start']}-{w['end']}", "change": float(g["change"])}
        for p in (*mr.PARTS, "residual"):
            part = g["parts"][p]
            row.update({p: float(part["value"]), f"{p}_low": float(part["low"]), f"{p}_high": float(part["high"])})
        row["check"] = float(g["check"])
        out.append(row)
    return out


def placement_table(normal: Mapping[str, Any], metric: str = "abs_log_ratio_mean") -> list[dict[str, Any]]:
    """Where each step falls in the baseline table, one row per step.

    Parameters
    ----------
    normal : Mapping[str, Any]
        ``RunDoctor.normal``: ``steps``, per step its placements (empty without a table).
    metric : str, default "abs_log_ratio_mean"
        One of :data:`rlparity.metrics.baselines.METRICS`.

    Returns
    -------
    list of dict
        ``step``, ``value``, ``percentile``, ``n_runs`` and ``exact`` (the run's own row, or the
        nearest) as :func:`rlparity.metrics.baselines.place` gives them, and its ``text``; empty
        without a baseline table.

    Raises
    ------
    ValueError
        If ``metric`` is not placed.
    """
    if metric not in mb.METRICS:
        raise ValueError(f"metric={metric!r}: use one of {', '.join(mb.METRICS)}")
    return [{"step": int(k), **{f: p[metric].get(f) for f in ("value", "percentile", "n_runs", "exact", "text")}}
            for k, p in sorted((normal.get("steps") or {}).items(), key=lambda kv: int(kv[0]))]


def spans(steps: list[int]) -> str:
    """Steps as runs of consecutive steps: ``[6, 7, 8, 10]`` -> ``"6-8, 10"``.

    Parameters
    ----------
    steps : list of int
        Steps, in any order, repeats allowed.

    Returns
    -------
    str
        The runs, ascending, comma-separated; ``""`` for no step.
    """
    out: list[str] = []
    for k in sorted(set(steps)):
        if out and k == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{k}"
        else:
            out.append(str(k))
    return ", ".join(out)


__all__ = ["MAX_STEP_ROWS", "alarm_timeline", "cause_lines", "counterfactual_lines", "growth_lines", "growth_table",
           "normal_lines", "placement_table", "spans", "table_lines", "view_lines", "window_table"]
