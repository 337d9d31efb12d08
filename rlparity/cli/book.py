"""Build the Jupyter Book offline: execute (or copy) the notebooks, generate the CLI reference and
the findings catalogue, serve plotly.js locally, run ``jupyter-book build -W --keep-going``.

``rlparity book [--ci] [--executed DIR]`` is what ``make book`` runs (it needs the ``book`` extra).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
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

BOOK = NOTEBOOKS.parent / "book"


def _cell(text) -> str:
    """One Markdown table cell: reStructuredText literals as Markdown code, pipes and newlines escaped."""
    text = re.sub(r"``([^`]+)``", r"`\1`", " ".join(str(text).split()))
    return text.replace("|", "\\|")


def _subcommands(cmd, ctx):
    if not hasattr(cmd, "list_commands"):
        return []
    return [(name, cmd.get_command(ctx, name)) for name in cmd.list_commands(ctx)]


def cli_reference(cmd) -> str:
    """Markdown of every command of the root click command ``cmd``
    (``typer.main.get_command(rlparity.cli.build_app())``), generated, never hand-kept: one
    section per command (an anchor ``cli-<command path>``), its help in full, a table of its
    arguments and options (name, value, default, help) and links to its subcommands."""

    def default(p) -> str:
        d = p.default
        if d is None or d in ((), [], "") or p.required:
            return "required" if p.required else ""
        return f"`{getattr(d, 'value', d)}`"

    def section(command, ctx, path: list[str], level: int) -> list[str]:
        anchor = "cli-" + "-".join(path[1:] or ["rlparity"])
        out = [f"({anchor})=", f"{'#' * level} `{' '.join(path)}`\n"]
        helptext = re.sub(r"``([^`]+)``", r"`\1`", inspect.cleandoc(command.help or ""))
        out.append(helptext + "\n")
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        if params:
            out += ["| argument or option | value | default | meaning |", "|---|---|---|---|"]
            for p in params:
                if p.param_type_name == "argument":
                    name = f"`{p.name.upper()}`"
                else:
                    name = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
                value = "" if getattr(p, "is_flag", False) else _cell(p.display_type(ctx).strip("<>"))
                out.append(f"| {name} | {value} | {default(p)} | {_cell(getattr(p, 'help', '') or '')} |")
            out.append("")
        subs = _subcommands(command, ctx)
        if subs:
            out.append("Commands: " + ", ".join(f"[`{n}`](#cli-{'-'.join([*path[1:], n])})" for n, _ in subs) + "\n")
        for name, sub in subs:
            sctx = sub.make_context(name, [], parent=ctx, resilient_parsing=True)
            out += section(sub, sctx, [*path, name], min(level + 1, 3))
        return out

    ctx = cmd.make_context("rlparity", [], resilient_parsing=True)
    parts = ["# Command line\n", "Generated from the command tree (`rlparity.cli.build_app()`): every command, "
             "its arguments and options. `rlparity COMMAND --help` prints the same.\n"]
    return "\n".join(parts + section(cmd, ctx, ["rlparity"], 2))


#: subpackages without an API page: the command line has its own page (reference/cli)
_NO_API_PAGE = ("cli", "data", "io")  # io: the deprecated alias of importers (one release), not documented


def api_modules() -> dict[str, list[str]]:
    """``{page: [module, ...]}`` for the API reference, read from the package itself (never a
    hand-kept list): one page per subpackage of ``rlparity`` (its public modules, the subpackage
    first), one per package inside a subpackage (``metrics.objective``: the package first), and one
    page ``rlparity`` for the top-level modules. A module whose name starts with
    ``_`` is private and left out."""
    import pkgutil

    import rlparity

    pages: dict[str, list[str]] = {"rlparity": []}
    for info in sorted(pkgutil.iter_modules(rlparity.__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name in _NO_API_PAGE:
            continue
        if not info.ispkg:
            pages["rlparity"].append(f"rlparity.{info.name}")
            continue
        package = importlib.import_module(f"rlparity.{info.name}")
        pages[info.name] = [package.__name__]
        for m in sorted(pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."), key=lambda m: m.name):
            if any(part.startswith("_") for part in m.name.split(".")):
                continue
            # a package inside a subpackage (rlparity.metrics.objective) is a page of its own: one
            # page of everything was past what a reader scrolls (metrics: 93 screens)
            parts = m.name.split(".")[1:]
            nested = ".".join(parts[:2]) if len(parts) > 2 or m.ispkg else None
            pages.setdefault(nested or info.name, []).append(m.name)
    return pages


def module_members(module) -> list[str]:
    """The public members ``module`` defines itself, in its ``__all__`` order (else every public
    name): a name it re-exports from another module (a subpackage's ``__init__``) is documented
    where it is defined, once; a submodule is documented as a module."""
    listed = getattr(module, "__all__", None)
    names = list(listed) if listed is not None else [n for n in vars(module) if not n.startswith("_")]
    out = []
    for n in names:
        obj = getattr(module, n, None)
        if obj is None or inspect.ismodule(obj):
            continue
        home = getattr(obj, "__module__", None)
        if home is None and listed is None:  # a constant imported or computed: documented only when listed
            continue
        if home is not None and home != module.__name__ and not isinstance(obj, (int, float, str, tuple, dict)):
            continue
        out.append(n)
    return out


def api_page(page: str, modules: list[str]) -> str:
    """The Markdown of one API page: per module its docstring and its public members (``__all__``
    where the module defines it), parameters and return types from the signatures' annotations
    (``autodoc_typehints = "description"``: a field list per function)."""
    title = "rlparity (top-level modules)" if page == "rlparity" else f"rlparity.{page}"
    out = [f"# {title}\n"]
    for name in modules:
        module = importlib.import_module(name)
        members = module_members(module)
        # a member named like a submodule (``rlparity.importers.formats()`` beside ``rlparity.importers.formats``) would
        # take the module's name in the index: it is documented apart, unindexed
        clash = [m for m in members if importlib.util.find_spec(f"{name}.{m}") is not None] \
            if hasattr(module, "__path__") else []
        members = [m for m in members if m not in clash]
        out += ["```{eval-rst}", f".. automodule:: {name}"]
        out += [f"   :members: {', '.join(members)}"] if members else []
        for m in clash:
            out += ["", f".. auto{'class' if inspect.isclass(getattr(module, m)) else 'function'}:: {name}.{m}",
                    "   :no-index:"]
        out += ["```\n"]
    return "\n".join(out)


def write_api_pages(book: Path = BOOK) -> list[Path]:
    """Write ``reference/api/<page>.md`` for every page of :func:`api_modules` (the toc lists the
    folder with a glob); remove pages of subpackages that no longer exist."""
    folder = book / "reference" / "api"
    folder.mkdir(parents=True, exist_ok=True)
    pages = api_modules()
    written = []
    for page, modules in pages.items():
        path = folder / f"{page}.md"
        path.write_text(api_page(page, modules))
        written.append(path)
    for stale in set(folder.glob("*.md")) - set(written):
        stale.unlink()
    return written


def prepare(executed: str | os.PathLike | None = None, *, cli_root, ci: bool = False, book: Path = BOOK) -> None:
    """Put executed notebooks under ``book/notebooks``, plotly.js under ``_static``, the CLI page (the
    help of ``cli_root``, the root click command: :func:`cli_reference`) and the findings catalogue
    (:func:`rlparity.diagnose.catalogue.catalogue_markdown`) under ``reference``."""
    from rlparity.diagnose.catalogue import catalogue_markdown

    import plotly

    target = book / "notebooks"
    target.mkdir(parents=True, exist_ok=True)
    for nb in notebook_paths():
        dst = target / f"{nb.stem}.ipynb"
        if executed is not None:
            src = Path(executed) / dst.name
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
    write_api_pages(book)


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
    page must not show). A documented default with a placeholder (``/tmp/rlparity-<uid>/...``, the
    engine lock's) is no machine path."""
    out: dict[str, list[str]] = {}
    for page in Path(html_dir).rglob("*.html"):
        text = page.read_text(errors="replace")
        found = []
        if "\x1b[" in text or "&#27;[" in text or "\u001b[" in text:
            found.append("ANSI escape")
        found += [f"log line: {m.group(0)[:80]}" for m in _LOG_LINE.finditer(text)][:3]
        found += [f"machine path: {m.group(0)[:80]}" for m in re.finditer(r"/tmp/rlparity(?!-&lt;uid&gt;)|/work/main|/root/\.cache",
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
