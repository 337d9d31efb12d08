"""Semantic layer: which distribution do the rollout logprobs come from?

Compares the rollout logprob with the trainer's two readings of the same token: the full
vocabulary at temperature 1 (vLLM ``raw_logprobs``) and the processed distribution the sampler
drew from (``processed_logprobs``), and says which one it matches.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.metrics import core, log_ratio

FIX_PROCESSED = ("start vLLM with --logprobs-mode processed_logprobs "
                 "(LLM(..., logprobs_mode='processed_logprobs'))")


def logprob_semantics(trace: xr.Dataset, *, tol: float = 0.02) -> Finding:
    """A finding saying whether rollout logprobs are raw or processed.

    ``tol`` is the RMS of d (nats) under which a side counts as matched. The trainer's expected
    side is the processed one (what the sampler drew from); when sampling is the identity
    (temperature 1, no top-k/top-p) both readings agree and no mismatch is possible.
    """
    mask = trace["response_mask"].values.astype(bool)
    rms = {}
    for side in ("processed", "raw"):
        rms[side] = core.abs_stats(log_ratio(trace, side).values, mask)["rms"]
    identity = bool(np.all(trace["temperature"].values == 1.0) and np.all(trace["top_k"].values <= 0)
                    and np.all(trace["top_p"].values >= 1.0))
    evidence = {"rms_d_vs_trainer_processed": rms["processed"], "rms_d_vs_trainer_raw": rms["raw"],
                "pair": "backend (pi_old, mu), d = log pi_old - log mu",
                "engine_logprobs_mode": trace.attrs.get("engine_effective", {}).get("logprobs_mode")}
    arm = trace.attrs.get("arm")
    if identity:
        return Finding(Layer.SEMANTIC, "logprob_semantics_untestable", Severity.INFO,
                       "sampling is the identity (T=1, no top-k/top-p): raw and processed coincide",
                       evidence, "capture at the temperature/top-k/top-p your RL run uses", arm)
    if rms["processed"] <= tol:
        return Finding(Layer.SEMANTIC, "logprobs_processed", Severity.INFO,
                       "rollout logprobs match the trainer's processed distribution", evidence, "", arm)
    if rms["raw"] <= tol or rms["raw"] < rms["processed"] / 3:
        return Finding(Layer.SEMANTIC, "raw_logprobs_used_as_processed", Severity.ERROR,
                       "rollout logprobs are raw (before temperature/top-k/top-p) while the trainer "
                       "recomputes the processed distribution", evidence, FIX_PROCESSED, arm)
    return Finding(Layer.SEMANTIC, "logprobs_match_neither", Severity.WARNING,
                   "rollout logprobs match neither trainer reading within tolerance: look at the "
                   "inference path (precision, LM head, kernels)", evidence, "", arm)
