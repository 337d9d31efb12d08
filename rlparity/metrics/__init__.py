"""Metrics: a numpy core over axes (:mod:`rlparity.metrics.core`), a thin xarray layer with
``dim=`` (:mod:`~rlparity.metrics.summary`), and the tables the diagnoses and plots read
(:mod:`~rlparity.metrics.semantic`, :mod:`~rlparity.metrics.ablation`, :mod:`~rlparity.metrics.head_precision`).

Every metric names its pair and direction in its attrs: the backend pair is ``(pi_old, mu)`` =
(trainer, rollout engine) and ``d = log pi_old - log mu`` (nats). Importing this package
registers the ``Dataset.parity`` accessor (``trace.parity.summary(dim="sequence")``).
"""

from rlparity.metrics import accessor as _accessor  # noqa: F401  (registers Dataset.parity)
from rlparity.metrics import core, objective
from rlparity.metrics.dashboard.traces import DASHBOARDS, as_dashboard
from rlparity.metrics.semantic import by_temperature, effective_temperature, temperature_table, zero_prob_tokens
from rlparity.metrics.summary import (
    BACKEND_PAIR,
    BACKEND_PAIR_D,
    SUMMARY_VARIABLES,
    TRAINER_VARIABLE,
    format_summary,
    format_summary_table,
    log_ratio,
    pair_attrs,
    reduce,
    scalars,
    summary,
    table_records,
    trainer_readings,
    trainer_side,
    trainer_variable,
)

__all__ = ["BACKEND_PAIR", "BACKEND_PAIR_D", "DASHBOARDS", "SUMMARY_VARIABLES", "TRAINER_VARIABLE", "as_dashboard", "by_temperature", "effective_temperature",
           "core", "format_summary", "format_summary_table", "log_ratio", "objective", "pair_attrs", "reduce", "scalars", "summary", "table_records", "temperature_table", "trainer_readings", "trainer_side", "trainer_variable",
           "zero_prob_tokens"]
