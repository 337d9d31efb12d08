"""The store lock: ``flock`` on ``DIR/.NAME.lock``, exclusive for writers and shared for readers,
re-entrant within a thread (:func:`store_lock`)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from rlparity.trace.storage.paths import StoreError, lock_file, store_path

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
    and :func:`~rlparity.trace.storage.recovery.install_store` take it, so concurrent writers never lose each other's arms. Shared for
    a reader: loading takes it, so a reader never sees a store half-swapped. Re-entrant within a
    thread (an exclusive holder may read and write again). In a read-only location a shared lock is
    taken if the lock file exists and skipped otherwise (nobody can write there; the integrity record
    still guards the read).

    Parameters
    ----------
    path : str or os.PathLike
        The store.
    shared : bool, default False
        Take a shared (reader's) lock instead of an exclusive one.
    timeout : float, optional
        Seconds to wait for the lock; ``None`` waits as long as it takes.

    Yields
    ------
    bool
        Whether a lock is held (False only for a shared lock in a read-only location without a lock
        file).

    Raises
    ------
    TimeoutError
        Another process held the lock for longer than ``timeout``.
    StoreError
        The lock path is a symbolic link, or an exclusive lock cannot be written beside the store.
    RuntimeError
        This thread holds a shared lock and asks for an exclusive one.
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
