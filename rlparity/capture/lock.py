"""The machine-wide engine lock: one vLLM engine at a time."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

_LOCK_PATH = Path(os.environ.get("RLPARITY_ENGINE_LOCK", "/tmp/rlparity-engine.lock"))


@contextlib.contextmanager
def engine_lock(enabled: bool | None = None) -> Iterator[None]:
    """Hold a machine-wide lock while an engine runs, so only one vLLM engine runs at a time.

    Small CPU machines cannot run two engines; set ``RLPARITY_ENGINE_LOCK=off`` to disable.
    """
    if enabled is None:
        enabled = os.environ.get("RLPARITY_ENGINE_LOCK", "") not in ("off", "0", "false")
    if not enabled:
        yield
        return
    _LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(_LOCK_PATH, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


__all__ = ["engine_lock"]
