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
from rlparity.metrics.summary import _require_trainer, log_ratio, reduce, trainer_variable

FLOOR_VARIABLES = {"floor_mean_abs": "mean |a - b| over tokens", "floor_rms": "RMS of a - b",
                   "floor_max_abs": "max |a - b|", "n_tokens": "tokens finite in both readings"}


def recorded_floors(trace: xr.Dataset, side: str = "processed") -> dict[str, float]:
    """The floors a trace recorded (mean ``|x|`` and RMS, nats; NaN where not measured): the
    trainer's self-check (``batch_shape``: its batch vs alone; ``run_to_run``: alone twice; the
    latest version's for a trace scored per version) on the ``side`` reading, and the engine's batch
    spread (``engine_batch``, ``attrs["engine_floor"]``).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    side : {"processed", "raw"}
        The trainer reading.

    Returns
    -------
    dict[str, float]
    """
    t = trace.attrs.get("trainer") or {}
    check = t.get("self_check")
    if not check:
        per = t.get("self_check_per_version") or {}
        check = next((v for v in per.values() if v), None)
    out = {**_self_check_floors(check, side), "engine_batch_rms": float("nan"), "engine_batch_mean_abs": float("nan")}
    eng = (trace.attrs.get("engine_floor") or {}).get("batch_shape") or {}
    for stat in ("rms", "mean_abs"):
        if eng.get(stat) is not None:
            out[f"engine_batch_{stat}"] = float(eng[stat])
    return out


def _self_check_floors(check, side: str) -> dict[str, float]:
    """``batch_shape`` and ``run_to_run`` mean ``|x|`` and RMS of one self-check record (NaN where absent)."""
    out = {f"{k}_{s}": float("nan") for k in ("batch_shape", "run_to_run") for s in ("rms", "mean_abs")}
    if isinstance(check, Mapping):
        for key in ("batch_shape", "run_to_run"):
            v = check.get(f"{key}_{side}") or {}
            for stat in ("rms", "mean_abs"):
                if isinstance(v, Mapping) and v.get(stat) is not None:
                    out[f"{key}_{stat}"] = float(v[stat])
    return out


def version_floors(trace: xr.Dataset, side: str = "processed") -> dict[int, float]:
    """The trainer's batch-shape floor (mean ``|x|``, nats) at each policy version of a trace scored
    per version: what its self-check measured with that version's weights.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, scored per version (``attrs["trainer"]["self_check_per_version"]``).
    side : {"processed", "raw"}
        The trainer reading.

    Returns
    -------
    dict[int, float]
        ``{version: floor}`` for the versions whose self-check measured a finite floor above 0;
        empty when none was recorded.
    """
    per = (trace.attrs.get("trainer") or {}).get("self_check_per_version") or {}
    out = {}
    for v, check in per.items():
        f = _self_check_floors(check, side)["batch_shape_mean_abs"]
        if np.isfinite(f) and f > 0:
            out[int(v)] = f
    return out


def floors_beside_gap(trace: xr.Dataset, gap_mean_abs: float, side: str = "processed") -> dict[str, float]:
    """The recorded floors next to the backend gap (mean ``|d|``): ``trainer_floor``,
    ``engine_floor`` (mean ``|x|``, nats) and ``trainer_floor_share`` = the trainer's floor over the
    gap, the share of the gap the trainer alone produces (NaN where not measured).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    gap_mean_abs : float
        The backend gap, mean ``|d|`` (nats).
    side : {"processed", "raw"}
        The trainer reading.

    Returns
    -------
    dict[str, float]
    """
    f = recorded_floors(trace, side)
    tf, ef = f["batch_shape_mean_abs"], f["engine_batch_mean_abs"]
    return {"trainer_floor": tf, "engine_floor": ef,
            "trainer_floor_share": tf / gap_mean_abs if gap_mean_abs and gap_mean_abs > 0 else float("nan")}


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
    out.attrs = make_attrs(reading=var, shape_a=(a.attrs.get("trainer") or {}).get("shape"),
                           shape_b=(b.attrs.get("trainer") or {}).get("shape"))
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
        sec = float((ds.attrs.get("trainer") or {}).get("score_s") or np.nan)
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
                             shapes={n: (arms[n].attrs.get("trainer") or {}).get("shape") for n in names},
                             engine_floor=ref.attrs.get("engine_floor"))
    return table


__all__ = ["FLOOR_VARIABLES", "floor_stats", "floor_table", "floors_beside_gap", "recorded_floors", "trainer_floor",
           "version_floors"]
