"""Mixture-of-experts routing (inference-path layer): do the engine and the trainer send each token to
the same experts?

A token the two sides route to different experts in some layer (a **routing flip**) is computed by
different weights on each side, so its logprob disagrees far beyond kernel noise: the largest
train/inference mismatches reported for MoE models come from these tokens (R3 paper: KL 1.5e-3 for
Qwen3-30B-A3B against 6.4e-4 for dense Qwen3-8B). The evidence (:mod:`rlparity.diagnose.evidence`)
claims the flipped tokens from the two sides' records before any logprob is compared, under the
router-precision cause when one side's router runs in a lower precision (``trainer_bf16_router``,
``rollout_bf16_router``), else ``moe_routing_disagreement``; the attribution gives them their share.

:func:`routing_finding`: ``moe_routing_disagreement`` with the flip rate (per layer and per token),
the router margins at the flips, the mismatch ``|d|`` of flipped vs unflipped tokens and, when the
trainer also scored with the engine's routes forced, how much routing replay removes from the
flipped tokens. Flips on tokens another cause explains (the tokens of a version whose weights differ
between the two sides) are that cause's, not routing's. A warning when the flipped tokens' residual stands above the tokens no cause
explains (:meth:`ArmEvidence.localized_test`) or replay removes at least half of their mismatch;
information when the routes agree or the flips barely move their tokens. Nothing on a trace without
both sides' routes (a dense model, or a capture without ``capture_routing``).
"""

from __future__ import annotations

import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.diagnose.evidence import ArmEvidence, build
from rlparity.diagnose.routing_evidence import router_dtypes, routing_cause
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.metrics import BACKEND_PAIR_D
from rlparity.metrics.routing import flip_summary, has_routes, routing_table
from rlparity.trace import arm_record, has_trainer
from rlparity.diagnose.topic import FIX_NONE, FindingCode, I, LOCALIZED, NOT_RECORDED, PATH, Topic, W, code

PAIR = BACKEND_PAIR_D
FIX_REPLAY = ("replay the engine's routes in the trainer (routing replay, R3: capture routed_experts with vLLM's "
              "enable_return_routed_experts and force them in the trainer's routers; verl router_replay, slime "
              "--use-rollout-routing-replay; rlparity: TrainerSettings(routing_replay='on'))")
FIX_FP32_ROUTER = ("compute both sides' routers in float32 (the trainer: cast hidden states and router weight to "
                   "float32 before the router projection, rlparity TrainerSettings(router_dtype='float32'); the "
                   "engine: its fp32 router GEMM where vLLM has one)")
# replay must remove at least this share of the flipped tokens' mean |d| to count as the flips' doing
REPLAY_SHARE = 0.5


def routing_finding(trace: xr.Dataset, *, evidence: ArmEvidence | None = None, trainer: str | None = None,
                    ratio: float | None = None, tol: float | None = None) -> Finding | None:
    """The routing verdict of one arm (see the module docstring).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm with both sides' routes.
    evidence : ArmEvidence, optional
        The arm's evidence (it holds the routing claim); built here when not given.
    trainer : str, optional
        The trainer reading, used when the evidence is built here; None: the default.
    ratio : float, optional
        Flipped tokens' mean ``|r|`` at least this many times the background's count as measured
        (:meth:`ArmEvidence.localized_test`); None: ``defaults().stale_ratio``.
    tol : float, optional
        Nats of excess over the background that count as measured (with 4 standard errors); None:
        ``defaults().tol_trainer``.

    Returns
    -------
    Finding or None
        ``moe_routes_agree`` (info) or ``moe_routing_disagreement`` (warning when the flips
        explain their tokens' mismatch or replay removes at least :data:`REPLAY_SHARE` of it,
        else info); ``None`` without both sides' routes or an unscored trace.
    """
    if not has_routes(trace) or not has_trainer(trace):
        return None
    ratio = defaults().stale_ratio if ratio is None else ratio
    tol = defaults().tol_trainer if tol is None else tol
    ev = evidence if evidence is not None else build(trace, trainer=trainer)
    arm = arm_record(trace).arm
    table = routing_table(trace)
    summ = flip_summary(trace, ev.side)
    layers = [int(x) for x in table["moe_layer"].values]
    evid: dict = {
        "token_flip_rate": float(summ["token_flip_rate"]), "n_flipped_tokens": int(summ["n_flipped"]),
        "n_tokens": int(summ["n_tokens"]),
        "flip_rate_by_layer": {str(L): float(table["flip_rate"].sel(moe_layer=L)) for L in layers},
        "topk_agreement_by_layer": {str(L): float(table["topk_agreement"].sel(moe_layer=L)) for L in layers},
        "abs_d_flipped": float(summ["abs_d_flipped"]), "abs_d_unflipped": float(summ["abs_d_unflipped"]),
        "router_dtypes": router_dtypes(trace), "pair": PAIR,
        "routing_capture": (arm_record(trace).routing_capture or {}).get("method")}
    if "margin_at_flips_median" in table:
        evid["router_margin_at_flips_median"] = {str(L): float(table["margin_at_flips_median"].sel(moe_layer=L))
                                                 for L in layers}
        evid["router_margin_median"] = {str(L): float(table["margin_median"].sel(moe_layer=L)) for L in layers}
    n_flip = evid["n_flipped_tokens"]
    if n_flip == 0:
        return Finding(Layer.INFERENCE_PATH, "moe_routes_agree", Severity.INFO,
                       f"the engine and the trainer route every one of {evid['n_tokens']} tokens to the same "
                       f"experts in all {len(layers)} MoE layers", evid, "", arm)
    cause = routing_cause(trace)
    if cause not in ev.claims:  # every flipped token is explained by another cause (weights that differ)
        by = sorted(c for c in ev.claims if c != cause)
        return Finding(Layer.INFERENCE_PATH, "moe_routing_disagreement", Severity.INFO,
                       f"{n_flip} of {evid['n_tokens']} tokens are routed to other experts by the engine and the trainer, "
                       f"all of them tokens another cause explains ({', '.join(by)})", evid, "", arm,
                       explained_by=by[0] if by else None)
    t = ev.localized_test(cause, ratio=ratio, tol=tol)
    evid.update({"flipped_abs_residual_mean": t.get("abs_residual_mean"),
                 "background_abs_residual_mean": t.get("background_abs_residual_mean"),
                 "flipped_over_background": t.get("ratio"), "excess_z": t.get("z"), "effect": t["verdict"]})
    removed = None
    if "replay_ratio" in summ:
        evid.update({"abs_d_flipped_replay": float(summ["abs_d_flipped_replay"]),
                     "replay_ratio": float(summ["replay_ratio"])})
        a, b = float(summ["abs_d_flipped"]), float(summ["abs_d_flipped_replay"])
        removed = (a - b) / a if a > 0 else 0.0
        evid["replay_removes_share_of_flipped"] = removed
    explains = t["verdict"] == "measured" or (removed is not None and removed >= REPLAY_SHARE
                                             and t["verdict"] != "small")
    worst = max(layers, key=lambda L: evid["flip_rate_by_layer"][str(L)])
    what = (f"{n_flip} of {evid['n_tokens']} tokens ({evid['token_flip_rate']:.1%}) are routed to other experts by "
            f"the engine and the trainer in at least one MoE layer (layer {worst}: "
            f"{evid['flip_rate_by_layer'][str(worst)]:.1%}); their mean |d| is {evid['abs_d_flipped']:.3g} nats "
            f"against {evid['abs_d_unflipped']:.3g} on the other tokens")
    if removed is not None:
        what += f", {evid['abs_d_flipped_replay']:.3g} with the engine's routes replayed ({evid['replay_ratio']:.3g}x less)"
    dt = evid["router_dtypes"]
    fix = FIX_REPLAY + "; " + FIX_FP32_ROUTER
    if cause == "trainer_bf16_router":
        what += f"; the trainer's routers run in {dt['trainer']}, the engine's in {dt['engine']}"
        fix = FIX_FP32_ROUTER + "; or " + FIX_REPLAY
    elif cause == "rollout_bf16_router":
        what += f"; the engine's routers run in {dt['engine']}, the trainer's in {dt['trainer']}"
    sev = Severity.WARNING if explains else Severity.INFO
    if not explains:
        what += (" (the flips barely move their tokens here)" if t["verdict"] == "small"
                 else " (another cause's mismatch hides their effect: measure again after fixing it)")
    return Finding(Layer.INFERENCE_PATH, "moe_routing_disagreement", sev, what, evid, fix, arm,
                   cause=cause if explains else None)


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=(),
                   evidence: ArmEvidence | None = None) -> list[Finding]:
    """The routing check of one arm (called by :func:`rlparity.diagnose.diagnose`).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    options : DiagnoseOptions, optional
        Reads ``trainer``, ``stale_ratio`` (the ratio) and ``tol_trainer`` (the tolerance); None:
        the defaults.
    prior : sequence of Finding, default ()
        The earlier layers' findings for the arm (unused here).
    evidence : ArmEvidence, optional
        The arm's evidence; built here when not given.

    Returns
    -------
    list of Finding
        :func:`routing_finding`'s finding, or empty.
    """
    opts = options or DiagnoseOptions()
    f = routing_finding(trace, evidence=evidence, trainer=opts.trainer, ratio=opts.stale_ratio, tol=opts.tol_trainer)
    return [f] if f is not None else []


# the finding codes this topic emits (collected by rlparity.diagnose.catalogue)
CODES: tuple[FindingCode, ...] = (
    code("moe_routing_disagreement", PATH, (I, W),
           "The engine and the trainer route some tokens to different experts (routing flips); those tokens are "
           "computed by different weights on each side. A warning when the flipped tokens stand above the background or "
           "routing replay removes at least half of their mismatch; information when the flips barely move them or "
           "another cause explains them.", FIX_REPLAY + "; " + FIX_FP32_ROUTER, "routing",
           rule=LOCALIZED + "; or replay removes at least REPLAY_SHARE of the flipped tokens' mean |d|",
           thresholds=("stale_ratio", "tol_trainer", "rlparity.diagnose.routing:REPLAY_SHARE"),
           calibrated_on="stale_ratio on CPU float32; REPLAY_SHARE " + NOT_RECORDED,
           causes=("moe_routing_disagreement", "trainer_bf16_router", "rollout_bf16_router")),
    code("moe_routes_agree", PATH, (I,),
           "The engine and the trainer route every token to the same experts in every MoE layer.", FIX_NONE, "routing",
           calibrated_on="exact (expert ids)"),
)

TOPIC = Topic('routing', 40, CODES, trace_findings)

__all__ = ["FIX_FP32_ROUTER", "FIX_REPLAY", "REPLAY_SHARE", "routing_finding", "trace_findings"]
