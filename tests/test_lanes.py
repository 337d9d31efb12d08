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
    runs at nice 19, so on a small machine it takes only the cycles the engine lane leaves."""
    import os

    monkeypatch.chdir(tmp_path)
    ours = os.nice(0)
    body = f"""
     import os, subprocess, sys
     import pytest
     @pytest.mark.engine
     def test_engine(): assert os.nice(0) == {ours}
     def test_plain():
         assert os.nice(0) == {min(ours + 19, 19)}
         child = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"], capture_output=True, text=True)
         assert int(child.stdout) == {min(ours + 19, 19)}
     """
    assert _lanes().main([_suite(tmp_path, body)]) == 0


def test_the_tiny_model_is_built_first_only_for_the_projects_tests(tmp_path):
    lanes = _lanes()
    assert lanes._runs_project_tests(["--durations=30", str(ROOT / "tests")])
    assert lanes._runs_project_tests([str(ROOT / "tests" / "test_trace.py") + "::test_x", "-q"])
    assert not lanes._runs_project_tests([str(tmp_path / "test_x.py")])
    assert not lanes._runs_project_tests(["-m", "not engine", str(ROOT / "scripts")])


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
