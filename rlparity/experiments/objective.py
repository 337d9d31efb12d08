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

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional

import numpy as np
import xarray as xr
from pydantic import BaseModel, ConfigDict, Field

from rlparity.config.defaults import TrainerSide
from rlparity.config.settings import Device
from rlparity.diagnose.findings import Finding
from rlparity.diagnose.objective import VERL_HEALTHY, correction_hides_backend_mismatch, corrected_health
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
    r"""Correct the raw trace and compare it with the parity trace on one step of ``loss``.

    The correction is token TIS at ``cap`` and the ``mask_rule`` rejection. The gradients are those
    of one step on the same samples, before any optimizer step; ``model`` is not stepped.

    Parameters
    ----------
    raw_trace : xarray.Dataset
        The capture with raw rollout logprobs (``raw_logprobs``); scored here if it has no
        trainer side.
    parity_trace : xarray.Dataset
        The capture of the same prompts and seeds in parity (``processed_logprobs``).
    model : str or transformers.PreTrainedModel
        A path or a loaded causal LM (the trainer; not stepped).
    rewards : callable or numpy.ndarray, default arithmetic_reward
        Per-sequence rewards, or a function of the trace that gives them.
    loss : str, default "ppo"
        The loss of :func:`rlparity.train.train_step`.
    trainer : TrainerSide, optional
        Which trainer reading is pi_old; ``None``: the default of the objective metrics.
    cap : float, optional
        The TIS cap C; ``None`` means ``OBJECTIVE_DEFAULTS.is_cap``.
    mask_rule : str or None, default "geometric_band"
        The rejection rule (:func:`rlparity.metrics.objective.rejection_keep`); ``None``: no mask.
    threshold : object, optional
        The rule's threshold (a band ``(lo, hi)`` or a KL bound); ``None``: the rule's default.
    findings_raw : iterable of Finding, optional
        The other layers' findings on the raw trace; ``None``: from :func:`rlparity.diagnose.diagnose`.
    findings_parity : iterable of Finding, optional
        The same for the parity trace.
    \*\*train_options
        Passed to :func:`rlparity.train.train_step` (``device``, ``dtype``...).

    Returns
    -------
    dict
        ``same_samples`` (identical token ids); ``pair``; ``correction``; ``before`` and ``after``
        (the backend pair's mean ratio, PPO clip fraction at eps, ESS: raw ratios before, truncated
        weights on the kept tokens after); ``masked_fraction`` (tokens and sequences);
        ``effective_batch`` (kept tokens and their weight-ESS, absolute and as a share of all usable
        tokens); ``cosine_raw_corrected_vs_parity`` and ``cosine_raw_uncorrected_vs_parity``
        (policy-gradient directions; the uncorrected one is 1 by construction when the ratio divides
        by the recomputed pi_old, which mu never enters; NaN when the mask rejects every token);
        ``cosine_raw_vs_parity_mu_denominator`` (the same, uncorrected, for a trainer whose ratio
        divides by mu, as PipelineRL's and prime-rl's do); ``truncated_fraction`` (usable tokens
        whose raw weight exceeds the cap) and ``truncated_fraction_at_verl_cap``;
        ``uncorrected_health``, ``corrected_health`` and ``health_rules`` (the verl view of the raw
        and of the corrected weights); ``grad_norm``; ``findings_raw`` and ``findings_parity`` (the
        ``correction_hides_backend_mismatch`` findings); ``other_errors_raw`` and
        ``other_errors_parity`` (the other layers' errors).
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
    verl_cap = o.is_cap
    wk = w[keep]
    eff = float(wk.sum() ** 2 / (wk ** 2).sum()) if wk.size and (wk ** 2).sum() > 0 else 0.0
    desc = {"tis": "token", "cap": c, "masks": [mask_rule] if mask_rule else [],
            "threshold": str(threshold if threshold is not None else (o.band(mask_rule) if mask_rule in ob.BAND_RULES
                                                                      else o.kl_thresholds.get(mask_rule)))}
    rw = rewards(raw) if callable(rewards) else np.asarray(rewards, float)
    common = dict(rewards=rw, loss=loss, trainer=trainer, step=False, return_gradient=True, **train_options)
    g_raw = train_step(model, raw, **common)
    g_par = train_step(model, par, **common)
    # a trainer that never recomputes pi_old (PipelineRL, prime-rl) divides by mu: there the raw
    # logprobs enter the uncorrected update itself
    g_raw_mu = train_step(model, raw, old_logprob=raw["rollout_logprob"].values, **common)
    g_par_mu = train_step(model, par, old_logprob=par["rollout_logprob"].values, **common)
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
        "cosine_raw_vs_parity_mu_denominator": _cos(g_raw_mu.gradient, g_par_mu.gradient),
        "truncated_fraction": float((r[usable] > c).mean()) if usable.any() else float("nan"),
        "truncated_fraction_at_verl_cap": float((r[usable] > verl_cap).mean()) if usable.any() else float("nan"),
        "uncorrected_health": corrected_health(raw, trainer=trainer, cap=float("inf")),
        "health_rules": dict(VERL_HEALTHY),
        "grad_norm": {"raw_corrected": corr_norm, "raw_uncorrected": g_raw.metrics["grad_norm"],
                      "parity": g_par.metrics["grad_norm"]},
        "corrected_health": corrected_health(raw, trainer=trainer, cap=c),
        "findings_raw": correction_hides_backend_mismatch(corrected, f_raw, trainer=trainer, cap=c),
        "findings_parity": correction_hides_backend_mismatch(par_corr, f_par, trainer=trainer, cap=c),
        "other_errors_raw": [f"{f.layer.value}/{f.name}" for f in f_raw if f.severity.value == "error"],
        "other_errors_parity": [f"{f.layer.value}/{f.name}" for f in f_par if f.severity.value == "error"],
    }


class ObjectiveSettings(BaseModel):
    """The settings of :func:`run_objective`.

    Parameters
    ----------
    n_prompts : int, default 16
        Prompts of the capture.
    n_samples : int, default 4
        Samples per prompt: the group of the advantage (at least 2).
    max_tokens : int, default 24
        Tokens per sample.
    temperature : float, default 0.7
        The sampling temperature (> 0).
    top_k : int, default 20
        The sampling top-k (0 = off).
    prompt_seed : int, default 3
        Seeds the prompts (:func:`rlparity.models.make_prompts`).
    loss : str, default "ppo"
        The loss of the step.
    lr : float, default 3e-5
        The step's learning rate.
    mask_rule : str or None, default "geometric_band"
        The correction's rejection rule; ``None``: no mask.
    threshold : tuple of (float, float) or None, default (0.9, 1.1)
        The rule's threshold.
    cap : float, optional
        The TIS cap C (> 1); ``None``: the ``truncate_share`` upper quantile of the raw weights
        (:func:`quantile_cap`), so that truncation acts on that share of tokens.
    truncate_share : float, default 0.1
        The share of tokens truncated when ``cap`` is ``None`` (0 < x < 1).
    device : str, default "cpu"
        The trainer's device.
    dtype : str, default "float32"
        The body dtype on both sides.
    engine : dict, optional
        More :class:`~rlparity.config.settings.EngineSettings` fields, such as ``gpu_memory_utilization``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_prompts: int = Field(16, ge=1)
    n_samples: int = Field(4, ge=2, description="samples per prompt: the group of the advantage")
    max_tokens: int = Field(24, ge=1)
    temperature: float = Field(0.7, gt=0.0)
    top_k: int = 20
    prompt_seed: int = 3
    loss: str = "ppo"
    lr: float = Field(3e-5, gt=0.0)
    mask_rule: Optional[str] = "geometric_band"
    threshold: Optional[tuple[float, float]] = (0.9, 1.1)
    cap: Optional[float] = Field(None, gt=1.0)
    truncate_share: float = Field(0.1, gt=0.0, lt=1.0)
    device: Device = "cpu"
    dtype: str = "float32"
    engine: dict[str, Any] = Field(default_factory=dict)


def quantile_cap(trace: xr.Dataset, share: float, trainer: TrainerSide | None = None) -> float:
    """The cap C at which token TIS truncates ``share`` of the usable tokens of a trace.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored trace.
    share : float
        The share of usable tokens to truncate.
    trainer : TrainerSide, optional
        Which trainer reading is pi_old; ``None``: the objective metrics' default.

    Returns
    -------
    float
        The ``1 - share`` quantile of the raw backend weights pi_old/mu, at least just above 1.

    Raises
    ------
    ValueError
        If no token is usable (every token masked or of probability 0).
    """
    d = ob.pair_log_ratio(trace, "backend", trainer).values
    w = np.exp(d[ob.finite_tokens(d)])
    if not w.size:
        raise ValueError("no usable token to place a cap on: every token is masked or has probability 0")
    return float(max(np.quantile(w, 1.0 - share), np.nextafter(1.0, 2.0)))


def run_objective(model: Any, settings: ObjectiveSettings | None = None, *, pool=None) -> dict[str, Any]:
    """The objective-layer experiment of chapter 5 on real vLLM.

    Two captures of the same prompts and seeds, ``parity`` (processed logprobs) and ``raw`` (vLLM's
    default raw logprobs), both with an fp32 head and the body in ``settings.dtype``; one optimizer
    step on the parity trace (pi_theta); then :func:`correction_demo` on the raw trace. The pool is
    closed at the end.

    Parameters
    ----------
    model : str
        A model path (engine and trainer).
    settings : ObjectiveSettings, optional
        ``None`` means ``ObjectiveSettings()``.
    pool : EnginePool, optional
        Where engines come from; ``None`` means the shared pool.

    Returns
    -------
    dict
        ``arms`` (``{"parity": stepped trace, "raw": raw trace}``), ``same_samples``, ``step`` (the
        step's metrics), ``cap``, ``demo``, ``tables``
        (:func:`rlparity.metrics.objective.objective_summary` per arm), ``dashboards`` (verl's
        names per arm) and ``settings``.
    """
    from rlparity.capture import EngineSettings, SamplingSettings
    from rlparity.capture.pool import shared_pool
    from rlparity.metrics import as_dashboard
    from rlparity.models import make_prompts
    from rlparity.score import Scorer

    st = settings or ObjectiveSettings()
    pool = pool or shared_pool()
    prompts = make_prompts(st.n_prompts, seed=st.prompt_seed)
    sampling = SamplingSettings(temperature=st.temperature, top_k=st.top_k, max_tokens=st.max_tokens,
                                n=st.n_samples, seed=0)
    scorer = Scorer(model, dtype=st.dtype, head_dtype="float32", device=st.device, progress=False)
    arms: dict[str, xr.Dataset] = {}
    try:
        for name, mode in (("parity", "processed_logprobs"), ("raw", "raw_logprobs")):
            eng = pool.get(model, EngineSettings(logprobs_mode=mode, head_dtype="float32", dtype=st.dtype,
                                                 enable_prefix_caching=False, generation_config="vllm",
                                                 **st.engine))
            arms[name] = scorer.score(eng.capture(prompts, sampling, arm=name, progress=False))
    finally:
        pool.close()
    same = bool((arms["parity"]["token_id"].values == arms["raw"]["token_id"].values).all())
    train = {"device": st.device, "dtype": st.dtype}
    rewards = arithmetic_reward(arms["parity"])
    step = train_step(model, arms["parity"], rewards=rewards, loss=st.loss, lr=st.lr, **train)
    cap = st.cap if st.cap is not None else quantile_cap(arms["raw"], st.truncate_share)
    demo = correction_demo(arms["raw"], arms["parity"], model, rewards=rewards, loss=st.loss, cap=cap,
                           mask_rule=st.mask_rule, threshold=st.threshold, **train)
    out = {"parity": step.trace, "raw": arms["raw"]}
    return {"arms": out, "same_samples": same, "step": step.metrics, "cap": cap, "demo": demo,
            "tables": {k: ob.objective_summary(v) for k, v in out.items()},
            "dashboards": {k: dict(as_dashboard(v, "verl")) for k, v in arms.items()},
            "settings": st.model_dump()}


def demo_table(demo: Mapping[str, Any]):
    """The demonstration's numbers as a small table, for a page.

    verl's four health metrics uncorrected and corrected with the healthy range, the shares
    truncated and masked, and the gradient cosines with the parity update.

    Parameters
    ----------
    demo : Mapping
        What :func:`correction_demo` returned.

    Returns
    -------
    pandas.DataFrame
        Index: what; columns: ``uncorrected``, ``corrected``, ``healthy`` (formatted strings).
    """
    import pandas as pd

    rules = demo.get("health_rules") or VERL_HEALTHY
    lo, hi = rules["rollout_is_mean"]
    healthy = {"rollout_is_mean": f"{lo:g} to {hi:g}",
               "rollout_is_eff_sample_size": f">= {rules['rollout_is_eff_sample_size_min']:g}",
               "rollout_is_std": f"<= {rules['rollout_is_std_max']:g}", "chi2_token": f"<= {rules['chi2_token_max']:g}"}
    rows = {f"{k} (verl)": (f"{demo['uncorrected_health'][k]:.4g}", f"{demo['corrected_health'][k]:.4g}", h)
            for k, h in healthy.items()}
    rows["passes verl's health rules"] = (str(demo["uncorrected_health"]["looks_healthy"]),
                                          str(demo["corrected_health"]["looks_healthy"]), "True")
    cap = demo["correction"]["cap"]
    rows[f"tokens truncated at C = {cap:.3g}"] = ("", f"{demo['truncated_fraction']:.1%}", "")
    rows["tokens above verl's C = 2"] = (f"{demo['truncated_fraction_at_verl_cap']:.1%}", "", "")
    rows["tokens / sequences masked"] = ("", f"{demo['masked_fraction']['tokens']:.1%} / "
                                             f"{demo['masked_fraction']['sequences']:.1%}", "")
    rows["gradient cosine with parity, ratio against pi_old"] = (f"{demo['cosine_raw_uncorrected_vs_parity']:.3f}",
                                                                 f"{demo['cosine_raw_corrected_vs_parity']:.3f}", "1")
    if "cosine_raw_vs_parity_mu_denominator" in demo:
        rows["gradient cosine with parity, ratio against mu"] = (f"{demo['cosine_raw_vs_parity_mu_denominator']:.3f}",
                                                                 "", "1")
    return pd.DataFrame.from_dict(rows, orient="index", columns=["uncorrected", "corrected", "healthy"])


__all__ = ["ObjectiveSettings", "correction_demo", "demo_table", "quantile_cap", "run_objective"]
