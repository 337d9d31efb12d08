"""Temperature from the numbers (issue 41): which side applied the request's temperature, read from the logprobs.

The fit is :func:`rlparity.metrics.effective_temperature`; this module turns each side's inverse temperature into
a state (tempered, untempered, inconclusive) and the states into findings. :mod:`rlparity.diagnose.semantic` calls
it beside the recorded-settings checks.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.semantic import FIX_PROCESSED, FIX_TRAINER_SAMPLING, PAIR, SEMANTIC_READINGS
from rlparity.diagnose.topic import E, FIX_NONE, FindingCode, I, SEM, Topic, code
from rlparity.trace import arm_record


def _temperature_state(beta: float, se: float, temperature: float) -> str:
    """``tempered`` / ``untempered`` / ``inconclusive`` / ``identity`` for one side at one request temperature.

    A side at temperature 1 against the raw reading has ``beta = 1`` exactly (the same model), so
    untempered is ``|log beta|`` below half of ``|log 1/T|`` by ``temperature_z`` errors. A tempered
    side's fitted ``log beta`` has the sign of ``log 1/T`` and at least its size (the fit's bias only
    inflates it: 1.1x on the H200 ``small`` model, 1.2-1.5x on the tiny CPU one), so tempered is
    ``|log beta|`` above that half by as many errors.
    """
    o = defaults()
    if not (np.isfinite(temperature) and temperature > 0) or abs(np.log(temperature)) < o.temperature_min_gap:
        return "identity"
    if not (np.isfinite(beta) and beta > 0 and np.isfinite(se)):
        return "inconclusive"
    lb, target, err = float(np.log(beta)), float(-np.log(temperature)), o.temperature_z * se / beta
    half = abs(target) / 2
    if abs(lb) + err < half:
        return "untempered"
    if np.sign(lb) == np.sign(target) and abs(lb) - err > half:
        return "tempered"
    return "inconclusive"


def _side_state(states: list[str]) -> str:
    decisive = {s for s in states if s in ("tempered", "untempered")}
    return decisive.pop() if len(decisive) == 1 else "mixed" if decisive else "inconclusive"


def temperature_from_numbers(trace: xr.Dataset, *, recorded: tuple[Finding, ...] = (),
                             semantics: Finding | None = None) -> list[Finding]:
    """Which side applied the request's temperature, read from the logprobs alone (issue 41).

    :func:`rlparity.metrics.effective_temperature` fits each side's inverse temperature against the
    trainer's raw reading per request temperature; each side is then *tempered* (at the request's
    temperature), *untempered* (at temperature 1) or inconclusive (:func:`_temperature_state`).
    Nothing recorded about either side's settings is read, so a user's own run and a peer's dump
    are judged alike; where the trace does record them (the engine's ``logprobs_mode``, the
    trainer's ``trainer_temperature``) and the numbers contradict the record, the finding says so.

    * rollout tempered, trainer untempered: ``trainer_logprobs_untempered`` (error, cause
      ``trainer_temperature``): the trainer does not divide its logits by the temperature;
    * rollout untempered, trainer tempered: ``rollout_logprobs_untempered`` (error, cause
      ``raw_logprobs``), unless the semantic fit already names raw logprobs;
    * both untempered while the request's temperature is not 1: both of the above (each side scores
      the temperature-1 distribution; the tokens were drawn from another one);
    * otherwise ``effective_temperatures`` (info) with the estimates.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm with the trainer's raw reading.
    recorded : tuple of Finding, default ()
        The findings from recorded settings (:func:`~rlparity.diagnose.semantic.trainer_sampling`): a recorded trainer
        temperature that already names the cause is not repeated, only confirmed.
    semantics : Finding, optional
        The semantic fit's finding (:func:`~rlparity.diagnose.semantic.logprob_semantics`).

    Returns
    -------
    list of Finding
        Empty when the trace has no raw reading or every request is at temperature ~1.
    """
    from rlparity.metrics import effective_temperature

    fit = effective_temperature(trace)
    if fit.sizes.get("temperature", 0) == 0:
        return []
    arm = arm_record(trace).arm
    rows, states = _states_by_temperature(fit)
    if all(st == "identity" for st in states["rollout"]):
        return []
    rollout, trainer = _side_state(states["rollout"]), _side_state(states["trainer"])
    ev = {"by_request_temperature": rows, "rollout": rollout, "trainer": trainer, "pair": PAIR,
          "reading": "slope of log(-log p) on the trainer's raw log(-log p) over confident tokens: the inverse "
                     "temperature against temperature 1 (metrics.effective_temperature)"}
    mode = arm_record(trace).effective.logprobs_mode
    requested = sorted({k for k, st in zip(rows, states["rollout"]) if st != "identity"})
    est = {side: ", ".join(f"{k}: {rows[k][f'temperature_{side}']:.2f}" for k in requested) for side in states}
    out = []
    if trainer == "untempered":
        out += _trainer_untempered(trace, recorded, ev, est, arm)
    semantic_raw = semantics is not None and semantics.cause == "raw_logprobs"
    if rollout == "untempered" and trainer in ("tempered", "untempered") and not semantic_raw:
        out.append(_rollout_untempered(trainer, mode, ev, est, arm))
    if not out:
        contradicted = None
        if rollout == "tempered" and mode == "raw_logprobs":
            contradicted = "the engine reports logprobs_mode=raw_logprobs, yet its logprobs follow the temperature"
        severity = Severity.INFO
        out.append(Finding(Layer.SEMANTIC, "effective_temperatures", severity,
                           f"from the numbers: the rollout's logprobs are {rollout} ({est['rollout']}), the trainer's "
                           f"{trainer} ({est['trainer']})" + (f"; {contradicted}" if contradicted else ""),
                           ev, "", arm))
    return out


def _states_by_temperature(fit: xr.Dataset) -> tuple[dict, dict[str, list[str]]]:
    """Per request temperature, the fit's numbers and each side's state (:func:`_temperature_state`)."""
    rows, states = {}, {"rollout": [], "trainer": []}
    for t in fit["temperature"].values:
        row = fit.sel(temperature=t)
        rows[f"T={float(t):g}"] = {k: float(row[k]) for k in fit.data_vars}
        for side in states:
            st = _temperature_state(float(row[f"beta_{side}"]), float(row[f"beta_{side}_se"]), float(t))
            rows[f"T={float(t):g}"][f"{side}_state"] = st
            states[side].append(st)
    return rows, states


def _trainer_untempered(trace: xr.Dataset, recorded: tuple[Finding, ...], ev: dict, est: dict[str, str],
                        arm: str | None) -> list[Finding]:
    """An untempered trainer: ``trainer_logprobs_untempered``, or the recorded finding that already
    names it confirmed (its evidence gains ``confirmed_by_numbers``) and nothing new."""
    trainer_named = any(f.cause == "trainer_temperature" for f in recorded)
    note = ""
    if "trainer_temperature" in trace:
        tt = np.unique(trace["trainer_temperature"].values[np.isfinite(trace["trainer_temperature"].values)])
        if tt.size and not np.allclose(tt, 1.0):
            note = f"; the trace records the trainer's temperature as {tt.tolist()}: the numbers contradict it"
            ev["record_contradicted"] = "trainer_temperature"
    if trainer_named and not note:
        for f in recorded:
            if f.cause == "trainer_temperature":
                f.evidence["confirmed_by_numbers"] = ev
        return []
    return [Finding(Layer.SEMANTIC, "trainer_logprobs_untempered", Severity.ERROR,
                    f"the trainer's processed logprobs are at temperature ~1 by their own numbers "
                    f"({est['trainer']}, against the requests' temperatures) while the tokens were drawn "
                    f"at the requests' temperature: the trainer does not divide its logits by it{note}",
                    ev, FIX_TRAINER_SAMPLING, arm, cause="trainer_temperature")]


def _rollout_untempered(trainer: str, mode: str | None, ev: dict, est: dict[str, str], arm: str | None) -> Finding:
    """An untempered rollout: ``rollout_logprobs_untempered`` (vLLM's raw logprobs)."""
    note = ""
    if mode == "processed_logprobs":
        note = "; the engine reports logprobs_mode=processed_logprobs: the numbers contradict it"
        ev["record_contradicted"] = "logprobs_mode"
    both = " (the trainer's are too: both sides score the temperature-1 distribution)" if trainer == "untempered" else ""
    return Finding(Layer.SEMANTIC, "rollout_logprobs_untempered", Severity.ERROR,
                   f"the rollout's logprobs are at temperature ~1 by their own numbers ({est['rollout']}) "
                   f"while the sampler drew at the requests' temperature{both}: they are vLLM's raw logprobs"
                   f"{note}", ev, FIX_PROCESSED, arm, cause="raw_logprobs")


# what semantic.trainer_sampling can emit: the recorded settings this topic confirms or contradicts
RECORDED_SAMPLING = ("trainer_temperature_differs", "trainer_cut_differs")


def trace_findings(trace: xr.Dataset, options=None, prior=(), *, evidence=None) -> list[Finding]:
    """The temperature topic's checks on one arm: :func:`temperature_from_numbers`, reading the
    semantic topic's findings on the arm (its fit, the recorded sampling settings); nothing when the
    trainer's logprobs are a copy of the rollout's (``trainer_is_rollout_copy``).

    Parameters
    ----------
    trace : xarray.Dataset
        One scored arm.
    options : DiagnoseOptions, optional
        Unused (the thresholds are ``defaults()``'s).
    prior : sequence of Finding
        The findings of the topics before this one, on this arm.
    evidence : ArmEvidence, optional
        Unused.

    Returns
    -------
    list of Finding
    """
    prior = list(prior)
    if any(f.name == "trainer_is_rollout_copy" for f in prior):
        return []
    semantics = next((f for f in prior if f.name in SEMANTIC_READINGS), None)
    recorded = tuple(f for f in prior if f.name in RECORDED_SAMPLING)
    return temperature_from_numbers(trace, recorded=recorded, semantics=semantics)

# the finding codes this topic emits (collected by rlparity.diagnose.catalogue)
CODES: tuple[FindingCode, ...] = (
    code("trainer_logprobs_untempered", SEM, (E,),
           "By its own numbers the trainer's processed reading is at temperature ~1 while the tokens were drawn at the "
           "requests' temperature: the trainer does not divide its logits by it. Read from the logprobs alone (no "
           "recorded setting); a recorded trainer temperature the numbers contradict is named in the summary.",
           FIX_TRAINER_SAMPLING, "temperature",
           rule="per request temperature T (|log T| >= `temperature_min_gap`), the slope beta of log(-log p) of the "
                "processed reading on the raw one over tokens with -log p_raw in `sharpness_band`: untempered when "
                "|log beta| + `temperature_z` se < |log T| / 2 while the rollout's is tempered (|log beta| - z se above it)",
           thresholds=("sharpness_band", "temperature_z", "temperature_min_gap"),
           calibrated_on="H200 bf16 small at T=0.7: a tempered side reads T 0.66-0.68, an untempered one 0.99-1.02; tiny "
                         "CPU model at T=0.5/0.7/1.3: tempered 0.43/0.61/1.48, untempered 0.99-1.00 (held out: cpu-semantic, "
                         "h200-semantic)", causes=("trainer_temperature",)),
    code("rollout_logprobs_untempered", SEM, (E,),
           "By their own numbers the rollout's logprobs are at temperature ~1 while the sampler drew at the requests' "
           "temperature: vLLM's raw logprobs. Named when the semantic fit cannot say it (the trainer's two readings "
           "coincide, or both sides are untempered).", FIX_PROCESSED, "temperature",
           rule="as trainer_logprobs_untempered, for the rollout's logprobs, while the trainer's reading is tempered or "
                "untempered too (then both are named)", thresholds=("sharpness_band", "temperature_z", "temperature_min_gap"),
           calibrated_on="as trainer_logprobs_untempered", causes=("raw_logprobs",)),
    code("effective_temperatures", SEM, (I,),
           "The temperature each side's logprobs are at, read from the numbers, where they agree with each other.",
           FIX_NONE, "temperature", rule="metrics.effective_temperature per request temperature"),
)

TOPIC = Topic('temperature', 15, CODES, trace_findings)

__all__ = ["temperature_from_numbers", "trace_findings"]
