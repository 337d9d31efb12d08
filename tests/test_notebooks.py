"""papermill CI: every notebook runs with ci=True into artifacts/notebooks/, no cell fails, and
what it wrote to out_dir (results.json, a zarr store of scored arms) is valid. Each notebook's own
numbers are checked further in its layer's test module."""

import json

import nbformat
import pytest

from conftest import ENGINE_FREE_NOTEBOOKS
from rlparity.cli.notebooks import notebook_paths, read_notebook
from rlparity.trace import open_arms, validate

NAMES = [p.stem for p in notebook_paths()]


def test_there_are_notebooks_with_a_parameters_cell():
    assert NAMES, "no notebooks found"
    for p in notebook_paths():
        nb = read_notebook(p)
        assert nb.metadata.get("kernelspec", {}).get("language") == "python", f"{p.name}: no kernelspec (papermill needs it)"
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{p.name}: exactly one cell must be tagged 'parameters'"
        src = tagged[0].source
        for name in ("ci", "out_dir", "model"):
            assert f"{name} =" in src, f"{p.name}: parameters cell lacks {name}"


def test_every_chapter_opens_with_results_and_hides_its_asserts():
    """Issue 28: a results box (a MyST ``{admonition} Results``) before the parameters cell, and
    every cell that asserts is tagged ``remove-cell`` (papermill runs it, the book hides it)."""
    for p in notebook_paths():
        nb = read_notebook(p)
        params = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
        assert any(c.cell_type == "markdown" and "{admonition} Results" in c.source for c in nb.cells[:params]), \
            f"{p.name}: no results box before the parameters cell"
        shown = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "code" and "assert " in c.source
                 and "remove-cell" not in c.metadata.get("tags", [])]
        assert not shown, f"{p.name}: cells that assert must be tagged remove-cell: {shown}"
        assert not [c for c in nb.cells if "What this notebook asserts" in c.source
                    and "remove-cell" not in c.metadata.get("tags", [])], p.name

THRESHOLDS = ("tol", "eps", "semantic_tol", "tol_reference", "tol_trainer", "offset_z", "boundary_flip_share",
              "stale_ratio")


def test_notebook_thresholds_are_not_copies_of_the_defaults():
    """A notebook threshold equal to rlparity's default is ``None`` in the parameters cell and read
    from ``rlparity.config.defaults()`` (so a changed default reaches the notebook); a literal is
    only for a value that differs on purpose (e.g. notebook 03's tol for a bf16 body)."""
    import ast

    from rlparity.config import defaults

    d = defaults()
    for p in notebook_paths():
        nb = read_notebook(p)
        params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        for node in ast.parse(params.source).body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if name in THRESHOLDS and isinstance(node.value, ast.Constant) and node.value.value is not None:
                    assert node.value.value != getattr(d, name), \
                        f"{p.name}: {name} = {node.value.value} copies defaults().{name}: write None and read defaults()"


def test_notebooks_are_kept_as_their_py_sources_only():
    """Issue 35: the ``.ipynb`` held nothing its jupytext ``.py`` did not; git keeps the ``.py`` alone, and an
    ``.ipynb`` is built from it where it runs (``read_notebook``) or paired locally (ignored)."""
    import shutil
    import subprocess

    from rlparity.cli.notebooks import NOTEBOOKS

    root = NOTEBOOKS.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "notebooks"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.split()
    assert [t for t in tracked if t.endswith(".ipynb")] == []
    assert {f"notebooks/{p.name}" for p in notebook_paths()} <= set(tracked)
    probe = subprocess.run(["git", "check-ignore", "-q", "notebooks/01_semantic.ipynb"], cwd=root)
    assert probe.returncode == 0, "a paired notebooks/*.ipynb is not ignored by git"
    for p in notebook_paths():  # each source reads as a notebook of code and markdown cells
        nb = read_notebook(p)
        assert {c.cell_type for c in nb.cells} == {"code", "markdown"}, p.name


# a notebook that starts no engine with ci=True runs in the lane without engines (test_lanes.py checks it takes no
# engine lock there)
@pytest.mark.parametrize("name", [n if n in ENGINE_FREE_NOTEBOOKS else pytest.param(n, marks=pytest.mark.engine)
                                  for n in NAMES])
def test_notebook_runs_and_writes_its_dataset(name, executed_notebook):
    from conftest import ARTIFACTS

    out_dir = executed_notebook(name)
    nb = nbformat.read(f"{ARTIFACTS}/{name}.ipynb", as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    results = json.loads((out_dir / "results.json").read_text())
    assert results.get("findings"), "the notebook wrote no findings"
    stores = list(out_dir.glob("*.zarr"))
    assert stores, "the notebook wrote no zarr store"
    for store in stores:
        arms = open_arms(store)
        assert arms
        for arm, ds in arms.items():
            validate(ds, require_trainer=True, where=f"{store.name}/{arm}")


def test_the_page_shows_the_parameters_that_ran(tmp_path):
    """Issue 28: papermill injects ``ci=True`` in a hidden cell and the setup cell shrinks the sizes,
    so the parameters cell alone misstates what ran. ``run_notebook`` adds a cell after the setup
    cell that shows the values that differ from the cell's: run a real (engine-free) notebook."""
    from rlparity.cli.notebooks import effective_parameters, run_notebook

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    params = 'ci = False\nn_prompts = 32\ntemperatures = [0.5, 0.7]\ntol = None\nseed = 0\nout_dir = "a"\n'
    nb.cells = [nbformat.v4.new_markdown_cell("# a chapter"),
                nbformat.v4.new_code_cell(params, metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("tol = 0.01 if tol is None else tol\n"
                                          "if ci:\n    n_prompts, temperatures = 8, [1.0]\nprint(n_prompts)"),
                nbformat.v4.new_code_cell("assert n_prompts == 8")]
    import jupytext

    src = tmp_path / "00_demo.py"  # a notebook's source as git keeps it: jupytext's percent text
    jupytext.write(nb, str(src), fmt="py:percent")
    out = run_notebook(src, tmp_path / "run" / "00_demo.ipynb", tmp_path / "out")
    ran = nbformat.read(str(out), as_version=4)
    cell = next(c for c in ran.cells if "parameters-ran" in c.metadata.get("tags", []))
    assert ran.cells.index(cell) == 4  # parameters, papermill's injected cell, setup, then this one
    assert "remove-input" in cell.metadata["tags"]
    html = cell.outputs[0]["data"]["text/html"]
    for name, value, written in (("ci", "True", "False"), ("n_prompts", "8", "32"),
                                 ("temperatures", "[1.0]", "[0.5, 0.7]"), ("tol", "0.01", "None")):
        assert f"<td><code>{name}</code></td><td><code>{value}</code></td><td><code>{written}</code></td>" in html
    assert "seed" not in html and "out_dir" not in html  # unchanged, and the run's temporary folder
    assert src.read_text() == jupytext.writes(nb, fmt="py:percent")  # the source is left as it was
    same = effective_parameters({"ci": False, "n_prompts": 32}, "ci = False\nn_prompts = 32\n")
    assert same.rows == [] and "ran with the parameters above" in repr(same)
