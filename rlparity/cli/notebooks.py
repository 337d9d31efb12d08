"""Run the project's notebooks with papermill (tests, ``make book``, CI artifacts)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

NOTEBOOKS = Path(__file__).resolve().parent.parent.parent / "notebooks"


def notebook_paths(folder: str | os.PathLike = NOTEBOOKS) -> list[Path]:
    """The walk-through notebooks in order (``NN_name.ipynb``)."""
    return sorted(p for p in Path(folder).glob("[0-9][0-9]_*.ipynb"))


def run_notebook(path: str | os.PathLike, output: str | os.PathLike, out_dir: str | os.PathLike,
                 parameters: dict[str, Any] | None = None, *, timeout: int = 1800) -> Path:
    """Execute ``path`` into ``output`` with ``ci``/``out_dir`` (and ``parameters``) injected.

    A failing cell raises ``papermill.PapermillExecutionError``; the partly executed notebook is
    still written to ``output`` so the failure can be read.
    """
    import papermill as pm

    output, out_dir = Path(output), Path(out_dir)
    output.parent.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    params = {"ci": True, "out_dir": str(out_dir), **(parameters or {})}
    pm.execute_notebook(str(path), str(output), parameters=params, kernel_name="python3",
                        cwd=str(Path(path).parent), progress_bar=False, execution_timeout=timeout)
    return output
