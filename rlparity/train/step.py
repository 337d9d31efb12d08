"""One real optimizer step of a transformers causal LM on a captured trace, then pi_theta rescored.

The trainer-side forward is :class:`rlparity.score.Scorer`'s (same body, same LM head in
``head_dtype``, same vLLM sampler transform for the ``processed`` reading), here with gradients:
the loss is computed on exactly the tokens the engine sampled, with group-normalised advantages,
and after one step the same scorer reads the updated weights (pi_theta).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.settings import with_overrides
from rlparity.score import Scorer, processed_logits
from rlparity.trace import sequences, validate, with_trainer
from rlparity.train.losses import LOSSES, clip_range, sequence_terms
from rlparity.train.reward import group_advantages

PI_OLD = {"processed": "trainer_processed_logprob", "raw": "trainer_logprob"}
PI_THETA = {"processed": "trainer_updated_processed_logprob", "raw": "trainer_updated_logprob"}


@dataclass
class StepResult:
    """What :func:`train_step` returns.

    Parameters
    ----------
    trace : xarray.Dataset
        The trace with pi_theta (``trainer_updated_logprob``, ``trainer_updated_processed_logprob``,
        nats), pi_old (scored first if the trace had none), ``reward`` and ``advantage`` added.
    metrics : dict
        The step's numbers (loss value, gradient norm, token counts, clip fraction, masked
        fraction, step-0 self-consistency, seconds, the settings used).
    gradient : numpy.ndarray or None, default None
        The flattened policy gradient (float64, before clipping) when ``return_gradient`` was set.
    model : object, default None
        The stepped model (the one given, or the one loaded from a path), for the next step.
    """

    trace: xr.Dataset
    metrics: dict[str, Any] = field(default_factory=dict)
    gradient: np.ndarray | None = None
    model: Any = None


def _rewards(trace: xr.Dataset, rewards) -> np.ndarray:
    if rewards is None:
        if "reward" not in trace or not np.isfinite(trace["reward"].values).all():
            raise ValueError("the trace has no finite reward per sequence: pass rewards=array or "
                             "rewards=rlparity.train.arithmetic_reward")
        return trace["reward"].values.astype(float)
    r = rewards(trace) if callable(rewards) else rewards
    r = np.asarray(r, dtype=float)
    if r.shape != (trace.sizes["sequence"],):
        raise ValueError(f"rewards has shape {r.shape}; pass one reward per sequence ({trace.sizes['sequence']})")
    return r


def _token_logprobs(scorer: Scorer, hidden, tokens, temperature, top_k, top_p, trainer: str):
    """Differentiable log-probabilities of ``tokens`` from hidden rows: the scorer's LM head
    (its ``head_dtype``), then vLLM's sampler transform for the processed reading."""
    import torch

    hd = getattr(torch, scorer.head_dtype)
    b = scorer.head_bias.to(hd) if scorer.head_bias is not None else None
    logits = torch.nn.functional.linear(hidden.to(hd), scorer.head_weight.to(hd), b).float()
    if trainer == "processed":
        logits = processed_logits(logits, temperature, top_k, top_p)
    return logits.log_softmax(dim=-1).gather(1, tokens.unsqueeze(1)).squeeze(1)


@dataclass(frozen=True)
class StepSettings:
    """The settings of :func:`train_step`, with their defaults.

    Parameters
    ----------
    loss : str, default "gspo"
        The policy loss: ``"gspo"``, ``"ppo"`` or ``"grpo"`` (:mod:`rlparity.train.losses`).
    lr : float or None, default None
        Learning rate of the default AdamW optimizer; None: 1e-5.
    group_by : str, default "prompt_index"
        The trace variable whose values form the advantage's groups (the n samples of a prompt).
    trainer : {"processed", "raw"} or None, default None
        The reading the loss is computed on; None: ``defaults().trainer``.
    eps_low : float or None, default None
        Lower clip of the ratio; None: the loss's usual (:func:`rlparity.train.clip_range`).
    eps_high : float or None, default None
        Upper clip of the ratio; None: the loss's usual.
    advantage_scale : str, default "std"
        ``"std"``: advantages divided by the group's standard deviation; ``"none"``: only centred.
    max_grad_norm : float or None, default None
        Clip the gradient's norm to this before stepping; None: no clipping.
    dtype : str, default "float32"
        Torch dtype a model given by path is loaded in.
    head_dtype : str, default "float32"
        Torch dtype of the LM head projection.
    device : str, default "cpu"
        Torch device of the model.
    batch_size : int, default 16
        Sequences per forward.
    return_gradient : bool, default False
        Return the flattened gradient in :attr:`StepResult.gradient`.
    step : bool, default True
        Step the optimizer; False computes the loss and gradient only.
    """

    loss: str = "gspo"
    lr: float | None = None
    group_by: str = "prompt_index"
    trainer: TrainerSide | None = None
    eps_low: float | None = None
    eps_high: float | None = None
    advantage_scale: str = "std"
    max_grad_norm: float | None = None
    dtype: str = "float32"
    head_dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 16
    return_gradient: bool = False
    step: bool = True


def train_step(model: Any, trace: xr.Dataset, *, rewards: Sequence[float] | Callable | None = None,
               optimizer: Any = None, token_weights: np.ndarray | None = None, keep: np.ndarray | None = None,
               old_logprob: np.ndarray | None = None, settings: StepSettings | None = None,
               **overrides: Any) -> StepResult:
    """One optimizer step of ``model`` on ``trace``; returns the trace with pi_theta.

    The loss (see :mod:`rlparity.train.losses`) is computed on the captured tokens with the
    ``trainer`` reading (``"processed"``: temperature, top-k, top-p as the sampler drew; ``"raw"``:
    full vocabulary); the ratio's denominator is that reading at the weights the step starts from,
    detached (the trace's pi_old on a first step; the returned trace keeps the trace's pi_old, the
    rollout-time reading); the LM head runs in ``head_dtype`` (float32, as trainers do) and the
    model in eval mode (no dropout). Advantages are group-normalised over ``group_by``.
    ``eps_low`` / ``eps_high`` default to the loss's usual clip (0.2 / 0.2; GSPO 3e-4 / 4e-4).

    Corrections are computed by the caller (e.g. with :mod:`rlparity.metrics.objective`) and given
    as ``(sequence, position)`` arrays. ``metrics`` names its pairs: the in-step clip fraction is
    the update pair at the start of the step, 0 on a first step.

    Parameters
    ----------
    model : str, os.PathLike or transformers model
        A path / hub id (loaded in ``dtype``) or a loaded transformers causal LM (trained in place).
    trace : xarray.Dataset
        A rollout trace (validated) with ``temperature``, ``top_k``, ``top_p`` and the ``group_by``
        variable; pi_old is scored first when missing.
    rewards : sequence of float, callable or None, default None
        One reward per sequence, a function of the trace (e.g.
        :func:`rlparity.train.arithmetic_reward`), or None for the trace's ``reward`` variable.
    optimizer : torch.optim.Optimizer, optional
        An optimizer over the model's parameters; None: AdamW(``lr``, default 1e-5, no weight decay).
    token_weights : numpy.ndarray, optional
        ``(sequence, position)`` weights multiplying each token's loss (token TIS, the decoupled
        correction weight pi_old/mu); must be finite at every token that takes part.
    keep : numpy.ndarray, optional
        ``(sequence, position)`` booleans; False drops the token from the loss (rejection masks).
    old_logprob : numpy.ndarray, optional
        ``(sequence, position)`` log-probabilities in nats replacing the recomputed denominator of
        the ratio, e.g. ``trace["rollout_logprob"].values`` (mu) for a trainer that never recomputes
        pi_old (PipelineRL, prime-rl: the ratio is then the bypass pair pi_theta/mu).
    settings : StepSettings, optional
        The step's settings; None: :class:`StepSettings` defaults.
    **overrides
        Fields of :class:`StepSettings` given as keywords (``loss``, ``lr``, ``group_by``,
        ``trainer``, ``eps_low``, ``eps_high``, ``advantage_scale``, ``max_grad_norm``, ``dtype``,
        ``head_dtype``, ``device``, ``batch_size``, ``return_gradient``, ``step``); they replace
        the fields of ``settings``.

    Returns
    -------
    StepResult
        The trace with pi_theta, pi_old, ``reward`` and ``advantage``; the step's metrics; the
        gradient when asked; the stepped model.

    Raises
    ------
    ValueError
        If the loss or the trainer reading is unknown, both ``lr`` and ``optimizer`` are given,
        ``group_by`` is not a trace variable, an array has the wrong shape, the rewards are missing
        or not one per sequence, ``token_weights`` is not finite where it is used, or no token takes
        part in the loss.
    """
    import torch

    st = with_overrides(settings or StepSettings(), overrides, "train_step")
    loss, group_by = st.loss, st.group_by
    trainer = _check_step(st, trace, optimizer, (("token_weights", token_weights), ("keep", keep),
                                                 ("old_logprob", old_logprob)))
    n, width = trace.sizes["sequence"], trace.sizes["position"]
    mask = trace["response_mask"].values.astype(bool)
    r = _rewards(trace, rewards)
    adv = group_advantages(r, trace[group_by].values, scale=st.advantage_scale)
    el, eh = clip_range(loss)
    el = el if st.eps_low is None else st.eps_low
    eh = eh if st.eps_high is None else st.eps_high
    t0 = time.perf_counter()

    scorer = Scorer(model, dtype=st.dtype, head_dtype=st.head_dtype, device=st.device, batch_size=st.batch_size,
                    progress=False, tokenize_prompts=False)
    module = scorer.module
    if PI_OLD[trainer] not in trace or "trainer_logprob" not in trace:
        trace = _with_readings(trace, scorer.score(trace), {"trainer_logprob": "trainer_logprob",
                                                            "trainer_processed_logprob": "trainer_processed_logprob"})
    stored_old = trace[PI_OLD[trainer]].values
    params = [p for p in module.parameters() if p.requires_grad]
    if optimizer is None:
        optimizer = torch.optim.AdamW(params, lr=1e-5 if st.lr is None else st.lr, weight_decay=0.0)
    seqs = sequences(trace)
    kept = mask & (np.ones_like(mask) if keep is None else np.asarray(keep, bool))

    # first pass without gradients: pi_old at the current weights, which tokens are usable
    module.eval()
    sampling = (trace[k].values for k in ("temperature", "top_k", "top_p"))
    passes = _Passes(scorer, seqs, list(scorer.batches(seqs)), *sampling, trainer, st.device)
    old = _denominator(passes, mask, old_logprob)
    usable = mask & np.isfinite(old)
    terms = _loss_inputs(loss, adv, el, eh, kept & usable, old, token_weights, old_logprob is None)

    optimizer.zero_grad(set_to_none=True)
    total_loss, n_clipped, n_clip_units, step0 = _backward(passes, terms)
    grad_norm, gradient = _apply_gradient(params, optimizer, st)

    after = scorer.score(trace)
    out = _with_readings(trace, after, {"trainer_updated_logprob": "trainer_logprob",
                                        "trainer_updated_processed_logprob": "trainer_processed_logprob"})
    use, n_tok, n_seq = terms.use, terms.n_tok, terms.n_seq
    w_used = (np.ones(n_tok) if token_weights is None else np.asarray(token_weights, float)[use])
    info = {"loss": loss, "lr": float(optimizer.param_groups[0]["lr"]), "eps_low": el, "eps_high": eh,
            "trainer_side": trainer, "group_by": group_by, "advantage_scale": st.advantage_scale,
            "stepped": bool(st.step), "ratio_denominator": "given (old_logprob)" if old_logprob is not None else
            f"{PI_OLD[trainer]} recomputed at the step's start",
            "corrections": {"token_weights": token_weights is not None, "keep": keep is not None}}
    out = with_trainer(out, {"reward": r, "advantage": adv},
                       {"train_step": {**info, "optimizer": type(optimizer).__name__}})
    metrics = {
        **info,
        "loss_value": total_loss,
        "grad_norm": grad_norm,
        "n_tokens": int(mask.sum()),
        "n_excluded_tokens": int((mask & ~usable).sum()),
        "n_loss_tokens": n_tok,
        "n_sequences": n,
        "n_loss_sequences": n_seq,
        "masked_fraction": float(1.0 - n_tok / max(int(usable.sum()), 1)),
        "effective_batch_tokens": float(w_used.sum() ** 2 / (w_used ** 2).sum()) if (w_used ** 2).sum() > 0 else 0.0,
        "in_step_clip_fraction": n_clipped / max(n_clip_units, 1),
        "reward_mean": float(r.mean()),
        "advantage_abs_mean": float(np.abs(adv).mean()),
        "groups_with_signal": int(sum(np.any(adv[trace[group_by].values == g] != 0)
                                      for g in np.unique(trace[group_by].values))),
        "pi_old_max_abs_diff_vs_trace": float(np.nanmax(np.abs(np.where(usable, old - stored_old, np.nan))))
        if usable.any() else float("nan"),
        **step0_check(step0 if old_logprob is None else float("nan"), module),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    return StepResult(out, metrics, gradient, module)


def _check_step(st: StepSettings, trace: xr.Dataset, optimizer: Any, arrays: Sequence[tuple[str, Any]]) -> str:
    """Refuse a step that cannot run, before anything is scored; the trainer reading it uses."""
    if st.loss not in LOSSES:
        raise ValueError(f"loss={st.loss!r}; use one of {LOSSES}")
    trainer = st.trainer or defaults().trainer
    if trainer not in PI_OLD:
        raise ValueError(f"trainer={trainer!r}; use 'processed' or 'raw'")
    if optimizer is not None and st.lr is not None:
        raise ValueError("pass lr (for the default AdamW) or optimizer, not both")
    if st.group_by not in trace:
        raise ValueError(f"group_by={st.group_by!r} is not a trace variable; use prompt_index (samples of one prompt)")
    validate(trace)
    n, width = trace.sizes["sequence"], trace.sizes["position"]
    for name, arr in arrays:
        if arr is not None and np.shape(arr) != (n, width):
            raise ValueError(f"{name} has shape {np.shape(arr)}; give one value per (sequence, position): {(n, width)}")
    return trainer


@dataclass(frozen=True)
class _Passes:
    """What a pass over the trace's sequences reads them with: the scorer, its batches, the sampling
    settings per (sequence, position) and the trainer reading."""

    scorer: Scorer
    seqs: Any
    batches: list
    temp: np.ndarray
    topk: np.ndarray
    topp: np.ndarray
    trainer: str
    device: str

    def logprobs(self, batch):
        return _batch_logprobs(self.scorer, self.seqs, batch, self.temp, self.topk, self.topp, self.trainer,
                               self.device)


def _denominator(passes: _Passes, mask: np.ndarray, old_logprob: np.ndarray | None) -> np.ndarray:
    """The ratio's denominator per (sequence, position): the trainer reading at the current weights
    (no gradients), or the caller's ``old_logprob`` (e.g. mu: no recompute)."""
    import torch

    n, width = mask.shape
    old = np.full((n, width), np.nan)
    with torch.no_grad():
        for batch in passes.batches:
            for i, lp in zip(batch, passes.logprobs(batch)):
                old[i, : lp.numel()] = lp.double().cpu().numpy()
    if old_logprob is not None:  # the caller's denominator (e.g. mu: no recompute)
        old = np.where(mask, np.asarray(old_logprob, dtype=float), np.nan)
    return old


@dataclass(frozen=True)
class _LossInputs:
    """What the loss reads besides pi_theta: the loss and its clip, the advantages, the tokens that
    take part (``use``), their denominator and weights, and the counts the terms are divided by."""

    loss: str
    adv: np.ndarray
    eps_low: float
    eps_high: float
    use: np.ndarray
    old: np.ndarray
    token_weights: np.ndarray | None
    recomputed: bool
    n_tok: int
    n_seq: int


def _loss_inputs(loss: str, adv: np.ndarray, el: float, eh: float, use: np.ndarray, old: np.ndarray,
                 token_weights: np.ndarray | None, recomputed: bool) -> _LossInputs:
    """:class:`_LossInputs`, refusing weights that are not finite where they are used and a loss
    no token takes part in."""
    if token_weights is not None and not np.isfinite(np.asarray(token_weights, float)[use]).all():
        raise ValueError("token_weights is not finite at some tokens that take part in the loss: drop those "
                         "tokens with keep=... (e.g. tokens the rollout gives probability 0)")
    n_tok = int(use.sum())
    seq_has = use.any(axis=1)
    n_seq = int(seq_has.sum())
    if n_tok == 0:
        raise ValueError("no token takes part in the loss: every token is masked or has trainer probability 0")
    return _LossInputs(loss, adv, el, eh, use, old, token_weights, recomputed, n_tok, n_seq)


def _backward(passes: _Passes, t: _LossInputs) -> tuple[float, int, int, float]:
    """The gradient pass: each batch's loss terms, backward. Returns the loss, the clipped count
    and the units it is a fraction of, and the largest ``|pi_theta - pi_old|`` at the same weights
    (0 where the denominator is the caller's)."""
    import torch

    total_loss, n_clipped, n_clip_units = 0.0, 0, 0
    step0 = 0.0  # the gradient pass's pi_theta (before the step) against the no-grad pi_old, same weights
    for batch in passes.batches:
        lps = passes.logprobs(batch)
        batch_loss = None
        for i, lp in zip(batch, lps):
            L = lp.numel()
            u = t.use[i, :L]
            if not u.any():
                continue
            lp_k = lp[torch.as_tensor(u, device=lp.device)]
            old_k = torch.as_tensor(t.old[i, :L][u], dtype=lp.dtype, device=lp.device)
            if t.recomputed:
                step0 = max(step0, float((lp_k.detach() - old_k).abs().max()))
            w = (None if t.token_weights is None else
                 torch.as_tensor(np.asarray(t.token_weights, float)[i, :L][u], dtype=lp.dtype, device=lp.device))
            term, count, clipped = sequence_terms(t.loss, lp_k, old_k, float(t.adv[i]), t.eps_low, t.eps_high, w)
            if t.loss == "ppo":
                term = term / t.n_tok
            elif t.loss == "grpo":
                term = term / count / t.n_seq
            else:
                term = term / t.n_seq
            n_clipped += clipped
            n_clip_units += count if t.loss != "gspo" else 1
            batch_loss = term if batch_loss is None else batch_loss + term
        if batch_loss is not None:
            batch_loss.backward()
            total_loss += float(batch_loss.detach())
    return total_loss, n_clipped, n_clip_units, step0


def _apply_gradient(params: list, optimizer: Any, st: StepSettings) -> tuple[float, np.ndarray | None]:
    """The gradient's norm (and the gradient itself when asked), then the clip and the optimizer
    step as ``st`` says; the gradients are cleared."""
    import torch

    grads = [p.grad for p in params]
    grad_norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))
    gradient = None
    if st.return_gradient:
        gradient = np.concatenate([(g if g is not None else torch.zeros_like(p)).detach().double().cpu().numpy().ravel()
                                   for g, p in zip(grads, params)])
    if st.max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, st.max_grad_norm)
    if st.step:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, gradient


def step0_check(max_abs: float, module) -> dict[str, Any]:
    """The step-0 self-consistency of the trainer: before the optimizer step pi_theta and pi_old
    are the same weights on the same tokens, so the gradient pass must reproduce the no-grad pass
    exactly (an lr of 0 must leave pi_theta == pi_old). ``step0_max_abs_diff`` (nats) and, when it
    is not 0, ``step0_why``: what in this trainer makes the two forwards differ (verl, slime and
    others meet this as "pi_old != pi_theta at step 0")."""
    import torch

    out: dict[str, Any] = {"step0_max_abs_diff": max_abs, "step0_consistent": bool(max_abs == 0.0)}
    if max_abs == 0.0 or max_abs != max_abs:
        return out
    why = []
    if module.training:
        why.append("the model is in train mode (dropout active)")
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in module.modules()):
        why.append("dropout layers have p > 0")
    if getattr(module, "is_gradient_checkpointing", False):
        why.append("gradient checkpointing recomputes activations")
    if not torch.are_deterministic_algorithms_enabled():
        why.append("kernels may differ between a no-grad and a gradient forward (autograd keeps other "
                   "buffers; torch.use_deterministic_algorithms(True) pins some)")
    out["step0_why"] = "; ".join(why) or "unknown: the two forwards ran the same shapes and mode"
    return out


def _batch_logprobs(scorer, seqs, batch, temp, topk, topp, trainer, device):
    import torch

    hidden = scorer.response_hidden(seqs, batch)
    rows = [h for h, i in zip(hidden, batch) if len(seqs[i][1])]
    idx = [i for i in batch if len(seqs[i][1])]
    if not rows:
        return [torch.zeros(0) for _ in batch]
    lens = [len(seqs[i][1]) for i in idx]
    tok = torch.tensor([t for i in idx for t in seqs[i][1]], device=device)
    tt = torch.tensor([float(temp[i]) for i, L in zip(idx, lens) for _ in range(L)], device=device)
    tk = torch.tensor([int(topk[i]) for i, L in zip(idx, lens) for _ in range(L)], dtype=torch.long, device=device)
    tp = torch.tensor([float(topp[i]) for i, L in zip(idx, lens) for _ in range(L)], device=device)
    lp = _token_logprobs(scorer, torch.cat(rows), tok, tt, tk, tp, trainer)
    parts = dict(zip(idx, torch.split(lp, lens)))
    return [parts.get(i, torch.zeros(0)) for i in batch]


def _with_readings(trace: xr.Dataset, scored: xr.Dataset, names: dict[str, str]) -> xr.Dataset:
    """``trace`` plus ``scored``'s trainer readings under new names (``{new: scored name}``)."""
    attrs = {}
    if "trainer_logprob" in names:  # first scoring: keep the scorer's provenance
        attrs = {k: scored.attrs[k] for k in ("trainer", "scored_token_checksum") if k in scored.attrs}
    return with_trainer(trace, {new: scored[old].values for new, old in names.items()}, attrs)


__all__ = ["StepResult", "StepSettings", "train_step"]
