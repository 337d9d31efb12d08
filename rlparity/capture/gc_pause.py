"""Python's cyclic garbage collector paused around an engine's generate (issue 39).

vLLM's offline ``LLM.generate`` allocates and keeps, per step and request, objects the collector tracks
(request states, output lists, logprobs containers) until the call returns. They survive the young
collections and are promoted to the oldest generation in bulk, which sets off full collections: each walks
the whole heap of the client process (about 0.7 million objects for a CPU engine's client). On an H100
(1.5B shape, 256 prompts x 512 tokens) this was 0.58-0.73 s of every 3.8 s generate, 1 or 2 full
collections each (``benchmarks/results/capture_h100.json``). vLLM itself freezes its engine core's heap
after start-up for the same reason (``vllm.utils.gc_utils.freeze_gc_heap``); the offline client's is not.

:func:`gc_paused` disables the collector for a block (reference counting still frees every acyclic object
at once) and puts back the state it found. No collection is run after the block: the first allocation once
the collector is on again starts the young collection the block owed (its count is past the threshold), so
an explicit ``gc.collect(0)`` would only move that work (measured in ``benchmarks/capture.py``,
``young_collection_after_pause``), and the promotions that set off full collections have not happened.
Cyclic garbage made inside the block waits for the next collection. The collector is one per process:
other threads' garbage waits too while a block runs.

``defaults().capture_gc_pause`` (default on) turns it on or off for the captures of
:class:`~rlparity.capture.Engine` and the sync :meth:`~rlparity.capture.AsyncEngine.capture` (the caller waits
there too; on the CPU, tiny model, 128 x 256 tokens: the client's CPU 0.94x, 0.06-0.15 s of young and middle
collections a capture gone); ``AsyncEngine.acapture`` / ``capture_async`` run beside the caller's own work and
leave the collector alone. ``defaults_context(capture_gc_pause=False)``, or ``capture_gc_pause: false`` in
``RLPARITY_DEFAULTS``, turns it off.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_depth = 0  # blocks open now, in any thread
_was_enabled: bool | None = None  # the collector's state when the first of them opened


class gc_paused:  # noqa: N801 (a context manager named as the contextlib ones are)
    """Disable Python's cyclic garbage collector for a ``with`` block; restore the state found after it.

    Blocks may nest and overlap (in one thread or several, and close in any order): the first to open
    records whether the collector was enabled and disables it, the last to close enables it again only if
    it was enabled then. A collector found disabled stays disabled; an exception in the block restores
    the state too. Nothing is collected at entry or exit.

    Parameters
    ----------
    pause : bool, default True
        ``False`` runs the block with the collector as it is (a switch for callers' settings).

    Examples
    --------
    >>> import gc
    >>> with gc_paused():
    ...     gc.isenabled()
    False
    """

    def __init__(self, pause: bool = True):
        self.pause = bool(pause)

    def __enter__(self) -> None:
        global _depth, _was_enabled
        if self.pause:
            with _lock:
                if _depth == 0:
                    _was_enabled = gc.isenabled()
                    gc.disable()
                _depth += 1

    def __exit__(self, *exc: object) -> None:
        global _depth
        if self.pause:
            with _lock:
                _depth -= 1
                if _depth == 0 and _was_enabled:
                    gc.enable()


__all__ = ["gc_paused"]
