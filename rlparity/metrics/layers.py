"""The divergence profile: where, layer by layer and module by module, the engine's states part
from the reference's (the trainer's, or another arm's engine).

numpy core:

* :func:`site_errors`: per site and position, the RMS (over the hidden dimension, or the vocabulary
  columns of ``lm_head``) of the engine's state minus the reference's, and the RMS of the
  reference's state, from a layer capture of each side on the same tokens (float64);
* :func:`pooled_relative_error`: ``sqrt(sum diff_rms^2 / sum state_rms^2)`` over axes (NaN
  entries, positions not computed, left out): the relative error of the stacked states.

xarray layer (a trace or a layer dataset, :mod:`rlparity.trace.layers`):

* :func:`relative_error`: pooled over ``dim`` (default: every sequence and position: one value
  per site; ``dim="full_position"``: one per site and sequence; ``dim=()``: per position);
* :func:`floor_from`: the per-site relative error of clean parity captures (the floor);
* :func:`divergence_table`: per site the relative error, its floor, the threshold
  ``max(floor_ratio x floor, min_rel)`` and whether the site leaves its floor;
* :func:`profile_table`: per arm and site the relative error and the floor (what the figure draws);
* :func:`first_divergence`: the first site (in data-flow order) that leaves its floor, with the
  sequences and positions that leave it there.

Relative errors are dimensionless (RMS of the difference over RMS of the state).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import defaults
from rlparity.trace.layers import LAYER_VARS, POSITION_DIM, SEQUENCE_DIM, SITE_DIM, has_layers, site_list
from rlparity.trace import arm_record

# ------------------------------------------------------------------------------- numpy core
def site_errors(engine: Mapping[str, Any], reference: Mapping[str, Any], length: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per site and position: the RMS of the engine's state minus the reference's, and the reference's.

    Computed in float64, over the hidden dimension (or the vocabulary columns of ``lm_head``).

    Parameters
    ----------
    engine : Mapping[str, Any]
        ``states`` ``(n_sites - 1, T, H)`` at ``positions`` ``(T,)`` (default every position) and
        ``logits`` ``(T, V')``.
    reference : Mapping[str, Any]
        ``states`` ``(n_sites - 1, length, H)`` and ``logits`` ``(length, V')`` (every position).
    length : int
        Positions of the sequence.

    Returns
    -------
    diff_rms : numpy.ndarray
        ``(n_sites, length)`` float64, NaN at positions the engine did not compute.
    state_rms : numpy.ndarray
        ``(n_sites, length)`` float64, the reference state's RMS, NaN likewise.

    Raises
    ------
    ValueError
        The reference does not cover every position, or the two sides' shapes differ.
    """
    es, rs = np.asarray(engine["states"], dtype=np.float64), np.asarray(reference["states"], dtype=np.float64)
    el, rl = np.asarray(engine["logits"], dtype=np.float64), np.asarray(reference["logits"], dtype=np.float64)
    pos = np.asarray(engine.get("positions", np.arange(es.shape[1])), dtype=np.int64)
    if rs.shape[1] != length or rl.shape[0] != length:
        raise ValueError(f"the reference covers {rs.shape[1]} positions, expected {length} (every position)")
    if es.shape[0] != rs.shape[0] or es.shape[2] != rs.shape[2] or el.shape[1] != rl.shape[1]:
        raise ValueError(f"engine states {es.shape} / logits {el.shape} do not match the reference's "
                         f"{rs.shape} / {rl.shape}: both sides must run the same model and vocabulary columns")
    n = es.shape[0] + 1
    diff, state = np.full((n, length), np.nan), np.full((n, length), np.nan)
    diff[:-1, pos] = np.sqrt(np.mean((es - rs[:, pos]) ** 2, axis=-1))
    state[:-1, pos] = np.sqrt(np.mean(rs[:, pos] ** 2, axis=-1))
    diff[-1, pos] = np.sqrt(np.mean((el - rl[pos]) ** 2, axis=-1))
    state[-1, pos] = np.sqrt(np.mean(rl[pos] ** 2, axis=-1))
    return diff, state


def pooled_relative_error(diff_rms: np.ndarray, state_rms: np.ndarray, axis: int | tuple[int, ...] | None = None
                          ) -> np.ndarray:
    """``sqrt(sum diff^2 / sum state^2)`` over ``axis``, entries where either is NaN left out.

    Parameters
    ----------
    diff_rms : numpy.ndarray
        RMS of the difference per entry.
    state_rms : numpy.ndarray
        RMS of the reference state per entry, the shape of ``diff_rms``.
    axis : int, tuple of int or None, default None
        Axes to pool; ``None`` pools all.

    Returns
    -------
    numpy.ndarray
        The relative error (dimensionless); NaN where nothing is left, 0 where the states are all
        zero and equal, inf where they are zero but differ.
    """
    d, s = np.asarray(diff_rms, dtype=np.float64), np.asarray(state_rms, dtype=np.float64)
    ok = np.isfinite(d) & np.isfinite(s)
    num = np.where(ok, d * d, 0.0).sum(axis=axis)
    den = np.where(ok, s * s, 0.0).sum(axis=axis)
    n = ok.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(den > 0, np.sqrt(num / np.where(den > 0, den, 1.0)), np.where(num > 0, np.inf, 0.0))
    return np.where(n > 0, out, np.nan)


# ------------------------------------------------------------------------------- xarray layer
def _layers(data: xr.Dataset) -> xr.Dataset:
    """``data`` if it holds a whole layer profile (every variable the judging reads, with its dims);
    else a :class:`~rlparity.trace.TraceValidationError` naming what is missing."""
    from rlparity.trace import TraceValidationError

    if not has_layers(data):
        raise TraceValidationError("no layer profile (layer_diff_rms): run a layer capture first (`rlparity layers`)")
    needed = ("layer_diff_rms", "layer_state_rms", "layer_floor", "layer_cached")
    bad = [k for k in needed if k not in data.variables or data[k].dims != LAYER_VARS[k][0]]
    if bad:
        raise TraceValidationError(f"the layer profile is incomplete: {bad} missing or not over "
                                   f"{[LAYER_VARS[k][0] for k in bad]}; record it again with `rlparity layers run`")
    return data


def relative_error(data: xr.Dataset, dim: str | Sequence[str] | None = None) -> xr.DataArray:
    """Pooled relative error of the states, reduced over ``dim``.

    Parameters
    ----------
    data : xarray.Dataset
        A trace or layer dataset with a layer profile (``layer_diff_rms``, ``layer_state_rms``).
    dim : str, sequence of str or None, default None
        ``"layer_sequence"`` and/or ``"full_position"``; ``None`` pools both (one value per site),
        ``()`` keeps every position.

    Returns
    -------
    xarray.DataArray
        ``relative_error`` (dimensionless) with a ``comparison`` attr (trainer or engine).

    Raises
    ------
    ValueError
        No layer profile, or a dim that cannot be reduced.
    """
    ds = _layers(data)
    dims = (SEQUENCE_DIM, POSITION_DIM) if dim is None else ((dim,) if isinstance(dim, str) else tuple(dim))
    bad = [d for d in dims if d not in (SEQUENCE_DIM, POSITION_DIM)]
    if bad:
        raise ValueError(f"dim {bad} cannot be reduced: use {SEQUENCE_DIM!r} and/or {POSITION_DIM!r}")
    if not dims:
        with np.errstate(divide="ignore", invalid="ignore"):
            out = ds["layer_diff_rms"] / ds["layer_state_rms"]
    else:
        out = xr.apply_ufunc(pooled_relative_error, ds["layer_diff_rms"], ds["layer_state_rms"],
                             input_core_dims=[list(dims), list(dims)], kwargs={"axis": tuple(range(-len(dims), 0))})
    return out.rename("relative_error").assign_attrs(
        long_name="RMS of the engine's state minus the reference's, over RMS of the reference's state",
        units="1", comparison=(arm_record(ds).layer_capture or {}).get("comparison", "trainer"))


def floor_from(clean: xr.Dataset | Iterable[xr.Dataset]) -> xr.DataArray:
    """The floor per site: the pooled relative error of clean parity captures.

    Of one capture, or the largest over several (e.g. clean captures on other prompts, or two runs
    of the reference).

    Parameters
    ----------
    clean : xarray.Dataset or iterable of xarray.Dataset
        Clean layer profiles of the same sites.

    Returns
    -------
    xarray.DataArray
        ``layer_floor`` per site (dimensionless).

    Raises
    ------
    ValueError
        No profile given, or one without a layer profile.
    """
    items = [clean] if isinstance(clean, xr.Dataset) else list(clean)
    if not items:
        raise ValueError("floor_from needs at least one clean layer profile")
    errs = [relative_error(ds) for ds in items]
    out = xr.concat(errs, dim="capture").max("capture")
    return out.rename("layer_floor").assign_attrs(long_name="relative error a clean parity capture reaches",
                                                 units="1", n_captures=len(items))


def divergence_table(data: xr.Dataset, *, floor: xr.DataArray | np.ndarray | None = None,
                     floor_ratio: float | None = None, min_rel: float | None = None) -> xr.Dataset:
    """Per site: the relative error, its floor, the threshold and whether the site leaves its floor.

    ``threshold`` = ``max(floor_ratio x floor, min_rel)``. A site without a measured floor (NaN) is
    judged against ``min_rel`` only.

    Parameters
    ----------
    data : xarray.Dataset
        A trace or layer dataset with a layer profile.
    floor : xarray.DataArray or numpy.ndarray, optional
        The floor per site; ``None`` takes the profile's ``layer_floor``.
    floor_ratio : float, optional
        Times the floor a site must exceed; ``None`` is ``defaults().layer_floor_ratio``.
    min_rel : float, optional
        Relative error under which a site never counts as diverging; ``None`` is
        ``defaults().layer_min_rel``.

    Returns
    -------
    xarray.Dataset
        Per site: ``relative_error``, ``floor``, ``threshold``, ``ratio_to_floor`` and ``over``; attrs
        ``floor_ratio``, ``min_rel``, ``floor_measured``.
    """
    ds = _layers(data)
    ratio = defaults().layer_floor_ratio if floor_ratio is None else float(floor_ratio)
    least = defaults().layer_min_rel if min_rel is None else float(min_rel)
    rel = relative_error(ds)
    fl = ds["layer_floor"] if floor is None else xr.DataArray(np.asarray(floor, dtype=np.float64), dims=(SITE_DIM,),
                                                                coords={SITE_DIM: ds[SITE_DIM]})
    thr = np.maximum(ratio * fl.fillna(0.0), least)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2f = rel / fl.where(fl > 0)
    out = xr.Dataset({"relative_error": rel, "floor": fl, "threshold": thr, "ratio_to_floor": r2f,
                      "over": rel > thr})
    return out.assign_attrs(floor_ratio=ratio, min_rel=least, floor_measured=bool(np.isfinite(fl.values).any()))


def first_divergence(data: xr.Dataset, *, floor: xr.DataArray | np.ndarray | None = None,
                     floor_ratio: float | None = None, min_rel: float | None = None) -> dict[str, Any] | None:
    """The first site (data-flow order) whose pooled relative error leaves its floor.

    Parameters
    ----------
    data : xarray.Dataset
        A trace or layer dataset with a layer profile.
    floor : xarray.DataArray or numpy.ndarray, optional
        The floor per site; ``None`` takes the profile's ``layer_floor``.
    floor_ratio : float, optional
        Times the floor a site must exceed; ``None`` is ``defaults().layer_floor_ratio``.
    min_rel : float, optional
        Relative error under which a site never counts as diverging; ``None`` is
        ``defaults().layer_min_rel``.

    Returns
    -------
    dict[str, Any] or None
        ``None`` where no site leaves its floor; else ``site``, ``index``, ``layer``, ``module``,
        ``relative_error``, ``floor``, ``threshold``, ``ratio_to_floor``, ``sequences`` (per sequence:
        whether it diverges there, its first divergent position, positions over the threshold, cached
        positions), ``position_0_over``, ``position_0_computed``, ``max_ratio_before``,
        ``max_relative_error_before``, ``floor_ratio`` and ``min_rel``.
    """
    table = divergence_table(data, floor=floor, floor_ratio=floor_ratio, min_rel=min_rel)
    over = table["over"].values
    if not over.any():
        return None
    k = int(np.flatnonzero(over)[0])
    ds = _layers(data)
    layer, module = site_list(ds)[k]
    thr = float(table["threshold"].values[k])
    d = ds["layer_diff_rms"].values[k]
    s = ds["layer_state_rms"].values[k]
    per_seq = pooled_relative_error(d, s, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_pos = d / s
    seqs = []
    for i in range(d.shape[0]):
        hot = np.flatnonzero(np.isfinite(per_pos[i]) & (per_pos[i] > thr))
        seqs.append({"diverges": bool(per_seq[i] > thr), "relative_error": float(per_seq[i]),
                     "first_position": int(hot[0]) if hot.size else None, "n_positions_over": int(hot.size),
                     "n_positions": int(np.isfinite(per_pos[i]).sum()),
                     "cached": int(ds["layer_cached"].values[i])})
    pos0 = per_pos[:, 0]
    before = table["ratio_to_floor"].values[:k]
    rel_before = table["relative_error"].values[:k]
    return {"site": str(ds[SITE_DIM].values[k]), "index": k, "layer": int(layer), "module": str(module),
            "relative_error": float(table["relative_error"].values[k]), "floor": float(table["floor"].values[k]),
            "threshold": thr, "ratio_to_floor": float(table["ratio_to_floor"].values[k]),
            "sequences": seqs,
            "position_0_over": bool(np.any(np.isfinite(pos0) & (pos0 > thr))),
            "position_0_computed": bool(np.isfinite(pos0).any()),
            "max_ratio_before": float(np.nanmax(before)) if np.isfinite(before).any() else float("nan"),
            "max_relative_error_before": float(np.nanmax(rel_before)) if np.isfinite(rel_before).any() else float("nan"),
            "floor_ratio": float(table.attrs["floor_ratio"]), "min_rel": float(table.attrs["min_rel"])}


def profile_table(arms: Mapping[str, xr.Dataset]) -> xr.Dataset:
    """Per arm and site (dims ``arm``, ``site``): the pooled relative error and the floor.

    Of every arm with a layer profile (the same sites in every arm), and per arm what it was compared
    with (``comparison``: trainer or engine).

    Parameters
    ----------
    arms : Mapping[str, xarray.Dataset]
        The arms; those without a layer profile are left out.

    Returns
    -------
    xarray.Dataset
        ``relative_error``, ``floor`` (over ``arm`` and ``site``) and ``comparison`` (over ``arm``).

    Raises
    ------
    ValueError
        No arm has a layer profile, or the arms cover different sites.
    """
    names = [a for a, ds in arms.items() if has_layers(ds)]
    if not names:
        raise ValueError("no arm carries a layer profile: run a layer capture first (`rlparity layers run`)")
    sites_ = [tuple(site_list(arms[a])) for a in names]
    if len(set(sites_)) > 1:
        raise ValueError("the arms' profiles cover different sites (different models): compare one model at a time")
    rel = xr.concat([relative_error(arms[a]) for a in names], dim="arm")
    fl = xr.concat([arms[a]["layer_floor"] for a in names], dim="arm")
    comp = [(arm_record(arms[a]).layer_capture or {}).get("comparison", "trainer") for a in names]
    return xr.Dataset({"relative_error": rel, "floor": fl, "comparison": ("arm", np.array(comp, dtype=str))},
                      coords={"arm": names})


def within_floor(data: xr.Dataset, **kw: Any) -> dict[str, float]:
    """How close a profile stays to its floor.

    For a clean arm, the statement "within its floor at every layer" is
    ``max_ratio_to_floor < floor_ratio``.

    Parameters
    ----------
    data : xarray.Dataset
        A trace or layer dataset with a layer profile.
    **kw : Any
        ``floor``, ``floor_ratio``, ``min_rel`` of :func:`divergence_table`.

    Returns
    -------
    dict[str, float]
        ``max_ratio_to_floor`` (the largest ``relative_error / floor`` over sites), ``at_site`` (its
        site), ``max_relative_error`` and ``n_sites_over``.
    """
    table = divergence_table(data, **kw)
    r = table["ratio_to_floor"].values
    k = int(np.nanargmax(r)) if np.isfinite(r).any() else 0
    return {"max_ratio_to_floor": float(np.nanmax(r)) if np.isfinite(r).any() else float("nan"),
            "at_site": str(table[SITE_DIM].values[k]),
            "max_relative_error": float(np.nanmax(table["relative_error"].values)),
            "n_sites_over": int(table["over"].values.sum())}


__all__ = ["divergence_table", "first_divergence", "floor_from", "pooled_relative_error", "profile_table",
           "relative_error", "site_errors", "within_floor"]
