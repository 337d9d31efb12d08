"""What every in-process engine backend shares: the lock, the settings' environment, start/close."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from rlparity.capture.engine_config import cpu_engine_env, fit_to_model
from rlparity.capture.lock import engine_lock
from rlparity.config.env import scoped_env
from rlparity.config.logs import engine_logging
from rlparity.config.settings import EngineSettings


def engine_env(settings: EngineSettings) -> dict[str, str]:
    """Environment variables an in-process engine with ``settings`` needs.

    vLLM reads some, e.g. ``VLLM_BATCH_INVARIANT`` or the CPU KV-cache size, only from there.

    Parameters
    ----------
    settings : EngineSettings
        The engine's settings.

    Returns
    -------
    dict of str to str
        :func:`rlparity.capture.engine_config.cpu_engine_env` merged with ``settings.env()``.
    """
    return {**cpu_engine_env(), **settings.env()}


@contextlib.contextmanager
def engine_session(settings: EngineSettings) -> Iterator[None]:
    """Hold what an in-process engine needs for as long as it lives.

    The engine lock plus :func:`engine_env` and this start's logging
    (:func:`rlparity.config.logs.engine_logging`); the environment is restored and the logging
    config removed on exit.

    Parameters
    ----------
    settings : EngineSettings
        The engine's settings (their environment variables are set).

    Yields
    ------
    None
        Inside the block the lock is held and the environment set.
    """
    with engine_lock(), engine_logging() as log_env, scoped_env({**engine_env(settings), **log_env}):
        yield


class EngineLifecycle:
    """What every in-process backend shares: start, close, the context manager.

    ``start()`` once (lazily through :attr:`llm`), ``close()`` idempotent, usable as a context
    manager. Subclasses implement ``_start_llm`` (returns the vLLM object) and ``_stop_llm``.
    """

    model: str
    settings: EngineSettings
    _llm: Any = None
    _session: contextlib.ExitStack | None = None
    startup_s: float | None = None

    def _start_llm(self) -> Any:
        raise NotImplementedError

    def _stop_llm(self) -> None:
        raise NotImplementedError

    def start(self):
        """Start the engine (once; a second call does nothing).

        Fits the settings to the model (:func:`rlparity.capture.engine_config.fit_to_model`),
        enters :func:`engine_session` and builds the vLLM object; on failure everything is closed
        again and the error raised.

        Returns
        -------
        EngineLifecycle
            The engine itself, started.
        """
        if self._llm is not None:
            return self
        self.settings = fit_to_model(self.model, self.settings)  # a model shorter than the default context
        self._session = contextlib.ExitStack()
        self._session.enter_context(engine_session(self.settings))
        try:
            t0 = time.perf_counter()
            self._llm = self._start_llm()
            self.startup_s = time.perf_counter() - t0
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Shut the engine down and free its memory; release the lock and the environment."""
        self._stop_llm()
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def llm(self):
        """The running vLLM object (the engine starts on first use)."""
        if self._llm is None:
            self.start()
        return self._llm


__all__ = ["EngineLifecycle", "engine_env", "engine_session"]
