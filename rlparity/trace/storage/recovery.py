"""Writing a store crash-safely: the guarded temporary store (:func:`temp_store`), the swap into
place (:func:`install_store`), and the recovery of an interrupted save (:func:`recover`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from rlparity.trace.storage.files import _open_tree, _write_root_attrs
from rlparity.trace.storage.integrity import integrity_record, missing_chunks
from rlparity.trace.storage.locking import store_lock
from rlparity.trace.storage.paths import (
    INTEGRITY_ATTR,
    STORE_FORMAT,
    STORE_MARKER,
    StoreError,
    _fsync_dir,
    _leftover_kind,
    _leftovers,
    _read_meta,
    check_arm_name,
    check_target,
    store_path,
)



@contextlib.contextmanager
def temp_store(path: str | os.PathLike, *, kind: str = "tmp") -> Iterator[Path]:
    """A fresh empty directory ``DIR/.NAME.tmp-<pid>-<id>`` beside the store ``path``, guarded.

    A ``flock`` on it means no recovery cleans it while this process lives. Write the store into it
    with ``mode="w-"`` (``mode="w"`` would replace the directory and drop the guard), then call
    :func:`install_store`. Removed on exit unless installed.

    Parameters
    ----------
    path : str or os.PathLike
        The store the folder is for.
    kind : {"tmp", "staging"}, default "tmp"
        ``"staging"`` gives a guarded ``.NAME.staging-*`` scratch folder instead (an importer's
        chunks), always removed on exit.

    Yields
    ------
    pathlib.Path
        The folder.

    Raises
    ------
    ValueError
        ``kind`` is neither ``"tmp"`` nor ``"staging"``.
    """
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


_CREATOR = re.compile(r"-(\d+)-[0-9a-f]{8}$")


def _creator_alive(d: Path) -> bool:
    """Whether the process named in a ``.NAME.tmp-<pid>-<id>`` / ``.staging-`` folder's name is
    alive on this machine. :func:`temp_store` makes the folder, then locks it: between the two, only
    the name says a writer owns it (a recovery that claimed it there removed a live writer's folder)."""
    m = _CREATOR.search(d.name)
    if m is None:
        return False
    pid = int(m.group(1))
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        return True
    return True


def _claim(d: Path, kind: str | None = None) -> int | None:
    """Lock a leftover directory if no live writer guards it; its fd, or None if it is live. A
    ``tmp`` / ``staging`` folder whose creating process is alive is live even before its lock."""
    if kind in ("tmp", "staging") and _creator_alive(d):
        return None
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
    the rest (``.tmp-``, ``.old-`` and an importer's ``.staging-`` folders) are removed. Called by
    every open and save.

    Parameters
    ----------
    path : str or os.PathLike
        The store.
    keep : pathlib.Path, optional
        A leftover to leave alone (the new copy being installed).

    Returns
    -------
    list[str]
        What was done, one line each.
    """
    p = store_path(path)
    done: list[str] = []
    with store_lock(p):
        claimed: list[tuple[Path, int]] = []
        try:
            for d in _leftovers(p):
                if keep is not None and d == keep:
                    continue
                fd = _claim(d, _leftover_kind(p, d))
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
    """Run :func:`recover` when leftovers of a save lie beside the store.

    Cheap otherwise: one directory listing.

    Parameters
    ----------
    path : str or os.PathLike
        The store.

    Raises
    ------
    StoreError
        In a read-only location, the store is missing and leftovers lie beside it (the message says
        how to recover).
    """
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
    """Swap a fully written store ``tmp_path`` into place at ``path``, crash-safely.

    If ``tmp_path`` carries no integrity record (a streaming writer's), it is read back, every arm
    validated, and the marker and record written. Then, under the store lock: interrupted saves are
    recovered, ``path`` is checked (missing, an empty directory, or an rlparity store when
    ``overwrite``; anything else is refused and nothing is touched), and the swap is done. A crash
    at any point leaves the old store or the complete new one at the next open.

    Parameters
    ----------
    tmp_path : str or os.PathLike
        The new store, beside ``path`` (use :func:`temp_store`): a consolidated zarr v2 store written
        with ``write_empty_chunks=True``.
    path : str or os.PathLike
        Where the store goes.
    overwrite : bool, default False
        Whether an existing rlparity store at ``path`` may be replaced.

    Returns
    -------
    pathlib.Path
        The store's resolved path.

    Raises
    ------
    StoreError
        ``tmp_path`` is not beside ``path``, not a consolidated zarr v2 store, holds no arms, or lacks
        chunk files; or something other than an rlparity store is at ``path``.
    TraceValidationError
        An arm does not follow the schema.
    FileExistsError
        A store is at ``path`` and ``overwrite`` is False.
    """
    from rlparity.trace.validation import validate

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
