"""``Dataset.parity``: the metrics of a trace as methods (``trace.parity.summary(dim="sequence")``)."""

from __future__ import annotations

from collections.abc import Sequence

import xarray as xr

from rlparity.config.defaults import TrainerSide


@xr.register_dataset_accessor("parity")
class ParityAccessor:
    """Metrics of one trace: ``trace.parity.log_ratio()``, ``trace.parity.summary(dim=...)``,
    ``trace.parity.by_temperature()``, ``trace.parity.zero_prob_tokens()``, ``print(trace.parity)``."""

    def __init__(self, ds: xr.Dataset):
        self._ds = ds

    def log_ratio(self, trainer: TrainerSide | None = None) -> xr.DataArray:
        from rlparity.metrics.summary import log_ratio

        return log_ratio(self._ds, trainer)

    def summary(self, trainer: TrainerSide | None = None, eps: float | None = None, *,
                dim: str | Sequence[str] | None = None) -> xr.Dataset:
        from rlparity.metrics.summary import summary

        return summary(self._ds, trainer, eps, dim=dim)

    def by_temperature(self, trainer: TrainerSide | None = None) -> xr.Dataset:
        from rlparity.metrics.semantic import by_temperature

        return by_temperature(self._ds, trainer)

    def zero_prob_tokens(self, trainer: TrainerSide | None = None) -> xr.Dataset:
        from rlparity.metrics.semantic import zero_prob_tokens

        return zero_prob_tokens(self._ds, trainer)

    def __str__(self) -> str:
        from rlparity.metrics.summary import format_summary

        return format_summary(self._ds)
