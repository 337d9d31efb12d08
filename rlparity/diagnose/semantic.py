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
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.metrics import BACKEND_PAIR_D, by_temperature, core, log_ratio, zero_prob_tokens

FIX_PROCESSED = ("start vLLM with --logprobs-mode processed_logprobs "
                 "(LLM(..., logprobs_mode='processed_logprobs'))")
PAIR = BACKEND_PAIR_D


def _identity_sampling(trace: xr.Dataset) -> bool:
    t = trace["temperature"].values
    return bool(np.all((t == 1.0) | (t < 1e-5)) and np.all(trace["top_k"].values <= 0)
                and np.all(trace["top_p"].values >= 1.0))


def _finite_rms(d: np.ndarray, mask: np.ndarray) -> float:
    return float(core.masked_rms(d, mask))


def logprob_semantics(trace: xr.Dataset, *, tol: float | None = None) -> Finding:
    """Whether rollout logprobs are raw or processed.

    ``tol`` is the RMS of d (nats, over tokens the trainer gives non-zero probability) under which
    a side counts as matched. The trainer's expected side is the processed one (what the sampler
    drew from); when sampling is the identity (temperature 1, no top-k/top-p) both readings agree
    and no mismatch can be seen.
    """
    tol = defaults().tol if tol is None else tol
    mask = trace["response_mask"].values.astype(bool)
    rms = {side: _finite_rms(log_ratio(trace, side).values, mask) for side in ("processed", "raw")}
    evidence: dict = {"rms_d_vs_trainer_processed": rms["processed"], "rms_d_vs_trainer_raw": rms["raw"],
                      "pair": PAIR,
                      "engine_logprobs_mode": trace.attrs.get("engine_effective", {}).get("logprobs_mode")}
    temps = np.unique(trace["temperature"].values)
    if temps.size > 1:
        bt = by_temperature(trace, "processed")
        offsets = {f"T={t:g}": float(v) for t, v in zip(bt["temperature"].values, bt["log_ratio_mean"].values)}
        evidence["mean_d_by_temperature"] = offsets
        finite = [v for v in offsets.values() if np.isfinite(v)]
        evidence["mean_d_range_over_temperatures"] = float(max(finite) - min(finite)) if finite else float("nan")
    arm = trace.attrs.get("arm")
    if _identity_sampling(trace):
        return Finding(Layer.SEMANTIC, "logprob_semantics_untestable", Severity.INFO,
                       "sampling is the identity (T=1, no top-k/top-p): raw and processed coincide",
                       evidence, "capture at the temperature/top-k/top-p your RL run uses", arm)
    if rms["processed"] <= tol:
        return Finding(Layer.SEMANTIC, "logprobs_processed", Severity.INFO,
                       "rollout logprobs match the trainer's processed distribution", evidence, "", arm)
    if rms["raw"] <= tol or rms["raw"] < rms["processed"] / 3:
        summary = ("rollout logprobs are raw (before temperature/top-k/top-p) while the trainer "
                   "recomputes the processed distribution the sampler drew from")
        if "mean_d_range_over_temperatures" in evidence:
            summary += "; the mean offset moves with temperature (the raw-mode signature)"
        return Finding(Layer.SEMANTIC, "raw_logprobs_used_as_processed", Severity.ERROR, summary,
                       evidence, FIX_PROCESSED, arm)
    return Finding(Layer.SEMANTIC, "logprobs_match_neither", Severity.WARNING,
                   "rollout logprobs match neither trainer reading within tolerance: look at the "
                   "inference path (precision, LM head, kernels)", evidence, "", arm)


def renormalization(trace: xr.Dataset, *, tol: float | None = None) -> Finding | None:
    """The top-k/top-p renormalization offset, and a finding if the rollout skipped it.

    ``log kept mass`` (<= 0) is the log of the temperature-scaled probability that top-k/top-p keep.
    A trainer (or engine) that applies temperature but not the renormalization is off by exactly
    ``-log kept mass`` per token. ``None`` when no request uses top-k/top-p or the trace was
    scored without ``trainer_log_kept_mass``.
    """
    tol = defaults().tol if tol is None else tol
    if "trainer_log_kept_mass" not in trace:
        return None
    cut = (trace["top_k"].values > 0) | (trace["top_p"].values < 1.0)
    if not cut.any():
        return None
    mask = trace["response_mask"].values.astype(bool) & cut[:, None]
    kept = trace["trainer_log_kept_mass"].values
    d = log_ratio(trace, "processed").values
    # a rollout that reports log softmax(z/T) over the full vocabulary: d_unrenorm = d + log kept
    rms_processed = _finite_rms(d, mask)
    rms_unrenorm = _finite_rms(d + kept, mask)
    evidence = {"mean_log_kept_mass": float(core.masked_mean(kept, mask)),
                "min_log_kept_mass": float(np.min(kept[mask])) if mask.any() else float("nan"),
                "share_tokens_with_cut_mass": float(np.mean(kept[mask] < -1e-6)) if mask.any() else 0.0,
                "rms_d_vs_trainer_processed": rms_processed,
                "rms_d_vs_trainer_tempered_not_renormalized": rms_unrenorm,
                "pair": PAIR, "units": "nats"}
    arm = trace.attrs.get("arm")
    if rms_processed > tol and rms_unrenorm <= tol:
        return Finding(Layer.SEMANTIC, "rollout_not_renormalized", Severity.ERROR,
                       "rollout logprobs apply temperature but not the top-k/top-p renormalization",
                       evidence, "return the sampler's distribution: " + FIX_PROCESSED
                       + "; in your own sampler, renormalise over the kept set", arm)
    return Finding(Layer.SEMANTIC, "topk_topp_renormalization", Severity.INFO,
                   f"top-k/top-p keep on average exp({evidence['mean_log_kept_mass']:.3g}) of the "
                   "tempered mass; a trainer that skips the renormalization would be off by "
                   f"{-evidence['mean_log_kept_mass']:.3g} nats per token", evidence, "", arm)


def zero_probability_tokens(trace: xr.Dataset) -> Finding | None:
    """Tokens the rollout sampled that the trainer's processed distribution excludes (-inf).

    They are counted and located, never averaged away: a single one makes the ratio infinite. They
    arise when the two sides cut different top-k/top-p sets (ties at the boundary, a different
    precision near the cut, different sampling parameters). ``None`` when there are none.
    """
    z = zero_prob_tokens(trace, "processed")
    n = z.sizes["token"]
    if n == 0:
        return None
    mask = trace["response_mask"].values.astype(bool)
    evidence = {"n_zero_prob_tokens": int(n), "share_of_tokens": float(n / max(int(mask.sum()), 1)),
                "sequences": sorted(set(z["sequence_index"].values.tolist()))[:20],
                "positions": sorted(set(z["position_index"].values.tolist()))[:20],
                "trainer_rank_of_token": sorted(set(z["trainer_token_rank"].values.tolist()))[:20],
                "rollout_logprob_of_those": [round(float(v), 4) for v in z["rollout_logprob"].values[:10]],
                "pair": "trainer processed distribution (pi_old) gives 0 to a token the engine (mu) sampled"}
    return Finding(Layer.SEMANTIC, "zero_probability_tokens", Severity.ERROR,
                   f"{n} sampled token(s) fall outside the trainer's top-k/top-p set (pi_old = 0, "
                   "the ratio is infinite there)", evidence,
                   "make the trainer apply the engine's exact top-k/top-p (vLLM keeps ties at the k-th "
                   "logit; same precision near the cut), or mask these tokens out of the loss; do not "
                   "average log 0 away", trace.attrs.get("arm"))


def prompt_token_parity(trace: xr.Dataset) -> Finding | None:
    """The prompt ids the engine saw vs the trainer's own tokenization of the same prompt.

    Needs ``trainer_prompt_token_id`` (added by :class:`rlparity.score.Scorer`). Sequences whose
    prompt was given as ids only cannot be checked and are counted as such. ``None`` when the
    trace has no trainer tokenization.
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
                   arm)


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=()) -> list[Finding]:
    """Every semantic check on one scored trace (what :func:`rlparity.diagnose.diagnose` runs)."""
    opts = options or DiagnoseOptions()
    found = [logprob_semantics(trace, tol=opts.tol), renormalization(trace, tol=opts.tol),
             zero_probability_tokens(trace), prompt_token_parity(trace)]
    return [f for f in found if f is not None]


def arms_findings(arms, options: DiagnoseOptions | None = None) -> list[Finding]:
    """The semantic layer has no check across arms."""
    return []


__all__ = ["logprob_semantics", "prompt_token_parity", "renormalization", "trace_findings",
           "zero_probability_tokens"]
