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

The page's text lines and its tables (``RunDoctor.window_table()`` and the others) are built in
:mod:`rlparity.diagnose.doctor_page`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide
from rlparity.diagnose import doctor_page as page
from rlparity.diagnose.findings import Severity
from rlparity.metrics import baselines as mb
from rlparity.metrics import counterfactual as mcf
from rlparity.metrics import run as mr
from rlparity.metrics import sequences as msq
from rlparity.trace import arm_record

DEFAULT_WINDOW = 10


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
        """The recorder's alarms, one row per alarm code.

        Returns
        -------
        list of dict
            :func:`rlparity.diagnose.doctor_page.alarm_timeline` of the run's alarms.
        """
        return page.alarm_timeline(self.alarms)

    def window_table(self) -> list[dict[str, Any]]:
        """The cause of each window, one row per window.

        Returns
        -------
        list of dict
            :func:`rlparity.diagnose.doctor_page.window_table` of the run's windows.
        """
        return page.window_table(self.windows, self.step_causes)

    def growth_table(self, target: str = "abs_d") -> list[dict[str, Any]]:
        """Each window's change against the first window, split, one row per window.

        Parameters
        ----------
        target : {"abs_d", "k3"}, default "abs_d"
            Mean ``|d|`` or the k3 term.

        Returns
        -------
        list of dict
            :func:`rlparity.diagnose.doctor_page.growth_table` of the run's windows.
        """
        return page.growth_table(self.windows, target)

    def placement_table(self, metric: str = "abs_log_ratio_mean") -> list[dict[str, Any]]:
        """Where each step falls in the baseline table, one row per step.

        Parameters
        ----------
        metric : str, default "abs_log_ratio_mean"
            One of :data:`rlparity.metrics.baselines.METRICS`.

        Returns
        -------
        list of dict
            :func:`rlparity.diagnose.doctor_page.placement_table` of the run's placements.
        """
        return page.placement_table(self.normal, metric)


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
    return [f"run {r.name}: {len(ks)} steps recorded ({ks[0]}..{ks[-1]})",
            *page.table_lines(r.steps, r.lags, r.alarms, r.step_causes, r.windows), *page.normal_lines(r.normal),
            *page.view_lines(r.views), *page.cause_lines(r.windows, r.first_named), *page.growth_lines(r.windows),
            *page.counterfactual_lines(r.counterfactual)]


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


__all__ = ["DEFAULT_WINDOW", "DoctorReport", "RunDoctor", "doctor", "doctor_run", "run_page"]
