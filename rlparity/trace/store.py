"""Store mechanics under :mod:`rlparity.trace.io`: the per-store lock, the crash-safe swap, the
integrity record and the recovery of an interrupted save.

A store ``DIR/NAME`` is a zarr (format 2, consolidated) group with one child group per arm. Beside
it, in ``DIR``, rlparity uses three kinds of names, all hidden:

``.NAME.lock``
    the store lock (``flock``): writers hold it exclusively, readers shared. The file is removed by
    the last holder, so an idle store has nothing beside it.
``.NAME.tmp-<pid>-<id>``
    a store being written; its writer holds a ``flock`` on the directory while it lives, so an
    orphan (its writer died) is told apart from a live write.
``.NAME.old-<pid>-<id>``
    the previous store during a swap (a few microseconds in a normal run).
``.NAME.staging-<pid>-<id>``
    an importer's chunks before they are assembled into ``.NAME.tmp-*``; guarded like it.

Recovery removes every one of these whose writer has died (no ``flock`` on it), never a live one.

The root attributes of a store written here carry ``rlparity_store`` (the store format, 1) and
``rlparity_integrity`` (a CRC-32 of every variable's values per arm, recorded at save). Opening a
store checks that every chunk file exists (stores are written with ``write_empty_chunks=True``, so a
missing chunk is damage, never padding) and, after loading, that every variable's values match the
record: a damaged store or a read torn by a concurrent writer is an error, never silent NaN.

A streaming writer uses the same pieces as :func:`rlparity.trace.save`::

    with temp_store(path) as tmp:                 # .NAME.tmp-..., guarded against cleaning
        tree.to_zarr(tmp, mode="w-", consolidated=True, zarr_format=2, write_empty_chunks=True)
        ...                                       # append as data arrives (mode="a")
        install_store(tmp, path, overwrite=True)  # integrity record, lock, crash-safe swap
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import shutil
import threading
import time
import uuid
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.schema import TraceValidationError

STORE_FORMAT = 1
STORE_MARKER = "rlparity_store"
INTEGRITY_ATTR = "rlparity_integrity"
DIGEST_ALGORITHM = "crc32-values-1"
ARM_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.+=,@-]{0,99}"
_ARM_RE = re.compile(ARM_NAME_PATTERN)
_RESERVED = {"zarr.json", "__pycache__"}
_ZARR_OPEN = {"engine": "zarr", "consolidated": True, "zarr_format": 2}
# written by rlparity.trace.save; a loaded variable's encoding carries these and they are lossless
_LOSSLESS_ENCODING = {"chunks", "preferred_chunks", "compressor", "compressors", "filters", "_FillValue",
                      "dtype", "write_empty_chunks", "shards", "serializer", "object_codec", "coordinates",
                      "fill_value", "source", "original_shape", "zlib", "complevel", "shuffle"}


class StoreError(TraceValidationError):
    """A store path cannot be used as asked (not a store, in the way, unreadable, bad arm name)."""


class StoreDamagedError(StoreError):
    """A store reads back other data than was saved: missing chunks, changed or torn data."""


# ----------------------------------------------------------------------------- names and paths


def check_arm_name(name: Any) -> str:
    """Return ``name`` if it can name an arm (a zarr group), else raise :class:`StoreError`.

    Allowed: 1-100 characters from letters, digits and ``_ . + = , @ -``, not starting with ``.``,
    ``-``, ``+``, ``=``, ``,`` or ``@`` (so no hidden names, no ``/`` and none of zarr's ``.z*`` keys).
    """
    hint = (f"use 1-100 letters, digits or _ . + = , @ - starting with a letter, digit or _ (pattern "
            f"{ARM_NAME_PATTERN}), e.g. 'bf16_head'")
    if not isinstance(name, str):
        raise StoreError(f"arm name {name!r} is not text ({type(name).__name__}): {hint}")
    if not _ARM_RE.fullmatch(name) or name in _RESERVED:
        why = ("is empty" if not name else "contains '/'" if "/" in name else
               "starts with '.' (hidden and zarr's own names such as .zgroup)" if name.startswith(".") else
               "is reserved by zarr" if name in _RESERVED else
               "is longer than 100 characters" if len(name) > 100 else "has characters outside the pattern")
        raise StoreError(f"arm name {name!r} {why}: {hint}")
    return name


def store_path(path: str | os.PathLike) -> Path:
    """The absolute path a store is handled at: symbolic links resolved, so every name of one store
    shares one lock and one set of temporary names."""
    raw = os.fspath(path)
    if isinstance(raw, bytes):
        raw = os.fsdecode(raw)
    fix = "give the store a name of its own, such as runs/traces.zarr"
    if os.path.basename(raw.rstrip("/")) in ("", ".", ".."):
        raise StoreError(f"{raw!r} names a folder ('.', '..' or '/'), not a store: {fix}")
    p = Path(os.path.realpath(raw))
    try:
        cwd = Path(os.getcwd())
    except OSError:
        cwd = None
    if cwd is not None and (p == cwd or p in cwd.parents):
        raise StoreError(f"{raw!r} is the working directory or a folder above it, not a store: {fix}")
    return p


def lock_file(path: str | os.PathLike) -> Path:
    """``DIR/.NAME.lock``: the file :func:`store_lock` locks for the store ``DIR/NAME``."""
    p = store_path(path)
    return p.parent / f".{p.name}.lock"


_KINDS = ("tmp", "old", "staging")


def _leftover_kind(path: Path, d: Path) -> str | None:
    """``"tmp"``, ``"old"`` or ``"staging"`` for a leftover ``.NAME.<kind>-*`` of the store ``path``."""
    return next((k for k in _KINDS if d.name.startswith(f".{path.name}.{k}-")), None)


def _leftovers(path: Path) -> list[Path]:
    """``.NAME.tmp-*``, ``.NAME.old-*`` and ``.NAME.staging-*`` beside the store."""
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    pre = tuple(f".{path.name}.{k}-" for k in _KINDS)
    return sorted(path.parent / n for n in names if n.startswith(pre))


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- the store lock
# Not filelock's: its FileLock is exclusive only (readers here share the lock), and its ReadWriteLock
# is an SQLite database file, not the ``flock`` on ``.NAME.lock`` that every rlparity version writing
# the same store must take to exclude the others. A read-only location here reads under a shared lock
# or none, and the last holder removes the file, so an idle store has nothing beside it.

_held = threading.local()


def _held_locks() -> dict[str, list]:
    if not hasattr(_held, "locks"):
        _held.locks = {}
    return _held.locks


def _open_lock_file(lf: Path, shared: bool) -> int | None:
    flags = os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(lf, os.O_RDWR | os.O_CREAT | flags, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise StoreError(f"{lf} is a symbolic link; rlparity never follows links at a lock path: "
                             "remove it") from err
        if err.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        if not shared:
            raise StoreError(f"cannot write beside the store: {lf.parent} is not writable ({err.strerror}); "
                             "save to a writable location") from err
        try:  # a read-only location: lock shared if a writer left the lock file there, else go without
            return os.open(lf, os.O_RDONLY | flags)
        except OSError:
            return None


def _acquire(lf: Path, shared: bool, timeout: float | None) -> int | None:
    op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        fd = _open_lock_file(lf, shared)
        if fd is None:
            return None
        try:
            if deadline is None:
                fcntl.flock(fd, op)
            else:
                while True:
                    try:
                        fcntl.flock(fd, op | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() > deadline:
                            raise TimeoutError(
                                f"the store lock {lf} has been held by another process for more than "
                                f"{timeout:g} s: wait for the other rlparity process to finish") from None
                        time.sleep(0.02)
            # the last holder removes the file; make sure the one we locked is still the one there
            st = os.fstat(fd)
            try:
                now = os.stat(lf, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _release(fd: int, lf: Path) -> None:
    try:
        try:  # nobody else holds it: remove the file (waiters notice and lock a fresh one)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        try:
            st, now = os.fstat(fd), os.stat(lf, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(lf)
        except OSError:
            pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def store_lock(path: str | os.PathLike, *, shared: bool = False,
               timeout: float | None = None) -> Iterator[bool]:
    """Hold the lock of the store at ``path`` (``flock`` on ``DIR/.NAME.lock``).

    Exclusive (the default) for a writer: :func:`rlparity.trace.save`, :func:`rlparity.trace.add_arm`
    and :func:`install_store` take it, so concurrent writers never lose each other's arms. Shared for
    a reader: loading takes it, so a reader never sees a store half-swapped. Re-entrant within a
    thread (an exclusive holder may read and write again). In a read-only location a shared lock is
    taken if the lock file exists and skipped otherwise (nobody can write there; the integrity record
    still guards the read). Yields whether a lock is held. ``timeout`` (seconds, ``None`` = wait) raises
    :class:`TimeoutError`.
    """
    p = store_path(path)
    key = str(p)
    held = _held_locks()
    if key in held:
        if held[key][0] and not shared:
            raise RuntimeError(f"this thread holds a shared lock on {p} and asks for an exclusive one: "
                               "take the exclusive lock first")
        held[key][1] += 1
        try:
            yield True
        finally:
            held[key][1] -= 1
        return
    if not shared:
        p.parent.mkdir(parents=True, exist_ok=True)
    lf = lock_file(p)
    fd = _acquire(lf, shared, timeout)
    held[key] = [shared, 1]
    try:
        if fd is not None and not shared:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd is not None
    finally:
        del held[key]
        if fd is not None:
            _release(fd, lf)


# ----------------------------------------------------------------------------- what is at a path


def _read_meta(p: Path) -> dict[str, Any] | None:
    """The consolidated metadata (``.zmetadata``) of a zarr v2 store, or None if unreadable."""
    try:
        with open(p / ".zmetadata", "rb") as fh:
            meta = json.load(fh)
        return meta["metadata"] if isinstance(meta.get("metadata"), dict) else None
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None


def store_kind(path: str | os.PathLike) -> str:
    """What is at ``path``: ``"missing"``, ``"empty"`` (an empty directory), ``"rlparity"`` (a store
    written by rlparity, this format or an earlier unmarked one), ``"file"`` or ``"other"``."""
    p = Path(path)
    if not os.path.lexists(p):
        return "missing"
    if not p.is_dir():
        return "file"
    try:
        if not os.listdir(p):
            return "empty"
    except OSError:
        return "other"
    meta = _read_meta(p)
    if meta is None:
        return "other"
    if STORE_MARKER in (meta.get(".zattrs") or {}):
        return "rlparity"
    for key, value in meta.items():  # stores from before the marker: arms stamped by make_attrs
        if key.count("/") == 1 and key.endswith("/.zattrs") and isinstance(value, dict) \
                and value.get("library") == "rlparity" and "schema_version" in value:
            return "rlparity"
    return "other"


def _describe(p: Path) -> str:
    if not p.is_dir():
        return "a file"
    try:
        names = sorted(os.listdir(p))
    except OSError as err:
        return f"an unreadable directory ({err.strerror})"
    shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
    return f"a directory holding {len(names)} {'entry' if len(names) == 1 else 'entries'}: {shown}"


def check_target(path: str | os.PathLike, *, overwrite: bool) -> Path:
    """Raise unless a store may be written at ``path``: missing, an empty directory, or an rlparity
    store when ``overwrite``. Anything else is refused, so a save never deletes user files."""
    p = store_path(path)
    kind = store_kind(p)
    if kind in ("file", "other"):
        raise StoreError(
            f"{p} exists and is not an rlparity store ({_describe(p)}): rlparity replaces only stores it "
            "wrote, or an empty directory; choose another path, or move those files away yourself")
    if kind == "rlparity" and not overwrite:
        raise FileExistsError(f"{p} exists; pass overwrite=True (--overwrite on the command line) or choose "
                              "another path")
    return p


# ----------------------------------------------------------------------------- integrity
# Our own digest, not zarr's ``crc32c`` codec (format 3; numcodecs' ``CRC32C`` filter in format 2):
# a checksum codec is part of each array's encoding, so using it would change the on-disk format of
# new stores and leave the shipped examples (rlparity/data/examples, written without it, which must
# keep loading) unchecked. It would also check each chunk's bytes only; the record here is one CRC-32
# per variable over its decoded values in a canonical form, kept in the root attrs: it catches a lossy
# encoding (a save reads its arms back against it), a read torn by a concurrent writer or a chunk file
# swapped for another intact one, and any reader can check it without zarr, block by block as the lazy
# reader does (:func:`digest_start` / :func:`digest_update`), whatever the chunking.


def _canonical_dtype(dtype: Any) -> np.dtype | None:
    """The numeric dtype a variable's values are digested as (None for text and unstored kinds)."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return np.dtype(np.uint8)
    if kind in "Mm":
        return np.dtype(np.int64)
    return np.dtype(dtype).newbyteorder("<") if kind in "iufc" else None


def digest_start(dtype: Any, shape: tuple[int, ...]) -> int | None:
    """The CRC-32 of a variable's header (its kind and whole shape), where :func:`digest_update`
    continues (None for kinds rlparity does not store)."""
    if np.dtype(dtype).kind in "UTOS":
        return zlib.crc32(f"str{tuple(shape)}".encode())
    canon = _canonical_dtype(dtype)
    return None if canon is None else zlib.crc32(f"{canon.kind}{canon.itemsize}{tuple(shape)}".encode())


def digest_update(crc: int, values: Any, *, first: bool = True) -> int:
    """``crc`` continued over ``values`` in their canonical form: numbers as little-endian bytes in C
    order, text as UTF-8 items joined by NUL (``first``: no NUL before the first item). Blocks of a
    variable along its first axis, fed in order, give the digest of the whole."""
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
    """``{variable: crc32}`` over every variable and coordinate of one arm (what
    ``rlparity_integrity`` records at save and :func:`verify_integrity` checks at load)."""
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
    """``{variable: how it changed}`` for every variable of ``saved`` that reads back from the store
    (``back``) with other values: a lossy encoding (``scale_factor``, a narrower ``dtype``)."""
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
    """The ``rlparity_integrity`` root attribute for ``{arm: Dataset}``."""
    return {"algorithm": DIGEST_ALGORITHM, "arms": {name: dataset_digests(ds) for name, ds in arms.items()}}


def verify_integrity(path: Path, arms: Mapping[str, xr.Dataset | None], record: Mapping[str, Any], *,
                     digests: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Raise :class:`StoreDamagedError` unless ``arms`` (loaded) match the record made at save
    (``digests``: their digests, already taken block by block)."""
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
    """``(array, n_missing, n_expected, example key)`` for every array of the store with chunk files
    missing. Stores written here hold every chunk (``write_empty_chunks=True``). The work is bounded
    by the files on disk, not by the shapes the metadata claims (a damaged ``.zmetadata`` claiming
    10^10 chunks is reported at once)."""
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
    """Raise :class:`StoreDamagedError` if any chunk file of the store is missing."""
    gone = missing_chunks(p, meta)
    if gone:
        arr, k, n, example = gone[0]
        more = f" (and {len(gone) - 1} more arrays)" if len(gone) > 1 else ""
        raise StoreDamagedError(
            f"the store is damaged: {p}: {k} of {n} chunks of {arr!r} are missing (e.g. chunk {example}){more}; "
            "they would read back as fill values (NaN / -1), not as the saved data: restore the store from "
            "a copy or re-create it")


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
    """Make ``p`` a zarr v2 group whose attributes are ``attrs`` (``.zgroup`` and ``.zattrs``)."""
    _write_json(p / ".zgroup", {"zarr_format": 2})
    _write_json(p / ".zattrs", dict(attrs))


def consolidate(p: Path, *, reuse: Mapping[str, Any] | None = None, reused_arms: Iterable[str] = ()) -> dict[str, Any]:
    """Write ``.zmetadata`` (zarr v2 consolidated metadata) from every ``.zgroup``, ``.zattrs`` and
    ``.zarray`` under ``p``, in one pass (zarr's own is slow on stores of many arms); return it.
    The entries of ``reused_arms`` are taken from ``reuse`` (arms linked unchanged from another store)."""
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
    """Copy the directory ``src`` to ``dst`` by hard links (a copy where links are refused). Stores
    are never changed in place, so sharing chunk files between an old and a new store is safe."""
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


# ----------------------------------------------------------------------------- temp store, swap, recovery


@contextlib.contextmanager
def temp_store(path: str | os.PathLike, *, kind: str = "tmp") -> Iterator[Path]:
    """A fresh empty directory ``DIR/.NAME.tmp-<pid>-<id>`` beside the store ``path``, guarded (a
    ``flock`` on it) so that no recovery cleans it while this process lives. Write the store into it
    with ``mode="w-"`` (``mode="w"`` would replace the directory and drop the guard), then call
    :func:`install_store`. Removed on exit unless installed. ``kind="staging"`` gives a guarded
    ``.NAME.staging-*`` scratch folder instead (an importer's chunks), always removed on exit."""
    if kind not in ("tmp", "staging"):
        raise ValueError(f"kind must be 'tmp' or 'staging', not {kind!r}")
    p = store_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.parent / f".{p.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.mkdir(tmp)
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield tmp
    finally:
        try:
            if os.path.lexists(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            os.close(fd)


def _claim(d: Path) -> int | None:
    """Lock a leftover directory if no live writer guards it; its fd, or None if it is live."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return -1  # not a directory we can open (a file, a link): an orphan all the same
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by a live writer (or not lockable here): keep it
        os.close(fd)
        return None
    return fd


def _complete(d: Path) -> bool:
    meta = _read_meta(d)
    if meta is None or INTEGRITY_ATTR not in (meta.get(".zattrs") or {}):
        return False
    return not missing_chunks(d, meta)


def _remove(d: Path) -> None:
    if d.is_dir() and not d.is_symlink():
        shutil.rmtree(d, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            d.unlink()


def recover(path: str | os.PathLike, *, keep: Path | None = None) -> list[str]:
    """Finish or undo an interrupted save of the store at ``path`` and clean its orphans.

    Takes the store lock. If the store is missing and a complete new copy (``.NAME.tmp-*`` with its
    integrity record, the swap had begun) or the previous store (``.NAME.old-*``) is beside it, that
    copy is put back (the newest complete new copy first). Leftovers whose writer is alive are kept;
    the rest (``.tmp-``, ``.old-`` and an importer's ``.staging-`` folders) are removed. Returns what was done, one line each. Called by every open and save.
    """
    p = store_path(path)
    done: list[str] = []
    with store_lock(p):
        claimed: list[tuple[Path, int]] = []
        try:
            for d in _leftovers(p):
                if keep is not None and d == keep:
                    continue
                fd = _claim(d)
                if fd is not None:
                    claimed.append((d, fd))
            if not os.path.lexists(p):
                real = [d for d, _ in claimed if d.is_dir() and not d.is_symlink()]  # never a planted link
                tmps = [d for d in real if _leftover_kind(p, d) == "tmp" and _complete(d)]
                olds = [d for d in real if _leftover_kind(p, d) == "old"]  # never a staging folder
                pick = max(tmps, key=lambda d: d.stat().st_mtime) if tmps else \
                    (max(olds, key=lambda d: d.stat().st_mtime) if olds else None)
                if pick is not None:
                    os.rename(pick, p)
                    _fsync_dir(p.parent)
                    done.append(f"restored {p} from {pick.name} ({'the new copy' if pick in tmps else 'the previous store'})")
            for d, _ in claimed:
                if os.path.lexists(d):
                    _remove(d)
                    done.append(f"removed orphan {d.name}")
        finally:
            for _, fd in claimed:
                if fd >= 0:
                    os.close(fd)
    return done


def recover_if_needed(path: str | os.PathLike) -> None:
    """Run :func:`recover` when leftovers of a save lie beside the store (cheap otherwise: one
    directory listing). In a read-only location, a missing store with leftovers is an error that says
    how to recover."""
    p = store_path(path)
    left = _leftovers(p)
    if not left:
        return
    try:
        recover(p)
    except StoreError:
        if os.path.lexists(p):
            return  # read-only: the store itself is intact; leave the leftovers
        raise StoreError(
            f"{p} is missing and an interrupted save left {[d.name for d in left]} beside it, but this "
            "location is not writable: open it once with write permission to recover it, or rename the "
            f"newest complete copy to {p.name}") from None


def _swap(tmp: Path, p: Path) -> Path | None:
    """Put ``tmp`` in place of ``p``: rename the old store aside, rename the new one in. A crash
    between the renames leaves both copies, which :func:`recover` resolves. Returns the old store's
    new name, for the caller to remove (outside the lock)."""
    if os.path.lexists(p):
        old = p.parent / f".{p.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(p, old)
        os.rename(tmp, p)
        _fsync_dir(p.parent)
        return old
    os.rename(tmp, p)
    _fsync_dir(p.parent)
    return None


def install_store(tmp_path: str | os.PathLike, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """Swap a fully written store ``tmp_path`` into place at ``path``, crash-safely; return ``path``.

    ``tmp_path`` must lie beside ``path`` (use :func:`temp_store`) and be a consolidated zarr v2
    store written with ``write_empty_chunks=True``. If it carries no integrity record (a streaming
    writer's), it is read back, every arm validated, and the marker and record written. Then, under
    the store lock: interrupted saves are recovered, ``path`` is checked (missing, an empty directory,
    or an rlparity store when ``overwrite``; anything else is refused and nothing is touched), and the
    swap is done. A crash at any point leaves the old store or the complete new one at the next open.
    """
    from rlparity.trace.schema import validate

    p = store_path(path)
    tmp = Path(os.path.abspath(os.fspath(tmp_path)))
    if tmp.parent != p.parent:
        raise StoreError(f"{tmp} is not beside {p}: write the new store with temp_store({str(p)!r}) so the "
                         "swap is a rename within one directory")
    meta = _read_meta(tmp)
    if meta is None:
        raise StoreError(f"{tmp} is not a consolidated zarr v2 store: write it with "
                         "to_zarr(..., consolidated=True, zarr_format=2)")
    root = meta.get(".zattrs") or {}
    if INTEGRITY_ATTR not in root:
        tree = _open_tree(tmp)
        arms = {name: node.to_dataset() for name, node in tree.children.items()}
        if not arms:
            raise StoreError(f"{tmp} holds no arms: write one group per arm")
        for name, ds in arms.items():
            check_arm_name(name)
            validate(ds, where=f"arm {name!r}")
        _write_root_attrs(tmp, {STORE_MARKER: STORE_FORMAT, INTEGRITY_ATTR: integrity_record(arms)})
        meta = _read_meta(tmp) or {}
    gone = missing_chunks(tmp, meta)
    if gone:
        raise StoreError(f"{tmp} lacks chunk files (e.g. {gone[0][0]!r} chunk {gone[0][3]}): write it with "
                         "write_empty_chunks=True so a missing chunk can be told from damage")
    with store_lock(p):
        recover(p, keep=tmp)
        check_target(p, overwrite=overwrite)
        old = _swap(tmp, p)
    if old is not None:
        _remove(old)  # an orphan if this process dies first: the next open removes it
    return p
