"""Run the test suite in two lanes at once: the tests that start vLLM engines, and the others.

An engine start on a small CPU machine is mostly one process spawning others and importing vLLM: one
core works while the other waits. The tests that start no engine (``-m "not engine"``) run meanwhile on
that core, in a second pytest process. The engine lane keeps the machine-wide engine lock; the other lane
gets a lock file of its own, and a lane that was supposed to start no engine but created it fails the run
(a test starts an engine, perhaps through a subprocess, without ``@pytest.mark.engine``).

The engine lane is the longer one (on a fresh clone about 40 minutes against 12), so it gets the CPU first:
the other lane runs at a lower scheduling priority (``nice`` 10, for its children too: about a tenth of a core
where both want it, not so little that a test of its own that waits on a child's timing starves) and takes the
cycles the engine lane leaves, e.g. while an engine starts. The engine lane runs the offline engines' core in
its own processes (``RLPARITY_ENGINE_IN_PROCESS=on``, :mod:`rlparity.capture.in_process`): no core and worker
processes to spawn and import vLLM in at each start. On a 2-core machine a light-lane test that runs beside
the engine lane's rescoring or an engine's own threads can slow them by more than its own share (threads that
meet at a barrier wait for the one that was preempted; issue 42). A lane that waits for the other (a model built once
under a lock, ``rlparity.models.make_model``) leaves it the whole machine, whatever its priority.

What needs no engine moves to the other lane: the notebooks that start none with ``ci=True`` and the book
(``tests/test_book.py``: sphinx on the executed notebooks). The engine lane executes the other notebooks into
``artifacts/notebooks/`` as before and names each one done in a folder both lanes share
(``RLPARITY_LANE_NOTEBOOKS``; ``RLPARITY_LANE`` says which lane a process is); the book's tests run last in the
other lane and wait for them (``tests/conftest.py``).

    python scripts/test_lanes.py [PYTEST ARGS...]     # e.g. --durations=40 tests

The engine lane prints as it runs; the other lane's output follows when both are done. Exit status: the
first non-zero of the two lanes, or 3 when the lane without engines started one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

LIGHT_NICE = 10  # the lane without engines: a lower priority (see the module docstring)


def _lower_priority() -> None:
    os.nice(LIGHT_NICE)


def main(argv: list[str]) -> int:
    args = argv or ["tests"]
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="rlparity-lanes-") as tmp:
        os.chmod(tmp, 0o700)
        lock = Path(tmp) / "light-lane-engine.lock"
        log = Path(tmp) / "light.log"
        notebooks = Path(tmp) / "notebooks"  # the engine lane says here which notebooks it executed (the book)
        notebooks.mkdir()
        lane_env = {**os.environ, "RLPARITY_LANE_NOTEBOOKS": str(notebooks)}
        light_env = {**lane_env, "RLPARITY_LANE": "light", "RLPARITY_ENGINE_LOCK_PATH": str(lock)}
        # the offline engines' core in the test process and the notebooks' kernels (rlparity.capture.in_process:
        # the same logprobs, an engine start about 18 s shorter on 2 cores); a value the caller set wins
        engine_env = {**lane_env, "RLPARITY_LANE": "engine",
                      "RLPARITY_ENGINE_IN_PROCESS": os.environ.get("RLPARITY_ENGINE_IN_PROCESS", "on")}
        with open(log, "w") as fh:
            light = subprocess.Popen([py, "-m", "pytest", "-q", "-m", "not engine", "-p", "no:cacheprovider", *args],
                                     stdout=fh, stderr=subprocess.STDOUT, env=light_env, preexec_fn=_lower_priority)
            try:
                heavy_rc = subprocess.call([py, "-m", "pytest", "-q", "-m", "engine", "-p", "no:cacheprovider", *args],
                                           env=engine_env)
            finally:
                (notebooks / "engine-lane.done").touch()  # the book stops waiting for a notebook not executed
                light_rc = light.wait()
        print("\n==================== tests without an engine (run alongside) ====================", flush=True)
        print(log.read_text(), flush=True)
        started = lock.exists()
    if started:
        print("test_lanes: a test outside @pytest.mark.engine started a vLLM engine (the lane without engines took "
              "an engine lock): mark it @pytest.mark.engine", file=sys.stderr)
    # pytest exits 5 when a lane selects no test (e.g. one file given): not a failure of that lane
    rcs = [0 if rc == 5 else rc for rc in (heavy_rc, light_rc)]
    if all(rc == 0 for rc in rcs) and (heavy_rc, light_rc) == (5, 5):
        return 5
    return next((rc for rc in rcs if rc), 3 if started else 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
