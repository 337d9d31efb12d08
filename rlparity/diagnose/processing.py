"""Semantic layer, the sampler's processing: what vLLM's sampler does to the distribution that the
trainer must repeat, and the prompt it scores after.

Checks, each returning a :class:`~rlparity.diagnose.findings.Finding` (after the reading,
:mod:`rlparity.diagnose.semantic`, and the effective temperature, :mod:`rlparity.diagnose.temperature`):

* :func:`sampling_penalty`: a repetition / presence / frequency penalty in the engine's processed
  logprobs that the trainer ignores;
* :func:`renormalization`: the top-k/top-p renormalization offset ``log kept mass``, and whether
  the rollout skipped it;
* :func:`zero_probability_tokens`: tokens the trainer gives probability 0, counted and located;
* :func:`prompt_token_parity`: the prompt ids the engine was sent vs the trainer's own
  tokenization of the same text or chat messages.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.diagnose.evidence import ArmEvidence, build, sequence_se
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.diagnose.semantic import FIX_PROCESSED, FIX_TRAINER_SAMPLING, PAIR, SEMANTIC_READINGS
from rlparity.diagnose.topic import E, FIX_NONE, FindingCode, I, SEM, Topic, W, code
from rlparity.metrics import TRAINER_VARIABLE, core, log_ratio, zero_prob_tokens
from rlparity.trace import arm_record, has_trainer


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
                   arm_record(trace).arm, cause="sampling_penalty")


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


def renormalization(trace: xr.Dataset, *, semantic_tol: float | None = None) -> Finding | None:
    """The top-k/top-p renormalization offset, and a finding if the rollout skipped it.

    ``log kept mass`` (<= 0) is the log of the temperature-scaled probability that top-k/top-p keep.
    A rollout that applies temperature but not the renormalization reports ``processed + log kept``:
    ``mu - log pi_processed = beta * log kept`` with ``beta ~ 1`` (``beta ~ 0`` when it
    renormalises), fitted as in :func:`~rlparity.diagnose.semantic.logprob_semantics`.

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
    arm = arm_record(trace).arm
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


def cut_spread(trace: xr.Dataset, *, margin: float | None = None) -> dict:
    """Where the trainer's processed distribution spreads over more tokens than the engine's top-k keeps.

    A distribution over ``k`` tokens has entropy at most ``log k``; a trainer that applies the
    engine's top-k (ties at the k-th logit kept, as vLLM does) gives every position a processed
    entropy of ``log k`` or less, plus what a tie pile adds. A position whose
    ``trainer_processed_entropy`` exceeds ``log k + margin`` was not cut at ``k``. Untestable
    without the entropy or an engine top-k, and where the trainer's largest logits are bfloat16
    numbers (:func:`rlparity.diagnose.head_precision.trainer_head_from_numbers`): logits on a coarse
    grid tie at the k-th value and a kept tie pile widens the set legitimately.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    margin : float, optional
        Nats above ``log k`` (``defaults().cut_entropy_margin``, log 2: more than twice ``k`` tokens).

    Returns
    -------
    dict
        ``testable`` (with ``why`` when not), ``tokens`` (bool ``(sequence, position)``, the positions
        over the bound), ``n_tokens``, ``n_tested``, ``max_excess`` (the largest entropy over ``log k``,
        nats), ``top_k`` (the engine's values) and ``margin``.
    """
    from rlparity.diagnose.head_precision import trainer_head_from_numbers

    margin = defaults().cut_entropy_margin if margin is None else margin
    out: dict = {"testable": False, "margin": margin, "n_tokens": 0}
    if "trainer_processed_entropy" not in trace or "top_k" not in trace:
        return {**out, "why": "the trace records no trainer processed entropy or no engine top-k"}
    k = np.asarray(trace["top_k"].values, dtype=float)
    h = trace["trainer_processed_entropy"].values
    use = trace["response_mask"].values.astype(bool) & (k > 0)[:, None] & np.isfinite(h)
    if not use.any():
        return {**out, "why": "no token was sampled with a top-k cut"}
    grid = trainer_head_from_numbers(trace)
    if grid.get("bf16"):
        return {**out, "why": "the trainer's logits are bfloat16 numbers: ties at the k-th logit may widen its set"}
    excess = np.where(use, h - np.log(np.maximum(k, 1.0))[:, None], -np.inf)  # rows without a cut are not used
    tokens = excess > margin
    return {**out, "testable": True, "why": "", "tokens": tokens, "n_tokens": int(tokens.sum()),
            "n_tested": int(use.sum()), "max_excess": float(excess[use].max()),
            "top_k": sorted({int(x) for x in k[k > 0]})[:8]}


def trainer_cut_from_numbers(trace: xr.Dataset, prior=(), *, margin: float | None = None) -> Finding | None:
    """The trainer did not cut the engine's top-k, read from its processed entropy (issue 41).

    :func:`cut_spread`: a position whose processed distribution has more entropy than any
    distribution over the engine's ``k`` tokens (by ``margin``) proves the trainer renormalised
    over more than ``k`` tokens there. Nothing when a recorded trainer cut already differs
    (``trainer_cut_differs`` among ``prior``); a recorded cut equal to the engine's and contradicted
    by the numbers says so.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    prior : sequence of Finding, default ()
        The earlier topics' findings for the arm.
    margin : float, optional
        See :func:`cut_spread`.

    Returns
    -------
    Finding or None
        ``trainer_cut_wider`` (warning, cause ``trainer_top_k``) or ``None``.
    """
    if any(f.name == "trainer_cut_differs" for f in prior):
        return None
    s = cut_spread(trace, margin=margin)
    if not s["n_tokens"]:
        return None
    tokens = s.pop("tokens")
    recorded = "trainer_top_k" in trace or "trainer_top_p" in trace
    seqs = np.flatnonzero(tokens.any(axis=1))
    ev = {**s, "sequences": seqs[:20].tolist(), "positions": np.argwhere(tokens)[:10].tolist(),
          "processed_entropy_of_those": [round(float(v), 4) for v in trace["trainer_processed_entropy"].values[tokens][:10]],
          "reading": "entropy of the trainer's processed distribution over log k: at most 0 for any distribution over "
                     "k tokens", "units": "nats", "pair": PAIR}
    said = " although its recorded cut is the engine's" if recorded else ""
    return Finding(Layer.SEMANTIC, "trainer_cut_wider", Severity.WARNING,
                   f"the trainer's processed distribution spreads over more tokens than the engine's top-k {s['top_k']}"
                   f"{said}: at {s['n_tokens']} position(s) its entropy exceeds log k by up to {s['max_excess']:.3g} "
                   "nats (any distribution over k tokens has at most log k): it does not cut what the sampler cut, and "
                   "renormalises over another set", ev, FIX_TRAINER_SAMPLING, arm_record(trace).arm,
                   cause="trainer_top_k", tokens={"scope": "positions whose trainer distribution is wider than the cut",
                                                  "n_tokens": int(tokens.sum()), "n_sequences": int(seqs.size)})


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
    arm = arm_record(trace).arm
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
    arm = arm_record(trace).arm
    evidence: dict = {"n_checked": int(checked.size), "n_ids_only_unchecked": int((tlen < 0).sum()),
                      "n_mismatched": len(bad),
                      "trainer_tokenization": arm_record(trace).scorer.prompt_tokenization}
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
    """The sampler's processing on one scored trace (module docstring); nothing when the trainer
    side is a copy of the rollout (``trainer_is_rollout_copy`` among the prior findings).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    options : DiagnoseOptions, optional
        Reads ``trainer`` and ``semantic_tol``; None: the defaults.
    prior : sequence of Finding, default ()
        The earlier topics' findings for the arm: the semantic reading gives the numeric noise floor
        the probability-0 tokens are judged against.
    evidence : ArmEvidence, optional
        The arm's evidence; built here when not given.

    Returns
    -------
    list of Finding
    """
    prior = list(prior)
    if any(f.name == "trainer_is_rollout_copy" for f in prior):
        return []
    opts = options or DiagnoseOptions()
    ev = evidence if evidence is not None else build(trace, trainer=opts.trainer, semantic_tol=opts.semantic_tol)
    reading = next((f for f in prior if f.name in SEMANTIC_READINGS), None)
    noise = reading.evidence.get("noise_floor_rms") if reading is not None else None
    found = [sampling_penalty(trace, evidence=ev), renormalization(trace, semantic_tol=opts.semantic_tol),
             trainer_cut_from_numbers(trace, prior), *zero_probability_tokens(trace, noise_rms=noise),
             prompt_token_parity(trace)]
    return [f for f in found if f is not None]


# the finding codes this topic emits (collected by rlparity.diagnose.catalogue)
CODES: tuple[FindingCode, ...] = (
    code("sampling_penalty_not_in_trainer", SEM, (E,),
           "The engine sampled with a repetition, presence or frequency penalty; its processed logprobs include it, "
           "the trainer's do not. The evidence compares the residual of repeated tokens with new ones.",
           "sample without penalties in RL (repetition_penalty=1, presence/frequency 0), or apply the same penalty to "
           "the trainer's logits (vLLM's rules)", "processing", rule="any sequence with a penalty other than neutral",
           causes=("sampling_penalty",)),
    code("rollout_not_renormalized", SEM, (E,),
           "The rollout's logprobs apply temperature but not the top-k/top-p renormalization: they are off by the log "
           "of the kept mass on every token.",
           "return the sampler's distribution: " + FIX_PROCESSED + "; in your own sampler, renormalise over "
                                                                              "the kept set", "processing",
           rule="mu - log pi_processed = beta * log kept mass: beta within `semantic_tol` of 1 (or 3 standard errors) "
                "and clearly away from 0", thresholds=("semantic_tol",), calibrated_on="dimensionless"),
    code("topk_topp_renormalization", SEM, (I,),
           "How much top-k/top-p cut on average (the mean log kept mass): what a trainer that skipped the "
           "renormalization would be off by, per token.", FIX_NONE, "processing",
           rule="reported whenever a request uses top-k/top-p and the trainer recorded the kept mass"),
    code("topk_boundary_flips", SEM, (I, W),
           "Sampled tokens the trainer's processed distribution excludes, sitting just outside its top-k/top-p set "
           "within rounding of the edge: the engine's precision put them inside. A handful is expected from a bf16 "
           "engine.",
           "mask them out of the loss (pi_old = 0 makes the ratio infinite) or compute the cut in float32 on both sides",
           "processing", rule="a flip is within `boundary_flip_ulps` bfloat16 ulps of the largest logit (or 3 noise RMS) "
                            "of the edge; a warning when their share of tokens exceeds `boundary_flip_share`",
           thresholds=("boundary_flip_share", "boundary_flip_ulps"),
           calibrated_on="H200 bf16: the parity arm has about 1e-4 flips per token (the default's description)"),
    code("zero_probability_tokens", SEM, (E,),
           "Sampled tokens clearly outside the trainer's top-k/top-p set (pi_old = 0: the ratio is infinite there): the "
           "two sides cut different sets (another top-k/top-p, ties at the k-th logit dropped).",
           "make the trainer apply the engine's exact top-k/top-p (vLLM keeps ties at the k-th logit) with the same "
           "sampling parameters, or mask these tokens out of the loss; do not average log 0 away", "processing",
           rule="any sampled token with trainer probability 0 beyond the boundary-flip margin; its tokens have "
                "infinite |d|, so it takes a share of the excess only together with trainer_cut_differs (a trainer "
                "that cuts another set acts on every token); alone it is evidence about those tokens",
           thresholds=("boundary_flip_ulps",), calibrated_on="bfloat16 rounding (2^-7 relative)",
           causes=("trainer_top_k",)),
    code("trainer_cut_wider", SEM, (W,),
           "The trainer's processed distribution spreads over more tokens than the engine's top-k keeps: at some "
           "position its entropy exceeds log k, which no distribution over k tokens can. The trainer did not apply "
           "the engine's cut (or applied a wider one) and renormalises over another set; read from the numbers when "
           "the trainer's cut is not recorded, or against a recorded cut that equals the engine's.",
           FIX_TRAINER_SAMPLING, "processing",
           rule="trainer_processed_entropy above log(top_k) + `cut_entropy_margin` at one position or more; untestable "
                "where the trainer's largest logits are bfloat16 numbers (ties at the k-th logit)",
           thresholds=("cut_entropy_margin",),
           calibrated_on="a bound (entropy of k tokens at most log k) with a margin of log 2 chosen on CPU tiny-bf16 "
                         "seeds 0-4: the trainer_top_k arm whose cut takes effect reads 1.17 nats over log k, every "
                         "other arm at most 0.0. Held out: CPU seeds 5-9 (the cut arm 5.63; bf16 trainer heads up to "
                         "0.65 from ties, under the margin: the bf16 exclusion was added after seeing them and changes "
                         "no score), H100 seeds 1-3 (every arm at most -0.47; the cut arms' cut removes no mass there)",
           causes=("trainer_top_k",)),
    code("prompt_token_mismatch", SEM, (E,),
           "The engine's prompt ids differ from the trainer's own tokenization of the same prompt (a chat template, "
           "BOS or special-token setting): the trainer scores the response after another prompt.",
           "send the trainer's token ids to the engine (prompt_token_ids=...) or tokenize the same way on both sides: "
           "the same add_special_tokens, and chat through the chat template", "processing",
           rule="any prompt whose ids differ", calibrated_on="exact (token ids)", causes=("prompt_token_mismatch",)),
    code("prompt_tokens_match", SEM, (I,),
           "The engine's prompt ids equal the trainer's tokenization of every prompt.", FIX_NONE, "processing",
           calibrated_on="exact (token ids)"),
    code("prompt_tokens_unchecked", SEM, (I,),
           "Prompts were given as token ids only: nothing for the trainer to re-tokenize.",
           "store the prompt text (or chat messages) with the ids to check them", "processing"),
)

TOPIC = Topic("processing", 16, CODES, trace_findings)

__all__ = ["cut_spread", "prompt_token_parity", "renormalization", "repeated_tokens", "sampling_penalty",
           "trace_findings", "trainer_cut_from_numbers", "zero_probability_tokens"]
