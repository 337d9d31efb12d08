"""Our numbers under the peers' own dashboard names, with the peers' own formulas, so a user can
put an rlparity trace next to their verl / PipelineRL / prime-rl / slime / TRL / NeMo-RL run.

Each ``<peer>_metrics`` function takes plain arrays ``(log_train, log_rollout, mask)`` (nats,
``(sequence, position)``) and reproduces one peer's code, cited in its docstring with the commit
read: which pair, which aggregation (mean over tokens, or mean over sequences of per-sequence
means), which clamps. :func:`as_dashboard` feeds them from a trace.

Which pair. Every peer here compares a trainer reading with the rollout engine's logprob mu.
verl, slime, TRL and NeMo-RL recompute the trainer at the rollout's weights (pi_old): the
backend pair (pi_old, mu). prime-rl ("trainer" vs "inference") and PipelineRL ("new" vs "old")
never recompute pi_old: their "old" / "inference" logprobs are the ones vLLM returned (mu), and
"new" / "trainer" is the trainer's current weights. On the first micro-batch of a step at lag 0
that is pi_old (the backend pair); after an optimizer step it is pi_theta (the bypass pair
(pi_theta, mu)). ``as_dashboard(policy="old" | "theta")`` picks which trainer reading stands in
for the peer's; the pair and direction are recorded on the result.

Tokens a policy gives probability 0 are removed from the mask before any peer formula runs (the
peers would turn them into infinities or clamp them silently) and counted on the result
(``n_excluded``).

A lazy trace (``open_arms(store, chunks=N)``) is streamed: every formula is written so dask can
reduce it chunk by chunk (see the note above :func:`_masked_max`), and all the metrics of a
dashboard, its counts and the gap beside the floors come from one ``dask.compute``. Its arm is
validated whole first, once, as the eager open validates it
(:func:`rlparity.trace.storage.lazy.ensure_validated`). The chunks are then read by dask straight from
zarr and checked as :func:`rlparity.trace.blocks` checks them: the same computation takes each
chunk's CRC-32 (:func:`rlparity.trace.storage.lazy.chunk_digests`), and the chunks' CRCs combined in order
must equal the store's record for every variable the dashboard read (prime-rl's ``advantage``,
read whole, against its own: :func:`rlparity.trace.storage.lazy.load_variable`), or
:class:`rlparity.trace.StoreDamagedError` is raised instead of a number.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.provenance import make_attrs
from rlparity.metrics.dims import refuse_dim
from rlparity.metrics.floors import floors_beside_gap
from rlparity.trace import arm_record, is_lazy
from rlparity.trace.storage.lazy.digests import chunk_digests, verify_chunk_digests
from rlparity.trace.storage.lazy.reading import ensure_validated, load_variable
from rlparity.metrics.objective import (
    OBJECTIVE_DEFAULTS,
    POLICY_NAMES,
    policy_logprob,
    policy_variable,
)

DASHBOARDS = ("verl", "pipelinerl", "prime-rl", "slime", "trl", "nemo-rl")

SOURCES = {
    "verl": "verl-project/verl verl/trainer/ppo/rollout_corr_helper.py @ 20c30bf8 "
            "(compute_offpolicy_metrics, compute_is_metrics, compute_rollout_rejection_mask, compute_rs_metrics); "
            "verl/utils/debug/metrics.py @ 0c2766b8 (calculate_debug_metrics)",
    "pipelinerl": "ServiceNow/PipelineRL pipelinerl/finetune/rl/__init__.py @ 005a1f17 (rl_step stats), "
                  "pipelinerl/finetune/rl/utils.py (aggregate_rl_stats), finetune_loop (rl/ess)",
    "prime-rl": "PrimeIntellect-ai/prime-rl src/prime_rl/trainer/rl/loss.py and train.py @ 559b4477 "
                "(compute_importance_ratio_and_mismatch_kl, default_loss_fn, mismatch_kl/all stats)",
    "slime": "THUDM/slime slime/backends/megatron_utils/loss.py @ 624b824a (train_rollout_logprob_abs_diff, "
             "sum_of_sample_mean in cp_utils.py)",
    "trl": "huggingface/trl trl/trainer/grpo_trainer.py @ f2cd5771 (vllm_importance_sampling_correction)",
    "nemo-rl": "NVIDIA-NeMo/RL nemo_rl/algorithms/loss/loss_functions.py @ 7ea279ab (ClippedPGLossFn), "
               "nemo_rl/algorithms/utils.py (calculate_kl)",
}

SAFETY_BOUND = 20.0  # verl's exp clamp


class DashboardMetrics(dict):
    """A flat ``{peer metric name: value}`` dict that also says what it was computed on: ``peer``,
    ``pair``, ``direction``, ``n_tokens`` used, ``n_excluded`` tokens, ``source``.

    Parameters
    ----------
    values : mapping
        ``{peer metric name: value}``.
    **info : Any
        Keyword arguments: what the numbers were computed on (``peer``, ``pair``, ...).
    """

    def __init__(self, values: Mapping[str, float], **info: Any):
        super().__init__(values)
        self.info = dict(info)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.info[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dataset(self) -> xr.Dataset:
        """The same numbers as an ``xarray.Dataset`` of scalars, provenance in attrs.

        Returns
        -------
        xarray.Dataset
            Scalars, provenance in attrs.
        """
        ds = xr.Dataset({k: ((), float(v)) for k, v in self.items()})
        ds.attrs = make_attrs(**{k: (v if isinstance(v, (str, int, float)) else str(v))
                                 for k, v in self.info.items()})
        return ds


def _as(x, dtype):
    """``x`` as ``dtype`` without reading it: a dask array stays lazy, a list becomes numpy."""
    return x.astype(dtype) if hasattr(x, "astype") and hasattr(x, "ndim") else np.asarray(x, dtype)


def _prep(log_train, log_rollout, mask):
    lt0, lr0 = _as(log_train, float), _as(log_rollout, float)
    m = _as(mask, bool) & np.isfinite(lt0) & np.isfinite(lr0)
    lt = np.where(m, lt0, 0.0)
    lr = np.where(m, lr0, 0.0)
    return lt, lr, m


# Every formula below is written so that dask can stream it over a lazy trace's chunks (and numpy
# run it unchanged on a trace in memory): no boolean indexing (masked statistics are sums over the
# mask / counts, masked extremes ``where(m, x, -inf).max()``), no Python branch on a value, no
# second pass over the tokens (spreads from sums of squares). Each peer function builds its metrics
# as 0-d arrays; :func:`_computed` evaluates them together (one ``dask.compute`` on a lazy trace).

def _masked_max(x, m):
    return np.where(m, x, -np.inf).max()


def _masked_min(x, m):
    return np.where(m, x, np.inf).min()


def _masked_std(x, mf, n):
    """The sample std (n - 1) of ``x`` over the mask from one pass of sums (NaN below 2 tokens)."""
    s, s2 = (x * mf).sum(), (x * x * mf).sum()
    return np.where(n > 1, np.sqrt(np.maximum(s2 - s * s / np.maximum(n, 1), 0.0) / np.maximum(n - 1, 1)), np.nan)


def _computed(func):
    """A peer function returning its metrics as (possibly lazy) 0-d arrays -> plain floats, all
    evaluated at once. ``_lazy=True`` returns the arrays unevaluated (for :func:`as_dashboard`,
    which adds its counts to the same computation)."""
    @functools.wraps(func)
    def wrapper(*args, _lazy: bool = False, **kwargs):
        with np.errstate(divide="ignore", invalid="ignore"):  # empty masks give NaN, as the peers' code does
            out = func(*args, **kwargs)
        return out if _lazy else _evaluate(out)
    return wrapper


def _evaluate(out: Mapping[str, Any], trace: xr.Dataset | None = None, read: tuple[str, ...] = ()) -> dict[str, float]:
    """The (possibly lazy) metrics as floats, in one ``dask.compute``; with a lazy ``trace``, the
    chunks of its variables ``read`` are CRC-checked in the same computation."""
    if any(hasattr(v, "dask") for v in out.values()):
        import dask

        digests = chunk_digests(trace, list(read)) if trace is not None and is_lazy(trace) else {}
        out, digests = dask.compute(dict(out), digests)
        if trace is not None:
            verify_chunk_digests(trace, digests)
    out = {k: float(v) for k, v in out.items()}
    if out.pop(_USABLE, 1.0) == 0:
        raise ValueError("no usable token: every real token has a probability-0 side or the mask is empty")
    return out


_USABLE = "__usable_tokens"  # the count a peer needs at least one of, checked once the values are computed
_N_TOKENS, _N_EXCLUDED, _GAP = "__n_tokens", "__n_excluded", "__gap"  # as_dashboard's own, beside the peer's


# ----------------------------------------------------------------------------------------------
# verl
# ----------------------------------------------------------------------------------------------

def _vmean(x, m, axis=None):
    """verl_F.masked_mean: sum(x * m) / (sum(m) + 1e-8)."""
    return (x * m).sum(axis=axis) / (m.sum(axis=axis) + 1e-8)


def _seq_fraction(cond, valid):
    """The share of the ``valid`` sequences meeting ``cond`` (verl: ``cond[valid].mean()``)."""
    return (cond & valid).sum() / np.maximum(valid.sum(), 1)


def _verl_is_metrics(d, m, level, cap):
    mf = m.astype(float)
    if level == "token":
        raw = np.exp(np.clip(d, -SAFETY_BOUND, SAFETY_BOUND)) * mf
    elif level == "sequence":
        s = (d * mf).sum(axis=-1, keepdims=True)
        raw = np.exp(np.clip(s, -SAFETY_BOUND, SAFETY_BOUND)) * mf
    else:
        raise ValueError(f"rollout_is={level!r}; use 'token', 'sequence' or None")
    w = np.minimum(raw, cap)
    lower = 1.0 / cap
    out: dict[str, Any] = {}
    if level == "sequence":
        out["rollout_is_max"] = np.exp(np.minimum(s.max(), SAFETY_BOUND))
        out["rollout_is_min"] = np.exp(s.min())
        out["rollout_is_mean"] = _vmean(w, mf)
        out["rollout_is_ratio_fraction_high"] = (s > math.log(cap)).mean()
        out["rollout_is_ratio_fraction_low"] = (s < math.log(lower)).mean()
    else:
        out["rollout_is_mean"] = _vmean(w, mf)
        out["rollout_is_ratio_fraction_high"] = _vmean((raw > cap).astype(float), mf)
        out["rollout_is_ratio_fraction_low"] = _vmean((raw < lower).astype(float), mf)
        out["rollout_is_max"] = _masked_max(w, m)
        out["rollout_is_min"] = _masked_min(w, m)
    wc = np.clip(w, 0.0, cap)
    mc, mc2 = _vmean(wc, mf), _vmean(wc ** 2, mf)
    out["rollout_is_std"] = np.where(mf.sum() > 1, np.sqrt(np.maximum(mc2 - mc ** 2, 0.0)), 0.0)
    # 1 / mean((wc / (mean wc + 1e-8))^2), its mean of squares taken in the same pass as mean wc
    out["rollout_is_eff_sample_size"] = (mc + 1e-8) ** 2 / mc2
    seq = _vmean(w, mf, axis=-1)
    out["rollout_is_seq_mean"] = seq.mean()
    out["rollout_is_seq_std"] = seq.std(ddof=1) if seq.size > 1 else 0.0
    out["rollout_is_seq_max"] = seq.max()
    out["rollout_is_seq_min"] = seq.min()
    out["rollout_is_seq_max_deviation"] = np.abs(seq - 1.0).max()
    raw_seq = _vmean(raw, mf, axis=-1)
    out["rollout_is_seq_fraction_high"] = (raw_seq > cap).mean()
    out["rollout_is_seq_fraction_low"] = (raw_seq < lower).mean()
    return out


_RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
               "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


def _verl_rs(d, m, options: Mapping[str, Any]):
    mf = m.astype(float)
    ls = np.clip(d, -SAFETY_BOUND, SAFETY_BOUND)
    tk = {"k1": lambda: -ls, "k2": lambda: 0.5 * ls ** 2, "k3": lambda: np.exp(ls) - 1.0 - ls}
    seq_valid = mf.sum(axis=-1) > 0
    combined = None
    out: dict[str, Any] = {}
    for opt, thr in options.items():
        level, est = opt.rsplit("_", 1)
        if opt not in _RS_OPTIONS:
            raise ValueError(f"rollout_rs option {opt!r} is not one of verl's k1/k2/k3 options")
        is_k1 = est == "k1"
        if is_k1:
            if np.ndim(thr) != 1:
                raise ValueError(f"rollout_rs threshold of {opt} must be a (lower, upper) ratio pair, got {thr!r}")
            lo_log, hi_log = math.log(thr[0]), math.log(thr[1])
        else:
            lo_log, hi_log = None, float(thr)
        k = tk[est]()
        up = hi_log
        low = lo_log if is_k1 else 0.0
        p = f"rollout_rs_{opt}"
        if level == "token":
            stat = k
            keep = (stat >= lo_log) & (stat <= hi_log) if is_k1 else stat <= hi_log
            out[f"{p}_mean"] = _vmean(stat, mf)
            out[f"{p}_max"], out[f"{p}_min"] = _masked_max(stat, m), _masked_min(stat, m)
            out[f"{p}_fraction_high"] = _vmean((stat > up).astype(float), mf)
            out[f"{p}_fraction_low"] = _vmean((stat < low).astype(float), mf) if is_k1 else 0.0
        else:
            if level == "seq_sum":
                seq_stat = (k * mf).sum(axis=-1)
            elif level == "seq_mean":
                seq_stat = _vmean(k, mf, axis=-1)
            else:
                mx = np.where(m, k, -np.inf).max(axis=-1)
                seq_stat = np.where(mx == -np.inf, 0.0, mx)
            keep_s = (seq_stat >= lo_log) & (seq_stat <= hi_log) if is_k1 else seq_stat <= hi_log
            keep = keep_s[:, None]  # broadcast over positions
            out[f"{p}_mean"] = _vmean(seq_stat[:, None], mf)
            out[f"{p}_max"], out[f"{p}_min"] = _masked_max(seq_stat, seq_valid), _masked_min(seq_stat, seq_valid)
            out[f"{p}_fraction_high"] = _seq_fraction(seq_stat > up, seq_valid)
            out[f"{p}_fraction_low"] = _seq_fraction(seq_stat < low, seq_valid) if is_k1 else 0.0
        kf = keep.astype(float)
        combined = kf if combined is None else combined * kf
        out[f"{p}_masked_fraction"] = _vmean(1.0 - kf, mf)
        seq_keep = (~(~keep & m)).all(axis=-1)
        out[f"{p}_seq_masked_fraction"] = ((1.0 - seq_keep) * seq_valid).sum() / np.maximum(seq_valid.sum(), 1)
    if options:
        out["rollout_rs_masked_fraction"] = _vmean(1.0 - combined, mf)
        final_keep = (combined > 0.5) & m
        out["rollout_rs_seq_masked_fraction"] = (~final_keep & m).any(axis=-1).mean()
    return out


@_computed
def verl_metrics(log_train, log_rollout, mask, *, rollout_is: str | None = "token",
                 rollout_is_threshold: float | None = None,
                 rollout_rs: Mapping[str, Any] | None = None) -> dict[str, float]:
    """verl's ``rollout_corr/*`` and ``training/rollout_*`` metrics.

    Pair: ``old_log_prob`` = the trainer recomputed at the rollout's weights (pi_old) against
    ``rollout_log_prob`` (mu); verl's ``log_ratio = log pi_train - log pi_rollout``. Source:
    verl-project/verl ``verl/trainer/ppo/rollout_corr_helper.py`` at 20c30bf8 and
    ``verl/utils/debug/metrics.py``:

    * ``kl`` = token mean of ``log mu - log pi`` (k1 of KL(mu||pi), may be negative);
      ``k3_kl`` = token mean of ``exp(d) - d - 1`` (unclamped).
    * ``training_ppl`` / ``rollout_ppl``: batch mean of per-sequence ``exp(-mean_t logp)``;
      ``*_log_ppl`` without the exp; ``log_ppl_diff`` = batch mean of (seq-mean logp_rollout -
      seq-mean logp_train), ``log_ppl_abs_diff``, ``_max``, ``_min``; ``ppl_ratio`` = batch mean of
      ``exp(log_ppl_diff_i)``.
    * ``chi2_token`` = token mean of ``exp(2 clamp(d, +-20))`` - 1; ``chi2_seq`` = sequence mean of
      ``exp(2 clamp(sum_t d, +-20))`` - 1.
    * ``rollout_is_*`` (``rollout_is`` = ``"token"`` | ``"sequence"`` | None, threshold C default
      ``OBJECTIVE_DEFAULTS.is_cap``, verl's 2.0): weights ``exp(clamp(d))`` or the broadcast
      ``exp(clamp(sum d))``, truncated ``min(w, C)``; mean / max / min of truncated weights (sequence
      mode: max / min from the log sums), fraction above C / below 1/C of the raw weights; ``std``
      and ``eff_sample_size = 1 / mean((w / mean w)^2)`` of the weights clamped to [0, C];
      ``rollout_is_seq_*`` on per-sequence means of the truncated weights (std with n - 1),
      ``seq_fraction_high/low`` on per-sequence means of the raw weights.
    * ``rollout_rs_*`` (``rollout_rs`` = ``{option: threshold}``, default the three band rules as
      verl options: ``token_k1`` with the token band, ``seq_mean_k1`` with the geometric band,
      ``seq_sum_k1`` with the product band): k1 = -d, k2 = d^2 / 2, k3 = exp(d) - 1 - d on
      ``clamp(d, +-20)``; a k1 threshold is a ratio pair ``(lower, upper)`` applied as
      ``log lower <= k1 <= log upper`` (verl's rule: with a symmetric band this is the ratio band);
      k2 / k3 an upper bound. Per option ``_mean``, ``_max``, ``_min``, ``_fraction_high``,
      ``_fraction_low``, ``_masked_fraction`` (tokens), ``_seq_masked_fraction``; combined
      ``rollout_rs_masked_fraction`` and ``rollout_rs_seq_masked_fraction``.
    * ``training/rollout_probs_diff_{max,mean,std}`` of ``|exp(log pi) - exp(log mu)|`` (std with
      n - 1) and ``training/rollout_actor_probs_pearson_corr`` of the probabilities.

    verl's masked mean divides by ``count + 1e-8``; so does this. Every statistic is a whole-batch
    one (``dim=`` makes no sense here); the arrays may be dask arrays (streamed chunk by chunk,
    evaluated in one ``dask.compute``).

    Parameters
    ----------
    log_train : numpy.ndarray or dask.array.Array
        The trainer side's log-probabilities, ``(sequence, position)``.
    log_rollout : numpy.ndarray or dask.array.Array
        The rollout's (mu) log-probabilities, same shape.
    mask : numpy.ndarray or dask.array.Array
        Boolean, real tokens.
    rollout_is : {"token", "sequence"} or None
        verl's importance-sampling level.
    rollout_is_threshold : float, optional
        The truncation C (default ``OBJECTIVE_DEFAULTS.is_cap``).
    rollout_rs : mapping, optional
        verl's rejection-sampling options, ``{rule: threshold}``.

    Returns
    -------
    dict
        ``{peer metric name: float}``.
    """
    lt, lr, m = _prep(log_train, log_rollout, mask)
    mf = m.astype(float)
    n = mf.sum()
    d = lt - lr
    o = OBJECTIVE_DEFAULTS
    cap = o.is_cap if rollout_is_threshold is None else float(rollout_is_threshold)
    out: dict[str, Any] = {}
    if rollout_is is not None:
        out.update(_verl_is_metrics(d, m, rollout_is, cap))
    rs = ({"token_k1": o.token_band, "seq_mean_k1": o.geometric_band, "seq_sum_k1": o.product_band}
          if rollout_rs is None else dict(rollout_rs))
    out.update(_verl_rs(d, m, rs))
    mt = _vmean(lt, mf, axis=-1)
    mr = _vmean(lr, mf, axis=-1)
    out["training_ppl"] = np.exp(-mt).mean()
    out["training_log_ppl"] = (-mt).mean()
    out["kl"] = _vmean(lr - lt, mf)
    out["k3_kl"] = _vmean(np.exp(d) - d - 1.0, mf)
    out["rollout_ppl"] = np.exp(-mr).mean()
    out["rollout_log_ppl"] = (-mr).mean()
    lpd = mr - mt
    out["log_ppl_diff"] = lpd.mean()
    out["log_ppl_abs_diff"] = np.abs(lpd).mean()
    out["log_ppl_diff_max"] = lpd.max()
    out["log_ppl_diff_min"] = lpd.min()
    out["ppl_ratio"] = np.exp(lpd).mean()
    rho = np.exp(np.clip(d, -SAFETY_BOUND, SAFETY_BOUND))
    out["chi2_token"] = _vmean(rho ** 2, mf) - 1.0
    s = np.clip((d * mf).sum(axis=-1), -SAFETY_BOUND, SAFETY_BOUND)
    out["chi2_seq"] = np.exp(2.0 * s).mean() - 1.0
    metrics = {f"rollout_corr/{k}": v for k, v in out.items()}
    pt, pr = np.exp(lt), np.exp(lr)
    diff = np.abs(pt - pr)
    nn = np.maximum(n, 1)
    metrics["training/rollout_probs_diff_max"] = _masked_max(diff, m)
    metrics["training/rollout_probs_diff_mean"] = (diff * mf).sum() / nn
    metrics["training/rollout_probs_diff_std"] = _masked_std(diff, mf, n)
    spt, spr = (pt * mf).sum(), (pr * mf).sum()
    cxy = (pt * pr * mf).sum() - spt * spr / nn
    cxx = (pt * pt * mf).sum() - spt * spt / nn
    cyy = (pr * pr * mf).sum() - spr * spr / nn
    metrics["training/rollout_actor_probs_pearson_corr"] = cxy / np.sqrt(cxx * cyy)
    metrics[_USABLE] = n
    return metrics


# ----------------------------------------------------------------------------------------------
# the others
# ----------------------------------------------------------------------------------------------

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


_FUNCS = {"verl": verl_metrics, "pipelinerl": pipelinerl_metrics, "prime-rl": prime_rl_metrics,
          "slime": slime_metrics, "trl": trl_metrics, "nemo-rl": nemo_rl_metrics}
_OPTIONS = {"verl": {"rollout_is", "rollout_is_threshold", "rollout_rs"},
            "pipelinerl": {"policy_loss", "epsilon_low", "epsilon_high"},
            "prime-rl": {"advantages", "dppo_mask_low", "dppo_mask_high"},
            "slime": set(),
            "trl": {"vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min",
                    "vllm_importance_sampling_clip_max"},
            "nemo-rl": {"kl_type"}}


def _check_peer(names: str, options: Mapping[str, Any]) -> None:
    if names not in _FUNCS:
        raise ValueError(f"names={names!r}; use one of {list(DASHBOARDS)}")
    unknown = sorted(set(options) - _OPTIONS[names])
    if unknown:
        raise ValueError(f"{names} has no option {unknown}; its options: {sorted(_OPTIONS[names]) or 'none'}")


def peer_metrics(names: str, log_train, log_rollout, mask, **options: Any) -> dict[str, float]:
    """One peer's dashboard metrics from plain arrays: the formulas of :func:`as_dashboard` without a
    trace (what a training loop holds per step, e.g. :class:`rlparity.record.Recorder`).

    Parameters
    ----------
    names : str
        The peer, one of :data:`DASHBOARDS`.
    log_train : numpy.ndarray
        The trainer side's log-probabilities, ``(sequence, position)`` (nats).
    log_rollout : numpy.ndarray
        The rollout's (mu) log-probabilities, same shape.
    mask : numpy.ndarray
        Boolean, real tokens; tokens where either side is not finite are left out.
    **options : Any
        Keyword arguments, the peer's own knobs (as :func:`as_dashboard`; prime-rl ``advantages``).

    Returns
    -------
    dict[str, float]
        ``{peer metric name: value}``.

    Raises
    ------
    ValueError
        ``names`` is no peer, an option is not the peer's, or no token is usable.
    """
    _check_peer(names, options)
    return _FUNCS[names](log_train, log_rollout, mask, **options)


def as_dashboard(trace: xr.Dataset, names: str = "verl", *, trainer: TrainerSide | None = None, policy: str = "old",
                 as_dataset: bool = False, dim: Any = None, **options: Any) -> DashboardMetrics | xr.Dataset:
    """The trace's mismatch under one peer's dashboard names, with that peer's formulas.

    ``policy="old"`` compares pi_old with mu (the backend pair: what every peer logs on the first
    micro-batch at lag 0); ``policy="theta"`` uses pi_theta (after :func:`rlparity.train.train_step`;
    for prime-rl and PipelineRL, whose "trainer"/"new" side is the current weights, that is what
    they log after an update). A peer logs one number per batch, so a dashboard is a function of
    the whole arm: ``dim=`` makes no sense here and is refused. A lazy trace is streamed in one
    dask computation, its chunks CRC-checked against the store's record in the same pass.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy (``open_arms(store, chunks=N)``).
    names : str
        The peer, one of :data:`DASHBOARDS` (see each ``<peer>_metrics``).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    policy : {"old", "theta"}
        The trainer reading that stands in for the peer's.
    as_dataset : bool
        Return an ``xarray.Dataset`` instead of the flat dict.
    dim : None
        Refused unless None (a dashboard reduces the whole arm).
    **options : Any
        Keyword arguments, the peer's own knobs (e.g. verl ``rollout_is="sequence"``, ``rollout_rs={"token_k3": 0.3}``;
        TRL ``vllm_importance_sampling_mode``; prime-rl ``advantages``, default the trace's
        ``advantage``).

    Returns
    -------
    DashboardMetrics or xarray.Dataset
        A flat dict of the peer's names with ``pair``, ``direction``, ``n_tokens``,
        ``n_excluded`` and ``source`` on ``.info`` (``as_dataset=True``: an ``xarray.Dataset``).
    """
    refuse_dim(dim, "a peer's dashboard (one number per batch)",
               "select sequences first (trace.isel(sequence=...)) or use summary(dim=...)")
    _check_peer(names, options)
    if policy not in ("old", "theta"):
        raise ValueError(f"policy={policy!r}; use 'old' (pi_old, the backend pair) or 'theta' (pi_theta)")
    trainer = trainer or defaults().trainer
    # a lazy trace stays lazy: the peer's formulas, the counts and the gap below are dask
    # reductions evaluated together in one pass over the chunks (in memory: numpy, as before),
    # once its arm was validated whole as the eager open validates it (the first read only)
    ensure_validated(trace)
    mask = trace["response_mask"].data.astype(bool)
    log_pi = policy_logprob(trace, policy, trainer, lazy=True)
    log_mu = policy_logprob(trace, "mu", trainer, lazy=True)
    usable = mask & np.isfinite(log_pi) & np.isfinite(log_mu)
    if names == "prime-rl" and "advantages" not in options and "advantage" in trace:
        adv = load_variable(trace, "advantage")  # one value per sequence, CRC-checked: small whatever the size
        if np.isfinite(adv).all():
            options = {**options, "advantages": adv}
    values = _FUNCS[names](log_pi, log_mu, mask, _lazy=True, **options)
    n_used = usable.sum()
    gap = np.where(usable, np.abs(log_pi - log_mu), 0.0).sum() / np.maximum(n_used, 1)
    read = ("response_mask", policy_variable(policy, trainer), policy_variable("mu", trainer))
    values = _evaluate({**values, _N_TOKENS: n_used, _N_EXCLUDED: (mask & ~usable).sum(),
                        _GAP: np.where(n_used > 0, gap, np.nan)}, trace, read)
    n_tokens, n_excluded, gap = int(values.pop(_N_TOKENS)), int(values.pop(_N_EXCLUDED)), values.pop(_GAP)
    pair = f"{'backend' if policy == 'old' else 'bypass'} ({POLICY_NAMES[policy]}, mu)"
    out = DashboardMetrics(values, peer=names, pair=pair,
                           direction=f"{policy_variable(policy, trainer)} - rollout_logprob",
                           n_tokens=n_tokens, n_excluded=n_excluded,
                           source=SOURCES[names], trainer_side=trainer,
                           options=str({k: v for k, v in options.items() if k != "advantages"}),
                           arm=arm_record(trace).name,
                           # beside the peer's numbers: the gap the trainer's own batch shape produces
                           **floors_beside_gap(trace, gap, trainer))
    return out.to_dataset() if as_dataset else out


__all__ = ["DASHBOARDS", "SOURCES", "DashboardMetrics", "as_dashboard", "nemo_rl_metrics", "peer_metrics",
           "pipelinerl_metrics", "prime_rl_metrics", "slime_metrics", "trl_metrics", "verl_metrics"]
