"""Semantic layer, the reading: do the rollout logprobs mean what the trainer thinks they mean?

Checks, each returning a :class:`~rlparity.diagnose.findings.Finding`:

* :func:`logprob_semantics`: rollout logprobs vs the trainer's full-vocabulary (vLLM
  ``raw_logprobs``) and processed (``processed_logprobs``) readings; which one they match, with the
  offset per temperature (the raw-mode signature moves with temperature).
* :func:`trainer_sampling`: the sampling parameters the trainer recorded against the engine's.
* :func:`trainer_is_rollout_copy`: a trainer side that is a copy of mu.

The semantic layer goes on in the next topics: the effective temperature read from the numbers
(:mod:`rlparity.diagnose.temperature`) and the sampler's processing the trainer must repeat
(:mod:`rlparity.diagnose.processing`: penalties, the top-k/top-p renormalization and its cut, the
prompt ids).
"""


from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.diagnose.evidence import ArmEvidence, build
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.metrics import (
    BACKEND_PAIR_D,
    TRAINER_VARIABLE,
    by_temperature,
    core,
    log_ratio,
    trainer_readings,
)
from rlparity.diagnose.topic import E, FIX_NONE, FindingCode, H200_BF16, I, SEM, Topic, W, code
from rlparity.metrics.semantic import identity_sampling
from rlparity.trace import ArmRecord, arm_record

FIX_PROCESSED = ("start vLLM with --logprobs-mode processed_logprobs "
                 "(LLM(..., logprobs_mode='processed_logprobs'))")
PAIR = BACKEND_PAIR_D
_RAW_SIGNATURE = ("rollout logprobs are raw (before temperature/top-k/top-p) while the trainer recomputes the "
                  "processed distribution the sampler drew from")

# what logprob_semantics can emit: the reading the topics after this one read from their prior findings
SEMANTIC_READINGS = ("raw_logprobs_used_as_processed", "logprobs_processed", "logprobs_raw", "logprobs_not_processed",
                     "logprobs_match_neither", "logprob_semantics_untestable")


def _offsets_by_temperature(trace: xr.Dataset, side: str) -> dict:
    temps = np.unique(trace["temperature"].values)
    if temps.size < 2:
        return {}
    bt = by_temperature(trace, side)
    offsets = {f"T={t:g}": float(v) for t, v in zip(bt["temperature"].values, bt["log_ratio_mean"].values)}
    finite = [v for v in offsets.values() if np.isfinite(v)]
    return {"mean_d_by_temperature": offsets,
            "mean_d_range_over_temperatures": float(max(finite) - min(finite)) if finite else float("nan")}


def logprob_semantics(trace: xr.Dataset, *, semantic_tol: float | None = None,
                      offset_z: float | None = None, evidence: ArmEvidence | None = None) -> Finding:
    """Whether rollout logprobs are raw or processed, from relative evidence.

    With both trainer readings, the rollout logprob ``mu`` is placed on the line between them:
    ``mu - raw = alpha (processed - raw) + noise`` (a robust least-squares fit,
    :func:`rlparity.diagnose.evidence.semantic_fit`), on the tokens no other identified cause
    explains (stale prefix-cache hits, KV carried over an update, tokens of a version the two sides
    hold different weights for). ``alpha ~ 1``: processed; ``alpha ~ 0``: raw; within
    ``semantic_tol`` of the gap (or three standard errors, if larger). The residual is the numeric
    noise floor of this engine and model: it never enters the verdict as a tolerance, so a bf16 GPU
    engine and an fp32 CPU engine are judged alike. With one trainer reading (an imported dump), the
    mean offset of d is tested against what a faithful rollout gives (``E[d] = -Var(d)/2``, mean
    ratio 1): more than ``offset_z`` standard errors above it is the raw-mode signature. When
    sampling is the identity (temperature 1, no top-k/top-p) both readings agree and no mismatch
    can be seen. An engine that reports ``logprobs_mode=raw_logprobs`` is believed (a warning) when
    the numbers cannot confirm it.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    semantic_tol : float, optional
        Tolerance on alpha, a share of the gap between the readings (dimensionless); None:
        ``defaults().semantic_tol``.
    offset_z : float, optional
        Standard errors the mean offset must exceed with one trainer reading; None:
        ``defaults().offset_z``.
    evidence : ArmEvidence, optional
        The arm's evidence (:func:`rlparity.diagnose.evidence.build`); built here when not given.

    Returns
    -------
    Finding
        ``logprobs_processed`` / ``logprobs_raw`` (info), ``logprob_semantics_untestable`` (info),
        ``raw_logprobs_used_as_processed`` (error, or warning from the engine's report alone),
        ``logprobs_not_processed`` (error) or ``logprobs_match_neither`` (warning); the evidence
        holds alpha, its standard error and band, the noise floor (nats RMS) and the offsets.
    """
    o = defaults()
    semantic_tol = o.semantic_tol if semantic_tol is None else semantic_tol
    offset_z = o.offset_z if offset_z is None else offset_z
    ev_ = evidence if evidence is not None else build(trace, semantic_tol=semantic_tol)
    readings = trainer_readings(trace)
    rec = arm_record(trace)
    evidence_ = _semantic_evidence(trace, ev_, readings, rec)
    arm = rec.arm
    if identity_sampling(trace):
        return Finding(Layer.SEMANTIC, "logprob_semantics_untestable", Severity.INFO,
                       "sampling is the identity (T=1, no top-k/top-p): raw and processed coincide",
                       evidence_, "capture at the temperature/top-k/top-p your RL run uses", arm)
    if len(readings) == 2:
        return _two_readings_finding(ev_, evidence_, semantic_tol, arm)
    return _one_reading_finding(trace, ev_, evidence_, readings[0], offset_z, arm)


def _semantic_evidence(trace: xr.Dataset, ev_: ArmEvidence, readings: list[str], rec: ArmRecord) -> dict:
    """The evidence every reading of :func:`logprob_semantics` starts from: the pair, the trainer's
    readings, the engine's logprobs mode, the RMS of d per reading, the offsets per temperature and
    the tokens left out of the fit (explained by another cause)."""
    mask = trace["response_mask"].values.astype(bool)
    evidence_: dict = {"pair": PAIR, "trainer_readings": readings, "engine_logprobs_mode": rec.effective.logprobs_mode}
    for side in readings:
        evidence_[f"rms_d_vs_trainer_{side}"] = float(core.masked_rms(log_ratio(trace, side).values, mask))
    evidence_.update(_offsets_by_temperature(trace, readings[0]))
    explained = ev_.claimed()
    if explained.any():
        evidence_["tokens_left_out"] = {c: int((t & mask).sum()) for c, t in ev_.claims.items()}
        evidence_["left_out_why"] = ("explained by another identified cause: the fit is made on the tokens no "
                                     "other cause explains")
    return evidence_


def _fit_evidence(fit: dict, semantic_tol: float) -> dict:
    """The semantic fit's numbers as evidence (alpha, its error and band, the noise floor)."""
    alpha, se = fit.get("alpha", float("nan")), fit.get("alpha_se", float("nan"))
    band = fit.get("alpha_band", semantic_tol)
    return {"alpha_processed": alpha, "alpha_se": se, "alpha_band": band,
            "noise_floor_rms": fit.get("noise_rms"), "noise_scale_robust": fit.get("noise_scale"),
            "separation_rms": fit.get("separation_rms"), "n_tokens_fitted": fit.get("n_tokens"),
            "n_sequences_fitted": fit.get("n_sequences_fitted"),
            "alpha_se_jackknife": fit.get("alpha_se_jackknife"),
            "trainer_noise_rms": fit.get("trainer_noise_rms"),
            "trainer_noise_ratio": fit.get("trainer_noise_ratio"),
            "downweighted_share": fit.get("downweighted_share"),
            "reading": "mu - log pi_raw = alpha (log pi_processed - log pi_raw) + noise; "
                       "alpha 1 = processed, 0 = raw (robust fit)"}


def _untestable_why(fit: dict, alpha: float, se: float) -> str:
    """Why the semantic fit cannot tell the readings apart: a noisy trainer, too few sequences, or
    the fit's own error."""
    n_seq = fit.get("n_sequences_fitted") or 0
    noisy = fit.get("trainer_noise_ratio", float("nan"))
    return (f"the trainer's own run-to-run noise, {fit['trainer_noise_rms']:.3g} nats RMS, is {noisy:.2g} times "
            "the gap between its processed and raw readings (its self-check): a trainer that does not repeat "
            "itself cannot tell them apart" if np.isfinite(noisy) and noisy > defaults().semantic_max_trainer_noise
            else f"only {n_seq} sequences to fit on (a reading needs {defaults().min_fit_sequences})"
            if n_seq < defaults().min_fit_sequences else
            f"alpha {alpha:.3g} +- {se:.2g} over {n_seq} sequences, with the readings "
            f"{fit.get('separation_rms', float('nan')):.2g} nats apart: at this noise the fit cannot tell them "
            "apart (the error is the larger of the per-token one and a jackknife over sequences)")


def _two_readings_finding(ev_: ArmEvidence, evidence_: dict, semantic_tol: float, arm: str | None) -> Finding:
    """:func:`logprob_semantics` with both trainer readings: the reading of the semantic fit (alpha)."""
    fit = ev_.fit
    evidence_.update(_fit_evidence(fit, semantic_tol))
    alpha, se = evidence_["alpha_processed"], evidence_["alpha_se"]
    mode = evidence_["engine_logprobs_mode"]
    if mode == "raw_logprobs" and ev_.reading != "raw":
        # the engine says it returns raw logprobs while the numbers cannot show it (here the
        # trainer's readings coincide, or another cause moves every token): believe the engine
        return Finding(Layer.SEMANTIC, "raw_logprobs_used_as_processed", Severity.WARNING,
                       _RAW_SIGNATURE + f": the running engine reports logprobs_mode=raw_logprobs; the logprobs "
                       f"alone cannot confirm it here (the fit reads {ev_.reading!r}: alpha {alpha:.3g} +- "
                       f"{se:.2g}, the trainer's readings {fit.get('separation_rms', float('nan')):.2g} nats apart)",
                       evidence_, FIX_PROCESSED, arm, cause="raw_logprobs")
    if ev_.reading == "untestable":
        why = _untestable_why(fit, alpha, se)
        return Finding(Layer.SEMANTIC, "logprob_semantics_untestable", Severity.INFO,
                       f"inconclusive: which reading the rollout reports cannot be told here ({why})", evidence_,
                       "capture more sequences, at the temperature/top-k your RL run uses, with the trainer in "
                       "eval mode (a noisy trainer hides the semantic reading)", arm)
    if ev_.reading == "processed":
        return Finding(Layer.SEMANTIC, "logprobs_processed", Severity.INFO,
                       f"rollout logprobs are the processed distribution (alpha {alpha:.3f} +- {se:.2g}; "
                       f"numeric noise floor {fit['noise_rms']:.3g} nats RMS)", evidence_, "", arm)
    if ev_.reading == "raw":
        summary = _RAW_SIGNATURE + f" (alpha {alpha:.3f} +- {se:.2g})"
        if evidence_.get("mean_d_range_over_temperatures", 0) > 0:
            summary += "; the mean offset moves with temperature (the raw-mode signature)"
        return Finding(Layer.SEMANTIC, "raw_logprobs_used_as_processed", Severity.ERROR, summary,
                       evidence_, FIX_PROCESSED, arm, cause="raw_logprobs")
    return Finding(Layer.SEMANTIC, "logprobs_match_neither", Severity.WARNING,
                   f"rollout logprobs lie between or beyond the trainer's processed and raw readings "
                   f"(alpha {alpha:.3f} +- {se:.2g}; 1 = processed, 0 = raw): another temperature, "
                   "other sampling parameters or a different distribution", evidence_,
                   "compare the engine's sampling parameters with the trainer's (temperature, top-k, "
                   "top-p, penalties, the model's generation_config)", arm)


def _one_reading_finding(trace: xr.Dataset, ev_: ArmEvidence, evidence_: dict, side: str, offset_z: float,
                         arm: str | None) -> Finding:
    """:func:`logprob_semantics` with one trainer reading: the mean offset of d against a faithful
    rollout's (``E[d] = -Var(d)/2``)."""
    free = ev_.unclaimed()
    t = core.offset_test(log_ratio(trace, side).values, free)
    evidence_.update({"offset_nats": t["offset"], "offset_se": t["offset_se"], "offset_z": t["z"],
                      "mean_d": t["mean"], "var_d": t["var"], "z_threshold": offset_z,
                      "reading": f"one trainer reading ({side}): a faithful rollout has mean(d) + var(d)/2 = 0"})
    if np.isfinite(t["z"]) and abs(t["z"]) > offset_z:
        if t["offset"] > 0 and side == "processed":
            return Finding(Layer.SEMANTIC, "logprobs_not_processed", Severity.ERROR,
                           f"rollout logprobs sit {t['offset']:.3g} nats ({t['z']:.0f} standard errors) below the "
                           "trainer's processed distribution on average: they do not describe the distribution "
                           "the sampler drew from (the signature of vLLM's raw logprobs)", evidence_,
                           FIX_PROCESSED + "; confirm with `rlparity score --model MODEL` (adds the raw reading)",
                           arm, cause="raw_logprobs")
        return Finding(Layer.SEMANTIC, "logprobs_match_neither", Severity.WARNING,
                       f"rollout logprobs are offset from the trainer's {side} reading by {t['offset']:+.3g} nats "
                       f"({t['z']:.0f} standard errors)", evidence_,
                       "compare the engine's sampling parameters with the trainer's; rescore with "
                       "`rlparity score --model MODEL` to get both readings", arm)
    return Finding(Layer.SEMANTIC, "logprobs_processed" if side == "processed" else "logprobs_raw", Severity.INFO,
                   f"rollout logprobs agree with the trainer's {side} reading on average "
                   f"(offset {t['offset']:+.2g} nats, {t['z']:.1f} standard errors)", evidence_, "", arm)


FIX_TRAINER_SAMPLING = ("compute the trainer's processed logprobs with the engine's sampling parameters of each "
                        "request: logits / temperature, then the same top-k (ties at the k-th logit kept) and "
                        "top-p, renormalised (rlparity: Scorer(settings=TrainerSettings()) follows the trace)")


def trainer_sampling(trace: xr.Dataset) -> list[Finding]:
    """The temperature and top-k/top-p cut the trainer applied, against the engine's request.

    Reads ``trainer_temperature`` / ``trainer_top_k`` / ``trainer_top_p`` (recorded by the scorer or
    the importer) per sequence with tokens: the trainer then computes another distribution than the
    sampler drew from, whatever the logprobs mode.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.

    Returns
    -------
    list of Finding
        An error per parameter that differs on any sequence (``trainer_temperature_differs``,
        ``trainer_cut_differs``); empty when they agree or the trace does not record what the
        trainer applied.
    """
    mask = trace["response_mask"].values.astype(bool)
    has = mask.any(axis=1)
    arm = arm_record(trace).arm
    out = []
    if "trainer_temperature" in trace:
        et, tt = trace["temperature"].values, trace["trainer_temperature"].values
        bad = has & ~np.isclose(et, tt, rtol=1e-6, atol=1e-9) & np.isfinite(et) & np.isfinite(tt)
        if bad.any():
            ev = {"n_sequences": int(bad.sum()), "engine_temperature": sorted(set(np.round(et[bad], 6).tolist()))[:8],
                  "trainer_temperature": sorted(set(np.round(tt[bad], 6).tolist()))[:8], "pair": PAIR}
            out.append(Finding(Layer.SEMANTIC, "trainer_temperature_differs", Severity.ERROR,
                               f"the trainer computed its processed reading at temperature {ev['trainer_temperature']} "
                               f"while the engine sampled at {ev['engine_temperature']} ({int(bad.sum())} sequences)",
                               ev, FIX_TRAINER_SAMPLING, arm, cause="trainer_temperature"))
    if "trainer_top_k" in trace or "trainer_top_p" in trace:
        ek, ep = trace["top_k"].values, trace["top_p"].values
        tk = trace["trainer_top_k"].values if "trainer_top_k" in trace else ek
        tp = trace["trainer_top_p"].values if "trainer_top_p" in trace else ep
        norm = lambda k: np.where(k <= 0, 0, k)  # noqa: E731  (0 and -1 both mean off)
        bad = has & ((norm(ek) != norm(tk)) | ~np.isclose(ep, tp, rtol=0, atol=1e-9))
        if bad.any():
            ev = {"n_sequences": int(bad.sum()), "engine_top_k": sorted(set(norm(ek[bad]).tolist()))[:8],
                  "trainer_top_k": sorted(set(norm(tk[bad]).tolist()))[:8],
                  "engine_top_p": sorted(set(np.round(ep[bad], 6).tolist()))[:8],
                  "trainer_top_p": sorted(set(np.round(tp[bad], 6).tolist()))[:8], "pair": PAIR}
            out.append(Finding(Layer.SEMANTIC, "trainer_cut_differs", Severity.ERROR,
                               f"the trainer cut top-k {ev['trainer_top_k']} / top-p {ev['trainer_top_p']} while the "
                               f"engine sampled with top-k {ev['engine_top_k']} / top-p {ev['engine_top_p']} "
                               f"({int(bad.sum())} sequences): it renormalises over another set",
                               ev, FIX_TRAINER_SAMPLING, arm, cause="trainer_top_k"))
    return out


def trainer_is_rollout_copy(trace: xr.Dataset) -> Finding | None:
    """An error when the trainer's only reading equals the rollout's logprobs bit for bit.

    On (nearly) every token of an imported dump: the "trainer side" is a copy of mu (verl's bypass
    mode writes ``old_log_probs = rollout_log_probs``), and parity of a copy with itself proves
    nothing. A rescoring (both readings, from the model) is never a copy.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.

    Returns
    -------
    Finding or None
        ``trainer_is_rollout_copy`` when at least 99% of at least 8 tokens are identical; ``None``
        otherwise or with two trainer readings.
    """
    mask = trace["response_mask"].values.astype(bool)
    mu = trace["rollout_logprob"].values
    n = int(mask.sum())
    if n < 8 or len(trainer_readings(trace)) != 1:  # a rescoring gives two readings: never a copy
        return None
    for side, var in TRAINER_VARIABLE.items():
        if var not in trace:
            continue
        same = float(np.mean(trace[var].values[mask] == mu[mask]))
        if same >= 0.99:
            return Finding(Layer.SEMANTIC, "trainer_is_rollout_copy", Severity.ERROR,
                           f"the trainer's {side} logprobs equal the rollout's bit for bit on {same:.1%} of {n} "
                           "tokens: the trainer side is a copy of mu, and parity of a copy with itself proves "
                           "nothing", {"share_identical": same, "n_tokens": n, "trainer_reading": side},
                           "recompute pi_old with the trainer: `rlparity score STORE --model MODEL` (or dump the "
                           "trainer's own old_log_probs, not the rollout's)", arm_record(trace).arm)
    return None


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=(),
                   evidence: ArmEvidence | None = None) -> list[Finding]:
    """The semantic reading of one scored trace: which distribution the rollout's logprobs describe
    (:func:`logprob_semantics`) and the sampling parameters the trainer recorded
    (:func:`trainer_sampling`); what :func:`rlparity.diagnose.diagnose` runs first.

    A trainer side that is a copy of the rollout stops the layer there (that one finding; the
    semantic topics after this one say nothing then).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    options : DiagnoseOptions, optional
        Reads ``trainer``, ``semantic_tol``, ``offset_z`` and ``stale_ratio``; None: the defaults.
    prior : sequence of Finding, default ()
        The earlier layers' findings for the arm (this first layer has none; unused).
    evidence : ArmEvidence, optional
        The arm's evidence; built here when not given.

    Returns
    -------
    list of Finding
        The semantic layer's findings for the arm.
    """
    opts = options or DiagnoseOptions()
    ev = evidence if evidence is not None else build(trace, trainer=opts.trainer, semantic_tol=opts.semantic_tol)
    copy = trainer_is_rollout_copy(trace)
    if copy is not None:
        return [copy]
    semantics = logprob_semantics(trace, semantic_tol=opts.semantic_tol, offset_z=opts.offset_z, evidence=ev)
    # then the effective temperature read from the numbers (rlparity.diagnose.temperature) and the sampler's
    # processing the trainer must repeat (rlparity.diagnose.processing): the next topics
    return [semantics, *trainer_sampling(trace)]


# the finding codes this topic emits (collected by rlparity.diagnose.catalogue)
CODES: tuple[FindingCode, ...] = (
    code("raw_logprobs_used_as_processed", SEM, (W, E),
           "The rollout's logprobs are raw (log softmax of the logits, before temperature and top-k/top-p) while the "
           "trainer recomputes the processed distribution the sampler drew from. An error when the fit of mu on the "
           "line between the trainer's raw and processed readings reads raw; a warning when the running engine "
           "reports logprobs_mode=raw_logprobs but the numbers cannot confirm it.",
           FIX_PROCESSED, "semantic",
           rule="mu - raw = alpha (processed - raw) + noise, a robust fit on the tokens no other cause explains: "
                "alpha within `semantic_tol` of 0 (or 3 standard errors, if larger) reads raw",
           thresholds=("semantic_tol",),
           calibrated_on="dimensionless (a share of the gap between the two readings); checked on " + H200_BF16
                         + " (example h200-semantic): the processed arms at alpha 1.000, the raw arms at 0.000",
           causes=("raw_logprobs",)),
    code("logprobs_processed", SEM, (I,),
           "The rollout's logprobs are the processed distribution the sampler drew from (the parity reading).",
           FIX_NONE, "semantic", rule="alpha within `semantic_tol` of 1; with one trainer reading, the mean offset of d "
                                      "within `offset_z` standard errors of a faithful rollout's",
           thresholds=("semantic_tol", "offset_z"), calibrated_on="dimensionless; checked on " + H200_BF16),
    code("logprobs_raw", SEM, (I,),
           "With one trainer reading (an imported dump) that is raw: the rollout's logprobs agree with it on average.",
           FIX_NONE, "semantic", rule="mean(d) + var(d)/2 within `offset_z` standard errors of 0",
           thresholds=("offset_z",), calibrated_on="a statistical bound in standard errors (any device)"),
    code("logprobs_not_processed", SEM, (E,),
           "With one trainer reading (processed): the rollout's logprobs sit below the trainer's on average by more "
           "than a faithful rollout's noise allows, the signature of vLLM's raw logprobs.",
           FIX_PROCESSED + "; confirm with `rlparity score --model MODEL` (adds the raw reading)", "semantic",
           rule="a faithful rollout has mean(d) + var(d)/2 = 0; an offset above 0 by more than `offset_z` standard errors",
           thresholds=("offset_z",), calibrated_on="a statistical bound in standard errors (any device)",
           causes=("raw_logprobs",)),
    code("logprobs_match_neither", SEM, (W,),
           "The rollout's logprobs lie between or beyond the trainer's processed and raw readings (or, with one "
           "reading, are offset from it): another temperature, other sampling parameters or another distribution.",
           "compare the engine's sampling parameters with the trainer's (temperature, top-k, top-p, penalties, the "
           "model's generation_config)", "semantic",
           rule="alpha neither within `semantic_tol` of 0 nor of 1; with one reading, an offset beyond `offset_z` "
                "standard errors that is not the raw-mode signature", thresholds=("semantic_tol", "offset_z"),
           calibrated_on="dimensionless; checked on " + H200_BF16),
    code("logprob_semantics_untestable", SEM, (I,),
           "Which reading the rollout reports cannot be told: sampling is the identity (temperature 1, no top-k/top-p), "
           "so raw and processed coincide, or the two readings are too close at this noise.",
           "capture at the temperature / top-k / top-p your RL run uses, or capture more tokens", "semantic",
           rule="the fit's alpha band is wider than the gap between the readings (ArmEvidence.reading == 'untestable')",
           thresholds=("semantic_tol",), calibrated_on="dimensionless"),
    code("trainer_temperature_differs", SEM, (E,),
           "The trainer computed its processed reading at another temperature than the engine sampled at, on some "
           "sequences: it describes another distribution than the sampler's, whatever the logprobs mode.",
           FIX_TRAINER_SAMPLING, "semantic", rule="per sequence, temperatures not equal (rtol 1e-6)",
           causes=("trainer_temperature",)),
    code("trainer_cut_differs", SEM, (E,),
           "The trainer cut another top-k / top-p set than the engine's sampler on some sequences: it renormalises "
           "over another set of tokens.", FIX_TRAINER_SAMPLING, "semantic",
           rule="per sequence, top-k differs (0 and -1 both mean off) or top-p differs by more than 1e-9",
           causes=("trainer_top_k",)),
    code("trainer_is_rollout_copy", SEM, (E,),
           "The trainer's only reading (an imported dump's) equals the rollout's logprobs bit for bit: the trainer "
           "side is a copy of mu (verl's bypass mode), and parity of a copy with itself proves nothing. When it fires, "
           "the other semantic checks are skipped.",
           "recompute pi_old with the trainer: `rlparity score STORE --model MODEL` (or dump the trainer's own "
           "old_log_probs, not the rollout's)", "semantic",
           rule="at least 99% of at least 8 tokens bitwise identical, with one trainer reading",
           calibrated_on="exact (bitwise equality)"),
)

TOPIC = Topic('semantic', 10, CODES, trace_findings)

__all__ = ["FIX_PROCESSED", "FIX_TRAINER_SAMPLING", "PAIR", "SEMANTIC_READINGS", "logprob_semantics", "trace_findings",
           "trainer_is_rollout_copy", "trainer_sampling"]
