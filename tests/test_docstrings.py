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


_ROLE = re.compile(r":(func|class|meth|data|attr|mod|exc|obj):`([^`]+)`")


def _reach(path: str):
    """``(object, module it was reached through, the attribute names after it)`` for a dotted
    path (a dataclass's or a settings model's field counts as an attribute), or ``None``."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        via = obj
        for attr in parts[i:]:
            fields = {**getattr(obj, "__dataclass_fields__", {}), **getattr(obj, "model_fields", {})} \
                if inspect.isclass(obj) else {}
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif attr in fields:
                obj = fields[attr]
            else:
                return None
        return obj, via, parts[i:]
    return None


def stale_reference(module: str, scope: list[str], target: str) -> str | None:
    """Why the cross-reference ``target`` in a docstring of ``module`` (inside the classes
    ``scope``) does not lead where Sphinx looks, or ``None`` when it does.

    Sphinx looks a target up as written, relative to the class, then to the module: a name the
    module only imports is documented elsewhere, so a function or class named through a plain
    module must be defined there (a package, or a module that lists it in ``__all__``, is a public
    path and may re-export it)."""
    import builtins

    name = re.sub(r"(?s).*<(.+)>$", r"\1", target).lstrip("~.").removesuffix("()")
    if hasattr(builtins, name):
        return None
    candidates = [".".join([module, *scope[:i], name]) for i in range(len(scope), -1, -1)] + [name]
    found = next((r for r in map(_reach, candidates) if r is not None), None)
    if found is None:
        return "names nothing importable"
    obj, via, rest = found
    if len(rest) == 1 and (inspect.isfunction(obj) or inspect.isclass(obj)) and not hasattr(via, "__path__") \
            and rest[0] not in getattr(via, "__all__", ()) and obj.__module__ != via.__name__:
        return f"imported there, defined in {obj.__module__}"
    return None


def docstring_references(module: str, source: str):
    """``(line, classes around it, role, target)`` of every cross-reference role in the docstrings
    of ``source`` (the module's, its classes', its functions')."""
    import ast

    def walk(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = scope + [child.name] if isinstance(child, ast.ClassDef) else scope
                yield child.lineno, inner, ast.get_docstring(child, clean=False) or ""
                yield from walk(child, inner)

    tree = ast.parse(source)
    for line, scope, doc in [(1, [], ast.get_docstring(tree, clean=False) or ""), *walk(tree, [])]:
        for role, target in _ROLE.findall(doc):
            yield line, scope, role, target


def test_cross_references_resolve_where_sphinx_looks():
    """Every ``:func:``/``:class:``/``:meth:``... target in a docstring of the package names an
    object as Sphinx reads it: relative to its class and module or fully qualified, and not through
    a module that only imports it (the links left behind when a function moved, issue 35)."""
    import pkgutil

    import rlparity

    bad = []
    for info in pkgutil.walk_packages(rlparity.__path__, "rlparity."):
        module = importlib.import_module(info.name)
        for line, scope, role, target in docstring_references(info.name, Path(module.__file__).read_text()):
            why = stale_reference(info.name, scope, target)
            if why:
                bad.append(f"{info.name}:{line} :{role}:`{target}` {why}")
    assert bad == []
    # the check fails where it should: a moved function, a name only imported, a broken line
    assert stale_reference("rlparity.metrics.core.fits", [], "no_such_fit") == "names nothing importable"
    assert "defined in rlparity.capture.checkpoints" in stale_reference("rlparity.capture.weights", ["WeightState"],
                                                                         "checkpoint_checksums")
    assert stale_reference("rlparity.diagnose", [], "rlparity.metrics.layers.\nfirst_divergence") is not None
    assert stale_reference("rlparity.capture.weights", [], "~rlparity.capture.checkpoints.checkpoint_checksums") is None
    assert stale_reference("rlparity.config.defaults", ["ObjectiveDefaults"], "Defaults.eps") is None  # a field
