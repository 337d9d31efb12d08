"""``Dataset.parity``: the metrics of a trace as methods (``trace.parity.summary(dim="sequence")``)."""

from __future__ import annotations

from collections.abc import Sequence

import xarray as xr

from rlparity.config.defaults import TrainerSide


@xr.register_dataset_accessor("parity")
class ParityAccessor:
    """Metrics of one trace as methods of ``Dataset.parity``.

    ``trace.parity.log_ratio()``, ``trace.parity.summary(dim=...)``,
    ``trace.parity.by_temperature()``, ``trace.parity.zero_prob_tokens()``, ``print(trace.parity)``
    (:func:`~rlparity.metrics.summary.format_summary`).

    Parameters
    ----------
    ds : xarray.Dataset
        The trace (xarray passes it when ``trace.parity`` is first read).
    """

    def __init__(self, ds: xr.Dataset):
        self._ds = ds

    def log_ratio(self, trainer: TrainerSide | None = None) -> xr.DataArray:
        """:func:`rlparity.metrics.summary.log_ratio` of this trace.

        Parameters
        ----------
        trainer : {"processed", "raw"}, optional
            The trainer reading to compare with; ``None`` is ``defaults().trainer``.

        Returns
        -------
        xarray.DataArray
            Per-token ``d = log pi_old - log mu`` (nats).
        """
        from rlparity.metrics.summary import log_ratio

        return log_ratio(self._ds, trainer)

    def summary(self, trainer: TrainerSide | None = None, eps: float | None = None, *,
                dim: str | Sequence[str] | None = None) -> xr.Dataset:
        """:func:`rlparity.metrics.summary.summary` of this trace.

        Parameters
        ----------
        trainer : {"processed", "raw"}, optional
            The trainer reading to compare with; ``None`` is ``defaults().trainer``.
        eps : float, optional
            PPO clip range; ``None`` is ``defaults().eps``.
        dim : str, sequence of str or None, default None
            Token dims to reduce; ``None`` reduces both.

        Returns
        -------
        xarray.Dataset
            The parity summary.
        """
        from rlparity.metrics.summary import summary

        return summary(self._ds, trainer, eps, dim=dim)

    def by_temperature(self, trainer: TrainerSide | None = None) -> xr.Dataset:
        """:func:`rlparity.metrics.semantic.by_temperature` of this trace.

        Parameters
        ----------
        trainer : {"processed", "raw"}, optional
            The trainer reading to compare with; ``None`` is ``defaults().trainer``.

        Returns
        -------
        xarray.Dataset
            Token stats of d by temperature.
        """
        from rlparity.metrics.semantic import by_temperature

        return by_temperature(self._ds, trainer)

    def zero_prob_tokens(self, trainer: TrainerSide | None = None) -> xr.Dataset:
        """:func:`rlparity.metrics.semantic.zero_prob_tokens` of this trace.

        Parameters
        ----------
        trainer : {"processed", "raw"}, optional
            The trainer reading to compare with; ``None`` is ``defaults().trainer``.

        Returns
        -------
        xarray.Dataset
            One row per probability-0 token, with its cause.
        """
        from rlparity.metrics.semantic import zero_prob_tokens

        return zero_prob_tokens(self._ds, trainer)

    def __str__(self) -> str:
        from rlparity.metrics.summary import format_summary

        return format_summary(self._ds)
