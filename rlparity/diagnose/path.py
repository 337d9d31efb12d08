"""Inference-path checks: does the rollout engine compute the same prompts down the same path?

Per arm (:func:`trace_findings`): the engine's effective settings, as the running engine
reported them into the trace, audited against the ``pipelinerl-parity`` profile for the path
settings (prefix caching, async scheduling, the model's generation config). ``logprobs_mode``
and the LM head have their own checks (:mod:`~rlparity.diagnose.semantic`,
:mod:`~rlparity.diagnose.head_precision`).

Over the arms of an ablation (:func:`arms_findings`, store from
:func:`rlparity.experiments.ablation.ablation`): one finding per setting saying what it moves
(batch determinism compared with the reference arm's own):
the gap to the trainer (backend pair, d = log pi_old - log mu), the logprobs against the
reference arm (d_ref = log mu_arm - log mu_ref), the sampled tokens, greedy determinism by batch
composition; and each setting the platform could not run, with the reason.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.profile_diff import compare
from rlparity.config.settings import EngineSettings
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.metrics import BACKEND_PAIR_D
from rlparity.metrics.ablation import REFERENCE, ablation_plan, ablation_table, is_ablation
from rlparity.metrics.summary import REFERENCE_PAIR_D
from rlparity.diagnose.topic import FIX_NONE, FIX_SETTING, FindingCode, I, NOT_RECORDED, PATH, Topic, W, code
from rlparity.trace import arm_record

# the path settings audited per arm, and the finding each gives when it differs from the profile
SETTING_DIFFERS = {"enable_prefix_caching": "enable_prefix_caching_differs",
                   "async_scheduling": "async_scheduling_differs",
                   "generation_config": "generation_config_differs"}
PATH_SETTINGS = tuple(SETTING_DIFFERS)
PAIR_TRAINER = BACKEND_PAIR_D
PAIR_REFERENCE = REFERENCE_PAIR_D


def setting_fix(field: str, value) -> str:
    """How to set ``field=value`` in the user's terms.

    Parameters
    ----------
    field : str
        A field of :class:`~rlparity.config.settings.EngineSettings`.
    value : object
        The value to set it to.

    Returns
    -------
    str
        ``LLM(..., field=value)`` keyword arguments and the ``vllm serve`` flags, or the
        environment variables to set where the setting is one.
    """
    s = EngineSettings(**{field: value}, seed=None, max_model_len=None)
    kwargs = ", ".join(f"{k}={v!r}" for k, v in s.to_engine_kwargs().items())
    env = s.env()
    flags = " ".join(shlex.quote(a) for a in s.to_cli_args())
    if env:
        envs = " ".join(f"{k}={v}" for k, v in env.items())
        return f"set {envs} in the engine's environment"
    return f"LLM(..., {kwargs}) or vllm serve ... {flags}"


def path_settings(trace: xr.Dataset, profile: str | None = None) -> list[Finding]:
    """The path settings of one arm that differ from ``profile``.

    Each is information: the setting is a known risk for parity, and whether it moves this model's
    logprobs is what :func:`rlparity.experiments.ablation.ablation` measures. The exception is a
    ``generation_config`` whose model file really sets sampling defaults (a warning: requests that
    omit them sample from another distribution).

    Parameters
    ----------
    trace : xarray.Dataset
        An arm with ``attrs["engine_effective"]`` (the running engine's settings).
    profile : str, optional
        The reference profile, a name or a YAML path; None: the default profile.

    Returns
    -------
    list of Finding
        One ``*_differs`` finding per path setting (:data:`PATH_SETTINGS`) that differs; empty
        when the trace records no effective configuration (e.g. imported from another framework).
    """
    rec = arm_record(trace)
    if not rec.engine_effective:
        return []
    res = compare(rec.engine_effective.to_attrs(), profile, source=f"arm {rec.arm!r}")
    out = []
    for d in res.differences:
        if d.setting not in PATH_SETTINGS:
            continue
        # a setting that differs is a risk, not a measured effect: information, unless the
        # model's generation config really changes the sampling defaults
        sev = Severity.INFO
        extra = {}
        note = " (a risk, not a measurement: the ablation measures what it moves)"
        if d.setting == "generation_config":
            model_defaults = rec.effective.generation_config_sampling_defaults or {}
            extra["generation_config_sampling_defaults"] = model_defaults
            if model_defaults:
                sev = Severity.WARNING
                note = f" (this model's generation_config.json sets {model_defaults})"
        out.append(Finding(
            Layer.INFERENCE_PATH, SETTING_DIFFERS[d.setting], sev,
            f"{d.setting} is {d.effective!r} in the engine (profile {res.profile}: {d.expected!r}): {d.why}{note}",
            {"setting": d.setting, "effective": d.effective, "expected": d.expected, "profile": res.profile,
             "source": "engine_effective, read back from the running engine", **extra},
            setting_fix(d.setting, d.expected), rec.arm))
    return out


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=(),
                   evidence=None) -> list[Finding]:
    """The inference-path checks of one arm (called by :func:`rlparity.diagnose.diagnose`).

    The engine's effective path settings against the reference profile (:func:`path_settings`).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    options : DiagnoseOptions, optional
        Reads ``profile``; None: the defaults.
    prior : sequence of Finding, default ()
        The earlier layers' findings for the arm (unused here).
    evidence : ArmEvidence, optional
        The arm's evidence (unused here).

    Returns
    -------
    list of Finding
        The settings findings of the arm.
    """
    opts = options or DiagnoseOptions()
    return path_settings(trace, opts.profile)


def moved_settings(table: xr.Dataset, *, tol_reference: float | None = None, tol_trainer: float | None = None
                   ) -> dict[str, list[str]]:
    """Which metrics each setting that ran moves against the reference arm.

    Batch determinism moves when the distinct greedy outputs or the logprob spread differ from the
    reference arm's.

    Parameters
    ----------
    table : xarray.Dataset
        The ablation table (:func:`rlparity.metrics.ablation.ablation_table`).
    tol_reference : float, optional
        Nats: a max ``|d_ref|`` or a change of the batch logprob spread above it counts as moved;
        None: ``defaults().tol_reference`` (0: any bitwise difference).
    tol_trainer : float, optional
        Nats: the change of mean ``|d|`` against the trainer above which the setting moves the gap
        itself; None: ``defaults().tol_trainer``.

    Returns
    -------
    dict of str to list of str
        ``{setting: ["reference logprobs", "tokens", "trainer gap", "batch determinism"]}`` (the
        ones moved; ``[]`` for a setting that moves nothing).
    """
    opts = DiagnoseOptions.make(**({} if tol_reference is None else {"tol_reference": tol_reference}),
                                **({} if tol_trainer is None else {"tol_trainer": tol_trainer}))
    tol_reference, tol_trainer = opts.tol_reference, opts.tol_trainer
    reference = table.attrs.get("reference", REFERENCE)
    out: dict[str, list[str]] = {}
    ref = table.sel(setting=reference)
    ref_gap = float(ref["trainer_abs_log_ratio_mean"])
    for s in table["setting"].values.tolist():
        if s == reference or str(table["status"].sel(setting=s).item()) != "ran":
            continue
        row = table.sel(setting=s)
        moved = []
        if float(row["reference_abs_log_ratio_max"]) > tol_reference:
            moved.append("reference logprobs")
        if float(row["reference_identical_sequences"]) < 1.0:
            moved.append("tokens")
        if abs(float(row["trainer_abs_log_ratio_mean"]) - ref_gap) > tol_trainer:
            moved.append("trainer gap")
        # batch determinism against the reference's own: a GPU reference is rarely batch-invariant
        d_out = float(row["batch_distinct_outputs"]) - float(ref["batch_distinct_outputs"])
        d_spread = float(row["batch_logprob_spread"]) - float(ref["batch_logprob_spread"])
        if (np.isfinite(d_out) and d_out != 0) or (np.isfinite(d_spread) and abs(d_spread) > tol_reference):
            moved.append("batch determinism")
        out[s] = moved
    return out


def _batch_fix(table: xr.Dataset, reference: str, ref: Mapping[str, Any]) -> str:
    """The fix of a reference that is not batch-invariant, from what the ablation measured: the
    settings that cut the greedy spread to half the reference's or less (best first), and whether
    batch-invariant kernels removed it."""
    ran = [str(s) for s in table["setting"].values if s != reference and table["status"].sel(setting=s).item() == "ran"]
    spread = {s: float(table["batch_logprob_spread"].sel(setting=s)) for s in ran}
    outs = {s: float(table["batch_distinct_outputs"].sel(setting=s)) for s in ran}
    better = sorted((s for s in ran if np.isfinite(spread[s]) and spread[s] <= 0.5 * ref["batch_logprob_spread"]
                     and outs[s] <= ref["batch_distinct_outputs"]), key=lambda s: spread[s])
    generic = ("enable batch-invariant kernels (VLLM_BATCH_INVARIANT=1) where the platform supports them, or accept it "
               "and rescore every rollout with the trainer")
    if not better:
        return generic
    def name(s):
        row = table.sel(setting=s)
        return f"{row['field'].item()}={row['value'].item()} ({spread[s]:.2g} nats)"
    text = ("in this ablation the spread fell to half or less with " + ", ".join(name(s) for s in better)
            + f" against the reference's {ref['batch_logprob_spread']:.2g}")
    bi = "batch_invariant"
    if bi in spread and spread[bi] > 0:
        text += "; batch-invariant kernels did not remove it here"
    return text + ": pin the setting that removes it where its other effects are acceptable, or rescore every rollout with the trainer"


def ablation_findings(arms: Mapping[str, xr.Dataset], options: DiagnoseOptions | None = None) -> list[Finding]:
    """One finding per setting of an ablation store (see the module docstring).

    The reference arm gets ``batch_composition_nondeterminism`` when it is not batch-invariant;
    each other setting ``setting_moves_trainer_gap``, ``setting_changes_numerics``,
    ``batch_determinism_worse`` / ``_better`` or ``setting_no_effect``; a setting the platform
    could not run ``setting_not_applicable`` with the reason.

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        The arms of an ablation store (:func:`rlparity.experiments.ablation.ablation`).
    options : DiagnoseOptions, optional
        Reads ``reference`` (the arm the others are compared with; default the store's reference
        arm), ``tol_reference`` (nats; default 0, any bitwise difference), ``tol_trainer`` (nats)
        and ``trainer``; None: the defaults.

    Returns
    -------
    list of Finding
        The ablation's findings, one or two per setting, each with the arm of its setting.
    """
    opts = options or DiagnoseOptions()
    reference = opts.reference or REFERENCE
    tol_reference = opts.tol_reference
    table = ablation_table(arms, trainer=opts.trainer, reference=reference)
    plan = {e["arm"]: e for e in ablation_plan(arms)}
    moved = moved_settings(table, tol_reference=opts.tol_reference, tol_trainer=opts.tol_trainer)
    ref = table.sel(setting=reference)
    ref_gap = float(ref["trainer_abs_log_ratio_mean"])
    out: list[Finding] = []
    for s in table["setting"].values.tolist():
        row = table.sel(setting=s)
        status = str(row["status"].item())
        field, value, refv = (str(row[k].item()) for k in ("field", "value", "reference_value"))
        if status != "ran":
            out.append(_not_applicable(row, s, field, value))
            continue
        ev = _setting_evidence(row, s, field, value, refv, ref_gap)
        if s == reference:
            if ev["batch_distinct_outputs"] > 1 or ev["batch_logprob_spread"] > tol_reference:
                out.append(Finding(
                    Layer.INFERENCE_PATH, "batch_composition_nondeterminism", Severity.WARNING,
                    f"the reference engine is not batch-invariant: one prompt at temperature 0 gives "
                    f"{int(ev['batch_distinct_outputs'])} distinct greedy output(s) and a logprob spread of "
                    f"{ev['batch_logprob_spread']:.2g} nats depending on the batch it runs in", ev,
                    _batch_fix(table, reference, ev), s))
            continue
        fix = (f"keep {field}={refv} as in the reference profile: " + setting_fix(field, plan[s]["reference_value"])
               if field else f"use the settings of the reference arm {reference!r}")
        out += _setting_findings(s, field, value, ev, moved.get(s, []), fix, ref, ref_gap, plan)
    return out


def _not_applicable(row: xr.Dataset, s: str, field: str, value: str) -> Finding:
    """``setting_not_applicable``: a setting the platform could not run, with the reason."""
    return Finding(
        Layer.INFERENCE_PATH, "setting_not_applicable", Severity.INFO,
        f"{s}: not run on this platform: {row['reason'].item()}",
        {"setting": s, "field": field, "value": value, "reason": str(row["reason"].item())},
        "run the ablation on a platform that supports it (e.g. the GPU) to measure this setting", s)


def _setting_evidence(row: xr.Dataset, s: str, field: str, value: str, refv: str, ref_gap: float) -> dict:
    """The evidence of one setting that ran: its row of the ablation table and the reference's gap."""
    ev = {k: float(row[k]) for k in ("trainer_abs_log_ratio_mean", "trainer_mean_ratio",
                                      "reference_abs_log_ratio_mean", "reference_abs_log_ratio_max",
                                      "reference_mean_ratio", "reference_identical_sequences",
                                      "batch_distinct_outputs", "batch_logprob_spread",
                                      "cached_prompt_token_share")}
    ev.update({"setting": s, "field": field, "value": value, "reference_value": refv,
               "reference_trainer_abs_log_ratio_mean": ref_gap, "pair_trainer": PAIR_TRAINER,
               "pair_reference": PAIR_REFERENCE})
    return ev


def _setting_findings(s: str, field: str, value: str, ev: dict, what: list[str], fix: str, ref: xr.Dataset,
                      ref_gap: float, plan: Mapping[str, Mapping]) -> list[Finding]:
    """The findings of one setting other than the reference, from what it moved (``what``: the trainer
    gap, the numerics, batch determinism, or nothing)."""
    out: list[Finding] = []
    if "trainer gap" in what:
        delta = ev["trainer_abs_log_ratio_mean"] - ref_gap
        sev = Severity.WARNING if delta > 0 else Severity.INFO
        out.append(Finding(
            Layer.INFERENCE_PATH, "setting_moves_trainer_gap", sev,
            f"{s} ({field}={value}) moves mean |d| against the trainer from {ref_gap:.3g} to "
            f"{ev['trainer_abs_log_ratio_mean']:.3g} nats ({'+' if delta > 0 else ''}{delta:.2g})",
            ev, fix if delta > 0 else "", s))
    elif what and what != ["batch determinism"]:
        out.append(Finding(
            Layer.INFERENCE_PATH, "setting_changes_numerics", Severity.INFO,
            f"{s} ({field}={value}) changes the rollout logprobs against the reference arm (max |d_ref| "
            f"{ev['reference_abs_log_ratio_max']:.2g} nats, {ev['reference_identical_sequences']:.0%} "
            "of sequences identical) but not the gap to the trainer", ev, "", s))
    if "batch determinism" in what:
        r_out, r_spread = float(ref["batch_distinct_outputs"]), float(ref["batch_logprob_spread"])
        worse = (ev["batch_distinct_outputs"], ev["batch_logprob_spread"]) > (r_out, r_spread)
        out.append(Finding(
            Layer.INFERENCE_PATH, "batch_determinism_worse" if worse else "batch_determinism_better",
            Severity.WARNING if worse else Severity.INFO,
            f"with {field}={value} one prompt's greedy output depends on its batch "
            f"{'more' if worse else 'less'} than in the reference: {int(ev['batch_distinct_outputs'])} "
            f"distinct output(s) (reference {int(r_out)}), logprob spread {ev['batch_logprob_spread']:.2g} "
            f"nats (reference {r_spread:.2g})", {**ev, "reference_batch_distinct_outputs": r_out,
                                                 "reference_batch_logprob_spread": r_spread},
            fix if worse else f"to make batch composition matter less: {setting_fix(field, plan[s]['value'])}", s))
    if not what:
        out.append(Finding(
            Layer.INFERENCE_PATH, "setting_no_effect", Severity.INFO,
            f"{s} ({field}={value}) leaves every rollout logprob bitwise equal to the reference "
            f"arm's on this platform{_cache_note(ev)}", ev, "", s))
    return out


def _cache_note(ev: Mapping) -> str:
    share = ev.get("cached_prompt_token_share")
    if share is None or share != share or share <= 0:
        return ""
    return f" (with {share:.0%} of prompt tokens served from the prefix cache)"


def arms_findings(arms: Mapping[str, xr.Dataset], options: DiagnoseOptions | None = None) -> list[Finding]:
    """Ablation checks over the arms of one store (called by :func:`rlparity.diagnose.diagnose`).

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        Every arm of the store.
    options : DiagnoseOptions, optional
        Passed to :func:`ablation_findings`; None: the defaults.

    Returns
    -------
    list of Finding
        :func:`ablation_findings` when the arms are an ablation; empty otherwise.
    """
    if not is_ablation(arms):
        return []
    return ablation_findings(arms, options)



# the finding codes this topic emits (collected by rlparity.diagnose.catalogue)
CODES: tuple[FindingCode, ...] = (
    code("enable_prefix_caching_differs", PATH, (I,),
           "The engine ran with prefix caching other than the reference profile: a cached prefix is reused from another "
           "request's computation (a risk for parity, not a measurement: the ablation measures what it moves).",
           FIX_SETTING, "path", rule="the engine's effective setting, read back from the running engine, against the "
                                     "profile (`profile`)", thresholds=("profile",), calibrated_on="exact (a setting)"),
    code("async_scheduling_differs", PATH, (I,),
           "The engine ran with async scheduling other than the reference profile: it overlaps scheduling with the "
           "previous step's execution (a risk for parity, not a measurement).", FIX_SETTING, "path",
           rule="the effective setting against the profile (`profile`)", thresholds=("profile",),
           calibrated_on="exact (a setting)"),
    code("generation_config_differs", PATH, (I, W),
           "The engine's generation_config differs from the reference profile; a warning when the model's "
           "generation_config.json really sets sampling defaults (requests that omit them sample from another "
           "distribution).", FIX_SETTING, "path", rule="the effective setting against the profile (`profile`)",
           thresholds=("profile",), calibrated_on="exact (a setting)"),
    code("setting_not_applicable", PATH, (I,),
           "An ablation setting this platform could not run (e.g. a GPU-only knob on CPU), with the reason.",
           "run the ablation on a platform that supports it (e.g. the GPU) to measure this setting", "path",
           across_arms=True),
    code("batch_composition_nondeterminism", PATH, (W,),
           "The ablation's reference engine is not batch-invariant: one prompt at temperature 0 gives several greedy "
           "outputs or a logprob spread depending on the batch it runs in.",
           "the settings of the same ablation that cut the spread to half the reference's or less, named with their "
           "spreads (on the H100: FLEX attention 0, eager 0.014, batch-invariant kernels 0.016 against 0.063 nats), "
           "and whether batch-invariant kernels removed it; with none, enable batch-invariant kernels "
           "(VLLM_BATCH_INVARIANT=1) where the platform supports them, or accept it and rescore every rollout with "
           "the trainer", "path",
           rule="more than one distinct greedy output, or a logprob spread above `tol_reference` nats",
           thresholds=("tol_reference",), calibrated_on="exact (0: any bitwise difference)", across_arms=True),
    code("setting_moves_trainer_gap", PATH, (I, W),
           "An ablation setting moves the mean |d| against the trainer: a warning when it widens the gap, "
           "information when it narrows it.", FIX_SETTING, "path",
           rule="|mean |d| of the arm - mean |d| of the reference arm| above `tol_trainer` nats",
           thresholds=("tol_trainer",), calibrated_on=NOT_RECORDED, across_arms=True),
    code("setting_changes_numerics", PATH, (I,),
           "An ablation setting changes the rollout logprobs against the reference arm (or the sampled tokens) but not "
           "the gap to the trainer.", FIX_NONE, "path",
           rule="max |d_ref| above `tol_reference` nats or fewer than all sequences identical, trainer gap unmoved",
           thresholds=("tol_reference", "tol_trainer"), calibrated_on="exact (0: any bitwise difference)",
           across_arms=True),
    code("batch_determinism_worse", PATH, (W,),
           "With this ablation setting one prompt's greedy output depends on its batch more than in the reference.",
           FIX_SETTING, "path", rule="(distinct greedy outputs, logprob spread) above the reference arm's",
           thresholds=("tol_reference",), calibrated_on="exact (0: any bitwise difference)", across_arms=True),
    code("batch_determinism_better", PATH, (I,),
           "With this ablation setting one prompt's greedy output depends on its batch less than in the reference.",
           "to make batch composition matter less, use the setting (the finding names it)", "path",
           rule="(distinct greedy outputs, logprob spread) below the reference arm's", thresholds=("tol_reference",),
           calibrated_on="exact (0: any bitwise difference)", across_arms=True),
    code("setting_no_effect", PATH, (I,),
           "An ablation setting leaves every rollout logprob bitwise equal to the reference arm's on this platform "
           "(with the share of prompt tokens served from the prefix cache).", FIX_NONE, "path",
           rule="no metric moves beyond `tol_reference` / `tol_trainer`", thresholds=("tol_reference", "tol_trainer"),
           calibrated_on="exact (0: any bitwise difference)", across_arms=True),
)

TOPIC = Topic('path', 20, CODES, trace_findings, arms_findings)

__all__ = ["PATH_SETTINGS", "SETTING_DIFFERS", "ablation_findings", "arms_findings", "moved_settings", "path_settings",
           "setting_fix", "trace_findings"]
