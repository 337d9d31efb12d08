"""Objective layer: are the importance weights, masks and clips of the RL objective healthy, and
does a correction hide a broken backend?

Checks, each returning a list of :class:`~rlparity.diagnose.findings.Finding` (empty when there
is nothing to say), every finding naming its pair and direction:

* :func:`ess_collapse`: normalised ESS of the raw (untruncated) token / sequence weights;
* :func:`masked_fraction_high`: the share of the batch a rejection rule drops;
* :func:`update_ratio_clipped_often`: PPO token and GSPO sequence clip fractions of the update
  pair (pi_theta, pi_old);
* :func:`backend_ratio_not_centred`: the mean backend ratio pi_old/mu, which is 1 in expectation
  under mu when both are distributions over the same tokens;
* :func:`correction_hides_backend_mismatch`: a correction is configured, or the corrected weights
  pass the peers' health rules, while the semantic or inference-path layer reports an error.

Thresholds default to :data:`rlparity.metrics.objective.OBJECTIVE_DEFAULTS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.options import DiagnoseOptions
from rlparity.metrics import objective as ob
from rlparity.metrics.dashboard.verl import verl_metrics
from rlparity.diagnose.topic import E, FindingCode, LITERATURE, OBJ, Topic, W, code
from rlparity.trace import arm_record

FIX_BACKEND_FIRST = ("fix the backend first (the semantic / inference-path errors: e.g. processed logprobs, "
                     "matched precision), re-capture, and only then tune the objective's corrections")
FIX_UPDATE = ("take a smaller step: lower the learning rate, fewer optimizer steps per batch, or less policy "
              "lag; for GSPO check eps (3e-4 / 4e-4 in the paper)")
# verl's docs' health rules for its rollout_corr metrics (what a user's dashboard calls healthy)
VERL_HEALTHY = {"rollout_is_mean": (0.5, 2.0), "rollout_is_eff_sample_size_min": 0.3, "rollout_is_std_max": 1.0,
                "chi2_token_max": 1.0}


def _pairs(trace, pairs, trainer) -> list[str]:
    have = ob.available_pairs(trace, trainer)
    return [p for p in (pairs or ("backend", "update")) if p in have]


def _ev(trace, pair, trainer) -> dict[str, Any]:
    a = ob.pair_direction(pair, trainer)
    return {"pair": a["pair"], "direction": a["direction"]}


def ess_collapse(trace: xr.Dataset, *, pairs: Iterable[str] | None = None, trainer: TrainerSide | None = None,
                 ess_min: float | None = None, ess_collapse: float | None = None) -> list[Finding]:
    """Normalised ESS ``(sum w)^2 / (n sum w^2)`` of the raw (untruncated) weights of each pair.

    Token level and sequence level (product and geometric); the worst of the three is judged.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    pairs : iterable of str, optional
        The pairs to judge (``"backend"``, ``"update"``); None: both, where present.
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: the default.
    ess_min : float, optional
        An ESS below it warns; None: ``OBJECTIVE_DEFAULTS.ess_min``.
    ess_collapse : float, optional
        An ESS below it is an error; None: ``OBJECTIVE_DEFAULTS.ess_collapse``.

    Returns
    -------
    list of Finding
        One ``ess_collapse`` finding per pair below ``ess_min``; empty when every ESS is fine.
    """
    o = ob.OBJECTIVE_DEFAULTS
    lo_warn = o.ess_min if ess_min is None else ess_min
    lo_err = o.ess_collapse if ess_collapse is None else ess_collapse
    out = []
    for p in _pairs(trace, pairs, trainer):
        vals = {"token": ob.effective_sample_size(trace, p, trainer=trainer),
                "sequence_product": ob.effective_sample_size(trace, p, level="sequence", kind="product", trainer=trainer),
                "sequence_geometric": ob.effective_sample_size(trace, p, level="sequence", kind="geometric",
                                                               trainer=trainer)}
        ess = {k: float(v) for k, v in vals.items()}
        worst = min(ess, key=lambda k: ess[k] if np.isfinite(ess[k]) else np.inf)
        if not np.isfinite(ess[worst]) or ess[worst] >= lo_warn:
            continue
        sev = Severity.ERROR if ess[worst] < lo_err else Severity.WARNING
        ev = {**_ev(trace, p, trainer), **{f"ess_{k}": v for k, v in ess.items()},
              "n_tokens": int(vals["token"].n_used), "n_excluded_tokens": int(vals["token"].n_excluded),
              "n_sequences": int(vals["sequence_product"].n_used),
              "n_excluded_sequences": int(vals["sequence_product"].n_excluded),
              "ess_min": lo_warn, "ess_collapse": lo_err, "weights": "raw (untruncated)"}
        fix = (FIX_BACKEND_FIRST + "; a truncated weight would hide this collapse, not cure it") if p == "backend" \
            else FIX_UPDATE
        out.append(Finding(Layer.OBJECTIVE, "ess_collapse", sev,
                           f"the {ev['pair']} importance weights have a {worst.replace('_', ' ')} ESS of "
                           f"{ess[worst]:.3g}: the batch counts as {ess[worst]:.1%} of its size", ev, fix,
                           arm_record(trace).arm))
    return out


def masked_fraction_high(trace: xr.Dataset, *, pair: str = "backend", rules: Iterable[str] | None = None,
                         trainer: TrainerSide | None = None, thresholds: Mapping[str, Any] | None = None,
                         masked_fraction_max: float | None = None,
                         masked_fraction_error: float | None = None) -> list[Finding]:
    """The share of usable tokens each rejection rule drops on ``pair``.

    With no rule given or configured nothing is judged (what a mask *would* drop is in
    :func:`rlparity.metrics.objective.objective_summary`, not a finding: a tight geometric band
    drops most of a healthy bf16 batch).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    pair : str, default "backend"
        The pair the rules are applied to.
    rules : iterable of str, optional
        The rejection rules; None: the masks the trace's ``objective_correction`` attrs configure.
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: the default.
    thresholds : mapping, optional
        A rule's band / bound, by rule name; None: each rule's default.
    masked_fraction_max : float, optional
        A masked token share above it warns; None: ``OBJECTIVE_DEFAULTS.masked_fraction_max``.
    masked_fraction_error : float, optional
        A masked token share above it is an error; None:
        ``OBJECTIVE_DEFAULTS.masked_fraction_error``.

    Returns
    -------
    list of Finding
        One ``masked_fraction_high`` finding per rule above ``masked_fraction_max``; empty without
        the pair or a rule.
    """
    o = ob.OBJECTIVE_DEFAULTS
    hi_warn = o.masked_fraction_max if masked_fraction_max is None else masked_fraction_max
    hi_err = o.masked_fraction_error if masked_fraction_error is None else masked_fraction_error
    if pair not in ob.available_pairs(trace, trainer):
        return []
    configured = (arm_record(trace).objective_correction or {}).get("masks")
    rules = list(rules or configured or [])
    verb = "drops" if (configured and set(rules) <= set(configured)) else "would drop"
    out = []
    for rule in rules:
        thr = (thresholds or {}).get(rule)
        tok = ob.masked_fraction(trace, rule, pair, threshold=thr, trainer=trainer)
        seq = ob.masked_fraction(trace, rule, pair, level="sequence", threshold=thr, trainer=trainer)
        f = float(tok)
        if not np.isfinite(f) or f <= hi_warn:
            continue
        ev = {**_ev(trace, pair, trainer), "rule": rule, "threshold": tok.attrs["threshold"],
              "masked_token_fraction": f, "masked_sequence_fraction": float(seq),
              "n_tokens": int(tok.n_used), "n_excluded_tokens": int(tok.n_excluded),
              "masked_fraction_max": hi_warn}
        sev = Severity.ERROR if f > hi_err else Severity.WARNING
        fix = (FIX_BACKEND_FIRST + "; masking this much trains on a different, smaller batch" if pair == "backend"
               else "widen the band or take a smaller step; " + FIX_UPDATE)
        out.append(Finding(Layer.OBJECTIVE, "masked_fraction_high", sev,
                           f"{rule} {verb} {f:.1%} of the tokens ({float(seq):.1%} of the sequences) on the "
                           f"{ev['pair']}", ev, fix, arm_record(trace).arm))
    return out


def update_ratio_clipped_often(trace: xr.Dataset, *, trainer: TrainerSide | None = None, eps: float | None = None,
                               gspo_eps: tuple[float, float] | None = None, clip_fraction_max: float | None = None,
                               sequence_clip_fraction_max: float | None = None) -> list[Finding]:
    """PPO token clip fraction and GSPO sequence clip fraction of the update pair (pi_theta, pi_old).

    Each warns above its threshold. When the trace records the step that made pi_theta
    (``attrs["train_step"]``, written by :func:`rlparity.train.train_step`), only its own loss's
    rule is judged, at the step's own clip (a PPO step is not held to GSPO's 3e-4 band, nor a GSPO
    step to PPO's token clip).

    Parameters
    ----------
    trace : xarray.Dataset
        An arm with pi_theta.
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: the default.
    eps : float, optional
        PPO token clip; None: the step's recorded clip, else ``OBJECTIVE_DEFAULTS.ppo_eps`` (0.2).
        An explicit value wins over the recorded one.
    gspo_eps : tuple of (float, float), optional
        GSPO's ``(eps_low, eps_high)``; None: the step's recorded clip, else the defaults (3e-4 /
        4e-4).
    clip_fraction_max : float, optional
        Token clip fraction above which it warns; None: ``OBJECTIVE_DEFAULTS.clip_fraction_max``.
    sequence_clip_fraction_max : float, optional
        Sequence clip fraction above which it warns; None:
        ``OBJECTIVE_DEFAULTS.sequence_clip_fraction_max``.

    Returns
    -------
    list of Finding
        Up to two ``update_ratio_clipped_often`` warnings; nothing without pi_theta in the trace.
    """
    o = ob.OBJECTIVE_DEFAULTS
    if "update" not in ob.available_pairs(trace, trainer):
        return []
    step = arm_record(trace).train_step or {}
    loss = str(step.get("loss") or "").lower()
    recorded = (step.get("eps_low"), step.get("eps_high"))
    has_clip = None not in recorded
    judge_token, judge_sequence = loss in ("", "ppo", "grpo"), loss in ("", "gspo")
    e = eps if eps is not None else (max(map(float, recorded)) if has_clip and loss in ("ppo", "grpo") else o.ppo_eps)
    gl, gh = gspo_eps if gspo_eps is not None else (
        tuple(map(float, recorded)) if has_clip and loss == "gspo" else (o.gspo_eps_low, o.gspo_eps_high))
    tmax = o.clip_fraction_max if clip_fraction_max is None else clip_fraction_max
    smax = o.sequence_clip_fraction_max if sequence_clip_fraction_max is None else sequence_clip_fraction_max
    tok = ob.clip_fraction(trace, "update", eps_low=e, eps_high=e, trainer=trainer)
    seq = ob.clip_fraction(trace, "update", level="sequence", eps_low=gl, eps_high=gh, trainer=trainer)
    out = []
    base = {**_ev(trace, "update", trainer), "ppo_token_clip_fraction": float(tok), "ppo_eps": e,
            "gspo_sequence_clip_fraction": float(seq), "gspo_eps": (gl, gh),
            "n_tokens": int(tok.n_used), "n_excluded_tokens": int(tok.n_excluded), "n_sequences": int(seq.n_used)}
    if loss:
        base["loss"] = loss
    if judge_token and float(tok) > tmax:
        out.append(Finding(Layer.OBJECTIVE, "update_ratio_clipped_often", Severity.WARNING,
                           f"{float(tok):.1%} of the tokens have pi_theta/pi_old outside [1-{e:g}, 1+{e:g}]: "
                           "the step leaves PPO's trust region", {**base, "threshold": tmax}, FIX_UPDATE,
                           arm_record(trace).arm))
    if judge_sequence and float(seq) > smax:
        out.append(Finding(Layer.OBJECTIVE, "update_ratio_clipped_often", Severity.WARNING,
                           f"{float(seq):.1%} of the sequences have a geometric pi_theta/pi_old outside "
                           f"[1-{gl:g}, 1+{gh:g}] (GSPO clip)", {**base, "threshold": smax, "level": "sequence"},
                           FIX_UPDATE, arm_record(trace).arm))
    return out


def backend_ratio_not_centred(trace: xr.Dataset, *, trainer: TrainerSide | None = None, backend_ratio_tol: float | None = None,
                              backend_ratio_z: float | None = None) -> list[Finding]:
    """Whether the mean backend ratio ``pi_old/mu`` over usable tokens is 1.

    Under mu, ``E[pi_old/mu] = 1`` when both are distributions over the same tokens, so a mean
    further than ``backend_ratio_tol`` from 1 and more than ``backend_ratio_z`` standard errors away
    means the weights of every correction are biased.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: the default.
    backend_ratio_tol : float, optional
        Tolerance on ``|mean - 1|``; None: ``OBJECTIVE_DEFAULTS.backend_ratio_tol``.
    backend_ratio_z : float, optional
        Standard errors the offset must also exceed; None: ``OBJECTIVE_DEFAULTS.backend_ratio_z``.

    Returns
    -------
    list of Finding
        A ``backend_ratio_not_centred`` warning (an error beyond 5 x the tolerance); empty when the
        mean is centred, or with fewer than 2 usable tokens.
    """
    o = ob.OBJECTIVE_DEFAULTS
    tol = o.backend_ratio_tol if backend_ratio_tol is None else backend_ratio_tol
    zmin = o.backend_ratio_z if backend_ratio_z is None else backend_ratio_z
    if "backend" not in ob.available_pairs(trace, trainer):
        return []
    d = ob.pair_log_ratio(trace, "backend", trainer).values
    u = ob.finite_tokens(d)
    n_used, n_excl = ob.token_counts(d)
    if u.sum() < 2:
        return []
    r = np.exp(d[u])
    mean, se = float(r.mean()), float(r.std(ddof=1) / np.sqrt(r.size))
    z = abs(mean - 1) / se if se > 0 else np.inf
    if abs(mean - 1) <= tol or z <= zmin:
        return []
    ev = {**_ev(trace, "backend", trainer), "mean_ratio": mean, "standard_error": se, "z": float(z),
          "mean_log_ratio": float(d[u].mean()), "tolerance": tol, "n_tokens": int(n_used),
          "n_excluded_tokens": int(n_excl)}
    sev = Severity.ERROR if abs(mean - 1) > 5 * tol else Severity.WARNING
    return [Finding(Layer.OBJECTIVE, "backend_ratio_not_centred", sev,
                    f"the backend ratio pi_old/mu averages {mean:.4f}, not 1 ({z:.0f} standard errors): every "
                    "correction weight built on it is biased", ev, FIX_BACKEND_FIRST, arm_record(trace).arm)]


def corrected_health(trace: xr.Dataset, *, trainer: TrainerSide | None = None, cap: float | None = None,
                     rollout_is: str = "token") -> dict[str, Any]:
    """The backend pair's corrected weights as a verl user sees them, and whether they look healthy.

    verl's ``rollout_corr/*`` metrics with the correction at ``cap``, judged by verl's docs' health
    rules (mean in [0.5, 2], ESS >= 0.3, std <= 1, chi2_token <= 1; :data:`VERL_HEALTHY`).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: the default.
    cap : float, optional
        The truncation cap C; None: ``OBJECTIVE_DEFAULTS.is_cap`` (verl's 2.0).
    rollout_is : str, default "token"
        The importance-sampling level, as verl names it.

    Returns
    -------
    dict
        ``rollout_is_mean``, ``rollout_is_eff_sample_size``, ``rollout_is_std``, ``chi2_token`` and
        ``looks_healthy`` (bool).
    """
    mask = trace["response_mask"].values.astype(bool)
    m = verl_metrics(ob.policy_logprob(trace, "old", trainer), ob.policy_logprob(trace, "mu", trainer), mask,
                     rollout_is=rollout_is, rollout_is_threshold=cap, rollout_rs={})
    vals = {k.split("/", 1)[1]: m[k] for k in ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_eff_sample_size",
                                               "rollout_corr/rollout_is_std", "rollout_corr/chi2_token")}
    lo, hi = VERL_HEALTHY["rollout_is_mean"]
    healthy = (lo <= vals["rollout_is_mean"] <= hi and vals["rollout_is_eff_sample_size"] >= VERL_HEALTHY[
        "rollout_is_eff_sample_size_min"] and vals["rollout_is_std"] <= VERL_HEALTHY["rollout_is_std_max"]
        and vals["chi2_token"] <= VERL_HEALTHY["chi2_token_max"])
    return {**vals, "looks_healthy": bool(healthy)}


def _correction_names(correction: Any) -> list[str]:
    """``"token_tis, geometric_band"`` / a list / a mapping -> the names it configures."""
    if not correction:
        return []
    if isinstance(correction, str):
        return [c.strip() for c in correction.replace(";", ",").split(",") if c.strip()]
    if isinstance(correction, Mapping):
        return [str(k) for k, v in correction.items() if v]
    return [str(c) for c in correction]


def _configured(trace: xr.Dataset, correction) -> Any:
    if correction:
        return correction
    rec = arm_record(trace)
    if rec.objective_correction:
        return rec.objective_correction
    step = rec.train_step or {}
    used = {k: v for k, v in (step.get("corrections") or {}).items() if v}
    return used or None


def correction_hides_backend_mismatch(trace: xr.Dataset, findings: Iterable[Finding] = (), *,
                                      correction: Any = None, trainer: TrainerSide | None = None,
                                      cap: float | None = None) -> list[Finding]:
    """An error when a correction hides a broken backend.

    Fires when a correction is configured (``correction``, or the trace's
    ``objective_correction`` / ``train_step`` attrs) or the corrected backend weights look healthy
    by verl's rules, while ``findings`` hold a semantic or inference-path error: the correction then
    compensates a broken backend, its statistics read as healthy, and the update differs from a
    parity update. Fix the backend first.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    findings : iterable of Finding, default ()
        The other layers' findings for this trace.
    correction : str, list or mapping, optional
        The corrections the run applies; None: what the trace's attrs record.
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: the default.
    cap : float, optional
        Cap C of the token TIS checked when none is configured; None:
        ``OBJECTIVE_DEFAULTS.is_cap``.

    Returns
    -------
    list of Finding
        The error, or empty.
    """
    errors = [f for f in findings if f.severity == Severity.ERROR
              and f.layer in (Layer.SEMANTIC, Layer.INFERENCE_PATH)]
    if not errors or "backend" not in ob.available_pairs(trace, trainer):
        return []
    configured = _configured(trace, correction)
    health = corrected_health(trace, trainer=trainer, cap=cap)
    if not configured and not health["looks_healthy"]:
        return []
    c = ob.OBJECTIVE_DEFAULTS.is_cap if cap is None else cap
    why = ("a correction is configured" if configured else
           f"token TIS at C={c:g} makes the backend weights pass the usual health rules")
    ev = {**_ev(trace, "backend", trainer), "backend_errors": [f"{f.layer.value}/{f.name}" for f in errors],
          "correction": configured if configured else f"none configured; checked token TIS C={c:g}",
          **{f"corrected_{k}": v for k, v in health.items()}}
    return [Finding(Layer.OBJECTIVE, "correction_hides_backend_mismatch", Severity.ERROR,
                    f"{why} while the backend is broken ({', '.join(ev['backend_errors'])}): the correction "
                    "compensates the bug, its metrics look healthy, and the update is not the parity update",
                    ev, FIX_BACKEND_FIRST + "; remove the correction until the backend pair is in parity",
                    arm_record(trace).arm)]


def objective_findings(trace: xr.Dataset, findings: Iterable[Finding] = (), *, trainer: TrainerSide | None = None,
                       correction: Any = None, **thresholds: Any) -> list[Finding]:
    """Every objective check on one trace.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    findings : iterable of Finding, default ()
        The other layers' findings for it (for :func:`correction_hides_backend_mismatch`).
    trainer : {"processed", "raw"}, optional
        The trainer reading; None: the default.
    correction : str, list or mapping, optional
        The corrections the run applies; its mask rules are the ones judged by
        :func:`masked_fraction_high`.
    **thresholds
        Passed to the checks that name them: ``ess_min``, ``ess_collapse``,
        ``masked_fraction_max``, ``masked_fraction_error``, ``clip_fraction_max``,
        ``sequence_clip_fraction_max``, ``backend_ratio_tol``, ``backend_ratio_z``, ``eps``,
        ``gspo_eps``, ``cap``.

    Returns
    -------
    list of Finding
        The objective findings; empty when the trace holds no pair.

    Raises
    ------
    ValueError
        If a threshold name is unknown.
    """
    known = {"ess_min", "ess_collapse", "masked_fraction_max", "masked_fraction_error", "clip_fraction_max",
             "sequence_clip_fraction_max", "backend_ratio_tol", "backend_ratio_z", "eps", "gspo_eps", "cap"}
    bad = sorted(set(thresholds) - known)
    if bad:
        raise ValueError(f"unknown objective option(s) {bad}; known: {sorted(known)}")
    if not ob.available_pairs(trace, trainer):
        return []
    t = thresholds
    pick = lambda *names: {k: t[k] for k in names if k in t}  # noqa: E731
    out = backend_ratio_not_centred(trace, trainer=trainer, **pick("backend_ratio_tol", "backend_ratio_z"))
    out += ess_collapse(trace, trainer=trainer, **pick("ess_min", "ess_collapse"))
    masks = [r for r in _correction_names(correction) if r in ob.RULES]
    if masks:
        out += masked_fraction_high(trace, trainer=trainer, rules=masks,
                                    **pick("masked_fraction_max", "masked_fraction_error"))
    else:
        out += masked_fraction_high(trace, trainer=trainer, **pick("masked_fraction_max", "masked_fraction_error"))
    out += update_ratio_clipped_often(trace, trainer=trainer, **pick("eps", "gspo_eps", "clip_fraction_max",
                                                                    "sequence_clip_fraction_max"))
    out += correction_hides_backend_mismatch(trace, list(findings), correction=correction, trainer=trainer,
                                             **pick("cap"))
    return out


def trace_findings(trace: xr.Dataset, options: DiagnoseOptions | None = None,
                   prior: Iterable[Finding] = (), evidence=None) -> list[Finding]:
    """The objective checks of one arm, after the backend layers.

    Called by :func:`rlparity.diagnose.diagnose`. Thresholds: ``defaults().objective`` (change
    them with :func:`rlparity.config.defaults_context`).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.
    options : DiagnoseOptions, optional
        Reads ``trainer``, ``correction`` and ``eps``; None: the defaults.
    prior : iterable of Finding, default ()
        The backend layers' findings for this arm (a correction over a backend error is reported).
    evidence : ArmEvidence, optional
        The arm's evidence (unused here).

    Returns
    -------
    list of Finding
        :func:`objective_findings`' findings.
    """
    opts = options or DiagnoseOptions()
    return objective_findings(trace, prior, trainer=opts.trainer, correction=opts.correction, eps=opts.eps)


# the finding codes this topic emits (collected by rlparity.diagnose.catalogue)
CODES: tuple[FindingCode, ...] = (
    code("backend_ratio_not_centred", OBJ, (W, E),
           "The mean backend ratio pi_old/mu is not 1 (it is in expectation under mu when both are distributions over "
           "the same tokens): every correction weight built on it is biased. Its multi-step form is the live "
           "recorder's `ratio_offset` alarm (rlparity.record.live): the same mean pooled over the trailing "
           "`record.ratio_window` steps, for a run whose single steps hold too few sequences to tell.",
           FIX_BACKEND_FIRST, "objective",
           rule="|mean - 1| above `objective.backend_ratio_tol` and `objective.backend_ratio_z` standard errors; an "
                "error beyond 5x the tolerance", thresholds=("objective.backend_ratio_tol", "objective.backend_ratio_z"),
           calibrated_on="rlparity check's band (mean ratio in [0.98, 1.02]; peers' published gates)"),
    code("ess_collapse", OBJ, (W, E),
           "The normalised effective sample size of the raw (untruncated) importance weights of a pair (backend or "
           "update), token or sequence level, is low: the batch counts as a small share of its size.",
           FIX_BACKEND_FIRST + " (backend pair); " + FIX_UPDATE + " (update pair)", "objective",
           rule="ESS below `objective.ess_min` warns, below `objective.ess_collapse` is an error",
           thresholds=("objective.ess_min", "objective.ess_collapse"), calibrated_on=LITERATURE),
    code("masked_fraction_high", OBJ, (W, E),
           "A configured rejection rule drops a large share of the tokens: the update trains on a different, smaller "
           "batch.", FIX_BACKEND_FIRST + " (backend pair); widen the band or take a smaller step (update pair)",
           "objective", rule="masked share above `objective.masked_fraction_max` warns, above "
                             "`objective.masked_fraction_error` is an error",
           thresholds=("objective.masked_fraction_max", "objective.masked_fraction_error"), calibrated_on=LITERATURE),
    code("update_ratio_clipped_often", OBJ, (W,),
           "The update pair (pi_theta, pi_old) is clipped often: PPO's token clip or GSPO's sequence clip; the step "
           "leaves the trust region.", FIX_UPDATE, "objective",
           rule="token clip fraction (ratio outside [1-eps, 1+eps]) above `objective.clip_fraction_max`, or GSPO "
                "sequence clip fraction above `objective.sequence_clip_fraction_max`; when the trace records the "
                "step (`train_step`), only that loss's rule, at the step's own clip",
           thresholds=("eps", "objective.gspo_eps_low", "objective.gspo_eps_high", "objective.clip_fraction_max",
                       "objective.sequence_clip_fraction_max"), calibrated_on=LITERATURE),
    code("correction_hides_backend_mismatch", OBJ, (E,),
           "An off-policy correction is configured (or token TIS makes the backend weights pass verl's health rules) "
           "while the semantic or inference-path layer reports an error: the correction compensates the bug, its "
           "metrics look healthy, and the update is not the parity update.",
           FIX_BACKEND_FIRST + "; remove the correction until the backend pair is in parity", "objective",
           rule="a backend error plus a configured correction, or corrected weights within verl's health rules (mean in "
                "[0.5, 2], ESS >= 0.3, std <= 1, chi2_token <= 1) at the cap `objective.is_cap`",
           thresholds=("objective.is_cap", "rlparity.diagnose.objective:VERL_HEALTHY"), calibrated_on=LITERATURE),
)

TOPIC = Topic('objective', 90, CODES, trace_findings)

__all__ = ["FIX_BACKEND_FIRST", "FIX_UPDATE", "VERL_HEALTHY", "backend_ratio_not_centred",
           "correction_hides_backend_mismatch", "objective_findings",
           "corrected_health", "ess_collapse", "masked_fraction_high", "trace_findings", "update_ratio_clipped_often"]
