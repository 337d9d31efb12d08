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
