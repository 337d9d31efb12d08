"""The API reference's docstrings are valid reStructuredText, checked in seconds.

The book (``tests/test_book.py``) builds with ``-W``, so a docstring docutils warns about (``|d|``
read as a substitution, an unclosed literal) fails CI only after every notebook has run. Each
object the generated API pages document (``rlparity.cli.book.api_modules``: every public module of
every subpackage, its own public members) is parsed here with docutils (Sphinx's cross-reference
roles stand in as literals).
"""

import importlib
import inspect
import io
import re
from pathlib import Path

import pytest

docutils_core = pytest.importorskip("docutils.core")
from docutils import nodes  # noqa: E402
from docutils.parsers.rst import roles  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _literal_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    return [nodes.literal(rawtext, text)], []


def documented_objects(modules=None):
    """``(name, object)`` for each module of the API pages (or of ``modules``), then each member
    its page documents: classes, functions, and a class's public methods and properties."""
    from rlparity.cli.book import api_modules, module_members

    pages = [modules] if modules is not None else api_modules().values()
    for modules in pages:
        for name in modules:
            module = importlib.import_module(name)
            yield name, module
            for member in module_members(module):
                obj = getattr(module, member)
                if not (inspect.isclass(obj) or inspect.isroutine(obj)):
                    continue  # a constant: autodoc shows its ``#:`` comment, not its type's docstring
                yield f"{name}.{member}", obj
                if inspect.isclass(obj):  # autodoc documents a class's public methods too
                    for attr, value in vars(obj).items():
                        if not attr.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)):
                            yield f"{name}.{member}.{attr}", value


def rst_problems(doc: str) -> list[str]:
    stream = io.StringIO()
    docutils_core.publish_doctree(doc, settings_overrides={"report_level": 2, "halt_level": 5,
                                                           "warning_stream": stream})
    return [line for line in stream.getvalue().splitlines() if re.search(r"\((WARNING|ERROR|SEVERE)/", line)]


def as_sphinx_reads(doc: str, obj) -> str:
    """``doc`` as the book's Sphinx reads it: through napoleon's numpy-docstring conversion
    (``book/_config.yml``), which turns the Parameters/Returns sections into field lists and escapes
    the names reStructuredText would misread (``**kwargs``, a trailing ``_``). Attributes become
    ``:ivar:`` fields here (the book's ``.. attribute::`` directive is Sphinx's, not docutils')."""
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import NumpyDocstring

    what = "class" if inspect.isclass(obj) else "module" if inspect.ismodule(obj) else \
        "attribute" if isinstance(obj, property) else "function"
    config = Config(napoleon_google_docstring=False, napoleon_use_ivar=True)
    config.strip_signature_backslash = True  # as book/_config.yml sets it: a trailing ``_`` escaped
    return str(NumpyDocstring(doc, config, what=what))


def test_rst_check_catches_a_bare_absolute_value():
    assert rst_problems("Mean |d| over tokens.")  # the docstring that broke the book build
    assert not rst_problems("Mean ``|d|`` over tokens.")
    # numpydoc names rST would misread read as napoleon escapes them, and a bare |d| still fails
    doc = "Sum.\n\nParameters\n----------\nglobal_ : float\n    A part.\n**kw\n    More.\n"
    assert rst_problems(doc) and not rst_problems(as_sphinx_reads(doc, len))
    assert rst_problems(as_sphinx_reads(doc.replace("A part.", "Mean |d|."), len))


def test_documented_docstrings_are_valid_rst():
    for role in ("class", "func", "meth", "mod", "data", "attr", "obj", "exc"):
        roles.register_local_role(role, _literal_role)
    seen, bad = 0, {}
    for name, obj in documented_objects():
        doc = inspect.getdoc(obj)
        if doc:
            seen += 1
            if problems := rst_problems(as_sphinx_reads(doc, obj)):
                bad[name] = problems
    assert seen > 50, seen
    assert bad == {}, bad


_REF = re.compile(r":(?:mod|func|class|data|meth|attr):`~?(rlparity(?:\.\w+)+)`")
_REPO_PATH = re.compile(r"(?<![\w/.-])((?:tests|benchmarks|rlparity|book|notebooks|scripts)/[\w./-]+\.\w+)")


def _resolves(ref: str) -> bool:
    parts = ref.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def _built(root, p: str) -> bool:
    """A file the book build writes (a page of book/_build, a generated source git ignores)."""
    import subprocess

    if p.startswith("book/") and p.endswith(".html"):
        return True
    return subprocess.run(["git", "check-ignore", "-q", p], cwd=root).returncode == 0


def test_docstrings_cite_only_what_exists():
    """Every ``:func:`rlparity...``` reference in the package resolves, and every repository file a
    docstring or comment cites (``tests/...``, ``benchmarks/...``) exists (issue 23)."""
    root = ROOT
    bad = []
    for path in sorted((root / "rlparity").rglob("*.py")):
        text = path.read_text()
        bad += [f"{path.relative_to(root)}: {r}" for r in sorted(set(_REF.findall(text))) if not _resolves(r)]
        bad += [f"{path.relative_to(root)}: {p}" for p in sorted(set(_REPO_PATH.findall(text)))
                if not (root / p).exists() and "<" not in p and not _built(root, p)]
    assert bad == []
    assert not _resolves("rlparity.config.NoSuchSettings") and _resolves("rlparity.config.settings.TrainerSettings")
