"""The engine lock: one vLLM engine at a time per user on a machine.

Small machines cannot run two engines, so every in-process engine (and the server backend) holds
this lock while it lives. Settings, all read when the lock is taken:

``RLPARITY_ENGINE_LOCK``
    ``on`` (default) or ``off`` (also ``1``/``0``, ``true``/``false``, ``yes``/``no``). Turn it off
    where a scheduler already gives each job its own GPUs (e.g. a GPU host).
``RLPARITY_ENGINE_LOCK_PATH``
    the lock file; default ``/tmp/rlparity-<uid>/engine.lock``. The default directory is created
    mode 0700 and must belong to you (a directory planted by someone else is refused). The same
    default for every session of a user, whatever its environment (``$XDG_RUNTIME_DIR`` differs
    between login and batch sessions, so it would not exclude them from each other).
``RLPARITY_ENGINE_LOCK_TIMEOUT``
    seconds to wait for another engine before giving up (default 3600; 0 = do not wait).

The file is opened without following symbolic links (a link planted at the path is refused and its
target left untouched), created mode 0600, and holds the holder's pid. While waiting, one line on
stderr names the holder.
"""

from __future__ import annotations

# Not filelock's FileLock: it opens the lock file itself, by path, while the checks here (a private
# 0700 directory of ours, no link, a regular 0600 file) are made on the very descriptor that is then
# locked and that names the holder's pid while another process waits (nothing can be swapped in
# between). It would replace only the polling loop; a second engine in the same thread must still
# fail at once here (or first stop the pool's idle engine: :func:`set_idle_release`), where a second
# FileLock waits out its timeout.

import contextlib
import errno
import fcntl
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

DEFAULT_TIMEOUT_S = 3600.0
_ON = {"on", "1", "true", "yes"}
_OFF = {"off", "0", "false", "no"}
DEFAULT_DIR_PARENT = Path("/tmp")  # the default lock lives in DEFAULT_DIR_PARENT/rlparity-<uid>/
_held_here: dict[tuple[int, int], str] = {}  # (pid, thread) -> lock path
# (pid, thread) -> how to stop the idle engine a pool keeps alive in that thread (a cache, not a user's engine)
_idle_release: dict[tuple[int, int], Callable[[], None]] = {}


class EngineLockError(RuntimeError):
    """The engine lock cannot be used (unsafe path, bad setting) or was not obtained in time."""


class EngineLockTimeout(EngineLockError, TimeoutError):
    """Another engine held the lock for longer than ``RLPARITY_ENGINE_LOCK_TIMEOUT``."""


def engine_lock_enabled() -> bool:
    """``RLPARITY_ENGINE_LOCK`` read as a switch (default on); anything else is an error.

    Returns
    -------
    bool
        ``True`` for ``on``, ``1``, ``true``, ``yes``, an empty value or an unset variable;
        ``False`` for ``off``, ``0``, ``false``, ``no`` (case-insensitive).

    Raises
    ------
    EngineLockError
        If the variable holds anything else (a path gets a hint to use ``RLPARITY_ENGINE_LOCK_PATH``).
    """
    raw = os.environ.get("RLPARITY_ENGINE_LOCK", "on")
    value = raw.strip().lower()
    if value in _ON or value == "":
        return True
    if value in _OFF:
        return False
    hint = (" (it is a switch now: set the file with RLPARITY_ENGINE_LOCK_PATH)"
            if "/" in raw or raw.endswith(".lock") else "")
    raise EngineLockError(f"RLPARITY_ENGINE_LOCK={raw!r} is not on or off{hint}: use RLPARITY_ENGINE_LOCK=on|off")


def engine_lock_timeout() -> float:
    """``RLPARITY_ENGINE_LOCK_TIMEOUT`` in seconds (default 3600).

    Returns
    -------
    float
        Seconds to wait for another engine; :data:`DEFAULT_TIMEOUT_S` when unset or empty.

    Raises
    ------
    EngineLockError
        If the value is not a finite number >= 0.
    """
    raw = os.environ.get("RLPARITY_ENGINE_LOCK_TIMEOUT")
    if raw is None or raw.strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise EngineLockError(f"RLPARITY_ENGINE_LOCK_TIMEOUT={raw!r}: give a number of seconds >= 0 (default "
                              f"{DEFAULT_TIMEOUT_S:g})")
    return value


def engine_lock_path() -> Path:
    """The lock file: ``RLPARITY_ENGINE_LOCK_PATH``, else ``/tmp/rlparity-<uid>/engine.lock``.

    Returns
    -------
    pathlib.Path
        The path (nothing is created or opened).
    """
    explicit = os.environ.get("RLPARITY_ENGINE_LOCK_PATH")
    if explicit:
        return Path(explicit)
    return DEFAULT_DIR_PARENT / f"rlparity-{os.getuid()}" / "engine.lock"


def _private_dir(d: Path) -> int:
    """Open (creating mode 0700) the default lock directory; refuse one that is not ours."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o700)
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise EngineLockError(f"{d} is not a directory of yours ({err.strerror}): remove it, or set "
                              "RLPARITY_ENGINE_LOCK_PATH to a file in a directory you own") from err
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        os.close(fd)
        raise EngineLockError(f"{d} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): someone may be "
                              "interfering; remove it, or set RLPARITY_ENGINE_LOCK_PATH")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.fchmod(fd, 0o700)
    return fd


def _open_lock(path: Path) -> int:
    explicit = bool(os.environ.get("RLPARITY_ENGINE_LOCK_PATH"))
    if explicit:
        path.parent.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    else:
        dir_fd = _private_dir(path.parent)
    try:
        fd = os.open(path.name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise EngineLockError(f"{path} is a symbolic link; the engine lock never follows links (its target is "
                                  "left untouched): remove the link, or set RLPARITY_ENGINE_LOCK_PATH") from err
        raise EngineLockError(f"cannot open the engine lock {path}: {err.strerror}; set "
                              "RLPARITY_ENGINE_LOCK_PATH to a writable file, or RLPARITY_ENGINE_LOCK=off") from err
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise EngineLockError(f"{path} is not a regular file: remove it, or set RLPARITY_ENGINE_LOCK_PATH")
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != 0o600:
        os.fchmod(fd, 0o600)
    return fd


def _me() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()


def set_idle_release(release: Callable[[], None] | None) -> None:
    """Mark the engine this thread holds the lock for as a cached, idle one.

    :class:`rlparity.capture.pool.EnginePool` does this, so that an engine a user starts next in the
    same thread first shuts the pool's idle engine instead of failing on the lock.

    Parameters
    ----------
    release : callable or None
        Stops the idle engine (and so releases the lock); ``None`` clears the mark.
    """
    if release is None:
        _idle_release.pop(_me(), None)
    else:
        _idle_release[_me()] = release


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        return "another process"
    return f"pid {text}" if text.isdigit() else "another process"


@contextlib.contextmanager
def engine_lock(enabled: bool | None = None, *, timeout: float | None = None) -> Iterator[None]:
    """Hold the engine lock while an engine runs, so only one vLLM engine runs at a time.

    Another thread of the process waits like another process does; see the module docstring for
    the path and the settings.

    Parameters
    ----------
    enabled : bool, optional
        Take the lock at all; ``None`` reads ``RLPARITY_ENGINE_LOCK`` (default on).
    timeout : float, optional
        Seconds to wait for another engine; ``None`` reads ``RLPARITY_ENGINE_LOCK_TIMEOUT`` (3600).

    Yields
    ------
    None
        Inside the block the lock is held (the file holds this process's pid).

    Raises
    ------
    EngineLockTimeout
        If another engine holds the lock longer than ``timeout``.
    EngineLockError
        At once when this thread already holds the lock (a second engine here would wait for
        itself), or when the lock path is unsafe or unusable.
    """
    if enabled is None:
        enabled = engine_lock_enabled()
    if not enabled:
        yield
        return
    wait_s = engine_lock_timeout() if timeout is None else float(timeout)
    path = engine_lock_path()
    me = _me()
    if me in _held_here and me in _idle_release:  # a pool's idle engine: shut it, then go on
        _idle_release.pop(me)()
    if me in _held_here:
        raise EngineLockError(f"this thread already holds the engine lock {_held_here[me]} (another engine is "
                              "running here and a second one would wait for it forever): close it first")
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"rlparity: waiting for the vLLM engine lock held by {_holder(fd)} ({path}); giving up after "
                  f"{wait_s:g} s (RLPARITY_ENGINE_LOCK_TIMEOUT)", file=sys.stderr, flush=True)
            deadline = time.monotonic() + wait_s
            delay = 0.05
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise EngineLockTimeout(
                            f"the vLLM engine lock {path} is still held by {_holder(fd)} after {wait_s:g} s: wait "
                            "for that engine to finish or stop it, or raise RLPARITY_ENGINE_LOCK_TIMEOUT") from None
                    time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                    delay = min(delay * 1.5, 1.0)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _held_here[me] = str(path)
        try:
            yield
        finally:
            _held_here.pop(me, None)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
