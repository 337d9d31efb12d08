"""Experiment factors: the settings an arm was captured under, kept as data and assembled into
coordinates.

Each arm of an experiment records its factors in ``attrs["factors"]`` when it is captured, e.g.
``{"rollout_head": "float32", "trainer_head": "bfloat16"}`` (the LM-head matrix),
``{"mode": "keep", "clear_cache": False, "prefix_caching": True}`` (inflight weight updates) or
``{"profile": "vllm-v1-defaults", "old_policy": "mu", "step": 7}`` (an online RL run). The arm
name stays a label; code that needs a factor reads it here, never from the name.

* :func:`with_factors`: stamp an arm's factors (the runners call it);
* :func:`arm_factors`: one arm's factors (``{}`` for an arm that records none: the arm name is
  never read; a store from before factors converts its old head-matrix or inflight record on read;
  the shipped examples were re-saved with their factors);
* :func:`factors`: the factors of every arm, one coordinate each along ``arm``;
* :func:`by_factors`: one variable (or anything computed per arm) with the factors as dims, so a
  cell is ``.sel(mode="keep", clear_cache=False)``;
* :func:`stack_cells`: the same from ``{(value, ...): Dataset}`` with the dims named.

>>> from rlparity.datasets import load_example
>>> from rlparity.trace import by_factors
>>> lp = by_factors(load_example("h200-inflight"), "rollout_logprob")       # doctest: +SKIP
>>> lp.sel(mode="keep", clear_cache=False, prefix_caching=True)             # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.storage.zarr_io import as_arms

FACTORS_ATTR = "factors"


def with_factors(trace: xr.Dataset, **factors: Any) -> xr.Dataset:
    """``trace`` with ``factors`` recorded in ``attrs["factors"]`` (in place, and returned).

    Parameters
    ----------
    trace : xarray.Dataset
        The arm's trace.
    **factors : str, int, float or bool
        The arm's factors; values must be JSON scalars so a store keeps them (numpy scalars are
        converted).

    Returns
    -------
    xarray.Dataset
        ``trace`` itself.

    Raises
    ------
    TypeError
        A value is not a str, int, float or bool.
    """
    for k, v in factors.items():
        if not isinstance(v, (str, bool, int, float, np.generic)):
            raise TypeError(f"factor {k}={v!r}: use a str, int, float or bool")
    trace.attrs[FACTORS_ATTR] = {k: v.item() if isinstance(v, np.generic) else v for k, v in factors.items()}
    return trace


def arm_factors(trace: xr.Dataset) -> dict[str, Any]:
    """The factors of one arm: its ``attrs["factors"]``, or an old store's head-matrix or inflight record
    converted (the arm name is never read).

    Parameters
    ----------
    trace : xarray.Dataset
        The arm's trace.

    Returns
    -------
    dict[str, Any]
        The factors; ``{}`` for an arm that records none (an arm of no experiment).
    """
    rec = trace.attrs.get(FACTORS_ATTR)
    return dict(rec) if isinstance(rec, Mapping) else _old_record_factors(trace.attrs)


def _old_record_factors(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """An old store converted on read (issue 35): before ``attrs["factors"]``, the LM-head matrix kept its
    cell in ``attrs["head_experiment"]`` and the inflight matrix in ``attrs["inflight"]``. Records only;
    the arm name is never read, and an RL step's old record (no step in it) gives none."""
    from rlparity.config.settings import normalize_dtype

    head, inflight = attrs.get("head_experiment"), attrs.get("inflight")
    if isinstance(head, Mapping) and {"rollout_head", "trainer_head"} <= set(head):
        try:
            return {k: normalize_dtype(str(head[k]), what="head dtype") for k in ("rollout_head", "trainer_head")}
        except ValueError:
            return {}
    if isinstance(inflight, Mapping) and {"mode", "clear_cache", "prefix_caching"} <= set(inflight):
        return {"mode": str(inflight["mode"]), "clear_cache": bool(inflight["clear_cache"]),
                "prefix_caching": bool(inflight["prefix_caching"])}
    return {}


def _common_keys(per_arm: Mapping[str, Mapping[str, Any]], dims: Sequence[str] | None) -> list[str]:
    if dims is not None:
        return list(dims)
    keys: list[str] = []
    for f in per_arm.values():
        keys += [k for k in f if k not in keys]
    return [k for k in keys if all(k in f for f in per_arm.values())]


def factors(data, dims: Sequence[str] | None = None) -> xr.Dataset:
    """The factors of every arm, one coordinate each along ``arm``.

    Parameters
    ----------
    data : Mapping[str, xarray.Dataset], xarray.DataTree or path
        The arms (``{arm: trace}``), a DataTree or a store path.
    dims : sequence of str, optional
        The factors to take; ``None`` takes those every arm has.

    Returns
    -------
    xarray.Dataset
        No variables; dim ``arm`` and one coordinate per factor.

    Raises
    ------
    ValueError
        An arm lacks one of ``dims``.
    """
    arms = as_arms(data)
    per_arm = {name: arm_factors(ds) for name, ds in arms.items()}
    keys = _common_keys(per_arm, dims)
    for name, f in per_arm.items():
        missing = [k for k in keys if k not in f]
        if missing:
            raise ValueError(f"arm {name!r} records no factor {', '.join(missing)} (it has {sorted(f) or 'none'})")
    return xr.Dataset(coords={"arm": list(per_arm), **{k: ("arm", [f[k] for f in per_arm.values()]) for k in keys}})


def stack_cells(cells: Mapping[tuple, xr.Dataset | xr.DataArray], dims: Sequence[str]) -> xr.Dataset:
    """One Dataset from one part per cell, with the cells' values as dims.

    Each part gets the dims ``dims`` (length 1) and the parts are merged (outer join: a missing cell
    is NaN); each dim's values are sorted (first-seen order where they do not sort).

    Parameters
    ----------
    cells : Mapping[tuple, xarray.Dataset or xarray.DataArray]
        ``{(value of dims[0], value of dims[1], ...): part}``; a DataArray becomes a variable of its
        name (``"value"`` when it has none).
    dims : sequence of str
        The names of the cells' key positions.

    Returns
    -------
    xarray.Dataset
        The parts merged, with one dim per entry of ``dims``.

    Raises
    ------
    ValueError
        No cells, or a key whose length differs from ``dims``.
    """
    dims = list(dims)
    parts = []
    for key, part in cells.items():
        if len(key) != len(dims):
            raise ValueError(f"cell {key!r} has {len(key)} values for the {len(dims)} dims {dims}")
        if isinstance(part, xr.DataArray):
            part = part.to_dataset(name=part.name if part.name is not None else "value")
        parts.append(part.expand_dims({d: [v] for d, v in zip(dims, key)}))
    if not parts:
        raise ValueError("no cells given")
    out = xr.merge(parts, join="outer", compat="no_conflicts", combine_attrs="drop_conflicts")
    return out.reindex({d: _ordered(k[i] for k in cells) for i, d in enumerate(dims)})


def _ordered(values) -> np.ndarray | list:
    """The distinct values, sorted (first-seen order where they do not sort)."""
    seen = list(dict.fromkeys(values))
    try:
        return np.asarray(sorted(seen))
    except TypeError:
        return seen


def by_factors(data, per_arm: str | Callable[[xr.Dataset], xr.Dataset | xr.DataArray] | None = None, *,
               dims: Sequence[str] | None = None) -> xr.Dataset | xr.DataArray:
    """One value per arm with the arms' factors as dims.

    Coordinate ``arm`` names each cell's arm (``""`` where a cell is missing); the arms' other dims
    (``sequence``, ``position``) are joined outer.

    >>> by_factors(load_example("h200-head"), "rollout_logprob").sel(rollout_head="float32")  # doctest: +SKIP

    Parameters
    ----------
    data : Mapping[str, xarray.Dataset], xarray.DataTree or path
        The arms (``{arm: trace}``), a DataTree or a store path.
    per_arm : str, callable or None, default None
        A variable name (a DataArray comes back), a function of one trace (its Dataset or DataArray
        gets the dims) or ``None`` (every variable).
    dims : sequence of str, optional
        The factors to use; ``None`` takes those every arm has.

    Returns
    -------
    xarray.Dataset or xarray.DataArray
        The values with one dim per factor (a DataArray when ``per_arm`` is a name).

    Raises
    ------
    ValueError
        The arms share no factor, or two arms are the same cell.
    """
    arms = as_arms(data)
    table = factors(arms, dims)
    keys = [k for k in table.coords if k != "arm"]
    if not keys:
        raise ValueError("the arms share no factor: capture them with an experiment runner, or stamp each with "
                         "rlparity.trace.with_factors")
    cells: dict[tuple, xr.Dataset | xr.DataArray] = {}
    owner: dict[tuple, str] = {}
    for i, (name, ds) in enumerate(arms.items()):
        key = tuple(table[k].values[i].item() for k in keys)
        if key in cells:
            raise ValueError(f"arms {owner[key]!r} and {name!r} are the same cell {dict(zip(keys, key))}")
        part = ds if per_arm is None else ds[per_arm] if isinstance(per_arm, str) else per_arm(ds)
        if isinstance(part, xr.DataArray):
            part = part.to_dataset(name=part.name if part.name is not None else "value")
        cells[key] = part
        owner[key] = name
    out = stack_cells(cells, keys)
    names = np.full([out.sizes[k] for k in keys], "", dtype=object)
    for key, name in owner.items():
        names[tuple(out.indexes[k].get_loc(v) for k, v in zip(keys, key))] = name
    out = out.assign_coords(arm=(keys, names.astype(str)))
    if isinstance(per_arm, str):
        return out[per_arm]
    return out


__all__ = ["FACTORS_ATTR", "arm_factors", "by_factors", "factors", "stack_cells", "with_factors"]
