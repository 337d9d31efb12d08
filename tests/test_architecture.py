"""The package's shape is held by tools, not by memory.

* import-linter contracts (pyproject.toml): layers cli > experiments > diagnose | plot | record > metrics >
  capture | score | ... > trace > config; metrics/diagnose/plot import no engine, trainer or runner;
  nothing imports the CLI. Imports inside functions count too.
* No ``_private`` name (module or attribute) is imported across subpackages.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rlparity"


def _lint_imports() -> Path | None:
    exe = Path(sys.executable).with_name("lint-imports")
    return exe if exe.exists() else (Path(p) if (p := shutil.which("lint-imports")) else None)


def test_import_linter_contracts_are_kept():
    exe = _lint_imports()
    if exe is None:
        pytest.fail("lint-imports is not installed: pip install -e '.[test]' (import-linter)")
    res = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout and "kept" in res.stdout


def _subpackage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def private_cross_imports() -> list[str]:
    """``module: imported name`` for every private name imported from another subpackage."""
    bad = []
    for module, path in _modules().items():
        tree = ast.parse(path.read_text())
        here = _subpackage(module)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlparity"):
                there = _subpackage(node.module)
                private_module = any(p.startswith("_") and not p.startswith("__") for p in node.module.split("."))
                for alias in node.names:
                    private_name = alias.name.startswith("_") and not alias.name.startswith("__")
                    if (private_module or private_name) and there != here:
                        bad.append(f"{module}: from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("rlparity") and _subpackage(alias.name) != here and any(
                            p.startswith("_") and not p.startswith("__") for p in alias.name.split(".")):
                        bad.append(f"{module}: import {alias.name}")
    return bad


def test_no_private_name_is_imported_across_subpackages():
    assert private_cross_imports() == []


def test_the_checker_sees_a_private_cross_import(tmp_path, monkeypatch):
    """The private-name check can fail: a planted cross-subpackage private import is reported."""
    planted = PACKAGE / "plot" / "_planted_for_test.py"
    planted.write_text("from rlparity.metrics.summary import _require_trainer\n")
    try:
        assert any("_require_trainer" in b for b in private_cross_imports())
    finally:
        planted.unlink()


def test_the_contracts_catch_an_upward_import():
    """import-linter really fails on a lower layer importing a higher one (inside a function too)."""
    exe = _lint_imports()
    planted = PACKAGE / "trace" / "_planted_for_test.py"
    planted.write_text("def f():\n    from rlparity.diagnose import diagnose\n    return diagnose\n")
    try:
        res = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    finally:
        planted.unlink()
    assert res.returncode != 0 and "BROKEN" in res.stdout.upper()


def test_every_part_of_the_package_is_reachable_as_an_attribute():
    """``rlparity.<name>`` imports each subpackage and top-level module on first use; only the CLI
    (with ``python -m rlparity``, its entry point) and the test helpers are left out (issue 23: io,
    train, datasets, models were missing)."""
    import rlparity

    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    parts |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert set(rlparity._SUBPACKAGES) == parts - {"cli", "testing", "__main__"}
    for name in rlparity._SUBPACKAGES:
        assert getattr(rlparity, name).__name__ == f"rlparity.{name}"


def test_the_removed_alias_rlparity_io_is_gone():
    """``rlparity.io`` (the name before ``rlparity.importers``, issue 23) was removed in issue 35:
    importing it fails, and nothing of the package refers to it."""
    code = "import importlib.util; print(importlib.util.find_spec('rlparity.io') is None)"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0 and res.stdout.strip() == "True", res.stderr


def test_the_names_before_issue_23_are_gone():
    """The objective core's names before issue 23 (``Measured``, ``real``, ``usable``), kept one
    release with a warning, were removed in issue 35: plain AttributeErrors."""
    import rlparity.metrics.objective as ob

    for old in ("Measured", "real", "usable"):
        with pytest.raises(AttributeError):
            getattr(ob, old)
    assert ob.ValueWithCounts and ob.real_tokens and ob.finite_tokens
