"""At most one live engine per process, reused while the settings stay the same.

Small machines (and the engine lock) allow one vLLM engine at a time. :class:`EnginePool` keeps
the current engine alive across captures with the same model and settings and shuts it down
before starting one with other settings. Tests, ablations and notebooks share this so that each
setting starts once. A pooled engine is a cache: when another engine starts in the same thread
(``with Engine(...)``, ``AsyncEngine``, ``Server``), the pool's engine is shut down first.
"""

from __future__ import annotations

import os

from rlparity.capture.lock import set_idle_release
from rlparity.capture.offline import Engine
from rlparity.config.settings import EngineSettings


class EnginePool:
    """At most one live offline engine, reused while the model and settings stay the same.

    ``with EnginePool() as pool: eng = pool.get(model, settings)``; a context manager that closes
    its engine on exit. ``starts`` counts the engines it started.
    """
    def __init__(self) -> None:
        self._key: tuple[str, str] | None = None
        self._engine: Engine | None = None
        self.starts = 0

    def get(self, model: str | os.PathLike, settings: EngineSettings | None = None) -> Engine:
        """The live engine for ``(model, settings)``, starting it (and stopping another) if needed.

        Parameters
        ----------
        model : str or os.PathLike
            A Hugging Face model name or a local checkpoint directory.
        settings : EngineSettings, optional
            The engine's settings; ``None`` means ``EngineSettings()``. Settings are compared by
            their JSON dump.

        Returns
        -------
        Engine
            The running engine; it is marked idle-releasable, so an engine started next in this
            thread shuts it first (:func:`rlparity.capture.lock.set_idle_release`).
        """
        settings = settings or EngineSettings()
        key = (str(model), settings.model_dump_json())
        if self._key != key:
            self.close()
            eng = Engine(model, settings)
            eng.start()
            self._engine, self._key = eng, key
            self.starts += 1
            set_idle_release(self.close)  # an engine started next in this thread shuts this one first
        assert self._engine is not None
        return self._engine

    def holds(self, model: str | os.PathLike, settings: EngineSettings | None = None) -> bool:
        """Whether the live engine is the one :meth:`get` would return for ``(model, settings)``
        (no start needed).

        Parameters
        ----------
        model : str or os.PathLike
            The model.
        settings : EngineSettings, optional
            The settings; ``None`` means ``EngineSettings()``.

        Returns
        -------
        bool
            ``True`` when an engine with that model and settings is live.
        """
        key = (str(model), (settings or EngineSettings()).model_dump_json())
        return self._engine is not None and self._key == key

    def close(self) -> None:
        """Shut the pooled engine down (no-op without one)."""
        if self._engine is not None:
            set_idle_release(None)
            self._engine.close()
        self._engine, self._key = None, None

    def __enter__(self) -> EnginePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_SHARED: EnginePool | None = None


def shared_pool() -> EnginePool:
    """The process-wide pool (close it before another process needs an engine).

    Returns
    -------
    EnginePool
        The same pool on every call, made on the first.
    """
    global _SHARED
    if _SHARED is None:
        _SHARED = EnginePool()
    return _SHARED
