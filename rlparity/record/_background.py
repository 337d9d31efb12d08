"""The recorder's background writer: queued steps written and committed in order in one thread, and
committed at the interpreter's exit for a recorder never closed."""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any

from rlparity.record.store import RunWriter
from rlparity.trace.storage import StoreError


class BackgroundWriter:
    """Writes and commits queued steps in order in one thread; a failure is raised at the next call."""

    def __init__(self, writer: RunWriter, depth: int = 2):
        self.writer = writer
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="rlparity-recorder", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                if self.error is None:
                    rows, columns = item
                    self.writer.write_step(rows)
                    self.writer.commit(**columns)
            except BaseException as err:  # kept, raised in the loop's thread
                self.error = err
            finally:
                self.queue.task_done()

    def check(self) -> None:
        if self.error is not None:
            raise StoreError(f"writing the run store {self.writer.path} failed ({type(self.error).__name__}: "
                             f"{self.error}); the steps before it are committed") from self.error

    def submit(self, rows: dict[str, Any], columns: dict[str, list[str]]) -> None:
        self.check()
        self.queue.put((rows, columns))

    def flush(self) -> None:
        self.queue.join()
        self.check()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()


def finish_writer(background: BackgroundWriter | None, writer: RunWriter) -> None:
    """Commit what is queued and release the store: at :meth:`Recorder.close <rlparity.record.recorder.Recorder.close>`, or at the
    interpreter's exit for a recorder never closed."""
    try:
        if background is not None:
            background.stop()
    finally:
        writer.close()


def commit_at_exit(rec: Any) -> None:
    """At the interpreter's exit, commit a recorder's queued steps before the thread pools stop
    taking work (zarr writes through them; ``weakref.finalize``'s own exit hook runs too late)."""
    ref = weakref.ref(rec)

    def commit() -> None:
        r = ref()
        if r is not None:
            r._finalizer()

    register = getattr(threading, "_register_atexit", None)  # CPython's hook that concurrent.futures uses
    if register is not None:
        register(commit)



__all__ = ["BackgroundWriter", "commit_at_exit", "finish_writer"]
