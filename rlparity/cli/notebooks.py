"""Run the project's notebooks with papermill (tests, ``make book``, CI artifacts)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

NOTEBOOKS = Path(__file__).resolve().parent.parent.parent / "notebooks"


def notebook_paths(folder: str | os.PathLike = NOTEBOOKS) -> list[Path]:
    """The walk-through notebooks in order: their sources, ``NN_name.py`` (jupytext percent format).

    Only the ``.py`` is kept in git; the ``.ipynb`` is built from it where it is run (:func:`read_notebook`)
    or paired locally (``jupytext --sync``, ignored by git).
    """
    return sorted(p for p in Path(folder).glob("[0-9][0-9]_*.py"))


def read_notebook(path: str | os.PathLike):
    """The notebook at ``path`` as an ``nbformat`` notebook: a jupytext text (``.py``) or an ``.ipynb``."""
    path = Path(path)
    if path.suffix == ".ipynb":
        import nbformat

        return nbformat.read(str(path), as_version=4)
    import jupytext

    return jupytext.read(str(path))


def run_notebook(path: str | os.PathLike, output: str | os.PathLike, out_dir: str | os.PathLike,
                 parameters: dict[str, Any] | None = None, *, timeout: int = 1800) -> Path:
    """Execute ``path`` (a notebook's ``.py`` source or an ``.ipynb``) into ``output`` with
    ``ci``/``out_dir`` (and ``parameters``) injected.

    Right after the setup cell (the first code cell after the parameters cell: where ``ci``
    shrinks the sizes) a cell tagged ``parameters-ran`` is run too (:func:`with_parameters_shown`):
    the page shows the parameters that actually ran, not only the defaults of the parameters cell.
    A failing cell raises ``papermill.PapermillExecutionError``; the partly executed notebook is
    still written to ``output`` so the failure can be read.
    """
    import tempfile

    import nbformat
    import papermill as pm

    output, out_dir = Path(output), Path(out_dir)
    output.parent.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    params = {"ci": True, "out_dir": str(out_dir), **(parameters or {})}
    with tempfile.TemporaryDirectory(prefix="rlparity-nb-") as tmp:
        source = Path(tmp) / f"{Path(path).stem}.ipynb"
        nbformat.write(with_parameters_shown(read_notebook(path)), str(source))
        pm.execute_notebook(str(source), str(output), parameters=params, kernel_name="python3",
                            cwd=str(Path(path).parent), progress_bar=False, execution_timeout=timeout)
    return output


def _parameters_index(nb) -> int:
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"a notebook needs exactly one cell tagged 'parameters', found {len(tagged)}")
    return tagged[0]


def with_parameters_shown(nb):
    """``nb`` with a ``parameters-ran`` cell (input hidden: ``remove-input``) inserted after its
    setup cell, the first code cell after the parameters cell. The cell displays
    :func:`effective_parameters` of the kernel's namespace against the parameters cell's source."""
    import nbformat

    i = _parameters_index(nb)
    setup = next((j for j in range(i + 1, len(nb.cells)) if nb.cells[j].cell_type == "code"), None)
    if setup is None:
        raise ValueError("the parameters cell has no setup cell after it")
    code = ("from rlparity.cli.notebooks import effective_parameters\n"
            f"effective_parameters(globals(), {nb.cells[i].source!r})")
    cell = nbformat.v4.new_code_cell(code, metadata={"tags": ["parameters-ran", "remove-input"]})
    nb.cells.insert(setup + 1, cell)
    return nb


_SKIP = ("out_dir",)  # a temporary folder of the run: no reader's business


def _show(value: Any) -> str:
    if isinstance(value, str) and os.sep in value and Path(value).exists():
        return Path(value).name  # a model built into the cache: its name, not the machine's path
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class ParametersTable:
    """The parameters a notebook ran with that differ from its parameters cell: ``rows`` of
    ``(name, ran, cell)`` shown as text, and as a small HTML table in Jupyter and the book."""

    def __init__(self, rows: list[tuple[str, str, str]]):
        self.rows = rows

    def _repr_html_(self) -> str:
        from html import escape

        if not self.rows:
            return '<p class="rlparity-parameters">Ran with the parameters above.</p>'
        body = "".join(f"<tr><td><code>{escape(n)}</code></td><td><code>{escape(r)}</code></td>"
                       f"<td><code>{escape(c)}</code></td></tr>" for n, r, c in self.rows)
        return ('<table class="rlparity-parameters"><caption>Parameters this page ran with, where they differ '
                'from the cell above (the rest as written)</caption><thead><tr><th>parameter</th><th>ran with</th>'
                f"<th>in the cell</th></tr></thead><tbody>{body}</tbody></table>")

    def __repr__(self) -> str:
        if not self.rows:
            return "ran with the parameters above"
        return "ran with: " + "; ".join(f"{n} = {r} (cell: {c})" for n, r, c in self.rows)


def effective_parameters(namespace: dict[str, Any], cell_source: str) -> ParametersTable:
    """Compare the names the parameters cell (``cell_source``) assigns with their values in
    ``namespace`` (the kernel's globals after the setup cell: papermill's injected values and the
    ``ci`` sizes applied); return the ones that differ (:class:`ParametersTable`). A value the cell
    writes as an expression is compared by its text."""
    import ast

    rows = []
    for node in ast.parse(cell_source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if name in _SKIP or name not in namespace:
            continue
        try:
            written = ast.literal_eval(node.value)
        except ValueError:
            written = ast.get_source_segment(cell_source, node.value)
        ran = namespace[name]
        if isinstance(written, (list, tuple)) and isinstance(ran, (list, tuple)):
            same = list(written) == list(ran)
        else:
            try:
                same = bool(written == ran)
            except (TypeError, ValueError):
                same = False
        if not same:
            rows.append((name, _show(ran), _show(written)))
    return ParametersTable(rows)
