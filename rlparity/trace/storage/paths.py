"""A store's names and paths, its errors, and what is at a path (see :mod:`rlparity.trace.storage` for
the layout: ``DIR/NAME`` and the hidden ``.NAME.lock``, ``.NAME.tmp-*``, ``.NAME.old-*`` and
``.NAME.staging-*`` beside it)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from rlparity.trace.schema import TraceValidationError

STORE_FORMAT = 1
STORE_MARKER = "rlparity_store"
INTEGRITY_ATTR = "rlparity_integrity"
ARM_NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.+=,@-]{0,99}"
_ARM_RE = re.compile(ARM_NAME_PATTERN)
_RESERVED = {"zarr.json", "__pycache__"}


class StoreError(TraceValidationError):
    """A store path cannot be used as asked (not a store, in the way, unreadable, bad arm name)."""


class StoreDamagedError(StoreError):
    """A store reads back other data than was saved: missing chunks, changed or torn data."""


_RESHAPE = re.compile(r"cannot reshape array of size (\d+) into shape \(([\d, ]+)\)")


def decode_failure(err: BaseException) -> str:
    """Why a chunk did not decode, in the user's terms (for a :class:`StoreDamagedError`).

    Parameters
    ----------
    err : BaseException
        What zarr or numpy raised.

    Returns
    -------
    str
        ``"<type>: <message>"``, with numpy's "cannot reshape" said as a chunk of the wrong size.
    """
    text = " ".join(str(err).split())
    m = _RESHAPE.search(text)
    if m:
        room = int(np.prod([int(v) for v in m.group(2).replace(" ", "").split(",") if v]))
        return (f"a chunk file holds {m.group(1)} values where the store's layout has room for {room}: it was "
                "copied from another store or written with other chunks")
    return f"{type(err).__name__}: {text}"


# ----------------------------------------------------------------------------- names and paths


def check_arm_name(name: Any) -> str:
    """Return ``name`` if it can name an arm (a zarr group), else raise :class:`StoreError`.

    Allowed: 1-100 characters from letters, digits and ``_ . + = , @ -``, not starting with ``.``,
    ``-``, ``+``, ``=``, ``,`` or ``@`` (so no hidden names, no ``/`` and none of zarr's ``.z*`` keys).

    Parameters
    ----------
    name : Any
        The proposed arm name.

    Returns
    -------
    str
        ``name``.

    Raises
    ------
    StoreError
        ``name`` is not text, does not match the pattern, or is reserved by zarr.
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
    """The absolute path a store is handled at.

    Symbolic links resolved, so every name of one store shares one lock and one set of temporary
    names.

    Parameters
    ----------
    path : str or os.PathLike
        The store's path.

    Returns
    -------
    pathlib.Path
        The resolved path.

    Raises
    ------
    StoreError
        The path names ``.``, ``..`` or ``/``, the working directory or a folder above it.
    """
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
    """``DIR/.NAME.lock``: the file :func:`~rlparity.trace.storage.locking.store_lock` locks for the store ``DIR/NAME``.

    Parameters
    ----------
    path : str or os.PathLike
        The store's path.

    Returns
    -------
    pathlib.Path
        The lock file's path.
    """
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


# ----------------------------------------------------------------------------- what is at a path


def _read_meta(p: Path) -> dict[str, Any] | None:
    """The consolidated metadata (``.zmetadata``) of a zarr v2 store, or None if unreadable."""
    try:
        with open(p / ".zmetadata", "rb") as fh:
            meta = json.load(fh)
        return meta["metadata"] if isinstance(meta.get("metadata"), dict) else None
    except (OSError, ValueError, AttributeError, KeyError, TypeError, RecursionError):  # nested 100k deep
        return None


def store_kind(path: str | os.PathLike) -> str:
    """What is at ``path``.

    Parameters
    ----------
    path : str or os.PathLike
        Any path.

    Returns
    -------
    str
        ``"missing"``, ``"empty"`` (an empty directory), ``"rlparity"`` (a store written by rlparity,
        this format or an earlier unmarked one), ``"file"`` or ``"other"``.
    """
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
    """Raise unless a store may be written at ``path``.

    A store may go where nothing is, in an empty directory, or over an rlparity store when
    ``overwrite``. Anything else is refused, so a save never deletes user files.

    Parameters
    ----------
    path : str or os.PathLike
        Where the store is to be written.
    overwrite : bool
        Whether an existing rlparity store may be replaced.

    Returns
    -------
    pathlib.Path
        The resolved store path (:func:`store_path`).

    Raises
    ------
    StoreError
        A file or a folder that is not an rlparity store is at ``path``.
    FileExistsError
        An rlparity store is at ``path`` and ``overwrite`` is False.
    """
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
