"""Saving and loading traces as zarr (format 2, consolidated), atomically.

A store is an ``xarray.DataTree`` with one child group per arm (``/<arm>``); each arm is a
trace ``Dataset``. :func:`save` writes to a temporary folder beside the target and renames it
into place, so a crash never leaves a half-written store and never destroys the old one.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

import xarray as xr

from rlparity.trace.schema import TraceValidationError, validate

_ARM_ATTR = "rlparity_arm"


def _as_tree(data: xr.Dataset | xr.DataTree | Mapping[str, xr.Dataset]) -> xr.DataTree:
    if isinstance(data, xr.DataTree):
        return data
    if isinstance(data, xr.Dataset):
        arm = str(data.attrs.get("arm", "default"))
        return xr.DataTree.from_dict({f"/{arm}": data})
    if isinstance(data, Mapping):
        return xr.DataTree.from_dict({f"/{k}": v for k, v in data.items()})
    raise TypeError(f"save takes a Dataset, a DataTree or a mapping arm -> Dataset, not {type(data).__name__}")


def save(data: xr.Dataset | xr.DataTree | Mapping[str, xr.Dataset], path: str | os.PathLike,
         *, overwrite: bool = True) -> Path:
    """Write a trace (one arm) or an experiment (several arms) to ``path`` atomically."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True or choose another path")
    tree = _as_tree(data)
    for node in tree.children.values():
        validate(node.to_dataset(), where=f"arm {node.name!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        tree.to_zarr(tmp, mode="w", consolidated=True, zarr_format=2)
        if path.exists():
            old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def add_arm(ds: xr.Dataset, path: str | os.PathLike, arm: str | None = None) -> Path:
    """Add (or replace) one arm in an existing store; the other arms are kept."""
    path = Path(path)
    arm = arm or str(ds.attrs.get("arm", "default"))
    arms = dict(open_arms(path)) if path.exists() else {}
    arms[arm] = ds.assign_attrs(arm=arm)
    return save(arms, path)


def open_experiment(path: str | os.PathLike) -> xr.DataTree:
    """Open a store as a DataTree (one child per arm), loaded into memory and validated."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no trace at {path}: capture one with `rlparity capture` first")
    try:
        tree = xr.open_datatree(path, engine="zarr", consolidated=True, zarr_format=2).load()
    except Exception as err:  # zarr raises several kinds for a store that is not one
        raise TraceValidationError(f"{path} is not a readable rlparity zarr store: {err}") from err
    if not tree.children:
        raise TraceValidationError(f"{path} holds no arms: it was not written by rlparity.trace.save")
    for node in tree.children.values():
        validate(node.to_dataset(), where=f"{path} arm {node.name!r}")
    return tree


def open_arms(path: str | os.PathLike) -> dict[str, xr.Dataset]:
    """All arms of a store as ``{arm: Dataset}`` in stored order."""
    tree = open_experiment(path)
    return {name: node.to_dataset() for name, node in tree.children.items()}


def load(path: str | os.PathLike, arm: str | None = None) -> xr.Dataset:
    """Load one arm of a store as a trace Dataset (the only arm when ``arm`` is None)."""
    arms = open_arms(path)
    if arm is None:
        if len(arms) != 1:
            raise ValueError(f"{path} holds arms {list(arms)}; pass arm=... to choose one")
        return next(iter(arms.values()))
    if arm not in arms:
        raise KeyError(f"{path} has no arm {arm!r}; it holds {list(arms)}")
    return arms[arm]


def as_arms(data) -> dict[str, xr.Dataset]:
    """``{arm: trace}`` from one trace, a mapping, a DataTree or a store path (what every
    multi-arm function accepts)."""
    if isinstance(data, xr.Dataset):
        return {data.attrs.get("arm", "default"): data}
    if isinstance(data, (str, os.PathLike)):
        return open_arms(data)
    if isinstance(data, xr.DataTree):
        return {k: v.to_dataset() for k, v in data.children.items()}
    if isinstance(data, Mapping):
        return dict(data)
    raise TypeError(f"expected a trace Dataset, a {{arm: trace}} mapping, a DataTree or a store path, "
                    f"not {type(data).__name__}")
