"""Stand-ins for the heavy imports of the copied writer code (scripts/peers/*.py).

prime-rl's token_export.py imports its config classes, its loss module and its logger; only
``DefaultLossConfig``'s two DPPO mask thresholds and ``compute_importance_ratio_and_mismatch_kl``
are used by the exporter. The function below is copied from PrimeIntellect-ai/prime-rl,
src/prime_rl/trainer/rl/loss.py at commit 559b44772e471d1538537b8805cc77f3824a5e64 (Apache License
2.0); the defaults of the thresholds are those of
packages/prime-rl-configs/src/prime_rl/configs/trainer.py at that commit.
"""

from __future__ import annotations

import logging
import sys
import types
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class DefaultLossConfig:
    dppo_mask_low: float = 0.2
    dppo_mask_high: float = 0.2


def compute_importance_ratio_and_mismatch_kl(
    trainer_logprobs: Tensor, inference_logprobs: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    mismatch_kl = importance_ratio - log_importance_ratio - 1
    return log_importance_ratio, importance_ratio, mismatch_kl


def install_prime_rl() -> None:
    """Register the ``prime_rl.*`` modules token_export.py imports (nothing else of prime-rl)."""
    for name in ("prime_rl", "prime_rl.configs", "prime_rl.configs.trainer", "prime_rl.trainer",
                 "prime_rl.trainer.rl", "prime_rl.trainer.rl.loss", "prime_rl.utils", "prime_rl.utils.logger"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["prime_rl.configs.trainer"].DefaultLossConfig = DefaultLossConfig
    sys.modules["prime_rl.configs.trainer"].TrainerConfig = object
    sys.modules["prime_rl.trainer.rl.loss"].compute_importance_ratio_and_mismatch_kl = \
        compute_importance_ratio_and_mismatch_kl
    sys.modules["prime_rl.utils.logger"].get_logger = logging.getLogger
