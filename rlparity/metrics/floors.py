"""Floors: how far two readings of the same tokens are apart when nothing but the shape changed.

The backend gap ``d = log pi_old - log mu`` is judged against what each side produces on its own:

* the **trainer floor**: the same tokens rescored under two trainer shapes (batch 1 vs 16 vs 64,
  padded vs packed, eval vs train, sdpa vs eager, gradient checkpointing; see
  :class:`rlparity.config.settings.TrainerSettings`), :func:`trainer_floor` with ``dim=``; every rescoring also
  records a small self-check of its own (``attrs["trainer"]["self_check"]``);
* the **engine floor**: the same requests sampled again in another batch composition
  (``attrs["engine_floor"]``, :func:`rlparity.capture.floor.engine_floor`);

and :func:`floor_table` puts every shape of a floor run (:mod:`rlparity.experiments.floors`) beside the
backend gap with the share of the gap the trainer alone produces. Units: nats of log-probability.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide
from rlparity.config.provenance import make_attrs
from rlparity.metrics import core
from rlparity.metrics.floor_records import floors_beside_gap, recorded_floors, version_floors  # noqa: F401 (re-exported)
from rlparity.metrics.summary import _require_trainer, log_ratio, reduce, trainer_variable
from rlparity.trace import arm_record

FLOOR_VARIABLES = {"floor_mean_abs": "mean |a - b| over tokens", "floor_rms": "RMS of a - b",
                   "floor_max_abs": "max |a - b|", "n_tokens": "tokens finite in both readings"}


def floor_stats(a: np.ndarray, b: np.ndarray, mask: np.ndarray, axis=None) -> dict[str, np.ndarray]:
    """Numpy core: ``|a - b|`` reduced over ``axis`` on the real tokens where both are finite:
    ``floor_mean_abs``, ``floor_rms``, ``floor_max_abs``, ``n_tokens``.

    Parameters
    ----------
    a : numpy.ndarray
        One reading's log-probabilities.
    b : numpy.ndarray
        The other reading's.
    mask : numpy.ndarray
        Boolean, real tokens.
    axis : int or tuple of int, optional
        Axes reduced (``None``: all).

    Returns
    -------
    dict[str, np.ndarray]
    """
    d = np.asarray(a, float) - np.asarray(b, float)
    m = core.finite_mask(d, mask)
    return {"floor_mean_abs": core.masked_mean(np.abs(d), m, axis=axis), "floor_rms": core.masked_rms(d, m, axis=axis),
            "floor_max_abs": core.masked_max_abs(d, m, axis=axis), "n_tokens": core.count(m, axis=axis)}


def trainer_floor(a: xr.Dataset, b: xr.Dataset, *, trainer: TrainerSide | None = None,
                  dim: str | Sequence[str] | None = None) -> xr.Dataset:
    """The floor between two rescorings ``a`` and ``b`` of the same trace (e.g. batch 1 and batch
    16): ``|log pi_a - log pi_b|`` of the ``trainer`` reading reduced over ``dim`` (``None``: one
    value; ``"position"``: one per sequence; ``"sequence"``: one per position), nats.

    Parameters
    ----------
    a : xarray.Dataset
        One rescoring of the trace.
    b : xarray.Dataset
        Another rescoring of the same tokens.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    dim : str or sequence of str, optional
        Token dims reduced (``None``: every token; ``"position"``: one value per sequence;
        ``"sequence"``: one per position).

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    TraceValidationError
        If either side lacks the ``trainer`` reading (not scored, or scored with the other one).
    ValueError
        If the two are not readings of the same tokens.
    """
    var = trainer_variable(trainer)
    for side in (a, b):
        _require_trainer(side, var)
    if a.sizes != b.sizes or not np.array_equal(a["token_id"].values, b["token_id"].values):
        raise ValueError("the two readings are not of the same tokens: rescore one trace twice")
    mask = a["response_mask"] & b["response_mask"]
    out = xr.Dataset({k: reduce(lambda x, y, m, axis, k=k: floor_stats(x, y, m, axis=axis)[k], a[var], b[var], mask,
                                dim=dim) for k in FLOOR_VARIABLES})
    for k, long in FLOOR_VARIABLES.items():
        out[k].attrs = {"long_name": long, "units": "tokens" if k == "n_tokens" else "nats"}
    out.attrs = make_attrs(reading=var, shape_a=arm_record(a).scorer.shape, shape_b=arm_record(b).scorer.shape)
    return out


def floor_table(arms: Mapping[str, xr.Dataset], reference: str, *, trainer: TrainerSide | None = None,
                dim: str | Sequence[str] | None = None) -> xr.Dataset:
    """One row per trainer shape: its floor against a reference shape beside the backend gap.

    Per shape (dim ``shape``): its floor against the ``reference`` shape (mean, RMS and max
    ``|delta|``, :func:`trainer_floor`), the backend gap of the reference (mean ``|d|``), the share
    of the gap the trainer's shape alone produces, and the scoring's speed (``tokens_per_s``, from
    the scorer's ``score_s``; relative to the reference in ``relative_throughput``: a property of
    the whole rescoring, never reduced). The floors, the gap and the share are reduced over ``dim``.

    Parameters
    ----------
    arms : mapping
        ``{shape name: trace}``, rescorings of the same trace (:mod:`rlparity.experiments.floors`).
    reference : str
        The shape the others are compared with.
    trainer : {"processed", "raw"}, optional
        The trainer reading (default ``defaults().trainer``).
    dim : str or sequence of str, optional
        Token dims reduced: ``None`` (default, every token), ``"position"`` (one value per
        sequence) or ``"sequence"`` (one per position).

    Returns
    -------
    xarray.Dataset
        Dim ``shape`` plus the dims not reduced; provenance and the shapes in attrs.
    """
    if reference not in arms:
        raise ValueError(f"reference {reference!r} is not one of the shapes {sorted(arms)}")
    ref = arms[reference]
    mask = ref["response_mask"].astype(bool)
    gap = reduce(lambda x, m, axis: core.masked_mean(np.abs(x), m, axis=axis), log_ratio(ref, trainer), mask, dim=dim)
    n_tok = int(mask.sum())
    rows = {}
    for name, ds in arms.items():
        f = trainer_floor(ref, ds, trainer=trainer, dim=dim)
        sec = float(arm_record(ds).scorer.score_s or np.nan)
        rows[name] = {**{k: f[k].astype(float) for k in FLOOR_VARIABLES},
                      "tokens_per_s": xr.DataArray(n_tok / sec if sec > 0 else np.nan)}
    names = list(rows)
    shape = xr.DataArray(names, dims="shape", name="shape")
    table = xr.Dataset({k: xr.concat([rows[n][k].drop_attrs() for n in names], dim=shape) for k in rows[names[0]]})
    table["gap_mean_abs_d"] = gap.drop_attrs()
    table["share_of_gap"] = (table["floor_mean_abs"] / gap.where(gap > 0)).drop_attrs()
    table["relative_throughput"] = table["tokens_per_s"] / table["tokens_per_s"].sel(shape=reference)
    for k, long in {**FLOOR_VARIABLES, "gap_mean_abs_d": "backend gap of the reference shape: mean |d|",
                    "share_of_gap": "floor over the backend gap (mean |delta| / mean |d|)",
                    "tokens_per_s": "rescoring throughput", "relative_throughput": "throughput over the reference's"
                    }.items():
        table[k].attrs["long_name"] = long
    table.attrs = make_attrs(reference=reference, reading=trainer_variable(trainer),
                             shapes={n: arm_record(arms[n]).scorer.shape for n in names},
                             engine_floor=arm_record(ref).engine_floor)
    return table


__all__ = ["FLOOR_VARIABLES", "floor_stats", "floor_table", "floors_beside_gap", "recorded_floors", "trainer_floor",
           "version_floors"]
