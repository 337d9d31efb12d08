"""README's Python examples run as written.

The ```python blocks of README.md are executed in order in one namespace (as a reader would paste
them), in a temporary working directory. Blocks whose first line is ``# needs: engine`` start real
vLLM engines and run under the engine marker, after the blocks that need none.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def readme_blocks() -> list[tuple[int, str, bool]]:
    """``(line number, source, needs_engine)`` of every python block."""
    text = README.read_text()
    out = []
    for m in _BLOCK.finditer(text):
        src = m.group(1)
        line = text[: m.start()].count("\n") + 2
        if src.lstrip().startswith("# not run:"):  # says why (runs inside another program)
            continue
        out.append((line, src, src.lstrip().startswith("# needs: engine")))
    return out


def _run(blocks, ns, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for line, src, _ in blocks:
        try:
            exec(compile(src, f"README.md:{line}", "exec"), ns)
        except Exception as err:  # name the block that failed
            raise AssertionError(f"README.md block at line {line} failed: {type(err).__name__}: {err}") from err


def test_readme_has_python_examples():
    blocks = readme_blocks()
    assert len(blocks) >= 5 and any(not e for *_, e in blocks) and any(e for *_, e in blocks)


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
