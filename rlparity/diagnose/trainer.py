"""The trainer's own determinism (inference-path layer): does the trainer give the same tokens the
same logprobs twice?

Every :class:`~rlparity.score.Scorer` run rescores a few sequences alone, twice
(``attrs["trainer"]["self_check"]``): ``run_to_run`` is how much a second identical forward moves
the logprobs (dropout left on, nondeterministic kernels), ``batch_shape`` how much the batch shape
moves them (issue "floors"). A trainer whose logprobs change from run to run compares a different
pi_old with mu at every step.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.diagnose.evidence import ArmEvidence, build, trainer_floor
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.metrics import BACKEND_PAIR_D, core
from rlparity.trace import has_trainer

PAIR = BACKEND_PAIR_D
FIX_DROPOUT = ("compute pi_old in eval mode (model.eval(), or dropout 0 in the config) inside torch.no_grad(): "
               "dropout makes the trainer's logprobs change from run to run")
# run-to-run differences below this share of the background are the floor, not a cause
RUN_TO_RUN_SHARE = 0.1


def trainer_determinism(trace: xr.Dataset, *, evidence: ArmEvidence | None = None) -> Finding | None:
    """``trainer_not_deterministic`` when the trainer's self-check moved the logprobs between two
    identical forwards by at least :data:`RUN_TO_RUN_SHARE` of the background mismatch (or the
    trainer scored in train mode with dropout on): an error when it scored in train mode with
    dropout, a warning otherwise. ``None`` without a self-check or when it is deterministic."""
    if not has_trainer(trace):
        return None
    ev = evidence if evidence is not None else build(trace)
    t = trace.attrs.get("trainer") or {}
    floor = trainer_floor(trace, ev.side)
    run = floor["run_to_run_rms"]
    dropout = float(t.get("dropout") or 0.0)
    training = bool(t.get("training_mode"))
    background = float(core.masked_rms(ev.residual, ev.unclaimed())) if ev.residual is not None else float("nan")
    evid = {"run_to_run_rms": run, "batch_shape_rms": floor["batch_shape_rms"], "background_rms": background,
            "training_mode": training, "dropout": dropout, "pair": PAIR,
            "measured_on": "the trainer's self-check: sequences rescored alone, twice"}
    arm = trace.attrs.get("arm")
    moving = np.isfinite(run) and run > 0 and (not np.isfinite(background) or run >= RUN_TO_RUN_SHARE * background)
    if training and dropout > 0:
        return Finding(Layer.INFERENCE_PATH, "trainer_not_deterministic", Severity.ERROR,
                       f"the trainer scored in train mode with dropout {dropout:g}: a second identical forward moves "
                       f"its logprobs by {run:.3g} nats RMS (the mismatch on the tokens no other cause explains: "
                       f"{background:.3g})", evid, FIX_DROPOUT, arm, cause="trainer_dropout")
    if moving:
        return Finding(Layer.INFERENCE_PATH, "trainer_not_deterministic", Severity.WARNING,
                       f"a second identical forward moves the trainer's logprobs by {run:.3g} nats RMS, "
                       f"{run / background:.0%} of the mismatch on the tokens no other cause explains" if background > 0
                       else f"a second identical forward moves the trainer's logprobs by {run:.3g} nats RMS",
                       evid, FIX_DROPOUT + "; or nondeterministic kernels: torch.use_deterministic_algorithms(True)",
                       arm, cause="trainer_dropout")
    return None


FIX_ENGINE_BATCH = ("run the engine with batch-invariant kernels (VLLM_BATCH_INVARIANT=1 with an attention backend "
                    "that supports it), or accept the spread as part of the floor and rescore every rollout with the "
                    "trainer (pi_old recomputed, not mu)")
# a floor that is at least this share of the mismatch on the unexplained tokens is worth a warning
FLOOR_SHARE = 0.25


def engine_batch_invariance(trace: xr.Dataset, *, evidence: ArmEvidence | None = None) -> Finding | None:
    """``engine_not_batch_invariant`` from the engine's own floor (``attrs["engine_floor"]``: the
    same requests sampled again alone; the logprob spread on the tokens sampled alike): a warning
    when its RMS is at least :data:`FLOOR_SHARE` of the RMS mismatch on the tokens no cause explains
    (the batch the request ran in moves the engine's logprobs as much as the backend differs),
    information when it is smaller but not zero; ``None`` without the probe or when it is 0."""
    probe = ((trace.attrs.get("engine_floor") or {}).get("batch_shape") or {})
    rms = probe.get("rms")
    if rms is None or not np.isfinite(rms) or rms <= 0 or not has_trainer(trace):
        return None
    ev = evidence if evidence is not None else build(trace)
    background = float(core.masked_rms(ev.residual, ev.unclaimed())) if ev.residual is not None else float("nan")
    share = rms / background if background > 0 else float("inf")
    evid = {"engine_batch_rms": rms, "engine_batch_max_abs": probe.get("max_abs"), "n_tokens": probe.get("n_tokens"),
            "background_rms": background, "share_of_background": share, "threshold_share": FLOOR_SHARE,
            "attention_backend": (trace.attrs.get("engine_effective") or {}).get("attention_backend"),
            "measured_on": "requests sampled again alone with the same seeds (rlparity.experiments.faults.engine_floor)",
            "pair": PAIR}
    arm = trace.attrs.get("arm")
    if share >= FLOOR_SHARE:
        return Finding(Layer.INFERENCE_PATH, "engine_not_batch_invariant", Severity.WARNING,
                       f"the engine's logprobs move by {rms:.3g} nats RMS with the batch a request runs in, "
                       f"{share:.0%} of the mismatch on the tokens no other cause explains", evid, FIX_ENGINE_BATCH, arm,
                       cause="batch_variant_attention")
    return Finding(Layer.INFERENCE_PATH, "engine_not_batch_invariant", Severity.INFO,
                   f"the engine's logprobs move by {rms:.3g} nats RMS with the batch ({share:.0%} of the mismatch on "
                   "the tokens no other cause explains): part of the floor", evid, "", arm)


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=(),
                   evidence: ArmEvidence | None = None) -> list[Finding]:
    """The trainer's and the engine's own floors for one arm (called by :func:`rlparity.diagnose.diagnose`)."""
    opts = options or DiagnoseOptions()
    if evidence is None and has_trainer(trace):
        evidence = build(trace, trainer=opts.trainer, semantic_tol=opts.semantic_tol, stale_ratio=opts.stale_ratio)
    found = [trainer_determinism(trace, evidence=evidence), engine_batch_invariance(trace, evidence=evidence)]
    return [f for f in found if f is not None]


def arms_findings(arms, options: DiagnoseOptions | None = None) -> list[Finding]:
    """No check across arms."""
    return []


__all__ = ["FIX_DROPOUT", "FIX_ENGINE_BATCH", "FLOOR_SHARE", "RUN_TO_RUN_SHARE", "arms_findings",
           "engine_batch_invariance", "trace_findings", "trainer_determinism"]
