"""The other peers' dashboards, each with its own formulas: PipelineRL and prime-rl (whose trainer
side is the current weights: they never recompute pi_old), slime, TRL and NeMo-RL (the trainer
recomputed at the rollout's weights). verl's is :mod:`~rlparity.metrics.dashboard.verl`."""

from __future__ import annotations

import math

import numpy as np

from rlparity.metrics.objective import OBJECTIVE_DEFAULTS
from rlparity.metrics.dashboard.formulas import _as, _computed, _masked_max, _masked_min, _masked_std, _prep


def _per_seq_mean_then_batch(x, m):
    """PipelineRL / slime aggregation: sum_t x / L_i summed over sequences, divided by the
    number of sequences (a sequence without tokens contributes 0)."""
    mf = m.astype(float)
    return ((x * mf).sum(axis=-1) / np.maximum(mf.sum(axis=-1), 1)).sum() / m.shape[0]


@_computed
def pipelinerl_metrics(log_new, log_old, mask, *, policy_loss: str = "ppo", epsilon_low: float | None = None,
                       epsilon_high: float | None = None) -> dict[str, float]:
    """PipelineRL's ``rl/*`` statistics of ``rl_step`` (ServiceNow/PipelineRL
    ``pipelinerl/finetune/rl/__init__.py`` at 005a1f17; ``aggregate_rl_stats`` divides by the
    samples per step; ``rl/ess`` is computed in the finetune loop).

    Pair: ``new_logprobs`` = the trainer's current weights, ``old_logprobs`` = the logprobs the
    inference server returned (mu): PipelineRL does not recompute pi_old. ``d = new - old``.

    * ``kl_new_old`` = mean over sequences of the per-sequence token mean of ``exp(d) - d - 1``;
    * ``ratio_new_old`` = the same aggregation of ``exp(d)``; ``ratio_new_old_sum``,
      ``ratio_new_old_squared_sum`` and ``num_output_tokens_sum`` are token sums;
    * ``ess`` = ``ratio_sum^2 / ratio_squared_sum / num_tokens`` (token level, raw ratios);
    * ``clamp_log_ratio_new_old_indicator``: ``policy_loss="ppo"``: tokens whose ratio is clamped
      to ``[1 - epsilon_low, 1 + epsilon_high]`` (default 0.2 / 0.2); ``"gspo"``: sequences whose
      geometric ratio ``exp(sum d / L)`` is clamped (default eps the GSPO paper's), same aggregation.

    Whole-batch statistics (``dim=`` makes no sense here); the arrays may be dask arrays.

    Parameters
    ----------
    log_new : numpy.ndarray or dask.array.Array
        The trainer side's log-probabilities, ``(sequence, position)``.
    log_old : numpy.ndarray or dask.array.Array
        The rollout's (mu) log-probabilities, same shape.
    mask : numpy.ndarray or dask.array.Array
        Boolean, real tokens.
    policy_loss : {"ppo", "gspo"}
        Which clip the indicator counts.
    epsilon_low : float, optional
        Lower clip (default 0.2, or GSPO's).
    epsilon_high : float, optional
        Upper clip (default 0.2, or GSPO's).

    Returns
    -------
    dict
        ``{peer metric name: float}``.
    """
    ln, lo, m = _prep(log_new, log_old, mask)
    mf = m.astype(float)
    d = ln - lo
    r = np.exp(d)
    level = "token" if policy_loss == "ppo" else "sequence"
    if policy_loss not in ("ppo", "gspo"):
        raise ValueError(f"policy_loss={policy_loss!r}; use 'ppo' or 'gspo' (PipelineRL's clipped losses)")
    el, eh = OBJECTIVE_DEFAULTS.eps(level)
    el = el if epsilon_low is None else epsilon_low
    eh = eh if epsilon_high is None else epsilon_high
    if policy_loss == "ppo":
        ind = (np.clip(r, 1 - el, 1 + eh) != r).astype(float)
    else:
        n = mf.sum(axis=-1)
        g = np.exp((d * mf).sum(axis=-1) / np.maximum(n, 1e-6))
        ind = ((np.clip(g, 1 - el, 1 + eh) != g) & (n > 0)).astype(float)[:, None]
    rs, r2s, nt = (r * mf).sum(), (r * r * mf).sum(), mf.sum()
    return {
        "rl/kl_new_old": _per_seq_mean_then_batch(r - d - 1.0, m),
        "rl/ratio_new_old": _per_seq_mean_then_batch(r, m),
        "rl/ratio_new_old_sum": rs,
        "rl/ratio_new_old_squared_sum": r2s,
        "rl/num_output_tokens_sum": nt,
        "rl/clamp_log_ratio_new_old_indicator": _per_seq_mean_then_batch(ind, m),
        "rl/ess": rs ** 2 / r2s / nt,
    }


@_computed
def prime_rl_metrics(log_trainer, log_inference, mask, *, advantages=None, dppo_mask_low: float = 0.2,
                     dppo_mask_high: float = 0.2) -> dict[str, float]:
    """prime-rl's mismatch statistics (PrimeIntellect-ai/prime-rl
    ``src/prime_rl/trainer/rl/loss.py`` and ``train.py`` at 559b4477).

    Pair: ``trainer_logprobs`` = the trainer's current weights, ``inference_logprobs`` = mu
    (prime-rl does not recompute pi_old).

    * ``mismatch_kl/all/{mean,std,max}``: over all loss-mask tokens of
      ``exp(d) - d - 1``, ``d = trainer - inference`` (std with n - 1);
    * ``is_masked/{mean,max}``, ``is_masked_low/mean``, ``is_masked_high/mean``: the default
      (DPPO) loss masks a token when ``p_trainer - p_inference > dppo_mask_high`` and its
      advantage is positive, or ``< -dppo_mask_low`` and its advantage is not positive
      (prime-rl's ``torch.where(A > 0, high, low)``); per sequence the token share, then mean / max
      over sequences. Needs per-sequence ``advantages`` (omitted without them).

    Whole-batch statistics (``dim=`` makes no sense here); the arrays may be dask arrays.

    Parameters
    ----------
    log_trainer : numpy.ndarray or dask.array.Array
        The trainer side's log-probabilities, ``(sequence, position)``.
    log_inference : numpy.ndarray or dask.array.Array
        The rollout's (mu) log-probabilities, same shape.
    mask : numpy.ndarray or dask.array.Array
        Boolean, real tokens.
    advantages : numpy.ndarray, optional
        One advantage per sequence (the ``is_masked`` metrics need them).
    dppo_mask_low : float
        DPPO's lower probability-difference bound.
    dppo_mask_high : float
        DPPO's upper bound.

    Returns
    -------
    dict
        ``{peer metric name: float}``.
    """
    lt, li, m = _prep(log_trainer, log_inference, mask)
    mf = m.astype(float)
    n = mf.sum()
    d = lt - li
    k = np.exp(d) - d - 1.0
    out = {"mismatch_kl/all/mean": (k * mf).sum() / np.maximum(n, 1), "mismatch_kl/all/std": _masked_std(k, mf, n),
           "mismatch_kl/all/max": _masked_max(k, m)}
    if advantages is not None:
        a = _as(advantages, float)[:, None]
        pdiff = np.exp(lt) - np.exp(li)
        high, low = pdiff > dppo_mask_high, pdiff < -dppo_mask_low
        masked = np.where(a > 0, high, low)

        def per_seq(x):
            return (x * mf).sum(axis=-1) / np.maximum(mf.sum(axis=-1), 1)

        im = per_seq(masked)
        out.update({"is_masked/mean": im.mean(), "is_masked/max": im.max(),
                    "is_masked_low/mean": per_seq((a < 0) & low).mean(),
                    "is_masked_high/mean": per_seq((a > 0) & high).mean()})
    return out


@_computed
def slime_metrics(log_train, log_rollout, mask) -> dict[str, float]:
    """slime's ``train/train_rollout_logprob_abs_diff`` (THUDM/slime
    ``slime/backends/megatron_utils/loss.py`` at 624b824a): ``sum_of_sample_mean(|old_log_probs -
    rollout_log_probs|)`` reported over the step's samples, i.e. the mean over sequences of the
    per-sequence token mean of ``|log pi_old - log mu|`` (default per-sample loss; pair: backend,
    ``old_log_probs`` recomputed by the trainer). Its CI gate: <= 0.1. A whole-batch statistic
    (``dim=`` makes no sense here); the arrays may be dask arrays.

    Parameters
    ----------
    log_train : numpy.ndarray or dask.array.Array
        The trainer side's log-probabilities, ``(sequence, position)``.
    log_rollout : numpy.ndarray or dask.array.Array
        The rollout's (mu) log-probabilities, same shape.
    mask : numpy.ndarray or dask.array.Array
        Boolean, real tokens.

    Returns
    -------
    dict
        ``{peer metric name: float}``.
    """
    lt, lr, m = _prep(log_train, log_rollout, mask)
    return {"train/train_rollout_logprob_abs_diff": _per_seq_mean_then_batch(np.abs(lt - lr), m)}


TRL_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@_computed
def trl_metrics(log_old, log_sampling, mask, *, vllm_importance_sampling_mode: str = "sequence_mask",
                vllm_importance_sampling_clip_min: float | None = None,
                vllm_importance_sampling_clip_max: float | None = 3.0) -> dict[str, float]:
    """TRL GRPOTrainer's ``sampling/*`` metrics with ``vllm_importance_sampling_correction``
    (huggingface/trl ``trl/trainer/grpo_trainer.py`` at f2cd5771; defaults of ``GRPOConfig``: mode
    ``sequence_mask``, clip max 3.0, no clip min).

    Pair: ``old_per_token_logps`` (the trainer at the generation weights, pi_old) against
    ``sampling_per_token_logps`` (vLLM, mu).

    * ``sampling/sampling_logp_difference/{mean,max}`` of ``|log pi_old - log mu|`` over tokens;
    * ``sampling/importance_sampling_ratio/{min,mean,max}``: ``exp(d)`` per token (``token_*``) or
      ``exp(sum_t d)`` per sequence (``sequence_*``), then ``*_truncate`` clamps to
      ``[clip_min, clip_max]`` and ``*_mask`` sets ratios outside it to 0; statistics over the
      masked tokens (token modes) or over sequences (sequence modes), after that processing.

    Whole-batch statistics (``dim=`` makes no sense here); the arrays may be dask arrays.

    Parameters
    ----------
    log_old : numpy.ndarray or dask.array.Array
        The trainer side's log-probabilities, ``(sequence, position)``.
    log_sampling : numpy.ndarray or dask.array.Array
        The rollout's (mu) log-probabilities, same shape.
    mask : numpy.ndarray or dask.array.Array
        Boolean, real tokens.
    vllm_importance_sampling_mode : str
        One of :data:`TRL_MODES`.
    vllm_importance_sampling_clip_min : float, optional
        The lower clip (None: none).
    vllm_importance_sampling_clip_max : float, optional
        The upper clip.

    Returns
    -------
    dict
        ``{peer metric name: float}``.
    """
    lo, ls, m = _prep(log_old, log_sampling, mask)
    if vllm_importance_sampling_mode not in TRL_MODES:
        raise ValueError(f"vllm_importance_sampling_mode={vllm_importance_sampling_mode!r}; use one of {TRL_MODES}")
    mf = m.astype(float)
    n = np.maximum(mf.sum(), 1)
    delta = np.abs(lo - ls)
    diff = (lo - ls) * m
    seq = vllm_importance_sampling_mode.startswith("sequence")
    r = np.exp(diff.sum(axis=-1) if seq else diff)
    cmin, cmax = vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max
    if vllm_importance_sampling_mode.endswith("truncate"):
        r = np.clip(r, -np.inf if cmin is None else cmin, np.inf if cmax is None else cmax)
    else:
        lo_v = -math.inf if cmin is None else cmin
        hi_v = math.inf if cmax is None else cmax
        r = np.where((r < lo_v) | (r > hi_v), 0.0, r)
    if seq:
        rmin, rmean, rmax = r.min(), r.mean(), r.max()
    else:
        rmin, rmean, rmax = _masked_min(r, m), (r * mf).sum() / n, _masked_max(r, m)
    return {"sampling/sampling_logp_difference/mean": (delta * mf).sum() / n,
            "sampling/sampling_logp_difference/max": _masked_max(delta, m),
            "sampling/importance_sampling_ratio/min": rmin,
            "sampling/importance_sampling_ratio/mean": rmean,
            "sampling/importance_sampling_ratio/max": rmax}


@_computed
def nemo_rl_metrics(log_prev, log_generation, mask, *, kl_type: str = "k3") -> dict[str, float]:
    """NeMo-RL's generation-mismatch metrics of ``ClippedPGLossFn`` (NVIDIA-NeMo/RL
    ``nemo_rl/algorithms/loss/loss_functions.py`` at 7ea279ab), token means over the batch.

    Pair: ``prev_logprobs`` (the trainer at the generation weights, pi_old) against
    ``generation_logprobs`` (mu).

    * ``token_mult_prob_error`` = token mean of ``exp(|log mu - log pi_old|)`` (1 = parity; NeMo-RL
      plots samples above 1.05);
    * ``gen_kl_error`` = token mean of ``calculate_kl(logprobs=mu, logprobs_reference=pi_old)``
      without clamps: ``logr = log pi_old - log mu``, k3 = ``exp(logr) - 1 - logr`` (the default
      ``reference_policy_kl_type``; k1 = ``-logr``, k2 = ``logr^2 / 2``), KL(P_gen || P_train).

    Whole-batch statistics (``dim=`` makes no sense here); the arrays may be dask arrays.

    Parameters
    ----------
    log_prev : numpy.ndarray or dask.array.Array
        The trainer side's log-probabilities, ``(sequence, position)``.
    log_generation : numpy.ndarray or dask.array.Array
        The rollout's (mu) log-probabilities, same shape.
    mask : numpy.ndarray or dask.array.Array
        Boolean, real tokens.
    kl_type : {"k1", "k2", "k3"}
        NeMo-RL's ``reference_policy_kl_type``.

    Returns
    -------
    dict
        ``{peer metric name: float}``.
    """
    lp, lg, m = _prep(log_prev, log_generation, mask)
    if kl_type not in ("k1", "k2", "k3"):
        raise ValueError(f"kl_type={kl_type!r}; use 'k1', 'k2' or 'k3'")
    mf = m.astype(float)
    n = np.maximum(mf.sum(), 1)
    logr = lp - lg
    kl = {"k1": lambda: -logr, "k2": lambda: logr ** 2 / 2, "k3": lambda: np.exp(logr) - 1 - logr}[kl_type]()
    return {"token_mult_prob_error": (np.exp(np.abs(logr)) * mf).sum() / n, "gen_kl_error": (kl * mf).sum() / n}


__all__ = ["nemo_rl_metrics", "pipelinerl_metrics", "prime_rl_metrics", "slime_metrics", "trl_metrics"]
