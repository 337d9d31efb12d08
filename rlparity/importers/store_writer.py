"""Writing imported traces into a zarr store, chunk by chunk, all or nothing.

:func:`write_store` is the only function of :mod:`rlparity.importers` that writes zarr. Chunks of one
arm may differ in width (the longest response of each chunk), so each chunk is first staged as
it comes (memory: one chunk), then the arms are assembled chunk by chunk into a temporary store
beside the target (padded to the arm's widest chunk, appended along ``sequence``), and that store
is renamed into place. A failure at any point removes the temporary folders and leaves the
target as it was.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace import ALL_VARS, annotate, install_store, temp_store
from rlparity.trace.storage import check_target

ZARR = {"zarr_format": 2}


@dataclass
class _ArmLayout:
    chunks: list[Path] = field(default_factory=list)
    widths: dict[str, int] = field(default_factory=dict)  # dim -> widest
    strings: dict[str, int] = field(default_factory=dict)  # variable -> widest string
    n: int = 0


def _fill(name: str, dtype: np.dtype) -> Any:
    kind = ALL_VARS[name][1] if name in ALL_VARS else dtype.kind
    return {"i": -1, "b": False, "U": ""}.get(kind, np.nan)


def pad_to(ds: xr.Dataset, widths: Mapping[str, int], strings: Mapping[str, int] | None = None) -> xr.Dataset:
    """Pad every non-``sequence`` dim of a trace chunk to common widths.

    Padding is the schema's (-1 ids, False masks, NaN floats); string variables get a common width.

    Parameters
    ----------
    ds : xarray.Dataset
        A trace chunk.
    widths : Mapping of str to int
        The width of each dim (a dim not listed keeps its size).
    strings : Mapping of str to int, optional
        The character width of each string variable.

    Returns
    -------
    xarray.Dataset
        The padded chunk, annotated (:func:`rlparity.trace.annotate`).
    """
    data = {}
    for name, var in ds.data_vars.items():
        values = var.values
        pads = [(0, max(0, int(widths.get(d, values.shape[i])) - values.shape[i])) if d != "sequence" else (0, 0)
                for i, d in enumerate(var.dims)]
        if any(p[1] for p in pads):
            values = np.pad(values, pads, constant_values=_fill(name, values.dtype))
        if strings and name in strings:
            values = values.astype(f"<U{max(1, strings[name])}")
        data[name] = (var.dims, values, var.attrs)
    coords = {d: np.arange(int(widths.get(d, ds.sizes[d]))) for d in ds.dims if d != "sequence"}
    coords["sequence"] = ds["sequence"].values
    return annotate(xr.Dataset(data, coords=coords, attrs=ds.attrs))


def write_store(chunks: Iterable[tuple[str, xr.Dataset]], path: str | os.PathLike, *,
                final_attrs: Callable[[], Mapping[str, Mapping[str, Any]]], overwrite: bool = False) -> Path:
    """Write ``(arm, trace chunk)`` pairs into a zarr store (format 2, consolidated), one group per arm, all or nothing.

    Nothing half-written remains on failure: the target is untouched and the temporary folders
    beside it are removed.

    Parameters
    ----------
    chunks : iterable of tuple of (str, xarray.Dataset)
        ``(arm, trace chunk)`` pairs, read once.
    path : str or os.PathLike
        The store to write.
    final_attrs : callable
        Called once every chunk has been read; gives each arm's attrs (``{arm: attrs}``: the
        counts are only known then).
    overwrite : bool, default False
        Replace an existing store at ``path``; without it an existing store is refused before
        anything is read.

    Returns
    -------
    pathlib.Path
        The store's path.

    Raises
    ------
    ValueError
        If ``chunks`` is empty (no sample with engine-sampled tokens).
    FileExistsError
        If ``path`` exists and ``overwrite`` is not set.
    """
    path = check_target(path, overwrite=overwrite)  # refused before anything is read or written
    path.parent.mkdir(parents=True, exist_ok=True)
    layout: dict[str, _ArmLayout] = {}
    # both folders are guarded while this process lives and removed on exit; a killed import's are
    # removed by the next open or save of the store (rlparity.trace.storage.recover)
    with temp_store(path) as tmp, temp_store(path, kind="staging") as staging:
        _assemble_into(chunks, tmp, staging, layout, final_attrs)
        install_store(tmp, path, overwrite=overwrite)  # validated, marked, swapped in under the store lock
    return path


def _assemble_into(chunks, tmp: Path, staging: Path, layout: dict[str, _ArmLayout], final_attrs) -> None:
    """Stage each chunk, then write every arm into the guarded temporary store ``tmp``."""
    for arm, ds in chunks:
        lay = layout.setdefault(arm, _ArmLayout())
        where = staging / arm / f"{len(lay.chunks):06d}"
        ds.to_zarr(where, mode="w", consolidated=False, **ZARR)
        lay.chunks.append(where)
        lay.n += ds.sizes["sequence"]
        for d, size in ds.sizes.items():
            if d != "sequence":
                lay.widths[d] = max(lay.widths.get(d, 0), size)
        for name, var in ds.data_vars.items():
            if var.dtype.kind == "U":
                lay.strings[name] = max(lay.strings.get(name, 0), var.dtype.itemsize // 4)
    if not layout:
        raise ValueError("nothing to write: the input held no sample with engine-sampled tokens")
    attrs = final_attrs()
    xr.Dataset().to_zarr(tmp, mode="a", consolidated=False, **ZARR)  # the guarded directory stays
    for arm, lay in layout.items():
        offset, arm_attrs = 0, None
        for k, chunk_path in enumerate(lay.chunks):
            with xr.open_zarr(chunk_path, consolidated=False, **ZARR) as part:
                ds = pad_to(part.load(), lay.widths, lay.strings)
            n = ds.sizes["sequence"]
            ds = ds.assign_coords(sequence=np.arange(offset, offset + n))
            offset += n
            if arm_attrs is None:
                arm_attrs = {**ds.attrs, **attrs.get(arm, {})}
            ds.attrs = arm_attrs  # an append rewrites the group's attrs: always the full set
            if k == 0:
                ds.to_zarr(tmp, group=arm, mode="w", consolidated=False, write_empty_chunks=True, **ZARR)
            else:
                ds.to_zarr(tmp, group=arm, append_dim="sequence", consolidated=False, write_empty_chunks=True,
                           **ZARR)
    import zarr

    zarr.consolidate_metadata(str(tmp), zarr_format=2)
    with xr.open_datatree(tmp, engine="zarr", consolidated=True, **ZARR) as tree:  # readable, lazily
        assert set(tree.children) == set(layout), (sorted(tree.children), sorted(layout))


def assemble(chunks: Iterable[tuple[str, xr.Dataset]], final_attrs: Callable[[], Mapping[str, Mapping[str, Any]]]
             ) -> dict[str, xr.Dataset]:
    """The in-memory counterpart of :func:`write_store`: ``{arm: trace}``.

    Parameters
    ----------
    chunks : iterable of tuple of (str, xarray.Dataset)
        ``(arm, trace chunk)`` pairs; the chunks of an arm are padded to common widths and
        concatenated along ``sequence``.
    final_attrs : callable
        Called once every chunk has been read; gives each arm's attrs (``{arm: attrs}``).

    Returns
    -------
    dict of str to xarray.Dataset
        One trace per arm.
    """
    parts: dict[str, list[xr.Dataset]] = {}
    for arm, ds in chunks:
        parts.setdefault(arm, []).append(ds)
    attrs = final_attrs()
    out = {}
    for arm, dss in parts.items():
        widths = {d: max(ds.sizes[d] for ds in dss) for d in dss[0].dims if d != "sequence"}
        strings = {name: max(ds[name].dtype.itemsize // 4 for ds in dss)
                   for name, var in dss[0].data_vars.items() if var.dtype.kind == "U"}
        padded, offset = [], 0
        for ds in dss:
            n = ds.sizes["sequence"]
            padded.append(pad_to(ds, widths, strings).assign_coords(sequence=np.arange(offset, offset + n)))
            offset += n
        merged = xr.concat(padded, dim="sequence", data_vars="all", coords="minimal", compat="override",
                           join="exact", combine_attrs="override") if len(padded) > 1 else padded[0]
        merged.attrs = {**dss[0].attrs, **attrs.get(arm, {})}
        out[arm] = annotate(merged)
    return out
