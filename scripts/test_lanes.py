"""Run the test suite in two lanes at once: the tests that start vLLM engines, and the others.

An engine start on a small CPU machine is mostly one process spawning others and importing vLLM: one
core works while the other waits. The tests that start no engine (``-m "not engine"``) run meanwhile on
that core, in a second pytest process. The engine lane keeps the machine-wide engine lock; the other lane
gets a lock file of its own, and a lane that was supposed to start no engine but created it fails the run
(a test starts an engine, perhaps through a subprocess, without ``@pytest.mark.engine``).

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


def main(argv: list[str]) -> int:
    args = argv or ["tests"]
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="rlparity-lanes-") as tmp:
        os.chmod(tmp, 0o700)
        lock = Path(tmp) / "light-lane-engine.lock"
        log = Path(tmp) / "light.log"
        light_env = {**os.environ, "RLPARITY_ENGINE_LOCK_PATH": str(lock)}
        with open(log, "w") as fh:
            light = subprocess.Popen([py, "-m", "pytest", "-q", "-m", "not engine", "-p", "no:cacheprovider", *args],
                                     stdout=fh, stderr=subprocess.STDOUT, env=light_env)
            try:
                heavy_rc = subprocess.call([py, "-m", "pytest", "-q", "-m", "engine", "-p", "no:cacheprovider", *args])
            finally:
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
