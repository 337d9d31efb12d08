"""Does it matter: what each correction the peers ship would do to one recorded step.

Every correction acts on the backend pair (pi_old, mu), ``d = log pi_old - log mu``,
``rho = exp(d)``, and gives each token a weight ``w`` and a keep flag (the loss term of a
dropped token is 0). They are built from :mod:`rlparity.metrics.objective` (one implementation;
thresholds from ``defaults().objective``, ``C = is_cap``):

* ``none``: ``w = 1``, every usable token kept (the update a trainer makes with no correction);
* ``token_tis``: ``w = min(rho, C)`` (verl ``rollout_is=token``; Yao et al.'s truncated IS);
* ``sequence_tis``: ``w = min(prod_t rho, C)`` on every token of the sequence (verl
  ``rollout_is=sequence``);
* ``token_mis``: masked IS, ``w = rho`` kept only where ``rho <= C`` (prime-rl / verl's mask mode:
  the token is dropped, not truncated);
* ``token_mask``: a two-sided token mask, ``rho`` in ``[1/C, C]``, ``w = 1`` (IcePop);
* ``sequence_mean_mask``: drop a sequence whose mean k3 exceeds its bound (verl ``rollout_rs``
  ``seq_mean_k3``);
* ``geometric_rejection``: drop a sequence whose geometric ratio ``exp(mean_t d)`` leaves the
  geometric band (verl ``seq_mean_k1`` / GSPO-style);
* ``product_band_mask``: drop a sequence whose product ratio leaves the product band;
* ``dppo_mask``: prime-rl's DPPO mask on the probability difference ``p = pi_old - mu``: drop a
  token of a positive advantage with ``p > dppo_mask_high`` and of a non-positive advantage with
  ``p < -dppo_mask_low`` (needs ``log_mu`` and the per-sequence ``advantages``);
* ``seq_error_mask``: NeMo-RL's sequence mask, drop a sequence whose ``mean_t exp(|d|)``
  (its ``seq_mult_prob_error``) exceeds ``seq_mult_prob_error_max``.

For each: the tokens and sequences it drops, the normalised ESS ``(sum w)^2 / (n sum w^2)`` of
the weights it applies over the usable tokens (a dropped token weighs 0) and the largest weight.
The gradient side (cosine and norm ratio of the policy gradient each gives, against the gradient
with no correction and against the full-IS gradient ``w = rho``) is computed with the model in
:mod:`rlparity.experiments.counterfactual`; this module is the numpy core.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlparity.metrics.objective import (
    OBJECTIVE_DEFAULTS,
    finite_tokens,
    importance_weights,
    real_tokens,
    rejection_keep,
    tis_weights,
    weights_ess,
)


def _ones(d, mask):
    u = finite_tokens(d, mask)
    return np.where(u, 1.0, np.nan), u


def _token_tis(d, mask):
    return tis_weights(d, mask), finite_tokens(d, mask)


def _sequence_tis(d, mask):
    w = importance_weights(d, mask, level="sequence", kind="product", cap=OBJECTIVE_DEFAULTS.is_cap)
    return w, np.isfinite(w)


def _token_mis(d, mask):
    w = importance_weights(d, mask, level="token")
    with np.errstate(invalid="ignore"):
        return w, np.isfinite(w) & (w <= OBJECTIVE_DEFAULTS.is_cap)


def _seq_error_mask(d, mask):
    u = finite_tokens(d, mask)
    real = real_tokens(d, mask)
    n = real.sum(axis=-1)
    err = np.where(u, np.exp(np.abs(np.where(u, d, 0.0))), np.inf)
    s = np.where(real, err, 0.0).sum(axis=-1) / np.maximum(n, 1)
    return np.where(u, 1.0, np.nan), u & (s <= OBJECTIVE_DEFAULTS.seq_mult_prob_error_max)[:, None]


def _dppo_mask(d, mask, log_mu, advantages):
    u = finite_tokens(d, mask)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(np.where(u, log_mu + d, 0.0)) - np.exp(np.where(u, log_mu, 0.0))
    a = np.asarray(advantages, float)[:, None]
    bad = np.where(a > 0, p > OBJECTIVE_DEFAULTS.dppo_mask_high, p < -OBJECTIVE_DEFAULTS.dppo_mask_low)
    return np.where(u, 1.0, np.nan), u & ~bad


NEEDS_ADVANTAGES = ("dppo_mask",)


def _mask_rule(rule: str) -> Callable:
    def f(d, mask):
        u = finite_tokens(d, mask)
        return np.where(u, 1.0, np.nan), rejection_keep(d, mask, rule=rule)
    return f


CORRECTIONS: dict[str, tuple[Callable, str]] = {
    "none": (_ones, "no correction: w = 1"),
    "token_tis": (_token_tis, "token TIS: w = min(rho, C)"),
    "sequence_tis": (_sequence_tis, "sequence TIS: w = min(prod rho, C) on the sequence"),
    "token_mis": (_token_mis, "token MIS: w = rho, token dropped where rho > C"),
    "token_mask": (_mask_rule("token_band"), "two-sided token mask: keep rho in [1/C, C], w = 1"),
    "sequence_mean_mask": (_mask_rule("seq_mean_k3"), "sequence-mean mask: drop a sequence with mean k3 above its bound"),
    "geometric_rejection": (_mask_rule("geometric_band"), "geometric-mean rejection: drop a sequence whose "
                                                          "exp(mean d) leaves the geometric band"),
    "product_band_mask": (_mask_rule("product_band"), "product band mask: drop a sequence whose prod rho "
                                                      "leaves the product band"),
    "dppo_mask": (_dppo_mask, "prime-rl DPPO mask: drop a token whose pi_old - mu passes the bound on its "
                              "advantage's side"),
    "seq_error_mask": (_seq_error_mask, "NeMo-RL sequence mask: drop a sequence whose mean exp(|d|) exceeds "
                                        "its bound"),
}


def correction_weights(d: np.ndarray, mask: np.ndarray | None = None, *, correction: str,
                       log_mu: np.ndarray | None = None, advantages: np.ndarray | None = None
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The weights and keep flags of one correction.

    Parameters
    ----------
    d : numpy.ndarray
        ``log pi_old - log mu`` (nats), dims ``(sequence, position)``.
    mask : numpy.ndarray, optional
        Real tokens (``None``: every non-NaN entry of ``d``).
    correction : str
        One of :data:`CORRECTIONS`.
    log_mu : numpy.ndarray, optional
        The engine's log-probabilities (nats), shaped like ``d`` (``dppo_mask`` needs them).
    advantages : numpy.ndarray, optional
        One advantage per sequence (``dppo_mask`` needs them).

    Returns
    -------
    tuple of numpy.ndarray
        ``w`` (NaN where the token cannot take part) and ``keep`` (booleans), shaped like ``d``.
        The weight the loss applies is ``w * keep``.
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r}; use one of {list(CORRECTIONS)}")
    d = np.asarray(d, dtype=float)
    if correction in NEEDS_ADVANTAGES:
        if log_mu is None or advantages is None:
            raise ValueError(f"correction={correction!r} needs log_mu (the engine's log-probabilities) and advantages "
                             "(one per sequence)")
        w, keep = CORRECTIONS[correction][0](d, mask, np.asarray(log_mu, float), advantages)
    else:
        w, keep = CORRECTIONS[correction][0](d, mask)
    return w, np.asarray(keep, bool) & finite_tokens(d, mask)


def counterfactual_row(d: np.ndarray, mask: np.ndarray | None = None, *, correction: str,
                       log_mu: np.ndarray | None = None, advantages: np.ndarray | None = None) -> dict[str, Any]:
    """What one correction does to a step.

    Parameters
    ----------
    d : numpy.ndarray
        ``log pi_old - log mu`` (nats), dims ``(sequence, position)``.
    mask : numpy.ndarray, optional
        Real tokens.
    correction : str
        One of :data:`CORRECTIONS`.
    log_mu : numpy.ndarray, optional
        The engine's log-probabilities (``dppo_mask``).
    advantages : numpy.ndarray, optional
        One advantage per sequence (``dppo_mask``).

    Returns
    -------
    dict
        ``correction``, ``rule`` (in words), ``dropped_token_share`` (usable tokens not kept),
        ``dropped_sequence_share`` (sequences with a usable token that lose at least one),
        ``dropped_sequences`` (their indices), ``ess`` (normalised, of ``w * keep`` over the usable
        tokens), ``max_weight``, ``n_usable`` and ``n_zero_prob`` (real tokens with a non-finite
        ``d``: no correction can use them).
    """
    w, keep = correction_weights(d, mask, correction=correction, log_mu=log_mu, advantages=advantages)
    usable = finite_tokens(d, mask)
    eff = np.where(usable, np.where(keep, w, 0.0), np.nan)
    n_use = int(usable.sum())
    seq_has = usable.any(axis=-1)
    lost = (usable & ~keep).any(axis=-1) & seq_has
    return {"correction": correction, "rule": CORRECTIONS[correction][1],
            "dropped_token_share": float((usable & ~keep).sum() / n_use) if n_use else float("nan"),
            "dropped_sequence_share": float(lost.sum() / seq_has.sum()) if seq_has.any() else float("nan"),
            "dropped_sequences": [int(i) for i in np.flatnonzero(lost)],
            "ess": float(weights_ess(eff, usable).value) if n_use else float("nan"),
            "max_weight": float(np.nanmax(eff)) if n_use else float("nan"),
            "n_usable": n_use, "n_zero_prob": int((real_tokens(d, mask) & ~usable).sum())}


def counterfactual_table(d: np.ndarray, mask: np.ndarray | None = None, *,
                         corrections: list[str] | None = None, log_mu: np.ndarray | None = None,
                         advantages: np.ndarray | None = None) -> list[dict[str, Any]]:
    """:func:`counterfactual_row` for every correction (default all of :data:`CORRECTIONS`, less
    those needing ``log_mu`` and ``advantages`` when they are not given).

    Parameters
    ----------
    d : numpy.ndarray
        ``log pi_old - log mu`` (nats), dims ``(sequence, position)``.
    mask : numpy.ndarray, optional
        Real tokens.
    corrections : list of str, optional
        Which corrections.
    log_mu : numpy.ndarray, optional
        The engine's log-probabilities.
    advantages : numpy.ndarray, optional
        One advantage per sequence.

    Returns
    -------
    list of dict
        One row per correction.
    """
    have = log_mu is not None and advantages is not None
    names = corrections or [c for c in CORRECTIONS if have or c not in NEEDS_ADVANTAGES]
    return [counterfactual_row(d, mask, correction=c, log_mu=log_mu, advantages=advantages) for c in names]


def would_hide(row: dict[str, Any], *, ess_min: float | None = None, dropped_max: float | None = None) -> bool:
    """Whether a correction leaves a batch looking healthy on the peers' dashboards: its ESS at
    least ``ess_min`` (default ``objective.ess_min``, verl's 0.3) and its dropped token share at
    most ``dropped_max`` (default ``objective.masked_fraction_max``). On a step whose attribution
    names a backend fault, such a correction hides that fault: the run trains on without a signal.

    Parameters
    ----------
    row : dict
        A :func:`counterfactual_row`.
    ess_min, dropped_max : float, optional
        The health rules.

    Returns
    -------
    bool
        Looks healthy (always False for ``none``, which corrects nothing).
    """
    if row["correction"] == "none":
        return False
    e = OBJECTIVE_DEFAULTS.ess_min if ess_min is None else ess_min
    m = OBJECTIVE_DEFAULTS.masked_fraction_max if dropped_max is None else dropped_max
    return bool(np.isfinite(row["ess"]) and row["ess"] >= e and row["dropped_token_share"] <= m)


__all__ = ["CORRECTIONS", "NEEDS_ADVANTAGES", "correction_weights", "counterfactual_row", "counterfactual_table", "would_hide"]
