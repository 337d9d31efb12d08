"""The objective layer's names and thresholds: the rule names, and :data:`OBJECTIVE_DEFAULTS`, the
defaults in effect (read from :func:`rlparity.config.defaults` at each call)."""

from __future__ import annotations

from typing import Literal

from rlparity.config.defaults import Level, defaults

Kind = Literal["product", "geometric"]
PairName = Literal["backend", "update", "bypass"]
KL_RULES = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
            "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
BAND_RULES = ("token_band", "geometric_band", "product_band")
RULES = BAND_RULES + KL_RULES


class _ObjectiveDefaults:
    """The objective layer's defaults in effect: ``defaults().objective`` (see
    :class:`rlparity.config.ObjectiveDefaults`) plus the PPO clip range ``defaults().eps``; read at
    each call, so :func:`rlparity.config.defaults_context` applies."""

    def __getattr__(self, name: str):
        if name == "ppo_eps":
            return defaults().eps
        return getattr(defaults().objective, name)

    def eps(self, level: Level) -> tuple[float, float]:
        """(eps_low, eps_high) of the PPO token clip (``"token"``) or the GSPO sequence clip."""
        od = defaults().objective
        return (defaults().eps, defaults().eps) if level == "token" else (od.gspo_eps_low, od.gspo_eps_high)

    def band(self, rule: str) -> tuple[float, float]:
        return defaults().objective.band(rule)


OBJECTIVE_DEFAULTS = _ObjectiveDefaults()
