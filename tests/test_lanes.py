"""scripts/test_lanes.py: the two lanes of `make test` (engine tests, and the others beside them)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _lanes():
    spec = importlib.util.spec_from_file_location("test_lanes_script", ROOT / "scripts" / "test_lanes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _suite(tmp_path, body: str) -> str:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    engine: starts an engine\n")
    f = tmp_path / "test_x.py"
    f.write_text(textwrap.dedent(body))
    return str(f)


@pytest.mark.parametrize("body, rc", [
    # both lanes pass: 0
    ("""
     import pytest
     @pytest.mark.engine
     def test_engine(): pass
     def test_plain(): pass
     """, 0),
    # the lane without engines fails: its status
    ("""
     import pytest
     @pytest.mark.engine
     def test_engine(): pass
     def test_plain(): assert False
     """, 1),
    # the engine lane fails: its status
    ("""
     import pytest
     @pytest.mark.engine
     def test_engine(): assert False
     def test_plain(): pass
     """, 1),
    # a test without the engine marker takes the engine lock: the run fails (3)
    ("""
     from rlparity.capture.lock import engine_lock
     def test_plain():
         with engine_lock(enabled=True):
             pass
     """, 3),
])
def test_lanes_combine_their_status_and_catch_an_unmarked_engine(tmp_path, monkeypatch, capsys, body, rc):
    monkeypatch.chdir(tmp_path)
    assert _lanes().main([_suite(tmp_path, body)]) == rc
    out = capsys.readouterr()
    if rc == 3:
        assert "mark it @pytest.mark.engine" in out.err


def test_the_lane_without_engines_runs_at_the_lowest_priority_and_the_engine_lane_at_ours(tmp_path, monkeypatch):
    """The engine lane is the long one: it keeps this process's priority, the other lane (and what it starts)
    runs at nice 10, so on a small machine it takes mostly the cycles the engine lane leaves. The engine lane's
    offline engines run their core in its processes (``RLPARITY_ENGINE_IN_PROCESS=on``)."""
    import os

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLPARITY_ENGINE_IN_PROCESS", raising=False)
    ours = os.nice(0)
    body = f"""
     import os, subprocess, sys
     import pytest
     @pytest.mark.engine
     def test_engine():
         assert os.nice(0) == {ours}
         assert os.environ["RLPARITY_ENGINE_IN_PROCESS"] == "on"  # the offline engines' core in the lane's processes
     def test_plain():
         assert os.nice(0) == {min(ours + 10, 19)}
         assert "RLPARITY_ENGINE_IN_PROCESS" not in os.environ
         child = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True, text=True)
         assert int(child.stdout) == {min(ours + 10, 19)}
     """
    assert _lanes().main([_suite(tmp_path, body)]) == 0


def test_test_check_runs_right_after_test_engine_whose_captures_it_reuses():
    """conftest's ordering: test_check's arms are test_engine's captures (capture_trace's cache), so it runs
    right after test_engine instead of starting both engines again before it; the rest keep their order."""
    from conftest import order_for_shared_captures

    class Item:
        def __init__(self, path):
            self.fspath = path

    names = ["test_a.py", "test_check.py", "test_check.py", "test_doctor.py", "test_engine.py", "test_engine.py",
             "test_faults.py"]
    items = [Item(f"/x/tests/{n}") for n in names]
    got = [Path(str(i.fspath)).name for i in order_for_shared_captures(items)]
    assert got == ["test_a.py", "test_doctor.py", "test_engine.py", "test_engine.py", "test_check.py",
                   "test_check.py", "test_faults.py"]
    alone = [Item("/x/tests/test_check.py"), Item("/x/tests/test_a.py")]  # no test_engine collected: as given
    assert order_for_shared_captures(alone) == alone


def test_the_book_waits_for_the_notebooks_the_engine_lane_executed(tmp_path, monkeypatch):
    """The lane without engines builds the book from the engine lane's notebooks: it takes a notebook's out_dir
    once the engine lane named it done (even when the engine lane ended right after), fails with the engine
    lane's error for a notebook that failed there, and does not wait for one the engine lane never executed."""
    import threading
    import time

    import conftest

    monkeypatch.setattr(conftest, "LANE_NOTEBOOKS", str(tmp_path))
    monkeypatch.setattr(conftest, "LANE", "engine")
    conftest._publish("01_x", tmp_path / "out01")
    assert conftest._published("01_x") == tmp_path / "out01"
    late = threading.Timer(3.0, lambda: (conftest._publish("02_x", tmp_path / "out02"),
                                         (tmp_path / "engine-lane.done").touch()))
    t0 = time.monotonic()
    late.start()
    assert conftest._published("02_x") == tmp_path / "out02" and time.monotonic() - t0 >= 2.5
    conftest._publish("03_x", None, RuntimeError("cell 4 raised"))
    with pytest.raises(pytest.fail.Exception, match="03_x failed in the engine lane: RuntimeError: cell 4 raised"):
        conftest._published("03_x")
    with pytest.raises(pytest.fail.Exception, match="without executing notebook 04_x"):
        conftest._published("04_x")
    monkeypatch.setattr(conftest, "LANE", "light")  # only the engine lane publishes
    conftest._publish("05_x", tmp_path / "out05")
    assert not (tmp_path / "05_x.json").exists()


def test_under_the_lanes_the_book_and_the_engine_free_notebooks_leave_the_engine_lane(tmp_path):
    """Collected as each lane collects them: the engine lane keeps the notebooks that start engines (first), the other
    lane gets the engine-free ones and the book, last."""
    import os
    import subprocess
    import sys

    def collect(lane, marker):
        env = {**os.environ, "RLPARITY_LANE": lane, "RLPARITY_LANE_NOTEBOOKS": str(tmp_path)}
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", "-m",
                              marker, "tests/test_book.py", "tests/test_engine.py", "tests/test_notebooks.py"],
                             cwd=ROOT, env=env, capture_output=True, text=True)
        return [line for line in res.stdout.splitlines() if "::" in line]

    engine = collect("engine", "engine")
    assert not [t for t in engine if "test_book.py" in t or "11_doctor" in t]
    assert [t for t in engine if "test_notebook_runs_and_writes_its_dataset" in t] == engine[:10]  # first
    light = collect("light", "not engine")
    assert "tests/test_notebooks.py::test_notebook_runs_and_writes_its_dataset[11_doctor]" in light
    book = [i for i, t in enumerate(light) if "test_book.py" in t]
    assert book and book == list(range(len(light) - len(book), len(light)))  # the book last
