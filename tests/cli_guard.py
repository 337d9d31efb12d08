"""Run ``rlparity`` command lines under a guard: importing vLLM, building a model (``make_model``,
``make_shape_model``), loading one into a trainer (``Scorer``) or starting an engine (``Engine``)
raises ``GuardTripped``, so a command that checks its arguments late shows as an internal error
(exit 3) naming what it reached.

``python tests/cli_guard.py CASES.json``: CASES is a JSON list of argument lists; prints one JSON
list of ``{"argv", "code", "stdout", "stderr"}``. Run in its own process (the guard cannot be
undone, and vLLM must not be imported already).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys


class GuardTripped(RuntimeError):
    pass


class _NoVllm:
    """A ``sys.meta_path`` finder that refuses ``vllm`` and its submodules."""

    def find_spec(self, name, path=None, target=None):
        if name == "vllm" or name.startswith("vllm."):
            raise GuardTripped(f"imported {name} before the arguments were refused")
        return None


def _refuse(what):
    def stop(*args, **kwargs):
        raise GuardTripped(f"{what} before the arguments were refused")

    return stop


def install() -> None:
    """The guard: no vLLM import, no model built, loaded or served (this process only)."""
    assert not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules), "vllm already imported"
    sys.meta_path.insert(0, _NoVllm())
    import rlparity.capture as capture
    import rlparity.models as models
    import rlparity.score as score

    models.make_model = _refuse("built a model (make_model)")
    models.make_shape_model = _refuse("built a model (make_shape_model)")
    score.Scorer.__init__ = _refuse("loaded a model into the trainer (Scorer)")
    capture.Engine.__init__ = _refuse("made an engine (Engine)")
    capture.AsyncEngine.__init__ = _refuse("made an engine (AsyncEngine)")


def run(argv: list[str]) -> dict:
    from rlparity.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return {"argv": argv, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    cases = json.loads(open(sys.argv[1]).read())
    install()
    results = [run(c) for c in cases]
    sys.stdout.write(json.dumps(results))
