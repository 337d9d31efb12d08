"""README's and the book's tour's Python examples run as written.

The ```python blocks of README.md, then of book/tour.md (the API tour README points to), are
executed in order in one namespace (as a reader would paste them), in a temporary working
directory. Blocks whose first line is ``# needs: engine`` start real vLLM engines and run under the
engine marker, after the blocks that need none.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = (ROOT / "README.md", ROOT / "book" / "tour.md")
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def readme_blocks() -> list[tuple[str, str, bool]]:
    """``(file:line, source, needs_engine)`` of every python block of README.md and book/tour.md."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in _BLOCK.finditer(text):
            src = m.group(1)
            line = text[: m.start()].count("\n") + 2
            if src.lstrip().startswith("# not run:"):  # says why (runs inside another program)
                continue
            out.append((f"{doc.relative_to(ROOT)}:{line}", src, src.lstrip().startswith("# needs: engine")))
    return out


def _run(blocks, ns, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for line, src, _ in blocks:
        try:
            exec(compile(src, line, "exec"), ns)
        except Exception as err:  # name the block that failed
            raise AssertionError(f"the block at {line} failed: {type(err).__name__}: {err}") from err


def test_readme_has_python_examples():
    blocks = readme_blocks()
    assert len(blocks) >= 5 and any(not e for *_, e in blocks) and any(e for *_, e in blocks)
    assert any(w.startswith("README.md") for w, *_ in blocks)  # README shows the code a loop adds


def test_readme_is_read_in_five_minutes_and_points_to_the_tour():
    """Issue 35: README is what it is, the two commands, the recorder, the importers and where to go
    next; the API tour lives in the book."""
    text = DOCS[0].read_text()
    assert len(text.splitlines()) <= 150
    assert "make quickstart" in text and "make test" in text and "book/tour.md" in text
    assert "tour" in (ROOT / "book" / "_toc.yml").read_text()


def test_readme_blocks_without_an_engine_run(tmp_path, monkeypatch):
    ns: dict = {"__name__": "__readme__"}
    _run([b for b in readme_blocks() if not b[2]], ns, tmp_path, monkeypatch)


@pytest.mark.engine
def test_readme_blocks_run_with_engines(tmp_path, monkeypatch, release_engines):
    release_engines()  # README's blocks start their own engines, one at a time
    ns: dict = {"__name__": "__readme__"}
    blocks = readme_blocks()
    # engine blocks define what later blocks use (model, prompts, sampling): run every block in order
    _run(blocks, ns, tmp_path, monkeypatch)
    from rlparity.capture.pool import shared_pool

    shared_pool().close()
    assert (tmp_path / "runs" / "exp.zarr").exists()
    assert set(ns["versions"].values[ns["versions"].values >= 0].ravel().tolist()) <= {0, 1}
