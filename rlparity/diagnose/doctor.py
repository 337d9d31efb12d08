"""The doctor of a recorded run: is my number normal, when did a cause appear, why does it grow.

:func:`doctor` reads a run as ``{step: trace}`` (a run store's steps through
:func:`rlparity.record.step_trace`, or the arms ``<run>@step_NNN`` of an RL store grouped by run:
``rlparity doctor RUN`` does both) and gives one page per run:

* per step the mismatch (mean ``|d|``, k3; ``d = log pi_old - log mu``) beside the floors the
  step recorded (:func:`rlparity.metrics.run.step_table`), and per policy lag
  (:func:`rlparity.metrics.run.lag_table`);
* the alarms the recorder raised, step by step (``attrs["record_alarms"]``);
* the attribution per window of ``window`` steps: the existing diagnosis
  (:func:`rlparity.diagnose.diagnose`) is run on **each step alone** and aggregated per window
  (the causes named on any of its steps, the headline named on most of them), so a cause is
  named from the first step whose own trace shows it, never earlier: steps are never pooled
  with steps before the cause appeared;
* why it grows: the change of mean ``|d|`` of every window against the first, split into
  composition parts and a residual (:func:`rlparity.metrics.run.growth_decomposition`);
* is it normal: each step's mean ``|d|``, k3 and share with ``|d| > ln 2`` placed in the baseline
  table shipped with the package (:func:`rlparity.metrics.baselines.place`: the row of the run's
  setting, or the nearest row and the fields that differ);
* the sequence-level views per step (:mod:`rlparity.metrics.sequences`: band shares of tokens and
  of whole sequences, ``|d| > ln 2``, per-sequence mean ``|d|``, the top tokens by KL);
* does it matter: on the last step (or the first step naming a cause), what each correction the
  peers ship would drop, its ESS, and whether it would leave the batch looking healthy while a
  cause is named (:mod:`rlparity.metrics.counterfactual`; the gradients need the model:
  :func:`rlparity.experiments.counterfactual.correction_gradients`, ``rlparity doctor --model``).

A cause is a key of :data:`rlparity.diagnose.causes.CAUSES` that a finding at warning or above
claims; findings without a cause (the objective layer's: ESS, clipping) are listed beside the
causes. A problem is a cause named on some step, a finding at error level or an alarm at error
level; ``DoctorReport.problem`` says whether there is one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide
from rlparity.diagnose.findings import Severity
from rlparity.metrics import baselines as mb
from rlparity.metrics import counterfactual as mcf
from rlparity.metrics import run as mr
from rlparity.metrics import sequences as msq
from rlparity.trace import arm_record

DEFAULT_WINDOW = 10
MAX_STEP_ROWS = 30  # the page lists every step up to this many, else one row per window


def _step_records(ds: xr.Dataset) -> list[dict[str, Any]]:
    ints = ("n_tokens", "n_zero_prob")
    return [{"step": int(k), **{v: (int(ds[v].values[i]) if v in ints else float(ds[v].values[i]))
                                for v in ds.data_vars}} for i, k in enumerate(ds["step"].values)]


@dataclass
class RunDoctor:
    """The doctor's findings on one run.

    Parameters
    ----------
    name : str
        The run.
    steps : xarray.Dataset
        :func:`rlparity.metrics.run.step_table`.
    lags : xarray.Dataset
        :func:`rlparity.metrics.run.lag_table`.
    step_causes : dict
        Per step, its diagnosis: ``{"causes": [...], "headline": {...} or None}``.
    alarms : list of dict
        ``{"step", "code", "level"}`` of every alarm the recorder raised.
    windows : list of dict
        Per window: ``start``, ``end``, ``steps`` (recorded), the window's mismatch
        (:func:`rlparity.metrics.run.token_row`), ``causes`` (``{cause: steps naming it}``),
        ``headline``, ``growth`` (the decomposition of mean ``|d|`` against the first window; None
        for it) and ``growth_k3`` (the same of the k3 term ``exp(d) - 1 - d``).
    first_named : dict
        Per cause, the first step naming it and its window.
    normal : dict
        ``key`` (the run's baseline key) and per step the placement of its numbers
        (:func:`rlparity.metrics.baselines.place`) of ``abs_log_ratio_mean``, ``kl_k3`` and
        ``above_ln2_token_share``; empty without a table.
    views : dict
        Per step: band shares of tokens and sequences, ``|d| > ln 2`` shares, per-sequence mean
        ``|d|`` (median, max), the top tokens by KL.
    counterfactual : dict
        ``step``, ``causes`` (named on it) and ``rows`` (:func:`rlparity.metrics.counterfactual.counterfactual_table`
        with ``hides``); empty when there is no token.
    """

    name: str
    steps: xr.Dataset
    lags: xr.Dataset
    step_causes: dict[int, dict[str, Any]]
    alarms: list[dict[str, Any]]
    windows: list[dict[str, Any]]
    first_named: dict[str, dict[str, Any]] = field(default_factory=dict)
    normal: dict[str, Any] = field(default_factory=dict)
    views: dict[int, dict[str, Any]] = field(default_factory=dict)
    counterfactual: dict[str, Any] = field(default_factory=dict)

    @property
    def problem(self) -> bool:
        """Whether a cause was named, a finding at error level was made or an alarm at error level fired.

        Returns
        -------
        bool
            True with a problem.
        """
        return (bool(self.first_named) or any(a["level"] == "error" for a in self.alarms)
                or any(d["errors"] for d in self.step_causes.values()))

    def to_dict(self) -> dict[str, Any]:
        """The run's findings as plain data.

        Returns
        -------
        dict
            ``name``, ``problem``, ``steps`` (rows), ``lags`` (rows of ``(step, lag)``),
            ``step_causes``, ``alarms``, ``windows``, ``first_named``, ``normal``, ``views`` and
            ``counterfactual``.
        """
        lags = [{"step": int(k), "lag": int(j), "abs_log_ratio_mean": float(self.lags["abs_log_ratio_mean"][i, j]),
                 "n_tokens": int(self.lags["n_tokens"][i, j])}
                for i, k in enumerate(self.lags["step"].values) for j in self.lags["lag"].values
                if int(self.lags["n_tokens"][i, j]) > 0]
        return {"name": self.name, "problem": self.problem, "steps": _step_records(self.steps), "lags": lags,
                "lag_max_label": f"{int(self.lags.attrs['lag_max'])}+",
                "step_causes": {str(k): v for k, v in self.step_causes.items()}, "alarms": self.alarms,
                "windows": self.windows, "first_named": self.first_named, "normal": self.normal,
                "views": {str(k): v for k, v in self.views.items()}, "counterfactual": self.counterfactual}

    def steps_naming(self, cause: str) -> list[int]:
        """The steps whose own diagnosis names ``cause``.

        Parameters
        ----------
        cause : str
            A key of :data:`rlparity.diagnose.causes.CAUSES`.

        Returns
        -------
        list of int
            Ascending.
        """
        return sorted(int(k) for k, v in self.step_causes.items() if cause in v["causes"])

    def alarm_timeline(self) -> list[dict[str, Any]]:
        """The recorder's alarms, one row per alarm code: its level, the steps it fired on and their spans.

        Returns
        -------
        list of dict
            ``{"alarm", "level", "first", "steps", "spans", "n_steps"}`` in the order the alarms first fired.
        """
        rows: dict[tuple[str, str], list[int]] = {}
        for a in sorted(self.alarms, key=lambda a: a["step"]):
            rows.setdefault((a["code"], a["level"]), []).append(int(a["step"]))
        return [{"alarm": code, "level": level, "first": min(ks), "steps": sorted(set(ks)), "spans": _spans(ks),
                 "n_steps": len(set(ks))} for (code, level), ks in rows.items()]

    def window_table(self) -> list[dict[str, Any]]:
        """The cause of each window, one row per window.

        Returns
        -------
        list of dict
            ``steps`` (``"4-7"``), ``recorded``, ``cause`` (the headline's, ``None`` when none),
            ``on_steps`` (the window's steps naming it), ``finding`` (``layer/name``), ``severity``,
            ``mean_abs_d`` (the window's, nats), ``other_causes`` and ``other_findings`` (findings
            without a cause).
        """
        out = []
        for w in self.windows:
            h = w["headline"]
            on = [k for k in w["steps"] if h is not None and h["cause"] in self.step_causes[k]["causes"]]
            out.append({"steps": f"{w['start']}-{w['end']}", "recorded": len(w["steps"]),
                        "cause": None if h is None else h["cause"], "on_steps": on,
                        "finding": None if h is None else f"{h['layer']}/{h['finding']}",
                        "severity": None if h is None else h["severity"],
                        "mean_abs_d": float(w["abs_log_ratio_mean"]),
                        "other_causes": [c for c in w["causes"] if h is None or c != h["cause"]],
                        "other_findings": list(w["other_findings"])})
        return out

    def growth_table(self, target: str = "abs_d") -> list[dict[str, Any]]:
        """The decomposition of each window's change against the first window, one row per window.

        Parameters
        ----------
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
        for w in self.windows:
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

    def placement_table(self, metric: str = "abs_log_ratio_mean") -> list[dict[str, Any]]:
        """Where each step falls in the baseline table, one row per step.

        Parameters
        ----------
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
                for k, p in sorted((self.normal.get("steps") or {}).items(), key=lambda kv: int(kv[0]))]


@dataclass
class DoctorReport:
    """The doctor's page: one :class:`RunDoctor` per run.

    Parameters
    ----------
    runs : dict of str to RunDoctor
        Per run.
    window : int
        Steps per window.
    source : str, default ""
        What was read (a path).
    """

    runs: dict[str, RunDoctor]
    window: int
    source: str = ""

    @property
    def problem(self) -> bool:
        """Whether any run has a problem (:attr:`RunDoctor.problem`).

        Returns
        -------
        bool
            True with a problem.
        """
        return any(r.problem for r in self.runs.values())

    def to_dict(self) -> dict[str, Any]:
        """The page as plain data (strict JSON with :func:`rlparity.config.provenance.to_json`).

        Returns
        -------
        dict
            ``source``, ``window``, ``problem``, ``pair``, ``runs`` (each :meth:`RunDoctor.to_dict`).
        """
        return {"source": self.source, "window": self.window, "problem": self.problem,
                "pair": "backend (pi_old, mu), d = log pi_old - log mu (nats)",
                "runs": {k: r.to_dict() for k, r in self.runs.items()}}

    def __str__(self) -> str:
        head = (f"rlparity doctor {self.source}: {len(self.runs)} run(s), window {self.window} steps; "
                "d = log pi_old - log mu (nats), over real tokens")
        body = [head] + [line for r in self.runs.values() for line in ["", *run_page(r)]]
        verdict = ("problem found: " + "; ".join(f"{n}: {', '.join(r.first_named) or 'errors'}"
                                                  for n, r in self.runs.items() if r.problem)
                   if self.problem else "no cause named, no error alarm")
        return "\n".join([*body, "", f"verdict: {verdict}"])


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


def _table_lines(r: RunDoctor) -> list[str]:
    """The mismatch per step (per window for a long run), the floors, the lags and the alarms."""
    ks = [int(k) for k in r.steps["step"].values]
    alarms_at: dict[int, list[str]] = {}
    for a in r.alarms:
        alarms_at.setdefault(a["step"], []).append(f"{a['code']}({a['level'][0]})")
    rows = []
    if len(ks) <= MAX_STEP_ROWS:
        for i, k in enumerate(ks):
            row = {v: float(r.steps[v].values[i]) for v in r.steps.data_vars}
            head = r.step_causes[k]["headline"]
            note = " ".join(alarms_at.get(k, [])) + (f" -> {head['cause']}" if head else "")
            rows.append((str(k), row, f"{_f(row['trainer_floor'])}/{_f(row['engine_floor'])}", note.strip() or "ok"))
        lines = ["  mismatch per step:", *_mismatch_rows("step", rows)]
    else:
        for w in r.windows:
            sel = r.steps.sel(step=w["steps"])
            floors = f"{_f(float(sel['trainer_floor'].mean()))}/{_f(float(sel['engine_floor'].mean()))}"
            n_alarms = sum(len(alarms_at.get(k, [])) for k in w["steps"])
            note = (f"{n_alarms} alarms " if n_alarms else "") + (f"-> {w['headline']['cause']}" if w["headline"] else "")
            rows.append((f"{w['start']}-{w['end']}", w, floors, note.strip() or "ok"))
        lines = [f"  mismatch per window ({len(ks)} steps; every step in --json):", *_mismatch_rows("steps", rows)]
    if not np.isfinite(r.steps["trainer_floor"].values).any() and not np.isfinite(r.steps["engine_floor"].values).any():
        lines.append("  floors: none recorded (no trainer self-check, no engine batch floor): `rlparity experiment "
                     "floors` measures them")
    lag_n, lag_d = r.lags["n_tokens"].values, r.lags["abs_log_ratio_mean"].values
    used = [j for j in range(lag_n.shape[1]) if lag_n[:, j].sum() > 0]
    if used and (len(used) > 1 or used[0] != 0):
        top = int(r.lags.attrs["lag_max"])
        lines.append("  mean |d| by policy lag (tokens):  " + "  ".join(
            f"lag {j}{'+' if j == top else ''}: {_f(float(np.nansum(lag_d[:, j] * lag_n[:, j]) / lag_n[:, j].sum()), '.4g')}"
            f" ({int(lag_n[:, j].sum())})" for j in used))
    elif used:
        lines.append("  policy lag: every token on-policy (lag 0)")
    else:
        lines.append("  policy lag: unknown (the run records no version per token)")
    counts = Counter((a["code"], a["level"]) for a in r.alarms)
    lines.append("  alarms: " + ("; ".join(
        f"{code} ({level}) at {n} steps from step {min(a['step'] for a in r.alarms if a['code'] == code)}"
        for (code, level), n in counts.items()) or "none recorded"))
    return lines


def _cause_lines(r: RunDoctor) -> list[str]:
    """The cause of every window and the first step naming each cause."""
    lines = ["  cause per window (each step diagnosed alone; the headline named on most of the window's steps):"]
    for w in r.windows:
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
    if r.first_named:
        lines.append("  first named: " + "; ".join(f"{c} at step {v['step']} (window {v['window'][0]}-{v['window'][1]})"
                                               for c, v in r.first_named.items()))
    return lines


def _growth_lines(r: RunDoctor) -> list[str]:
    """The decomposition of every window's change of mean |d| against the first window."""
    grown = [w for w in r.windows if w["growth"] is not None]
    if not grown:
        return []
    base = r.windows[0]
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


def _normal_lines(r: RunDoctor) -> list[str]:
    """Where the first and the last step fall in the baseline table."""
    if not r.normal.get("steps"):
        return []
    ks = sorted(r.normal["steps"], key=int)
    lines = ["  is it normal (the baseline table of clean batches shipped with rlparity):"]
    for k in dict.fromkeys([ks[0], ks[-1]]):
        p = r.normal["steps"][k]["abs_log_ratio_mean"]
        lines.append(f"    step {k}: mean |d| {_f(p['value'], '.4g')} is {p['text']}")
    return lines


def _view_lines(r: RunDoctor) -> list[str]:
    """The last step's sequence-level view and top tokens."""
    if not r.views:
        return []
    k = max(r.views)
    v = r.views[k]
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


def _counterfactual_lines(r: RunDoctor) -> list[str]:
    """What each correction would do on the step the doctor picked."""
    c = r.counterfactual
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


def run_page(r: RunDoctor) -> list[str]:
    """One run's part of the doctor's page, line by line.

    Parameters
    ----------
    r : RunDoctor
        The run.

    Returns
    -------
    list of str
        The lines: the mismatch per step (or per window for long runs) beside the floors, per lag,
        the alarms, the cause per window and the first step naming each, the growth decomposition.
    """
    ks = [int(k) for k in r.steps["step"].values]
    return [f"run {r.name}: {len(ks)} steps recorded ({ks[0]}..{ks[-1]})", *_table_lines(r), *_normal_lines(r),
            *_view_lines(r), *_cause_lines(r), *_growth_lines(r), *_counterfactual_lines(r)]


def _step_diagnosis(trace: xr.Dataset, arm: str, options: Mapping[str, Any]) -> dict[str, Any]:
    from rlparity.diagnose import diagnose

    report = diagnose({arm: trace}, **options)
    probs = report.problems(Severity.WARNING)
    causes = list(dict.fromkeys(f.cause for f in probs if f.cause))
    others = list(dict.fromkeys(f.name for f in probs if not f.cause))
    head = report.headline(arm)
    if head is not None and not head.cause:  # the headline cause: the top finding that claims one
        head = next((f for f in report.also(arm) if f.cause), None)
    return {"causes": causes, "other_findings": others, "errors": [f.name for f in report.problems(Severity.ERROR)],
            "headline": None if head is None else {"cause": head.cause, "finding": head.name,
                                                   "layer": head.layer.value, "severity": head.severity.value,
                                                   "share": head.share, "fix": head.fix}}


def _window_headline(ks: list[int], diag: Mapping[int, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The window's headline: the cause most of its steps give as theirs (ties: the larger mean share)."""
    heads = Counter(diag[k]["headline"]["cause"] for k in ks if diag[k]["headline"] is not None)
    if not heads:
        return None

    def rank(kv: tuple[str, int]) -> tuple[int, float]:
        shares = [diag[k]["headline"]["share"] or 0.0 for k in ks
                  if diag[k]["headline"] and diag[k]["headline"]["cause"] == kv[0]]
        return kv[1], float(np.mean(shares)) if shares else 0.0

    cause, n = max(heads.items(), key=rank)
    finding = next(diag[k]["headline"] for k in ks if diag[k]["headline"] and diag[k]["headline"]["cause"] == cause)
    return {**finding, "steps": n}


def doctor_run(name: str, steps: Mapping[int, xr.Dataset], *, window: int = DEFAULT_WINDOW,
               trainer: TrainerSide | None = None, n_boot: int = 200, seed: int = 0,
               options: Mapping[str, Any] | None = None, baselines=None, decode=None,
               device: str | None = None) -> RunDoctor:
    """The doctor on one run.

    Parameters
    ----------
    name : str
        The run's name.
    steps : Mapping[int, xarray.Dataset]
        ``{step: trace}``, each scored.
    window : int, default DEFAULT_WINDOW
        Steps per window: window ``w`` holds steps ``[w * window, (w + 1) * window)``.
    trainer : {"processed", "raw"}, optional
        The trainer reading that is pi_old.
    n_boot : int, default 200
        Bootstrap replicates of the growth decomposition.
    seed : int, default 0
        Seeds the bootstrap.
    options : Mapping[str, Any], optional
        Options of :func:`rlparity.diagnose.diagnose` for every step.
    baselines : list of BaselineRow, optional
        The baseline table (default the shipped one, :func:`rlparity.metrics.baselines.load_baselines`).
    decode : callable, optional
        ``token ids -> text`` for the top tokens (e.g. a tokenizer's ``decode``).
    device : str, optional
        The card of the run's key in the baseline table (e.g. ``"H100"``); None: the trainer's
        device from the attrs (``cuda`` / ``cpu``), which matches no GPU row exactly.

    Returns
    -------
    RunDoctor
        The run's findings.

    Raises
    ------
    ValueError
        If there is no step or ``window`` is below 1.
    """
    if not steps:
        raise ValueError(f"run {name!r} has no step to read")
    if int(window) < 1:
        raise ValueError(f"window={window}; give at least 1 step per window")
    opts = dict(options or {})
    tokens = mr.run_tokens(steps, trainer=trainer)
    table = mr.step_table(steps, trainer=trainer, tokens=tokens)
    lags = mr.lag_table(tokens)
    nothing = {"causes": [], "other_findings": [], "errors": [], "headline": None, "note": "no token to judge"}
    diag = {k: _step_diagnosis(steps[k], f"{name}@step_{k}", opts) if tokens[k].d.size else dict(nothing)
            for k in sorted(steps)}
    alarms = [{"step": int(k), "code": code, "level": level}
              for k in sorted(steps) for code, level in (arm_record(steps[k]).record_alarms or {}).items()]
    first: dict[str, dict[str, Any]] = {}
    by_window: dict[int, list[int]] = {}
    for k in sorted(steps):
        by_window.setdefault(int(k) // int(window), []).append(int(k))
    windows: list[dict[str, Any]] = []
    base_tokens = None
    for w, ks in sorted(by_window.items()):
        pooled = mr.concat_tokens([tokens[k] for k in ks])
        named = Counter(c for k in ks for c in diag[k]["causes"])
        other = Counter(c for k in ks for c in diag[k]["other_findings"])
        start, end = w * int(window), (w + 1) * int(window) - 1
        for k in ks:
            for c in diag[k]["causes"]:
                first.setdefault(c, {"step": k, "window": [start, end]})
        headline = _window_headline(ks, diag)
        growth = growth_k3 = None
        if base_tokens is None:
            base_tokens = pooled
        elif pooled.d.size and base_tokens.d.size:
            growth = mr.growth_decomposition(base_tokens, pooled, n_boot=n_boot, seed=seed + w)
            growth_k3 = mr.growth_decomposition(base_tokens, pooled, target="k3", n_boot=n_boot, seed=seed + w)
        row = mr.token_row(pooled)
        row.update(n_tokens=int(row["n_tokens"]), n_zero_prob=int(row["n_zero_prob"]))
        windows.append({"start": start, "end": end, "steps": ks, **row,
                        "causes": dict(named), "other_findings": dict(other), "headline": headline,
                        "growth": growth, "growth_k3": growth_k3})
    normal = _placements(steps, baselines, device)
    views = {int(k): _view(steps[k], trainer, decode) for k in sorted(steps) if tokens[k].d.size}
    counterfactual = _counterfactual(steps, diag, first, trainer)
    return RunDoctor(name, table, lags, diag, alarms, windows, first, normal, views, counterfactual)


def _placements(steps: Mapping[int, xr.Dataset], baselines, device: str | None = None) -> dict[str, Any]:
    """Each step's numbers placed in the baseline table (the run's key: its first step's attrs)."""
    rows = mb.load_baselines() if baselines is None else list(baselines)
    if not rows:
        return {}
    first = steps[min(steps)]
    key = mb.baseline_key(first.attrs, device=device)
    out: dict[str, Any] = {"key": key, "steps": {}}
    for k in sorted(steps):
        vals = mb.unit_values(steps[k])
        if not vals["n_tokens"]:
            continue
        out["steps"][str(int(k))] = {m: mb.place(vals[m], m, key, rows) for m in mb.METRICS}
    return out


def _view(trace: xr.Dataset, trainer: TrainerSide | None, decode) -> dict[str, Any]:
    v = msq.sequence_view(trace, trainer=trainer)
    per_seq = v["sequence_mean_abs_log_ratio"].values
    fin = per_seq[np.isfinite(per_seq)]
    return {"token_share": dict(zip(map(str, v["band"].values), map(float, v["token_share"].values))),
            "sequence_share": dict(zip(map(str, v["band"].values), map(float, v["sequence_share"].values))),
            "above_ln2_token_share": float(v["above_ln2_token_share"]),
            "above_ln2_sequence_share": float(v["above_ln2_sequence_share"]),
            "sequence_mean_abs_median": float(np.median(fin)) if fin.size else float("nan"),
            "sequence_mean_abs_max": float(fin.max()) if fin.size else float("nan"),
            "sequence_mean_abs": [float(x) for x in per_seq],
            "top_tokens": msq.top_kl_tokens(trace, trainer=trainer, decode=decode)}


def _counterfactual(steps: Mapping[int, xr.Dataset], diag: Mapping[int, Mapping[str, Any]],
                    first: Mapping[str, Mapping[str, Any]], trainer: TrainerSide | None) -> dict[str, Any]:
    """The corrections on the first step naming a cause, else on the last step."""
    k = min((v["step"] for v in first.values()), default=max(steps))
    d, mask, _ = msq.backend_log_ratio(steps[k], trainer)
    if not (mask & np.isfinite(d)).any():
        return {}
    causes = list(diag[k]["causes"])
    t = steps[k]
    adv = t["advantage"].values if "advantage" in t else None  # prime-rl's DPPO mask needs them
    rows = mcf.counterfactual_table(d, mask, log_mu=np.where(mask, t["rollout_logprob"].values, np.nan), advantages=adv)
    for row in rows:
        row["hides"] = causes if mcf.would_hide(row) else []
    return {"step": int(k), "causes": causes, "rows": rows}


def doctor(runs: Mapping[str, Mapping[int, xr.Dataset]], *, window: int = DEFAULT_WINDOW,
           trainer: TrainerSide | None = None, n_boot: int = 200, seed: int = 0,
           options: Mapping[str, Any] | None = None, source: str = "", baselines=None,
           decode=None, device: str | None = None) -> DoctorReport:
    """The doctor on every run: per step the mismatch and its floors, per lag, the alarms, the cause
    of each window and the first step naming it, and why the mismatch grows.

    ::

        run = rlparity.record.open_run("run.zarr")
        steps = {k: rlparity.record.step_trace(run, k) for k in range(run.sizes["step"])}
        print(doctor({"run": steps}))

    Parameters
    ----------
    runs : Mapping[str, Mapping[int, xarray.Dataset]]
        ``{run: {step: trace}}``.
    window : int, default DEFAULT_WINDOW
        Steps per window.
    trainer : {"processed", "raw"}, optional
        The trainer reading that is pi_old.
    n_boot : int, default 200
        Bootstrap replicates of the growth decomposition.
    seed : int, default 0
        Seeds the bootstrap.
    options : Mapping[str, Any], optional
        Options of :func:`rlparity.diagnose.diagnose` for every step.
    source : str, default ""
        What was read (shown on the page).
    baselines : list of BaselineRow, optional
        The baseline table (default the shipped one).
    decode : callable, optional
        ``token ids -> text`` for the top tokens.
    device : str, optional
        The card of the runs' key in the baseline table (e.g. ``"H100"``).

    Returns
    -------
    DoctorReport
        The page (``str()``) and its data (``to_dict()``).

    Raises
    ------
    ValueError
        If there is no run, a run has no step, or ``window`` is below 1.
    """
    if not runs:
        raise ValueError("no run to read: pass {run: {step: trace}}")
    return DoctorReport({name: doctor_run(name, steps, window=window, trainer=trainer, n_boot=n_boot, seed=seed,
                                          options=options, baselines=baselines, decode=decode,
                                          device=device)
                            for name, steps in runs.items()}, int(window), source)


# ------------------------------------------------------------------------------ the page as tables

def _spans(steps: list[int]) -> str:
    """``[6, 7, 8, 10]`` -> ``"6-8, 10"``."""
    out: list[str] = []
    for k in sorted(set(steps)):
        if out and k == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{k}"
        else:
            out.append(str(k))
    return ", ".join(out)


__all__ = ["DEFAULT_WINDOW", "DoctorReport", "MAX_STEP_ROWS", "RunDoctor", "doctor", "doctor_run", "run_page"]
