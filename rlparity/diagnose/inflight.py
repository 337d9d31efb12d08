"""Inflight weight updates (inference-path layer): what the rollout engine computed across an update.

An online RL loop updates the rollout engine's weights while it samples. Three things can make the
rollout's logprobs disagree with a trainer that scores each token at its own version:

* :func:`stale_prefix_cache`: a prompt hits the prefix cache after an update that did not reset
  it, so its prefix's KV was computed by the old weights (PipelineRL disabled prefix caching for
  this; others measured mean ``|d|`` 0.87 nats from it). Evidence: d on those sequences against the
  noise floor of tokens computed by one set of weights.
* :func:`kv_carried_over`: a request kept across an update (``mode="keep"`` without clearing the
  cache) samples its later tokens on KV the old weights computed for its earlier ones.
* :func:`scored_at_one_version`: the trace holds tokens of several versions but the trainer scored
  them all with one set of weights, so d mixes policy lag into the backend mismatch.

:func:`policy_lag` states the lag (information). Over the arms of an inflight matrix
(:func:`rlparity.experiments.inflight.inflight_matrix`) :func:`matrix_findings` names the stale arms
and compares each with the same arm whose cache was reset.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.diagnose.evidence import ArmEvidence, build
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.metrics import BACKEND_PAIR_D
from rlparity.metrics import inflight as mi
from rlparity.trace import arm_record, has_trainer, trace_versions
from rlparity.diagnose.topic import E, FIX_NONE, FindingCode, I, LOCALIZED, NOT_RECORDED, PATH, Topic, W, code

PAIR = BACKEND_PAIR_D
FIX_STALE = ("reset the prefix cache whenever the weights change: pause_generation(..., clear_cache=True) "
             "(rlparity: AsyncEngine.update_weights(..., clear_cache=True)), or call reset_prefix_cache() right "
             "after loading the weights; or disable prefix caching (LLM(..., enable_prefix_caching=False), "
             "vllm serve --no-enable-prefix-caching), as PipelineRL does")
FIX_CARRIED = ("update with clear_cache=True (vLLM then recomputes the kept requests' KV with the new weights), "
               "or pause with mode='wait' / 'abort'; or keep it as PipelineRL does and count these tokens as "
               "off-policy in the correction")
FIX_VERSIONS = ("score every token with the weights that sampled it: rlparity.score.score_versions(trace, "
                "{version: checkpoint, ...}); the latest-weights reading goes to trainer_latest_*")


def _residual_note(ev: ArmEvidence) -> str:
    reading = ev.reading if ev.reading in ("processed", "raw") else ev.side
    return f"r = mu - the trainer's {reading} reading (the semantic cause corrected), nats"


def stale_prefix_cache(trace: xr.Dataset, *, trainer: str | None = None, stale_ratio: float = 3.0,
                       tol: float | None = None, evidence: ArmEvidence | None = None) -> Finding | None:
    """``stale_prefix_cache_after_update`` when sequences hit a prefix cache not reset at an update.

    Such a cache may hold KV of other weights (``prefix_cache_stale``). An error when the trace is
    unscored (the hits are stale by construction) or when the effect is measured
    (:meth:`ArmEvidence.localized_test`: mean ``|r|`` on the stale sequences at least
    ``stale_ratio`` times the background of tokens no identified cause explains, or above it by
    ``tol`` nats and four standard errors), ``r`` being the residual once the semantic cause is
    corrected (so a raw-mode engine does not hide it); a warning otherwise (the cached blocks may
    have been written after the update, or another cause's mismatch hides the effect).

    Parameters
    ----------
    trace : xarray.Dataset
        An arm (scored or not) that records prefix-cache hits and updates.
    trainer : str, optional
        The trainer reading; None: the default.
    stale_ratio : float, default 3.0
        The ratio to the background at which the effect counts as measured.
    tol : float, optional
        Nats of excess over the background that count as measured; None:
        ``defaults().tol_trainer``.
    evidence : ArmEvidence, optional
        The arm's evidence; built here when not given.

    Returns
    -------
    Finding or None
        The finding; ``None`` when no sequence hit a stale cache or the trace does not record it.
    """
    stale = mi.stale_sequences(trace)
    if not stale.any():
        return None
    tol = defaults().tol_trainer if tol is None else tol
    ev = {**mi.stale_evidence(trace, trainer), "pair": PAIR, "stale_ratio_threshold": stale_ratio,
          "updates": [{k: u.get(k) for k in ("version", "mode", "clear_cache", "cache_reset")} for u in mi.updates(trace)]}
    arm = arm_record(trace).arm
    n, tot = ev["n_stale_sequences"], ev["n_sequences"]
    if "stale_abs_log_ratio_mean" not in ev:
        return Finding(Layer.INFERENCE_PATH, "stale_prefix_cache_after_update", Severity.ERROR,
                       f"{n} of {tot} sequences took {ev['stale_cached_prompt_share']:.0%} of their prompt tokens from a "
                       "prefix cache filled before a weight update that did not reset it: their prefix KV was computed "
                       "by the old weights (score the trace to measure the effect)", ev, FIX_STALE, arm,
                       cause="stale_prefix_cache")
    e = evidence if evidence is not None else build(trace, trainer=trainer)
    t = e.localized_test("stale_prefix_cache", ratio=stale_ratio, tol=tol)
    ev.update({"stale_abs_residual_mean": t.get("abs_residual_mean"),
               "background_abs_residual_mean": t.get("background_abs_residual_mean"),
               "stale_over_floor": t.get("ratio"), "excess_z": t.get("z"), "effect": t["verdict"],
               "residual": _residual_note(e)})
    what = (f"mean |r| {t.get('abs_residual_mean', float('nan')):.3g} nats on them against "
            f"{t.get('background_abs_residual_mean', float('nan')):.3g} on the tokens no cause explains "
            f"({t.get('ratio', float('nan')):.3g}x)")
    if t["verdict"] == "measured":
        return Finding(Layer.INFERENCE_PATH, "stale_prefix_cache_after_update", Severity.ERROR,
                       f"{n} of {tot} sequences reused prefix-cache KV computed by older weights (the cache was not "
                       f"reset at the update): {what}", ev, FIX_STALE, arm, cause="stale_prefix_cache")
    why = ("the blocks they reused may have been written after the update" if t["verdict"] == "small"
           else "the mismatch every token shows hides the effect: measure again after fixing the headline")
    return Finding(Layer.INFERENCE_PATH, "stale_prefix_cache_after_update", Severity.WARNING,
                   f"{n} of {tot} sequences hit a prefix cache that was not reset at the update, but {what}: {why}",
                   ev, FIX_STALE, arm, cause="stale_prefix_cache")


def kv_carried_over(trace: xr.Dataset, *, trainer: str | None = None, stale_ratio: float = 3.0,
                    tol: float | None = None, evidence: ArmEvidence | None = None) -> Finding | None:
    """``kv_carried_over_update`` when sequences straddle an update that kept the cache.

    Their later tokens were sampled by the new weights on KV the old ones computed. A warning when
    the effect is measured on those tokens (:meth:`ArmEvidence.localized_test` against the
    background of tokens no cause explains, semantic cause corrected) or cannot be told apart from
    another cause's mismatch; information when it is measured to be small (below ``tol`` nats of
    mean ``|r|``) or the trace is unscored.

    Parameters
    ----------
    trace : xarray.Dataset
        An arm that records its updates.
    trainer : str, optional
        The trainer reading; None: the default.
    stale_ratio : float, default 3.0
        The ratio to the background at which the effect counts as measured.
    tol : float, optional
        Nats of excess over the background that count as measured; None:
        ``defaults().tol_trainer``.
    evidence : ArmEvidence, optional
        The arm's evidence; built here when not given.

    Returns
    -------
    Finding or None
        The finding; ``None`` when no token is carried over.
    """
    carried = mi.carried_tokens(trace)
    if not carried.any():
        return None
    tol = defaults().tol_trainer if tol is None else tol
    seqs = int(carried.any(axis=1).sum())
    ev = {"n_sequences": seqs, "n_carried_tokens": int(carried.sum()), "pair": PAIR}
    arm = arm_record(trace).arm
    if not has_trainer(trace):
        return Finding(Layer.INFERENCE_PATH, "kv_carried_over_update", Severity.INFO,
                       f"{seqs} sequences continued across a weight update on KV of the old weights "
                       f"({ev['n_carried_tokens']} tokens; score the trace to measure the effect)", ev, FIX_CARRIED, arm,
                       cause="kv_carried_over")
    e = evidence if evidence is not None else build(trace, trainer=trainer)
    t = e.localized_test("kv_carried_over", ratio=stale_ratio, tol=tol)
    c, f = t.get("abs_residual_mean", float("nan")), t.get("background_abs_residual_mean", float("nan"))
    ev.update({"carried_abs_residual_mean": c, "background_abs_residual_mean": f,
               "carried_over_floor": t.get("ratio"), "excess_z": t.get("z"), "effect": t["verdict"],
               "residual": _residual_note(e)})
    sev = Severity.INFO if t["verdict"] == "small" else Severity.WARNING
    tail = {"measured": "", "small": ": too small to matter here",
            "inconclusive": ": not separable from the mismatch every token shows; measure again after fixing the "
                            "headline"}[t["verdict"]]
    return Finding(Layer.INFERENCE_PATH, "kv_carried_over_update", sev,
                   f"{seqs} sequences continued across a weight update on KV the old weights computed: mean |r| "
                   f"{c:.3g} nats on their {ev['n_carried_tokens']} later tokens against {f:.3g} on the tokens no "
                   f"cause explains ({t.get('ratio', float('nan')):.3g}x){tail}", ev, FIX_CARRIED, arm,
                   cause="kv_carried_over")


def scored_at_one_version(trace: xr.Dataset) -> Finding | None:
    """``scored_at_one_version`` (warning) when the trainer did not score each token at its own version.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.

    Returns
    -------
    Finding or None
        The finding when the tokens come from several policy versions and the trainer did not
        score by ``policy_version``; ``None`` otherwise or for an unscored trace.
    """
    if not has_trainer(trace):
        return None
    versions = trace_versions(trace)
    rec = arm_record(trace)
    if len(versions) < 2 or rec.scorer.scored_by == "policy_version":
        return None
    return Finding(Layer.INFERENCE_PATH, "scored_at_one_version", Severity.WARNING,
                   f"the tokens come from policy versions {versions} but the trainer scored them all with one set of "
                   f"weights ({rec.scorer.model}): d mixes policy lag with the backend "
                   "mismatch", {"versions": versions, "pair": PAIR}, FIX_VERSIONS, rec.arm,
                   cause="mixed_versions")


def policy_lag(trace: xr.Dataset) -> Finding | None:
    """``policy_lag`` (information): the token and per-sequence policy lag, as PipelineRL logs it.

    Parameters
    ----------
    trace : xarray.Dataset
        An arm.

    Returns
    -------
    Finding or None
        The lag (mean and max per token, per sequence, off-policy share); ``None`` for a trace
        without recorded updates and with one version.
    """
    if not mi.updates(trace) and len(trace_versions(trace)) < 2:
        return None
    tok = mi.lag_summary(trace)
    seq = mi.lag_summary(trace, dim="position")
    has = seq["n_tokens"].values > 0
    ev = {"latest_version": tok.attrs["latest_version"], "lag_mean": float(tok["lag_mean"]),
          "lag_max": float(tok["lag_max"]), "offpolicy_share": float(tok["offpolicy_share"]),
          "sequence_lag_mean": float(np.mean(seq["lag_mean"].values[has])) if has.any() else float("nan"),
          "sequence_lag_max_mean": float(np.mean(seq["lag_max"].values[has])) if has.any() else float("nan")}
    return Finding(Layer.INFERENCE_PATH, "policy_lag", Severity.INFO,
                   f"{ev['offpolicy_share']:.0%} of tokens were sampled by weights older than the latest (version "
                   f"{ev['latest_version']}): mean lag {ev['lag_mean']:.3g}, max {ev['lag_max']:.3g}", ev, "",
                   arm_record(trace).arm)


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None, prior=(),
                   evidence: ArmEvidence | None = None) -> list[Finding]:
    """The inflight checks of one arm (called by :func:`rlparity.diagnose.diagnose`).

    Stale prefix cache, KV carried over, scoring at one version, and the policy lag.

    Parameters
    ----------
    trace : xarray.Dataset
        An arm.
    options : DiagnoseOptions, optional
        Reads ``trainer``, ``semantic_tol``, ``stale_ratio`` and ``tol_trainer``; None: the
        defaults.
    prior : sequence of Finding, default ()
        The earlier layers' findings for the arm (unused here).
    evidence : ArmEvidence, optional
        The arm's evidence; built here for a scored trace when not given.

    Returns
    -------
    list of Finding
        The inflight findings of the arm.
    """
    opts = options or DiagnoseOptions()
    ev = evidence
    if ev is None and has_trainer(trace):
        ev = build(trace, trainer=opts.trainer, semantic_tol=opts.semantic_tol)
    found = [stale_prefix_cache(trace, trainer=opts.trainer, stale_ratio=opts.stale_ratio, tol=opts.tol_trainer,
                                evidence=ev),
             kv_carried_over(trace, trainer=opts.trainer, stale_ratio=opts.stale_ratio, tol=opts.tol_trainer,
                             evidence=ev),
             scored_at_one_version(trace), policy_lag(trace)]
    return [f for f in found if f is not None]


def matrix_findings(arms: Mapping[str, xr.Dataset], options: DiagnoseOptions | None = None) -> list[Finding]:
    """Over an inflight matrix: ``inflight_stale_arms``, naming the arms with stale prefix-cache hits.

    For each stale arm the evidence gives mean ``|d|`` (nats) after the update against the same arm
    with the cache reset, and their ratio. Information: each stale arm has its own error.

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        The arms of an inflight matrix (:func:`rlparity.experiments.inflight.inflight_matrix`).
    options : DiagnoseOptions, optional
        Reads ``trainer``; None: the defaults.

    Returns
    -------
    list of Finding
        One finding over all arms.
    """
    opts = options or DiagnoseOptions()
    table = mi.inflight_table(arms, trainer=opts.trainer)
    stale = [a for a in table["arm"].values.tolist() if float(table["n_stale_sequences"].sel(arm=a)) > 0]
    clean = [a for a in table["arm"].values.tolist() if a not in stale]
    ev: dict = {"stale_arms": stale, "arms_without_stale_hits": clean, "pair": PAIR}
    for a, r in mi.reset_ratios(table).items():
        if a in stale:
            ev[f"{a}_after_abs_log_ratio_mean"] = r["kept"]
            ev[f"{r['reset_arm']}_after_abs_log_ratio_mean"] = r["reset"]
            ev[f"{a}_over_{r['reset_arm']}"] = r["ratio"]
    summary = (f"stale prefix-cache hits in {len(stale)} arm(s): {', '.join(stale)}" if stale
               else "no arm served a prefix cache across an update without resetting it")
    return [Finding(Layer.INFERENCE_PATH, "inflight_stale_arms", Severity.INFO, summary, ev,
                    FIX_STALE if stale else "", None)]


def arms_findings(arms: Mapping[str, xr.Dataset], options: DiagnoseOptions | None = None) -> list[Finding]:
    """The inflight-matrix check over the arms of one store (called by :func:`rlparity.diagnose.diagnose`).

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        Every arm of the store.
    options : DiagnoseOptions, optional
        Passed to :func:`matrix_findings`; None: the defaults.

    Returns
    -------
    list of Finding
        :func:`matrix_findings` when the arms are an inflight matrix; empty otherwise.
    """
    if not mi.is_inflight(arms):
        return []
    return matrix_findings(arms, options)



# the finding codes this topic emits (collected by rlparity.diagnose.catalogue)
CODES: tuple[FindingCode, ...] = (
    code("stale_prefix_cache_after_update", PATH, (W, E),
           "Sequences took prompt tokens from a prefix cache filled before a weight update that did not reset it: their "
           "prefix KV was computed by the old weights. An error when the trace is unscored (stale by construction) or "
           "the effect is measured; a warning when the blocks may have been written after the update or another "
           "cause's mismatch hides the effect.", FIX_STALE, "inflight", rule=LOCALIZED,
           thresholds=("stale_ratio", "tol_trainer"), calibrated_on="CPU float32 (the bar of 3x is met by 10^4x there); "
                                                                   "tol_trainer " + NOT_RECORDED,
           causes=("stale_prefix_cache",)),
    code("kv_carried_over_update", PATH, (I, W),
           "Requests kept across a weight update (pause mode keep, cache not cleared) sampled their later tokens with "
           "the new weights on KV the old weights computed. A warning when measured or not separable from another "
           "cause; information when small or the trace is unscored.", FIX_CARRIED, "inflight", rule=LOCALIZED,
           thresholds=("stale_ratio", "tol_trainer"), calibrated_on="CPU float32; tol_trainer " + NOT_RECORDED,
           causes=("kv_carried_over",)),
    code("scored_at_one_version", PATH, (W,),
           "The tokens come from several policy versions but the trainer scored them all with one set of weights: d "
           "mixes policy lag with the backend mismatch.", FIX_VERSIONS, "inflight",
           rule="two or more versions and the trainer did not score by policy_version", causes=("mixed_versions",)),
    code("policy_lag", PATH, (I,),
           "The policy lag of the tokens (share sampled by weights older than the latest, mean and max lag per token "
           "and per sequence), as PipelineRL logs it.", FIX_NONE, "inflight",
           rule="reported when the trace records updates or holds several versions"),
    code("inflight_stale_arms", PATH, (I,),
           "Over an inflight matrix: the arms with stale prefix-cache hits, and each one's mean |d| after the update "
           "against the same arm with the cache reset (each stale arm has its own finding).", FIX_STALE,
           "inflight", across_arms=True),
)

TOPIC = Topic('inflight', 50, CODES, trace_findings, arms_findings)

__all__ = ["FIX_CARRIED", "FIX_STALE", "FIX_VERSIONS", "arms_findings", "kv_carried_over", "matrix_findings",
           "policy_lag", "scored_at_one_version", "stale_prefix_cache", "trace_findings"]
