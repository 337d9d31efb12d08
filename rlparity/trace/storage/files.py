"""A store's metadata files: JSON written through a rename, the root group and its attributes, the
consolidated ``.zmetadata``, a store copied by hard links, and the tree opened from disk."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.storage.paths import _read_meta

_ZARR_OPEN = {"engine": "zarr", "consolidated": True, "zarr_format": 2}


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"root attribute value {value!r} ({type(value).__name__}) cannot be stored as JSON")


def _write_json(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename (never a torn file)."""
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=_json_default, allow_nan=False)
    os.replace(tmp, path)


def write_root(p: Path, attrs: Mapping[str, Any]) -> None:
    """Make ``p`` a zarr v2 group whose attributes are ``attrs`` (``.zgroup`` and ``.zattrs``).

    Each file is written through a temporary file and a rename (never a torn file).

    Parameters
    ----------
    p : pathlib.Path
        The group's folder (it exists).
    attrs : Mapping[str, Any]
        The group's attributes (JSON-able; numpy values are converted).
    """
    _write_json(p / ".zgroup", {"zarr_format": 2})
    _write_json(p / ".zattrs", dict(attrs))


def consolidate(p: Path, *, reuse: Mapping[str, Any] | None = None, reused_arms: Iterable[str] = ()) -> dict[str, Any]:
    """Write ``.zmetadata`` (zarr v2 consolidated metadata) of the store ``p``.

    From every ``.zgroup``, ``.zattrs`` and ``.zarray`` under ``p``, in one pass (zarr's own is slow
    on stores of many arms).

    Parameters
    ----------
    p : pathlib.Path
        The store.
    reuse : Mapping[str, Any], optional
        Consolidated metadata of another store, the source of the entries of ``reused_arms``.
    reused_arms : iterable of str, default ()
        Arms linked unchanged from another store: their entries come from ``reuse``, their folders
        are not read.

    Returns
    -------
    dict[str, Any]
        The metadata written, keyed by file path inside the store.
    """
    reused = set(reused_arms)
    meta: dict[str, Any] = {k: v for k, v in (reuse or {}).items() if k.split("/", 1)[0] in reused and "/" in k}
    for dirpath, dirnames, filenames in os.walk(p):
        rel = os.path.relpath(dirpath, p)
        if rel == ".":
            dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in reused]
        for name in (".zgroup", ".zattrs", ".zarray"):
            if name in filenames:
                key = name if rel == "." else f"{Path(rel).as_posix()}/{name}"
                with open(os.path.join(dirpath, name), "rb") as fh:
                    meta[key] = json.load(fh)
    _write_json(p / ".zmetadata", {"metadata": meta, "zarr_consolidated_format": 1})
    return meta


def _write_root_attrs(p: Path, attrs: Mapping[str, Any]) -> None:
    meta = _read_meta(p) or {}
    root = dict(meta.get(".zattrs") or {})
    root.update(attrs)
    write_root(p, root)
    consolidate(p)


def link_tree(src: Path, dst: Path) -> None:
    """Copy the directory ``src`` to ``dst`` by hard links (a copy where links are refused).

    Stores are never changed in place, so sharing chunk files between an old and a new store is safe.

    Parameters
    ----------
    src : pathlib.Path
        The folder to copy.
    dst : pathlib.Path
        Where the copy goes (made as needed).
    """
    for dirpath, _, filenames in os.walk(src):
        out = dst / os.path.relpath(dirpath, src)
        out.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            try:
                os.link(os.path.join(dirpath, name), out / name)
            except OSError:
                shutil.copy2(os.path.join(dirpath, name), out / name)


def _open_tree(p: Path, chunks: Any = None) -> xr.DataTree:
    """The store's tree, loaded into memory; lazy (dask arrays over the zarr chunks) with ``chunks``."""
    if chunks is None:
        return xr.open_datatree(p, **_ZARR_OPEN).load()
    with warnings.catch_warnings():  # blocks of N sequences need not match the stored chunks
        warnings.filterwarnings("ignore", message="The specified chunks separate")
        return xr.open_datatree(p, **_ZARR_OPEN, chunks=chunks)
