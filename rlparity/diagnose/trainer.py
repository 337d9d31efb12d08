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


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=(),
                   evidence: ArmEvidence | None = None) -> list[Finding]:
    """The trainer checks of one arm (called by :func:`rlparity.diagnose.diagnose`)."""
    opts = options or DiagnoseOptions()
    if evidence is None and has_trainer(trace):
        evidence = build(trace, trainer=opts.trainer, semantic_tol=opts.semantic_tol, stale_ratio=opts.stale_ratio)
    f = trainer_determinism(trace, evidence=evidence)
    return [f] if f is not None else []


def arms_findings(arms, options: DiagnoseOptions | None = None) -> list[Finding]:
    """No check across arms."""
    return []


__all__ = ["FIX_DROPOUT", "RUN_TO_RUN_SHARE", "arms_findings", "trace_findings", "trainer_determinism"]
