"""Saving and loading traces as zarr (format 2, consolidated), crash-safely and under a lock.

A store is an ``xarray.DataTree`` with one child group per arm (``/<arm>``); each arm is a
trace ``Dataset``. :func:`save` writes to a temporary folder beside the target and swaps it into
place (:func:`rlparity.trace.store.install_store`), so a crash leaves the old store or the complete
new one, never a half-written one, and never deletes anything that is not an rlparity store.
Opening a store recovers an interrupted save, checks every chunk is present and every variable
reads back what was saved (CRC-32 recorded at save), then validates every arm.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import xarray as xr

from rlparity.trace.schema import validate
from rlparity.trace.store import (
    INTEGRITY_ATTR,
    STORE_FORMAT,
    STORE_MARKER,
    StoreDamagedError,
    StoreError,
    _lossless,
    _open_tree,
    _read_meta,
    check_arm_name,
    check_chunks,
    check_target,
    install_store,
    integrity_record,
    recover_if_needed,
    store_kind,
    store_lock,
    store_path,
    temp_store,
    verify_integrity,
)

_ARM_ATTR = "rlparity_arm"
_WRITE = {"consolidated": True, "zarr_format": 2, "write_empty_chunks": True}


def _arms_to_save(data: xr.Dataset | xr.DataTree | Mapping[str, xr.Dataset]) -> dict[str, xr.Dataset]:
    if isinstance(data, xr.Dataset):
        arms = {str(data.attrs.get("arm", "default")): data}
    elif isinstance(data, xr.DataTree):
        if data.ds.data_vars:
            raise StoreError(f"the DataTree's root holds variables {list(data.ds.data_vars)}; a store holds "
                             "traces only in child groups, one per arm")
        deep = [f"{name}/{sub}" for name, node in data.children.items() for sub in node.children]
        if deep:
            raise StoreError(f"the DataTree has nested groups {deep[:5]}; a store holds one level of arms: "
                             "flatten it to {arm: trace}")
        arms = {name: node.to_dataset() for name, node in data.children.items()}
    elif isinstance(data, Mapping):
        arms = dict(data)
        bad = [type(v).__name__ for v in arms.values() if not isinstance(v, xr.Dataset)]
        if bad:
            raise TypeError(f"save takes a mapping arm -> Dataset; got values of type {sorted(set(bad))}")
    else:
        raise TypeError(f"save takes a Dataset, a DataTree or a mapping arm -> Dataset, not {type(data).__name__}")
    for name in arms:
        check_arm_name(name)
    folded = {}
    for name in arms:  # case-insensitive file systems (macOS, Windows) would merge these
        if name.lower() in folded:
            raise StoreError(f"arm names {folded[name.lower()]!r} and {name!r} differ only in case; on a "
                             "case-insensitive file system they are one folder: rename one")
        folded[name.lower()] = name
    return arms


def _write(arms: dict[str, xr.Dataset], p: Path, *, overwrite: bool, root_attrs: Mapping | None = None,
           validated: Iterable[str] = ()) -> Path:
    if not arms:
        raise StoreError("nothing to save: no arms given")
    done = set(validated)
    for name, ds in arms.items():
        if name not in done:
            validate(ds, where=f"arm {name!r}")
    check_target(p, overwrite=overwrite)  # refuse before writing anything
    attrs = {k: v for k, v in (root_attrs or {}).items() if k not in (STORE_MARKER, INTEGRITY_ATTR)}
    if all(_lossless(ds) for ds in arms.values()):  # else install_store reads back and records
        attrs.update({STORE_MARKER: STORE_FORMAT, INTEGRITY_ATTR: integrity_record(arms)})
    tree = xr.DataTree.from_dict({f"/{k}": v for k, v in arms.items()})
    tree.attrs = attrs
    with temp_store(p) as tmp:
        tree.to_zarr(tmp, mode="w-", **_WRITE)
        install_store(tmp, p, overwrite=overwrite)
    return p


def save(data: xr.Dataset | xr.DataTree | Mapping[str, xr.Dataset], path: str | os.PathLike,
         *, overwrite: bool = True) -> Path:
    """Write a trace (one arm) or an experiment (several arms) to ``path``; return the path.

    Every arm is validated first. ``path`` may be missing, an empty directory, or (with
    ``overwrite``) an rlparity store, which is replaced whole; anything else is refused
    (:class:`~rlparity.trace.store.StoreError`) and left untouched. The write goes to a temporary
    store beside ``path`` and is swapped in under the store lock, crash-safely.
    """
    arms = _arms_to_save(data)
    root = dict(data.attrs) if isinstance(data, xr.DataTree) else None
    return _write(arms, store_path(path), overwrite=overwrite, root_attrs=root)


def add_arm(ds: xr.Dataset, path: str | os.PathLike, arm: str | None = None) -> Path:
    """Add (or replace) one arm in a store, creating it if needed; the other arms are kept.

    Holds the store lock from reading to swapping, so concurrent ``add_arm`` calls on one store
    keep every arm.
    """
    arm = check_arm_name(arm if arm is not None else str(ds.attrs.get("arm", "default")))
    p = store_path(path)
    with store_lock(p):
        recover_if_needed(p)
        kind = store_kind(p)
        if kind in ("file", "other"):
            check_target(p, overwrite=True)  # raises with the reason
        arms = open_arms(p) if kind == "rlparity" else {}
        kept = [k for k in arms if k != arm]
        arms[arm] = ds.assign_attrs(arm=arm)
        _arms_to_save(arms)  # names (case clashes) before anything is written
        return _write(arms, p, overwrite=True, validated=kept)


def _read(p: Path, shown: str) -> xr.DataTree:
    meta = _read_meta(p)
    if meta is None:
        raise StoreError(f"{shown} is not a readable rlparity zarr store: it has no consolidated metadata "
                         "(.zmetadata), so rlparity.trace.save did not write it")
    root = meta.get(".zattrs") or {}
    fmt = root.get(STORE_MARKER)
    if fmt is not None and fmt != STORE_FORMAT:
        newer = isinstance(fmt, int) and fmt > STORE_FORMAT
        raise StoreError(f"{shown} has store format {fmt!r}; this release of rlparity reads store format "
                         f"{STORE_FORMAT}" + (": upgrade rlparity" if newer else ""))
    if fmt is not None:
        check_chunks(p, meta)
    try:
        tree = _open_tree(p)
    except Exception as err:  # zarr raises several kinds for a store that is not one, or a broken chunk
        if fmt is not None:
            raise StoreDamagedError(f"the store is damaged: reading {shown} failed ({type(err).__name__}: "
                                    f"{err}): restore it from a copy or re-create it") from err
        raise StoreError(f"{shown} is not a readable rlparity zarr store: {err}") from err
    if not tree.children:
        raise StoreError(f"{shown} holds no arms: it was not written by rlparity.trace.save")
    if fmt is not None:
        record = root.get(INTEGRITY_ATTR)
        if not isinstance(record, Mapping):
            raise StoreDamagedError(f"the store is damaged: {shown} is marked as an rlparity store but has no "
                                    "integrity record: restore it from a copy or re-create it")
        verify_integrity(p, {k: v.to_dataset() for k, v in tree.children.items()}, record)
    return tree


def open_experiment(path: str | os.PathLike) -> xr.DataTree:
    """Open a store as a DataTree (one child per arm), loaded into memory and validated.

    Recovers an interrupted save first; reads under the shared store lock; a missing chunk or data
    that differs from what was saved raises :class:`~rlparity.trace.store.StoreDamagedError`.
    """
    p = store_path(path)
    recover_if_needed(p)
    if not os.path.lexists(p):
        raise FileNotFoundError(f"no trace at {path}: capture one with `rlparity capture` first")
    if not p.is_dir():
        raise StoreError(f"{path} is a file, not an rlparity store (a zarr directory written by rlparity.trace.save)")
    tries = 3
    for attempt in range(tries):
        with store_lock(p, shared=True) as locked:
            try:
                tree = _read(p, str(path))
                break
            except StoreDamagedError:
                # without a lock (read-only location) a writer may have swapped the store under us
                if locked or attempt == tries - 1:
                    raise
        time.sleep(0.05 * (attempt + 1))
    for name, node in tree.children.items():
        validate(node.to_dataset(), where=f"{path} arm {name!r}")
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
