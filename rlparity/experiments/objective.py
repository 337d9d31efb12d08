"""The objective-layer demonstration: a correction applied before backend parity makes the ratio
statistics look fixed, yet the update is not the parity update.

:func:`correction_demo` takes two captures of the same prompts with the same seeds, one whose
rollout logprobs are raw (``raw_logprobs``) and one in parity (``processed_logprobs``); vLLM's
``logprobs_mode`` changes only what is reported, so both hold the same sampled tokens. On the raw
one it applies token TIS (``w = min(pi_old/mu, C)``) and a rejection mask (default the geometric
sequence band), then compares, for one optimizer step on the same samples, the policy gradient of
the corrected raw trace with that of the parity trace, and runs the objective findings on both.
It lives here, not in ``diagnose``, because it trains (``rlparity.train``) and measures
(``rlparity.metrics``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide
from rlparity.diagnose.findings import Finding
from rlparity.diagnose.objective import correction_hides_backend_mismatch, corrected_health
from rlparity.metrics import objective as ob
from rlparity.train import arithmetic_reward, train_step


def _scored(trace: xr.Dataset, model: Any) -> xr.Dataset:
    if "trainer_logprob" in trace and "trainer_processed_logprob" in trace:
        return trace
    from rlparity.score import Scorer

    return Scorer(model, progress=False, tokenize_prompts=False).score(trace)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na > 0 and nb > 0 else float("nan")


def _other_findings(trace: xr.Dataset) -> list[Finding]:
    from rlparity.diagnose import diagnose

    return list(diagnose(trace))


def correction_demo(raw_trace: xr.Dataset, parity_trace: xr.Dataset, model: Any, *,
                    rewards: Callable | np.ndarray = arithmetic_reward, loss: str = "ppo", trainer: TrainerSide | None = None,
                    cap: float | None = None, mask_rule: str | None = "geometric_band", threshold: Any = None,
                    findings_raw: Iterable[Finding] | None = None, findings_parity: Iterable[Finding] | None = None,
                    **train_options: Any) -> dict[str, Any]:
    """Correct the raw trace (token TIS at ``cap``, default ``OBJECTIVE_DEFAULTS.is_cap``, and the
    ``mask_rule`` rejection) and compare it with the parity trace on one step of ``loss``.

    Returns a dict: ``same_samples`` (identical token ids), ``before`` and ``after`` (the backend
    pair's mean ratio, PPO clip fraction at eps, ESS: raw ratios before, truncated weights on the
    kept tokens after), ``masked_fraction`` (tokens and sequences), ``effective_batch`` (kept
    tokens and their weight-ESS, absolute and as a share of all usable tokens),
    ``cosine_raw_corrected_vs_parity`` and ``cosine_raw_uncorrected_vs_parity`` (policy-gradient
    directions of one step on the same samples, before any optimizer step), ``corrected_health``
    (the verl view of the corrected weights; the cosine is NaN when the mask rejects every token)
    and the ``correction_hides_backend_mismatch``
    findings on each trace (the other layers' findings come from :func:`rlparity.diagnose.diagnose`
    unless given). ``model`` is a path or a loaded causal LM (not stepped); ``train_options`` go
    to :func:`rlparity.train.train_step`.
    """
    o = ob.OBJECTIVE_DEFAULTS
    c = o.is_cap if cap is None else cap
    raw = _scored(raw_trace, model)
    par = _scored(parity_trace, model)
    same = (raw["token_id"].shape == par["token_id"].shape
            and bool((raw["token_id"].values == par["token_id"].values).all()))
    d = ob.pair_log_ratio(raw, "backend", trainer).values
    usable = ob.finite_tokens(d)
    w = ob.tis_weights(d, cap=c)
    keep = usable if mask_rule is None else ob.rejection_keep(d, rule=mask_rule, threshold=threshold)
    eps = o.ppo_eps
    r = np.exp(np.where(usable, d, 0.0))

    def stats(x, sel):
        v = x[sel]
        return {"mean_ratio": float(v.mean()) if v.size else float("nan"),
                "clip_fraction": float(((v < 1 - eps) | (v > 1 + eps)).mean()) if v.size else float("nan"),
                "ess": float(v.sum() ** 2 / (v.size * (v ** 2).sum())) if v.size and (v ** 2).sum() > 0 else float("nan"),
                "n_tokens": int(v.size)}

    before = stats(r, usable)
    after = stats(np.where(keep, w, 0.0), keep)
    wk = w[keep]
    eff = float(wk.sum() ** 2 / (wk ** 2).sum()) if wk.size and (wk ** 2).sum() > 0 else 0.0
    desc = {"tis": "token", "cap": c, "masks": [mask_rule] if mask_rule else [],
            "threshold": str(threshold if threshold is not None else (o.band(mask_rule) if mask_rule in ob.BAND_RULES
                                                                      else o.kl_thresholds.get(mask_rule)))}
    rw = rewards(raw) if callable(rewards) else np.asarray(rewards, float)
    common = dict(rewards=rw, loss=loss, trainer=trainer, step=False, return_gradient=True, **train_options)
    g_raw = train_step(model, raw, **common)
    g_par = train_step(model, par, **common)
    if (keep & usable).any():
        g_corr = train_step(model, raw, token_weights=np.where(keep, w, 0.0), keep=keep, **common)
        corr_grad, corr_norm = g_corr.gradient, g_corr.metrics["grad_norm"]
    else:  # the mask rejected the whole batch: no update at all
        corr_grad, corr_norm = np.zeros_like(g_raw.gradient), 0.0
    corrected = raw.assign_attrs(objective_correction=desc)
    par_corr = par.assign_attrs(objective_correction=desc)
    f_raw = list(findings_raw) if findings_raw is not None else _other_findings(raw)
    f_par = list(findings_parity) if findings_parity is not None else _other_findings(par)
    masked_tok = ob.rejected_fraction(keep, d)
    masked_seq = ob.rejected_fraction(keep, d, level="sequence")
    return {
        "same_samples": same,
        "pair": ob.pair_direction("backend", trainer)["pair"],
        "correction": desc,
        "before": before,
        "after": after,
        "masked_fraction": {"tokens": float(masked_tok.value), "sequences": float(masked_seq.value),
                            "n_excluded_tokens": int(masked_tok.n_excluded)},
        "effective_batch": {"kept_tokens": int(keep.sum()), "weight_ess_tokens": eff,
                            "share_of_usable": eff / max(int(usable.sum()), 1)},
        "cosine_raw_corrected_vs_parity": _cos(corr_grad, g_par.gradient),
        "cosine_raw_uncorrected_vs_parity": _cos(g_raw.gradient, g_par.gradient),
        "grad_norm": {"raw_corrected": corr_norm, "raw_uncorrected": g_raw.metrics["grad_norm"],
                      "parity": g_par.metrics["grad_norm"]},
        "corrected_health": corrected_health(raw, trainer=trainer, cap=c),
        "findings_raw": correction_hides_backend_mismatch(corrected, f_raw, trainer=trainer, cap=c),
        "findings_parity": correction_hides_backend_mismatch(par_corr, f_par, trainer=trainer, cap=c),
        "other_errors_raw": [f"{f.layer.value}/{f.name}" for f in f_raw if f.severity.value == "error"],
        "other_errors_parity": [f"{f.layer.value}/{f.name}" for f in f_par if f.severity.value == "error"],
    }


__all__ = ["correction_demo"]
