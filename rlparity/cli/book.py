"""Build the Jupyter Book offline: execute (or copy) the notebooks, generate the CLI reference and
the findings catalogue, serve plotly.js locally, run ``jupyter-book build -W --keep-going``.

``rlparity book [--ci] [--executed DIR]`` is what ``make book`` runs (it needs the ``book`` extra).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from rlparity.cli.notebooks import NOTEBOOKS, notebook_paths, run_notebook
from rlparity.config.env import scoped_env

BOOK = NOTEBOOKS.parent / "book"


def cli_reference(cmd) -> str:
    """Markdown of ``rlparity --help`` and every command's help (generated, never hand-kept) from the
    root click command (``typer.main.get_command(rlparity.cli.build_app())``)."""

    def plain_help(command, ctx) -> str:
        # typer renders help with rich and prints it; capture it without colours at a fixed width
        import contextlib
        import io

        buf = io.StringIO()
        with scoped_env({"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}), contextlib.redirect_stdout(buf):
            text = command.get_help(ctx)
        return "\n".join(line.rstrip() for line in ((text or "") + buf.getvalue()).strip("\n").splitlines())

    ctx = cmd.make_context("rlparity", [], resilient_parsing=True)
    parts = ["# Command line\n", "Generated from the commands' own help.\n", "```text", plain_help(cmd, ctx), "```\n"]
    for name in sorted(cmd.list_commands(ctx)):  # type: ignore[attr-defined]
        sub = cmd.get_command(ctx, name)  # type: ignore[attr-defined]
        sctx = sub.make_context(name, [], parent=ctx, resilient_parsing=True)
        parts += [f"## `rlparity {name}`\n", "```text", plain_help(sub, sctx), "```\n"]
    return "\n".join(parts)


def prepare(executed: str | os.PathLike | None = None, *, cli_root, ci: bool = False, book: Path = BOOK) -> None:
    """Put executed notebooks under ``book/notebooks``, plotly.js under ``_static``, the CLI page (the
    help of ``cli_root``, the root click command: :func:`cli_reference`) and the findings catalogue
    (:func:`rlparity.diagnose.catalogue.catalogue_markdown`) under ``reference``."""
    from rlparity.diagnose.catalogue import catalogue_markdown

    import plotly

    target = book / "notebooks"
    target.mkdir(parents=True, exist_ok=True)
    for nb in notebook_paths():
        dst = target / nb.name
        if executed is not None:
            src = Path(executed) / nb.name
            if not src.exists():
                raise FileNotFoundError(f"{src} is missing: execute {nb.name} first (or build without --executed)")
            shutil.copyfile(src, dst)
        else:
            out_dir = Path(tempfile.mkdtemp(prefix=f"rlparity-{nb.stem}-"))
            run_notebook(nb, dst, out_dir, {"ci": ci})
        publishable(dst)
    static = book / "_static"
    static.mkdir(exist_ok=True)
    shutil.copyfile(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", static / "plotly.min.js")
    (book / "reference").mkdir(exist_ok=True)
    (book / "reference" / "cli.md").write_text(cli_reference(cli_root))
    (book / "reference" / "findings.md").write_text(catalogue_markdown())


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MACHINE_PATH = re.compile(r"(?:/tmp|/var/tmp|/root|/home/[^/\s'\"]+|/work)(?:/[^\s'\",)\]}]+)+")
# a vLLM / torch log line: "(EngineCore pid=..)", "INFO 12-03 16:49:25 [file.py:87]", "[W1203 ...]"
_LOG_LINE = re.compile(r"^.*(\((?:EngineCore|Worker|APIServer)[^)]*pid=\d+\)|\b(?:INFO|WARNING|DEBUG|ERROR) "
                       r"\d\d-\d\d \d\d:\d\d:\d\d \[|^\[W\d{4} ).*$", re.M)


def publishable(path: str | os.PathLike) -> Path:
    """Make an executed notebook fit to publish, in place: the papermill-injected parameters cell
    is removed (``remove-cell``), stderr streams are dropped, ANSI colour codes and engine log lines
    are cut from the outputs, and machine paths (``/tmp/...``, ``/work/...``, home folders) are
    shortened to their last part."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)

    def clean(text: str) -> str:
        text = _LOG_LINE.sub("", _ANSI.sub("", text))
        return _MACHINE_PATH.sub(lambda m: ".../" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)

    for cell in nb.cells:
        tags = cell.metadata.setdefault("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            tags.append("remove-cell")
        if cell.cell_type != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                if out.get("name") == "stderr":
                    continue
                out["text"] = clean(out["text"])
                if not out["text"].strip():
                    continue
            for mime, value in (out.get("data") or {}).items():
                if mime.startswith("text/") and isinstance(value, str):
                    out["data"][mime] = clean(value)
            outputs.append(out)
        cell["outputs"] = outputs
    nbformat.write(nb, str(path))
    return Path(path)


def page_problems(html_dir: str | os.PathLike) -> dict[str, list[str]]:
    """Per built page: ANSI escapes, engine log lines and machine paths left in it (what a published
    page must not show)."""
    out: dict[str, list[str]] = {}
    for page in Path(html_dir).rglob("*.html"):
        text = page.read_text(errors="replace")
        found = []
        if "\x1b[" in text or "&#27;[" in text or "\u001b[" in text:
            found.append("ANSI escape")
        found += [f"log line: {m.group(0)[:80]}" for m in _LOG_LINE.finditer(text)][:3]
        found += [f"machine path: {m.group(0)[:80]}" for m in re.finditer(r"/tmp/rlparity|/work/main|/root/\.cache",
                                                                         text)][:3]
        if found:
            out[str(page.relative_to(html_dir))] = found
    return out


def build(book: Path = BOOK) -> Path:
    """``jupyter-book build -W --keep-going``; raises if sphinx reports any warning."""
    exe = Path(sys.executable).with_name("jupyter-book")
    cmd = [str(exe) if exe.exists() else "jupyter-book", "build", "-W", "--keep-going", str(book)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"book build failed ({' '.join(cmd)}):\n{res.stdout[-6000:]}\n{res.stderr[-3000:]}")
    return book / "_build" / "html"


_SCRIPT_SRC = re.compile(r"<script[^>]*\bsrc=[\"']([^\"']+)[\"']", re.I)


def external_scripts(html_dir: str | os.PathLike) -> dict[str, list[str]]:
    """Script sources that point outside the built site (http:, https: or //), per page."""
    out = {}
    for page in Path(html_dir).rglob("*.html"):
        bad = [s for s in _SCRIPT_SRC.findall(page.read_text(errors="replace"))
               if s.startswith(("http:", "https:", "//"))]
        if bad:
            out[str(page.relative_to(html_dir))] = bad
    return out


def plotly_figures(page: str | os.PathLike) -> int:
    """Number of interactive plotly figures (``Plotly.newPlot`` calls) in one built page."""
    return Path(page).read_text(errors="replace").count("Plotly.newPlot(")


def book_cmd(ctx: typer.Context,
             ci: bool = typer.Option(False, "--ci", help="execute the notebooks with ci=True (small sizes)"),
             executed: Optional[Path] = typer.Option(None, help="folder of already executed notebooks to publish "
                                                                "instead")):
    """Build the Jupyter Book offline (needs the book extra): execute (or copy) the notebooks,
    generate the CLI reference and the findings catalogue, run ``jupyter-book build -W``."""
    prepare(executed, cli_root=ctx.find_root().command, ci=ci)
    typer.echo(f"book built: {build() / 'index.html'}")
