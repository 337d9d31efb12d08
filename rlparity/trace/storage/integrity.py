"""A store's integrity: the CRC-32 of every variable's values recorded at save
(:func:`dataset_digests`, :func:`integrity_record`) and checked at load (:func:`verify_integrity`),
and the check that every chunk file exists (:func:`check_chunks`)."""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.storage.paths import StoreDamagedError, StoreError

DIGEST_ALGORITHM = "crc32-values-1"
# Our own digest, not zarr's ``crc32c`` codec (format 3; numcodecs' ``CRC32C`` filter in format 2):
# a checksum codec is part of each array's encoding, so using it would change the on-disk format of
# new stores and leave the shipped examples (rlparity/data/examples, written without it, which must
# keep loading) unchecked. It would also check each chunk's bytes only; the record here is one CRC-32
# per variable over its decoded values in a canonical form, kept in the root attrs: it catches a lossy
# encoding (a save reads its arms back against it), a read torn by a concurrent writer or a chunk file
# swapped for another intact one, and any reader can check it without zarr, block by block as the lazy
# reader does (:func:`digest_start` / :func:`digest_update`), whatever the chunking.

# written by rlparity.trace.save; a loaded variable's encoding carries these and they are lossless
_LOSSLESS_ENCODING = {"chunks", "preferred_chunks", "compressor", "compressors", "filters", "_FillValue",
                      "dtype", "write_empty_chunks", "shards", "serializer", "object_codec", "coordinates",
                      "fill_value", "source", "original_shape", "zlib", "complevel", "shuffle"}


def _canonical_dtype(dtype: Any) -> np.dtype | None:
    """The numeric dtype a variable's values are digested as (None for text and unstored kinds)."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return np.dtype(np.uint8)
    if kind in "Mm":
        return np.dtype(np.int64)
    return np.dtype(dtype).newbyteorder("<") if kind in "iufc" else None


def digest_start(dtype: Any, shape: tuple[int, ...]) -> int | None:
    """The CRC-32 of a variable's header (its kind and whole shape), where :func:`digest_update` continues.

    Parameters
    ----------
    dtype : numpy dtype
        The variable's dtype.
    shape : tuple of int
        The variable's whole shape.

    Returns
    -------
    int or None
        The running CRC-32; ``None`` for kinds rlparity does not store.
    """
    if np.dtype(dtype).kind in "UTOS":
        return zlib.crc32(f"str{tuple(shape)}".encode())
    canon = _canonical_dtype(dtype)
    return None if canon is None else zlib.crc32(f"{canon.kind}{canon.itemsize}{tuple(shape)}".encode())


def digest_update(crc: int, values: Any, *, first: bool = True) -> int:
    """``crc`` continued over ``values`` in their canonical form.

    Numbers as little-endian bytes in C order, text as UTF-8 items joined by NUL. Blocks of a
    variable along its first axis, fed in order, give the digest of the whole.

    Parameters
    ----------
    crc : int
        The running CRC-32 (from :func:`digest_start` or a previous call).
    values : array_like
        The next block of values.
    first : bool, default True
        Whether this is the first block (no NUL before its first text item).

    Returns
    -------
    int
        The CRC-32 continued.
    """
    a = np.asarray(values)
    if a.dtype.kind in "UTOS":
        items = [x.decode("utf-8", "surrogateescape") if isinstance(x, bytes) else str(x) for x in a.ravel().tolist()]
        text = chr(0).join(items)
        if items and not first:
            text = chr(0) + text
        return zlib.crc32(text.encode("utf-8", "surrogatepass"), crc)
    a = np.ascontiguousarray(a.view(_canonical_dtype(a.dtype)) if a.dtype.kind in "bMm" else a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return zlib.crc32(a.reshape(-1).view(np.uint8), crc)


def _digest(values: Any) -> str | None:
    """CRC-32 of a variable's values in a canonical form (None for kinds rlparity does not store)."""
    a = np.asarray(values)
    crc = digest_start(a.dtype, a.shape)
    return None if crc is None else f"{digest_update(crc, a):08x}"


def dataset_digests(ds: xr.Dataset) -> dict[str, str]:
    """``{variable: crc32}`` over every variable and coordinate of one arm.

    What ``rlparity_integrity`` records at save and :func:`verify_integrity` checks at load.

    Parameters
    ----------
    ds : xarray.Dataset
        One arm.

    Returns
    -------
    dict[str, str]
        CRC-32 as 8 hex digits per variable (kinds rlparity does not store are left out).
    """
    out = {}
    for name in sorted(map(str, ds.variables)):
        d = _digest(ds.variables[name].values)
        if d is not None:
            out[name] = d
    return out


def _lossless(ds: xr.Dataset) -> bool:
    """Whether writing ``ds`` and reading it back gives the same values (no scale/offset/time
    encodings), so its digests can be taken from memory before the write."""
    for var in ds.variables.values():
        if not set(var.encoding) <= _LOSSLESS_ENCODING:
            return False
        if "dtype" in var.encoding and np.dtype(var.encoding["dtype"]) != var.dtype:
            return False
        if var.dtype.kind in "MmO":
            return False
    return True


def round_trip_changes(saved: xr.Dataset, back: xr.Dataset) -> dict[str, str]:
    """How each variable changed between what was saved and what reads back from the store.

    A lossy encoding (``scale_factor``, a narrower ``dtype``) shows here.

    Parameters
    ----------
    saved : xarray.Dataset
        The arm as saved.
    back : xarray.Dataset
        The arm read back from the store.

    Returns
    -------
    dict[str, str]
        ``{variable: how it changed}`` (missing, by how much, NaN moved, with its encoding) for every
        variable that reads back with other values; empty for a lossless round trip.
    """
    out = {}
    for name, var in saved.variables.items():
        got = back.variables.get(name)
        if got is None:
            out[str(name)] = "is missing"
            continue
        if var.equals(got):
            continue
        x, y = np.asarray(var.values), np.asarray(got.values)
        how = "to other values"
        if x.shape == y.shape and x.dtype.kind in "iufb" and y.dtype.kind in "iufb":
            with np.errstate(invalid="ignore", over="ignore"):
                d = np.abs(x.astype(np.float64) - y.astype(np.float64))
            moved = int(np.count_nonzero(np.isnan(x.astype(np.float64)) != np.isnan(y.astype(np.float64))))
            finite = d[np.isfinite(d)]
            how = (f"by up to {float(finite.max()):.3g}" if finite.size else "") + \
                  (f"{' and ' if finite.size else ''}NaN at {moved} other places" if moved else "")
            how = how or "to other values"
        enc = {k: v for k, v in var.encoding.items() if k in ("dtype", "scale_factor", "add_offset", "units")}
        out[str(name)] = f"{how} (encoding {enc})" if enc else how
    return out


def integrity_record(arms: Mapping[str, xr.Dataset]) -> dict[str, Any]:
    """The ``rlparity_integrity`` root attribute for ``{arm: Dataset}``.

    Parameters
    ----------
    arms : Mapping[str, xarray.Dataset]
        The store's arms.

    Returns
    -------
    dict[str, Any]
        ``{"algorithm": DIGEST_ALGORITHM, "arms": {arm: dataset_digests(arm)}}``.
    """
    return {"algorithm": DIGEST_ALGORITHM, "arms": {name: dataset_digests(ds) for name, ds in arms.items()}}


def verify_integrity(path: Path, arms: Mapping[str, xr.Dataset | None], record: Mapping[str, Any], *,
                     digests: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Raise :class:`~rlparity.trace.storage.paths.StoreDamagedError` unless the loaded arms match the record made at save.

    Parameters
    ----------
    path : pathlib.Path
        The store, for the error message.
    arms : Mapping[str, xarray.Dataset or None]
        The arms loaded (``None`` where ``digests`` gives the arm's digests).
    record : Mapping[str, Any]
        The store's ``rlparity_integrity`` record.
    digests : Mapping[str, Mapping[str, str]], optional
        The arms' digests, already taken block by block; ``None`` computes them from ``arms``.

    Raises
    ------
    StoreError
        The record uses a digest algorithm this release does not know.
    StoreDamagedError
        The arms, or a variable's values, differ from the record.
    """
    if record.get("algorithm") != DIGEST_ALGORITHM:
        raise StoreError(f"{path} records its integrity with {record.get('algorithm')!r}, which this release "
                         f"of rlparity does not know ({DIGEST_ALGORITHM}): upgrade rlparity")
    want = record.get("arms") or {}
    if set(want) != set(arms):
        raise StoreDamagedError(
            f"the store is damaged: {path} holds arms {sorted(arms)} but was saved with {sorted(want)}: "
            "restore it from a copy or re-create it")
    for arm, ds in arms.items():
        got = digests[arm] if digests is not None else dataset_digests(ds)
        missing = sorted(set(want[arm]) - set(got))
        extra = sorted(set(got) - set(want[arm]))
        changed = sorted(k for k in set(got) & set(want[arm]) if got[k] != want[arm][k])
        if missing or extra or changed:
            parts = ([f"variables {changed} read back other values than were saved"] if changed else []) + \
                    ([f"variables {missing} are gone"] if missing else []) + \
                    ([f"variables {extra} were added after the save"] if extra else [])
            raise StoreDamagedError(
                f"the store is damaged: {path} arm {arm!r}: {'; '.join(parts)} (CRC-32 recorded at save; "
                "a changed file, a lost write or a writer swapping the store during this read): "
                "restore it from a copy or re-create it")


def _present_chunks(d: Path, grid: list[int], sep: str) -> set[tuple[int, ...]]:
    """The chunk indices inside ``grid`` that have a file under ``d`` (one directory listing, or one
    walk for nested keys): bounded by what is on disk, whatever the metadata claims."""
    ndim = len(grid)
    found: set[tuple[int, ...]] = set()
    if sep == ".":
        try:
            keys = [n for n in os.listdir(d) if not n.startswith(".")]
        except OSError:
            return found
    else:
        keys = []
        for dirpath, dirnames, filenames in os.walk(d):
            dirnames[:] = [n for n in dirnames if not n.startswith(".")]
            rel = os.path.relpath(dirpath, d)
            keys += [n if rel == "." else f"{Path(rel).as_posix()}/{n}" for n in filenames if not n.startswith(".")]
    for key in keys:
        parts = key.split(sep)
        if ndim == 0:
            if key == "0":
                found.add(())
            continue
        if len(parts) != ndim or not all(x.isdigit() for x in parts):
            continue
        ix = tuple(int(x) for x in parts)
        if all(i < g for i, g in zip(ix, grid)):
            found.add(ix)
    return found


def _indices(grid: list[int], n: int) -> Iterator[tuple[int, ...]]:
    """The first ``n`` chunk indices of ``grid`` in C order (lazily: a grid may claim 10^10)."""
    ix = [0] * len(grid)
    for _ in range(n):
        yield tuple(ix)
        for d in reversed(range(len(grid))):
            ix[d] += 1
            if ix[d] < grid[d]:
                break
            ix[d] = 0
        else:
            return


def missing_chunks(p: Path, meta: Mapping[str, Any]) -> list[tuple[str, int, int, str]]:
    """The arrays of the store with chunk files missing.

    Stores written here hold every chunk (``write_empty_chunks=True``). The work is bounded by the
    files on disk, not by the shapes the metadata claims (a damaged ``.zmetadata`` claiming 10^10
    chunks is reported at once).

    Parameters
    ----------
    p : pathlib.Path
        The store.
    meta : Mapping[str, Any]
        Its consolidated metadata.

    Returns
    -------
    list[tuple[str, int, int, str]]
        ``(array, n_missing, n_expected, example key)`` per damaged array.
    """
    out = []
    for key, zarray in meta.items():
        if not key.endswith("/.zarray") or not isinstance(zarray, dict):
            continue
        arr = key[: -len("/.zarray")]
        sep = zarray.get("dimension_separator") or "."
        try:
            shape, chunks = [int(x) for x in zarray.get("shape", [])], [int(x) for x in zarray.get("chunks", [])]
        except (TypeError, ValueError):
            out.append((arr, 1, 1, "(its .zarray has a shape or chunks that are not integers)"))
            continue
        if len(shape) != len(chunks) or any(x < 0 for x in shape + chunks):
            out.append((arr, 1, 1, f"(its .zarray claims shape {shape} in chunks {chunks})"))
            continue
        grid = [(-(-s // c) if c else 0) for s, c in zip(shape, chunks)]
        if any(g == 0 for g in grid):
            continue
        expected = math.prod(grid)
        present = _present_chunks(p / arr, grid, sep)
        if len(present) < expected:
            # the first missing index lies within the first len(present) + 1 in order: bounded
            first = next(ix for ix in _indices(grid, len(present) + 1) if ix not in present)
            out.append((arr, expected - len(present), expected, sep.join(map(str, first)) or "0"))
    return out


def check_chunks(p: Path, meta: Mapping[str, Any]) -> None:
    """Raise :class:`~rlparity.trace.storage.paths.StoreDamagedError` if any chunk file of the store is missing.

    Parameters
    ----------
    p : pathlib.Path
        The store.
    meta : Mapping[str, Any]
        Its consolidated metadata.

    Raises
    ------
    StoreDamagedError
        A chunk file is missing (it would read back as fill values).
    """
    gone = missing_chunks(p, meta)
    if gone:
        arr, k, n, example = gone[0]
        more = f" (and {len(gone) - 1} more arrays)" if len(gone) > 1 else ""
        raise StoreDamagedError(
            f"the store is damaged: {p}: {k} of {n} chunks of {arr!r} are missing (e.g. chunk {example}){more}; "
            "they would read back as fill values (NaN / -1), not as the saved data: restore the store from "
            "a copy or re-create it")
