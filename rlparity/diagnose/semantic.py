"""Semantic layer: do the rollout logprobs mean what the trainer thinks they mean?

Checks, each returning a :class:`~rlparity.diagnose.findings.Finding`:

* :func:`logprob_semantics`: rollout logprobs vs the trainer's full-vocabulary (vLLM
  ``raw_logprobs``) and processed (``processed_logprobs``) readings; which one they match, with the
  offset per temperature (the raw-mode signature moves with temperature).
* :func:`renormalization`: the top-k/top-p renormalization offset ``log kept mass``, and whether
  the rollout skipped it.
* :func:`zero_probability_tokens`: tokens the trainer gives probability 0, counted and located.
* :func:`prompt_token_parity`: the prompt ids the engine was sent vs the trainer's own
  tokenization of the same text or chat messages.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.diagnose.evidence import ArmEvidence, build, identity_sampling, sequence_se
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.trace import has_trainer
from rlparity.metrics import (
    BACKEND_PAIR_D,
    TRAINER_VARIABLE,
    by_temperature,
    core,
    log_ratio,
    trainer_readings,
    zero_prob_tokens,
)
from rlparity.diagnose.topic import E, FIX_NONE, FindingCode, H200_BF16, I, SEM, Topic, W, code

FIX_PROCESSED = ("start vLLM with --logprobs-mode processed_logprobs "
                 "(LLM(..., logprobs_mode='processed_logprobs'))")
PAIR = BACKEND_PAIR_D


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
    mask = trace["response_mask"].values.astype(bool)
    readings = trainer_readings(trace)
    evidence_: dict = {"pair": PAIR, "trainer_readings": readings,
                       "engine_logprobs_mode": (trace.attrs.get("engine_effective") or {}).get("logprobs_mode")}
    for side in readings:
        evidence_[f"rms_d_vs_trainer_{side}"] = float(core.masked_rms(log_ratio(trace, side).values, mask))
    evidence_.update(_offsets_by_temperature(trace, readings[0]))
    explained = ev_.claimed()
    if explained.any():
        evidence_["tokens_left_out"] = {c: int((t & mask).sum()) for c, t in ev_.claims.items()}
        evidence_["left_out_why"] = ("explained by another identified cause: the fit is made on the tokens no "
                                     "other cause explains")
    arm = trace.attrs.get("arm")
    if identity_sampling(trace):
        return Finding(Layer.SEMANTIC, "logprob_semantics_untestable", Severity.INFO,
                       "sampling is the identity (T=1, no top-k/top-p): raw and processed coincide",
                       evidence_, "capture at the temperature/top-k/top-p your RL run uses", arm)
    raw_signature = ("rollout logprobs are raw (before temperature/top-k/top-p) while the trainer recomputes the "
                     "processed distribution the sampler drew from")
    if len(readings) == 2:
        fit = ev_.fit
        alpha, se = fit.get("alpha", float("nan")), fit.get("alpha_se", float("nan"))
        band = fit.get("alpha_band", semantic_tol)
        evidence_.update({"alpha_processed": alpha, "alpha_se": se, "alpha_band": band,
                          "noise_floor_rms": fit.get("noise_rms"), "noise_scale_robust": fit.get("noise_scale"),
                          "separation_rms": fit.get("separation_rms"), "n_tokens_fitted": fit.get("n_tokens"),
                          "n_sequences_fitted": fit.get("n_sequences_fitted"),
                          "alpha_se_jackknife": fit.get("alpha_se_jackknife"),
                          "trainer_noise_rms": fit.get("trainer_noise_rms"),
                          "trainer_noise_ratio": fit.get("trainer_noise_ratio"),
                          "downweighted_share": fit.get("downweighted_share"),
                          "reading": "mu - log pi_raw = alpha (log pi_processed - log pi_raw) + noise; "
                                     "alpha 1 = processed, 0 = raw (robust fit)"})
        mode = evidence_["engine_logprobs_mode"]
        if mode == "raw_logprobs" and ev_.reading != "raw":
            # the engine says it returns raw logprobs while the numbers cannot show it (here the
            # trainer's readings coincide, or another cause moves every token): believe the engine
            return Finding(Layer.SEMANTIC, "raw_logprobs_used_as_processed", Severity.WARNING,
                           raw_signature + f": the running engine reports logprobs_mode=raw_logprobs; the logprobs "
                           f"alone cannot confirm it here (the fit reads {ev_.reading!r}: alpha {alpha:.3g} +- "
                           f"{se:.2g}, the trainer's readings {fit.get('separation_rms', float('nan')):.2g} nats apart)",
                           evidence_, FIX_PROCESSED, arm, cause="raw_logprobs")
        if ev_.reading == "untestable":
            n_seq = fit.get("n_sequences_fitted") or 0
            noisy = fit.get("trainer_noise_ratio", float("nan"))
            why = (f"the trainer's own run-to-run noise, {fit['trainer_noise_rms']:.3g} nats RMS, is {noisy:.2g} times "
                   "the gap between its processed and raw readings (its self-check): a trainer that does not repeat "
                   "itself cannot tell them apart" if np.isfinite(noisy) and noisy > defaults().semantic_max_trainer_noise
                   else f"only {n_seq} sequences to fit on (a reading needs {defaults().min_fit_sequences})"
                   if n_seq < defaults().min_fit_sequences else
                   f"alpha {alpha:.3g} +- {se:.2g} over {n_seq} sequences, with the readings "
                   f"{fit.get('separation_rms', float('nan')):.2g} nats apart: at this noise the fit cannot tell them "
                   "apart (the error is the larger of the per-token one and a jackknife over sequences)")
            return Finding(Layer.SEMANTIC, "logprob_semantics_untestable", Severity.INFO,
                           f"inconclusive: which reading the rollout reports cannot be told here ({why})", evidence_,
                           "capture more sequences, at the temperature/top-k your RL run uses, with the trainer in "
                           "eval mode (a noisy trainer hides the semantic reading)", arm)
        if ev_.reading == "processed":
            return Finding(Layer.SEMANTIC, "logprobs_processed", Severity.INFO,
                           f"rollout logprobs are the processed distribution (alpha {alpha:.3f} +- {se:.2g}; "
                           f"numeric noise floor {fit['noise_rms']:.3g} nats RMS)", evidence_, "", arm)
        if ev_.reading == "raw":
            summary = raw_signature + f" (alpha {alpha:.3f} +- {se:.2g})"
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
    side = readings[0]
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
    arm = trace.attrs.get("arm")
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


def sampling_penalty(trace: xr.Dataset, *, evidence: ArmEvidence | None = None) -> Finding | None:
    """An error when the engine's requests used a sampling penalty the trainer does not apply.

    ``repetition_penalty`` / ``presence_penalty`` / ``frequency_penalty`` recorded per sequence: no
    trainer applies them, and vLLM's processed logprobs include them. Evidence: the mean residual
    (nats) of tokens that already occurred in the prompt or response (the penalised ones) against
    those that did not.

    Parameters
    ----------
    trace : xarray.Dataset
        An arm (scored, for the residual evidence).
    evidence : ArmEvidence, optional
        The arm's evidence; built here when not given and the trace is scored.

    Returns
    -------
    Finding or None
        ``sampling_penalty_not_in_trainer``; ``None`` when no penalty was used or none is
        recorded.
    """
    names = [n for n, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0))
             if n in trace and np.any(trace[n].values != neutral)]
    if not names:
        return None
    mask = trace["response_mask"].values.astype(bool)
    pen = np.zeros(trace.sizes["sequence"], dtype=bool)
    for n in names:
        neutral = 1.0 if n == "repetition_penalty" else 0.0
        pen |= trace[n].values != neutral
    ev: dict = {"penalties": {n: sorted(set(np.round(trace[n].values[pen], 6).tolist()))[:4] for n in names},
                "n_sequences": int((pen & mask.any(axis=1)).sum()), "pair": PAIR}
    if has_trainer(trace):
        ev_ = evidence if evidence is not None else build(trace)
        seen = repeated_tokens(trace)
        sel = mask & pen[:, None] & ev_.finite_tokens
        r = ev_.residual
        if r is not None:
            ev.update({"mean_residual_repeated_tokens": float(core.masked_mean(r, sel & seen)),
                       "mean_residual_new_tokens": float(core.masked_mean(r, sel & ~seen)),
                       "n_repeated_tokens": int((sel & seen).sum()), "n_new_tokens": int((sel & ~seen).sum()),
                       "residual": "mu - the trainer's matched reading (nats): a penalty lowers mu on repeated tokens"})
    return Finding(Layer.SEMANTIC, "sampling_penalty_not_in_trainer", Severity.ERROR,
                   f"the engine sampled with {', '.join(f'{k}={v}' for k, v in ev['penalties'].items())} on "
                   f"{ev['n_sequences']} sequences; its processed logprobs include the penalty, the trainer's do not",
                   ev, "sample without penalties in RL (repetition_penalty=1, presence/frequency 0), or apply the same "
                   "penalty to the trainer's logits (vLLM's rules: divide positive / multiply negative logits of seen "
                   "tokens by the repetition penalty, subtract the presence and frequency terms)",
                   trace.attrs.get("arm"), cause="sampling_penalty")


def repeated_tokens(trace: xr.Dataset) -> np.ndarray:
    """Per token: whether its id already occurred in the prompt or earlier in the response.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with ``token_id`` and ``prompt_token_id`` (padded with negative ids).

    Returns
    -------
    numpy.ndarray
        ``(sequence, position)`` bool.
    """
    tok = trace["token_id"].values
    prompt = trace["prompt_token_id"].values
    out = np.zeros(tok.shape, dtype=bool)
    for i in range(tok.shape[0]):
        seen = set(prompt[i][prompt[i] >= 0].tolist())
        for j, t in enumerate(tok[i]):
            if t < 0:
                break
            out[i, j] = int(t) in seen
            seen.add(int(t))
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
                           "trainer's own old_log_probs, not the rollout's)", trace.attrs.get("arm"))
    return None


def renormalization(trace: xr.Dataset, *, semantic_tol: float | None = None) -> Finding | None:
    """The top-k/top-p renormalization offset, and a finding if the rollout skipped it.

    ``log kept mass`` (<= 0) is the log of the temperature-scaled probability that top-k/top-p keep.
    A rollout that applies temperature but not the renormalization reports ``processed + log kept``:
    ``mu - log pi_processed = beta * log kept`` with ``beta ~ 1`` (``beta ~ 0`` when it
    renormalises), fitted as in :func:`logprob_semantics`.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm with ``trainer_log_kept_mass``.
    semantic_tol : float, optional
        Tolerance on beta (dimensionless); None: ``defaults().semantic_tol``.

    Returns
    -------
    Finding or None
        ``rollout_not_renormalized`` (error) or ``topk_topp_renormalization`` (info: the mean log
        kept mass, nats); ``None`` when no request uses top-k/top-p or the trace was scored without
        ``trainer_log_kept_mass``.
    """
    semantic_tol = defaults().semantic_tol if semantic_tol is None else semantic_tol
    if "trainer_log_kept_mass" not in trace or TRAINER_VARIABLE["processed"] not in trace:
        return None
    cut = (trace["top_k"].values > 0) | (trace["top_p"].values < 1.0)
    if not cut.any():
        return None
    mask = trace["response_mask"].values.astype(bool) & cut[:, None]
    kept = trace["trainer_log_kept_mass"].values
    d = log_ratio(trace, "processed").values
    fit = core.reading_fit(-d, kept, mask)
    fit = {**fit, **sequence_se(core.reading_fit, -d, kept, mask, fit["alpha_se"])}
    evidence = {"mean_log_kept_mass": float(core.masked_mean(kept, mask)),
                "min_log_kept_mass": float(np.min(kept[mask])) if mask.any() else float("nan"),
                "share_tokens_with_cut_mass": float(np.mean(kept[mask] < -1e-6)) if mask.any() else 0.0,
                "beta_unrenormalized": fit["alpha"], "beta_se": fit["alpha_se"],
                "beta_se_jackknife": fit["alpha_se_jackknife"],
                "rms_d_vs_trainer_processed": float(core.masked_rms(d, mask)),
                "rms_d_vs_trainer_tempered_not_renormalized": float(core.masked_rms(d + kept, mask)),
                "reading": "mu - log pi_processed = beta * log kept mass + noise; beta 1 = not renormalized",
                "pair": PAIR, "units": "nats"}
    arm = trace.attrs.get("arm")
    beta, se = fit["alpha"], fit["alpha_se"]
    if np.isfinite(beta) and np.isfinite(se) and se < semantic_tol and abs(beta - 1) <= max(semantic_tol, 3 * se) \
            and abs(beta) > max(semantic_tol, 3 * se):
        return Finding(Layer.SEMANTIC, "rollout_not_renormalized", Severity.ERROR,
                       "rollout logprobs apply temperature but not the top-k/top-p renormalization "
                       f"(beta {beta:.3f} +- {se:.2g})", evidence, "return the sampler's distribution: "
                       + FIX_PROCESSED + "; in your own sampler, renormalise over the kept set", arm)
    return Finding(Layer.SEMANTIC, "topk_topp_renormalization", Severity.INFO,
                   f"top-k/top-p keep on average exp({evidence['mean_log_kept_mass']:.3g}) of the "
                   "tempered mass; a trainer that skips the renormalization would be off by "
                   f"{-evidence['mean_log_kept_mass']:.3g} nats per token", evidence, "", arm)


def zero_probability_tokens(trace: xr.Dataset, *, noise_rms: float | None = None) -> list[Finding]:
    """Tokens the rollout sampled that the trainer's processed distribution excludes (-inf), by cause.

    Every one is counted and located, never averaged away (a single one makes the ratio infinite).
    *Boundary flips* (:func:`rlparity.metrics.zero_prob_tokens`, ``cause="boundary"``): the token's
    logit is within a precision-sized margin of the kept set's edge (the k-th logit / the top-p
    cut), so the engine's and the trainer's rounding put it on different sides; a handful is
    expected from a bf16 engine and is information, a share above
    ``defaults().boundary_flip_share`` a warning. *Outside* tokens sit clearly beyond the trainer's
    set: the two sides cut different sets (other top-k/top-p, ties dropped), an error.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    noise_rms : float, optional
        The engine's measured noise (nats RMS), widening the margin; None: precision only.

    Returns
    -------
    list of Finding
        ``topk_boundary_flips`` and ``zero_probability_tokens`` findings, one per cause present;
        empty without a processed reading or such tokens.
    """
    z = zero_prob_tokens(trace, "processed", noise_rms=noise_rms) if TRAINER_VARIABLE["processed"] in trace else None
    if z is None or z.sizes["token"] == 0:
        return []
    n_tokens = max(int(trace["response_mask"].values.sum()), 1)
    arm = trace.attrs.get("arm")
    out = []
    for cause in ("boundary", "outside", "unclassified"):
        sel = z.where(z["cause"] == cause, drop=True) if (z["cause"] == cause).any() else None
        if sel is None:
            continue
        n = sel.sizes["token"]
        share = n / n_tokens
        evidence = {"n_tokens_with_cause": int(n), "share_of_tokens": share, "n_zero_prob_tokens_all": int(z.sizes["token"]),
                    "sequences": sorted(set(sel["sequence_index"].values.astype(int).tolist()))[:20],
                    "positions": sorted(set(sel["position_index"].values.astype(int).tolist()))[:20],
                    "trainer_rank_of_token": sorted(set(sel["trainer_token_rank"].values.astype(int).tolist()))[:20],
                    "cut_margin_logits": [round(float(v), 4) for v in sel["cut_margin"].values[:10]],
                    "precision_margin_logits": [round(float(v), 4) for v in sel["precision_margin"].values[:10]],
                    "rollout_logprob_of_those": [round(float(v), 4) for v in sel["rollout_logprob"].values[:10]],
                    "pair": "trainer processed distribution (pi_old) gives 0 to a token the engine (mu) sampled"}
        if cause == "boundary":
            sev = Severity.INFO if share <= defaults().boundary_flip_share else Severity.WARNING
            out.append(Finding(Layer.SEMANTIC, "topk_boundary_flips", sev,
                               f"{n} sampled token(s) ({share:.2%}) sit just outside the trainer's top-k/top-p set, "
                               "within rounding of its edge: the engine's precision put them inside", evidence,
                               "expected from a low-precision engine in small numbers; mask them out of the loss "
                               "(pi_old = 0 makes the ratio infinite) or compute the cut in float32 on both sides",
                               arm))
        else:
            out.append(Finding(Layer.SEMANTIC, "zero_probability_tokens", Severity.ERROR,
                               f"{n} sampled token(s) ({share:.2%}) fall {'clearly ' if cause == 'outside' else ''}"
                               "outside the trainer's top-k/top-p set (pi_old = 0, the ratio is infinite there)",
                               evidence, "make the trainer apply the engine's exact top-k/top-p (vLLM keeps ties at "
                               "the k-th logit) with the same sampling parameters, or mask these tokens out of the "
                               "loss; do not average log 0 away", arm, cause="trainer_top_k",
                               tokens={"scope": "tokens outside the trainer's kept set", "n_tokens": int(n),
                                       "n_sequences": len(set(sel["sequence_index"].values.tolist()))}))
    return out


def prompt_token_parity(trace: xr.Dataset) -> Finding | None:
    """The prompt ids the engine saw against the trainer's own tokenization of the same prompt.

    Sequences whose prompt was given as ids only cannot be checked and are counted as such.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm with ``trainer_prompt_token_id`` (added by :class:`rlparity.score.Scorer`).

    Returns
    -------
    Finding or None
        ``prompt_token_mismatch`` (error, with the first differing position),
        ``prompt_tokens_match`` or ``prompt_tokens_unchecked`` (info); ``None`` when the trace has
        no trainer tokenization.
    """
    if "trainer_prompt_token_id" not in trace:
        return None
    eng = trace["prompt_token_id"].values
    tr = trace["trainer_prompt_token_id"].values
    tlen = trace["trainer_prompt_length"].values
    elen = trace["prompt_length"].values
    checked = np.flatnonzero(tlen >= 0)
    bad = []
    for i in checked:
        a, b = eng[i, : elen[i]].tolist(), tr[i, : tlen[i]].tolist()
        if a != b:
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            bad.append((int(i), first, a, b))
    arm = trace.attrs.get("arm")
    evidence: dict = {"n_checked": int(checked.size), "n_ids_only_unchecked": int((tlen < 0).sum()),
                      "n_mismatched": len(bad),
                      "trainer_tokenization": (trace.attrs.get("trainer", {}) or {}).get("prompt_tokenization")}
    if not bad:
        if checked.size == 0:
            return Finding(Layer.SEMANTIC, "prompt_tokens_unchecked", Severity.INFO,
                           "prompts were given as token ids only: nothing for the trainer to re-tokenize",
                           evidence, "store the prompt text (or chat messages) with the ids to check them", arm)
        return Finding(Layer.SEMANTIC, "prompt_tokens_match", Severity.INFO,
                       "the engine's prompt ids equal the trainer's tokenization of every prompt",
                       evidence, "", arm)
    i, first, a, b = bad[0]
    evidence.update({"first_sequence": i, "first_mismatch_position": first,
                     "engine_ids_head": a[: first + 4], "trainer_ids_head": b[: first + 4],
                     "engine_length": len(a), "trainer_length": len(b),
                     "length_difference_engine_minus_trainer": len(a) - len(b),
                     "sequences": [x[0] for x in bad][:20]})
    hint = ""
    if len(a) - len(b) == 1 and a[1:] == b or len(b) - len(a) == 1 and b[1:] == a:
        hint = " (one extra leading token: a special-token / BOS setting differs)"
    return Finding(Layer.SEMANTIC, "prompt_token_mismatch", Severity.ERROR,
                   f"{len(bad)} of {checked.size} prompts were tokenized differently by the engine and "
                   f"the trainer{hint}", evidence,
                   "send the trainer's token ids to the engine (prompt_token_ids=...) or tokenize the same "
                   "way on both sides: the same add_special_tokens, and chat through the chat template "
                   "(LLM.chat / apply_chat_template(tokenize=True)), not rendered text plus special tokens",
                   arm, cause="prompt_token_mismatch")


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=(),
                   evidence: ArmEvidence | None = None) -> list[Finding]:
    """Every semantic check on one scored trace (what :func:`rlparity.diagnose.diagnose` runs).

    A trainer side that is a copy of the rollout stops the layer there (that one finding).

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
    noise = semantics.evidence.get("noise_floor_rms")
    # the effective temperature read from the numbers is the next topic's (rlparity.diagnose.temperature)
    found = [semantics, *trainer_sampling(trace), sampling_penalty(trace, evidence=ev),
             renormalization(trace, semantic_tol=opts.semantic_tol),
             *zero_probability_tokens(trace, noise_rms=noise), prompt_token_parity(trace)]
    return [f for f in found if f is not None]


def arms_findings(arms, options: DiagnoseOptions | None = None) -> list[Finding]:
    """The semantic layer has no check across arms."""
    return []



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
    code("sampling_penalty_not_in_trainer", SEM, (E,),
           "The engine sampled with a repetition, presence or frequency penalty; its processed logprobs include it, "
           "the trainer's do not. The evidence compares the residual of repeated tokens with new ones.",
           "sample without penalties in RL (repetition_penalty=1, presence/frequency 0), or apply the same penalty to "
           "the trainer's logits (vLLM's rules)", "semantic", rule="any sequence with a penalty other than neutral",
           causes=("sampling_penalty",)),
    code("trainer_is_rollout_copy", SEM, (E,),
           "The trainer's only reading (an imported dump's) equals the rollout's logprobs bit for bit: the trainer "
           "side is a copy of mu (verl's bypass mode), and parity of a copy with itself proves nothing. When it fires, "
           "the other semantic checks are skipped.",
           "recompute pi_old with the trainer: `rlparity score STORE --model MODEL` (or dump the trainer's own "
           "old_log_probs, not the rollout's)", "semantic",
           rule="at least 99% of at least 8 tokens bitwise identical, with one trainer reading",
           calibrated_on="exact (bitwise equality)"),
    code("rollout_not_renormalized", SEM, (E,),
           "The rollout's logprobs apply temperature but not the top-k/top-p renormalization: they are off by the log "
           "of the kept mass on every token.",
           "return the sampler's distribution: " + FIX_PROCESSED + "; in your own sampler, renormalise over "
                                                                              "the kept set", "semantic",
           rule="mu - log pi_processed = beta * log kept mass: beta within `semantic_tol` of 1 (or 3 standard errors) "
                "and clearly away from 0", thresholds=("semantic_tol",), calibrated_on="dimensionless"),
    code("topk_topp_renormalization", SEM, (I,),
           "How much top-k/top-p cut on average (the mean log kept mass): what a trainer that skipped the "
           "renormalization would be off by, per token.", FIX_NONE, "semantic",
           rule="reported whenever a request uses top-k/top-p and the trainer recorded the kept mass"),
    code("topk_boundary_flips", SEM, (I, W),
           "Sampled tokens the trainer's processed distribution excludes, sitting just outside its top-k/top-p set "
           "within rounding of the edge: the engine's precision put them inside. A handful is expected from a bf16 "
           "engine.",
           "mask them out of the loss (pi_old = 0 makes the ratio infinite) or compute the cut in float32 on both sides",
           "semantic", rule="a flip is within `boundary_flip_ulps` bfloat16 ulps of the largest logit (or 3 noise RMS) "
                            "of the edge; a warning when their share of tokens exceeds `boundary_flip_share`",
           thresholds=("boundary_flip_share", "boundary_flip_ulps"),
           calibrated_on="H200 bf16: the parity arm has about 1e-4 flips per token (the default's description)"),
    code("zero_probability_tokens", SEM, (E,),
           "Sampled tokens clearly outside the trainer's top-k/top-p set (pi_old = 0: the ratio is infinite there): the "
           "two sides cut different sets (another top-k/top-p, ties at the k-th logit dropped).",
           "make the trainer apply the engine's exact top-k/top-p (vLLM keeps ties at the k-th logit) with the same "
           "sampling parameters, or mask these tokens out of the loss; do not average log 0 away", "semantic",
           rule="any sampled token with trainer probability 0 beyond the boundary-flip margin; its tokens have "
                "infinite |d|, so it takes a share of the excess only together with trainer_cut_differs (a trainer "
                "that cuts another set acts on every token); alone it is evidence about those tokens",
           thresholds=("boundary_flip_ulps",), calibrated_on="bfloat16 rounding (2^-7 relative)",
           causes=("trainer_top_k",)),
    code("prompt_token_mismatch", SEM, (E,),
           "The engine's prompt ids differ from the trainer's own tokenization of the same prompt (a chat template, "
           "BOS or special-token setting): the trainer scores the response after another prompt.",
           "send the trainer's token ids to the engine (prompt_token_ids=...) or tokenize the same way on both sides: "
           "the same add_special_tokens, and chat through the chat template", "semantic",
           rule="any prompt whose ids differ", calibrated_on="exact (token ids)", causes=("prompt_token_mismatch",)),
    code("prompt_tokens_match", SEM, (I,),
           "The engine's prompt ids equal the trainer's tokenization of every prompt.", FIX_NONE, "semantic",
           calibrated_on="exact (token ids)"),
    code("prompt_tokens_unchecked", SEM, (I,),
           "Prompts were given as token ids only: nothing for the trainer to re-tokenize.",
           "store the prompt text (or chat messages) with the ids to check them", "semantic"),
)

TOPIC = Topic('semantic', 10, CODES, trace_findings, arms_findings)

__all__ = ["FIX_TRAINER_SAMPLING", "logprob_semantics", "prompt_token_parity", "renormalization", "repeated_tokens",
           "sampling_penalty", "trace_findings", "trainer_is_rollout_copy", "trainer_sampling",
           "zero_probability_tokens"]
