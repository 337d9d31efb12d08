"""Policy losses on per-sequence token log-probabilities (torch), as trainers write them.

``logp`` are the trainer's log-probabilities of the sampled tokens under the current weights
(with gradient), ``logp_old`` the same detached at the start of the step (pi_old), ``adv`` one
advantage per sequence, ``weights`` optional per-token correction weights (e.g. token TIS,
detached), ``keep`` which tokens take part.

* ``"ppo"``: token clipped surrogate ``-min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``,
  ``r = exp(logp - logp_old)``, averaged over all kept tokens of the batch (token mean);
* ``"grpo"``: the same per token, averaged per sequence then over sequences (GRPO's
  sequence-mean of token-means);
* ``"gspo"``: the GSPO sequence surrogate with ``s_i = exp(mean_t (logp - logp_old))`` clipped to
  ``[1 - eps_low, 1 + eps_high]``, averaged over sequences; a token weight enters as its
  sequence's mean weight.
"""

from __future__ import annotations

from typing import Literal

LossName = Literal["ppo", "grpo", "gspo"]
LOSSES = ("ppo", "grpo", "gspo")


def clip_range(loss: str) -> tuple[float, float]:
    """The clip range ``(eps_low, eps_high)`` of a policy loss.

    The values come from :func:`rlparity.config.defaults`: the PPO/GRPO token clip ``eps`` (the
    same on both sides), the GSPO sequence clip ``objective.gspo_eps_low/high``.

    Parameters
    ----------
    loss : str
        The loss name, one of :data:`LOSSES` (``"ppo"``, ``"grpo"``, ``"gspo"``).

    Returns
    -------
    tuple of (float, float)
        ``(eps_low, eps_high)``: the ratio is clipped to ``[1 - eps_low, 1 + eps_high]``.

    Raises
    ------
    ValueError
        If ``loss`` is not one of :data:`LOSSES`.
    """
    from rlparity.config.defaults import defaults

    d = defaults()
    if loss == "gspo":
        return (d.objective.gspo_eps_low, d.objective.gspo_eps_high)
    if loss in ("ppo", "grpo"):
        return (d.eps, d.eps)
    raise ValueError(f"loss={loss!r}; use one of {', '.join(LOSSES)}")


def sequence_terms(loss: str, logp, logp_old, adv: float, eps_low: float, eps_high: float,
                   weights=None):
    """One sequence's contribution to a policy loss, before the batch normalisation.

    For ``ppo`` / ``grpo`` the token clipped surrogate summed over the sequence's tokens; for
    ``gspo`` the sequence surrogate of ``s = exp(mean_t (logp - logp_old))``, weighted by the
    sequence's mean token weight. ``logp`` / ``logp_old`` / ``weights`` hold the kept tokens only.

    Parameters
    ----------
    loss : str
        The loss name, one of :data:`LOSSES`.
    logp : torch.Tensor
        The trainer's log-probabilities (nats) of the sequence's kept tokens under the current
        weights, with gradient.
    logp_old : torch.Tensor
        The same log-probabilities at the start of the step (pi_old, detached), in nats.
    adv : float
        The sequence's advantage.
    eps_low : float
        Lower clip: ratios below ``1 - eps_low`` are clipped.
    eps_high : float
        Upper clip: ratios above ``1 + eps_high`` are clipped.
    weights : torch.Tensor, optional
        Per-token correction weights (e.g. token TIS, detached); ``None`` weighs every token 1.

    Returns
    -------
    term : torch.Tensor
        The sum of token losses (``ppo`` / ``grpo``) or the sequence loss (``gspo``), a scalar.
    count : int
        The number of tokens (``ppo`` / ``grpo``) or 1 (``gspo``), for the normalisation.
    clipped : int
        How many tokens (or, for ``gspo``, whether the sequence) lay outside the clip range.

    Raises
    ------
    ValueError
        If ``loss`` is not one of :data:`LOSSES`.
    """
    import torch

    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r}; use one of {LOSSES}")
    log_r = logp - logp_old
    if loss == "gspo":
        s = torch.exp(log_r.mean())
        w = weights.mean() if weights is not None else 1.0
        clipped = s.clamp(1 - eps_low, 1 + eps_high)
        term = -torch.minimum(s * adv, clipped * adv) * w
        return term, 1, int(bool((s < 1 - eps_low) | (s > 1 + eps_high)))
    r = torch.exp(log_r)
    clipped = r.clamp(1 - eps_low, 1 + eps_high)
    per_tok = -torch.minimum(r * adv, clipped * adv)
    if weights is not None:
        per_tok = per_tok * weights
    return per_tok.sum(), int(logp.numel()), int(((r < 1 - eps_low) | (r > 1 + eps_high)).sum())


__all__ = ["LOSSES", "LossName", "clip_range", "sequence_terms"]
