"""Does it matter: the policy gradient every correction gives on one recorded step, with the model.

For each correction of :data:`rlparity.metrics.counterfactual.CORRECTIONS` (its weights and keep
flags on the backend pair), one loss pass of :func:`rlparity.train.train_step` on the step's
samples, before any optimizer step (``step=False``, ``return_gradient=True``): at the start of a
step pi_theta = pi_old, so the PPO ratio is 1, nothing is clipped and the gradient is
``-(1/n_kept) sum_t A_i w_t grad log pi_theta(t)``. Each gradient is compared (cosine, norm
ratio) with

* the **parity** gradient, ``none`` (``w = 1``, every usable token): the update the trainer would
  make if the engine were the trainer (pi_old = mu), on the same batch;
* the **full-IS** gradient (``w = rho = pi_old / mu``, nothing truncated or dropped): the
  unbiased on-policy update from samples of mu.

It lives here, not in ``metrics``, because it runs the trainer (``rlparity.train``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide
from rlparity.experiments.objective import _cos
from rlparity.metrics import counterfactual as cf
from rlparity.metrics.objective import finite_tokens, importance_weights, pair_log_ratio
from rlparity.train import train_step
from rlparity.train.reward import group_advantages
from rlparity.train.step import StepSettings


def _ratio(a: np.ndarray, b: np.ndarray) -> float:
    nb = np.linalg.norm(b)
    return float(np.linalg.norm(a) / nb) if nb > 0 else float("nan")


def correction_gradients(trace: xr.Dataset, model: Any, *, corrections: Iterable[str] | None = None,
                         rewards: Callable | np.ndarray | None = None, loss: str = "ppo",
                         trainer: TrainerSide | None = None, causes: Iterable[str] = (),
                         **train_options: Any) -> list[dict[str, Any]]:
    """Every correction's counterfactual on one step, with its real policy gradient.

    Parameters
    ----------
    trace : xarray.Dataset
        One scored step (pi_old, mu, a reward per sequence or ``rewards``).
    model : str or transformers model
        The trainer at the step's weights (a path or a loaded causal LM; not stepped).
    corrections : iterable of str, optional
        Default: all of :data:`rlparity.metrics.counterfactual.CORRECTIONS`.
    rewards : callable or numpy.ndarray, optional
        Per-sequence rewards (None: the trace's ``reward``).
    loss : str, default "ppo"
        The loss of :func:`rlparity.train.train_step`.
    trainer : {"processed", "raw"}, optional
        The trainer reading that is pi_old (and differentiated).
    causes : iterable of str
        The backend causes the attribution names on this step: a correction that looks healthy
        (:func:`rlparity.metrics.counterfactual.would_hide`) is said to hide them.
    **train_options
        More options of :func:`rlparity.train.train_step` (``dtype``, ``device``, ``batch_size``...).

    Returns
    -------
    list of dict
        One :func:`rlparity.metrics.counterfactual.counterfactual_row` per correction, plus
        ``cosine_vs_parity``, ``norm_ratio_vs_parity``, ``cosine_vs_full_is``,
        ``norm_ratio_vs_full_is``, ``grad_norm``, ``looks_healthy`` and ``hides`` (the causes it
        would hide).
    """
    d = pair_log_ratio(trace, "backend", trainer).values
    mask = trace["response_mask"].values.astype(bool)
    st = StepSettings()
    r = trace["reward"].values if rewards is None else (rewards(trace) if callable(rewards) else rewards)
    adv = group_advantages(np.asarray(r, float), trace[train_options.get("group_by", st.group_by)].values,
                           scale=train_options.get("advantage_scale", st.advantage_scale))
    log_mu = np.where(mask, trace["rollout_logprob"].values, np.nan)
    names = list(corrections or cf.CORRECTIONS)
    common = dict(rewards=rewards, loss=loss, trainer=trainer, step=False, return_gradient=True, **train_options)
    usable = finite_tokens(d, mask)

    def grad(w: np.ndarray, keep: np.ndarray) -> np.ndarray | None:
        if not keep.any():
            return None
        return train_step(model, trace, token_weights=np.where(keep, w, 0.0), keep=keep, **common).gradient

    g_par = grad(np.ones_like(d), usable)
    rho = importance_weights(d, mask, level="token")
    g_is = grad(np.where(usable, rho, 0.0), usable)
    causes = list(causes)
    rows = []
    for c in names:
        row = cf.counterfactual_row(d, mask, correction=c, log_mu=log_mu, advantages=adv)
        w, keep = cf.correction_weights(d, mask, correction=c, log_mu=log_mu, advantages=adv)
        g = g_par if c == "none" else grad(np.where(keep, w, 0.0), keep)
        if g is None:
            row.update(cosine_vs_parity=float("nan"), norm_ratio_vs_parity=0.0, cosine_vs_full_is=float("nan"),
                       norm_ratio_vs_full_is=0.0, grad_norm=0.0)
        else:
            row.update(cosine_vs_parity=_cos(g, g_par), norm_ratio_vs_parity=_ratio(g, g_par),
                       cosine_vs_full_is=_cos(g, g_is), norm_ratio_vs_full_is=_ratio(g, g_is),
                       grad_norm=float(np.linalg.norm(g)))
        healthy = cf.would_hide(row)
        row.update(looks_healthy=healthy, hides=causes if healthy else [])
        rows.append(row)
    return rows


__all__ = ["correction_gradients"]
