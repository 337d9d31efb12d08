"""The shape of the package in numbers, so a refactor can say what it changed (issue 35's counts).

    python scripts/code_shape.py [--top N] [--over-params 10] [--rev REV] [--json] [ROOT]

Counts, for ``ROOT`` (default: the ``rlparity`` package next to this script) or for the package as
it stood at a git revision (``--rev``, read with ``git archive``, the working tree untouched):

- modules over 500 lines, functions over 80 lines, signatures over 10 parameters (``self``/``cls``
  not counted);
- pairs of repeated code blocks: two places sharing 6 or more consecutive code lines (comments,
  docstrings and blank lines dropped, whitespace stripped; lines of brackets alone do not start a
  run), overlapping runs of one pair of files counted once;
- metadata read by string: ``attrs["key"]`` and ``attrs.get("key")`` reads (not assignments), and
  how many distinct keys;
- import cycles between the package's modules: at module level, and counting the imports made inside
  functions too (a cycle hidden in a function), as strongly connected components of more than one
  module.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import subprocess
import tarfile
import tempfile
import tokenize
from collections import defaultdict
from pathlib import Path

LIMITS = {"module_lines": 500, "function_lines": 80, "parameters": 10, "block_lines": 6}


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _name(p: Path, root: Path) -> str:
    return str(p.relative_to(root.parent))


def modules(root: Path) -> list[tuple[int, str]]:
    """``(lines, path)`` of every module under ``root``, longest first."""
    out = [(len(p.read_text().splitlines()), _name(p, root)) for p in _files(root)]
    return sorted(out, reverse=True)


def _functions(root: Path):
    for p in _files(root):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield p, node


def signatures(root: Path) -> list[tuple[int, str]]:
    """``(parameters, module:function)`` of every function and method under ``root``, longest first."""
    out = []
    for p, node in _functions(root):
        a = node.args
        names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
        names += [f"*{a.vararg.arg}"] if a.vararg else []
        names += [f"**{a.kwarg.arg}"] if a.kwarg else []
        names = [n for n in names if n not in ("self", "cls")]
        out.append((len(names), f"{_name(p, root)}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def function_lengths(root: Path) -> list[tuple[int, str]]:
    """``(lines, module:function)`` of every function and method (its ``def`` to its last line)."""
    out = [(node.end_lineno - node.lineno + 1, f"{_name(p, root)}:{node.lineno} {node.name}")
           for p, node in _functions(root)]
    return sorted(out, reverse=True)


def _docstring_lines(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def code_lines(text: str) -> list[tuple[int, str]]:
    """``(line number, stripped text)`` of a module's code lines: no blank, comment or docstring line."""
    skip = _docstring_lines(ast.parse(text))
    comments = {tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                if tok.type == tokenize.COMMENT and tok.line.strip().startswith("#")}
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s and i not in skip and i not in comments:
            out.append((i, s))
    return out


def repeated_blocks(root: Path, size: int = LIMITS["block_lines"]) -> list[tuple[str, str]]:
    """Pairs of places sharing ``size`` or more consecutive code lines, one row per pair of runs.

    A window of ``size`` code lines is keyed by its text; a window whose first line is only brackets
    or punctuation is not a start. Windows that repeat a run already counted (the next line of both
    places) extend it instead of counting again.
    """
    where: dict[tuple[str, ...], list[tuple[str, int]]] = defaultdict(list)
    lines: dict[str, list[tuple[int, str]]] = {}
    for p in _files(root):
        name = _name(p, root)
        lines[name] = cl = code_lines(p.read_text())
        for k in range(len(cl) - size + 1):
            if not any(ch.isalnum() for ch in cl[k][1]):
                continue
            where[tuple(s for _, s in cl[k:k + size])].append((name, k))
    matches: set[tuple[str, int, str, int]] = set()
    for places in where.values():
        if len(places) > 8:     # too common to be a block worth naming (as `duplicates` does)
            continue
        for i in range(len(places)):
            for j in range(i + 1, len(places)):
                (a, ka), (b, kb) = sorted((places[i], places[j]))
                if not (a == b and kb - ka < size):     # a run overlapping itself is not a pair
                    matches.add((a, ka, b, kb))
    # a run of n > size shared lines leaves n - size + 1 matching windows: count its first only
    starts = [m for m in matches if (m[0], m[1] - 1, m[2], m[3] - 1) not in matches]
    return sorted((f"{a}:{lines[a][ka][0]}", f"{b}:{lines[b][kb][0]}") for a, ka, b, kb in starts)


def attrs_reads(root: Path) -> tuple[int, dict[str, int]]:
    """``(reads, {key: reads})``: ``X.attrs["key"]`` loads and ``X.attrs.get("key")`` calls."""
    keys: dict[str, int] = defaultdict(int)
    for p in _files(root):
        for node in ast.walk(ast.parse(p.read_text())):
            key = None
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "attrs" \
                    and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                key = node.slice.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "get" and isinstance(node.func.value, ast.Attribute) \
                    and node.func.value.attr == "attrs" and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                key = node.args[0].value
            if key is not None:
                keys[key] += 1
    return sum(keys.values()), dict(sorted(keys.items(), key=lambda kv: -kv[1]))


def _module_name(p: Path, root: Path) -> str:
    parts = list(p.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, *, inside_functions: bool) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``; ``inside_functions``: count imports made in
    a function body too. ``from pkg import sub`` counts the module ``pkg.sub`` (not ``pkg``, whose
    ``__init__`` any submodule import runs); ``from pkg import name`` counts ``pkg``."""
    pkg = root.name
    files = _files(root)
    names = {_module_name(p, root) for p in files}
    graph: dict[str, set[str]] = {n: set() for n in names}
    for p in files:
        me = _module_name(p, root)
        base = me if p.name == "__init__.py" else me.rpartition(".")[0]
        tree = ast.parse(p.read_text())
        nodes = ast.walk(tree) if inside_functions else _top_level(tree)
        for node in nodes:
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    up = base.split(".")
                    up = up[: len(up) - node.level + 1]
                    mod = ".".join(up + ([mod] if mod else []))
                # `from pkg import sub` imports the module pkg.sub; `from pkg import name`, pkg itself
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in names else mod for a in node.names]
            for t in targets:
                if t.split(".")[0] != pkg:
                    continue
                while t and t not in names:
                    t = t.rpartition(".")[0]
                if t and t != me:
                    graph[me].add(t)
    return graph


def _top_level(tree: ast.Module):
    """Statements not inside a function (module level, class bodies, if/try blocks)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, out = set(), [], []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def count(root: Path) -> dict:
    """Every count of the module docstring, as a JSON-ready dict."""
    mods, sigs, funcs = modules(root), signatures(root), function_lengths(root)
    reads, keys = attrs_reads(root)
    blocks = repeated_blocks(root)
    return {
        "lines": sum(n for n, _ in mods),
        "modules": len(mods),
        "modules_over_500_lines": [[n, m] for n, m in mods if n > LIMITS["module_lines"]],
        "functions_over_80_lines": [[n, f] for n, f in funcs if n > LIMITS["function_lines"]],
        "signatures_over_10_parameters": [[n, f] for n, f in sigs if n > LIMITS["parameters"]],
        "repeated_block_pairs": len(blocks),
        "repeated_blocks": [list(b) for b in blocks],
        "attrs_reads_by_string": reads,
        "attrs_keys": keys,
        "import_cycles_module_level": cycles(import_graph(root, inside_functions=False)),
        "import_cycles_with_function_imports": cycles(import_graph(root, inside_functions=True)),
    }


def _at_revision(rev: str, repo: Path, tmp: Path) -> Path:
    data = subprocess.run(["git", "-C", str(repo), "archive", rev, "rlparity"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(tmp, filter="data")
    return tmp / "rlparity"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = Path(__file__).resolve().parent.parent
    ap.add_argument("root", nargs="?", default=str(here / "rlparity"))
    ap.add_argument("--rev", default=None, help="count the package as it stood at this git revision")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print every count as JSON")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = _at_revision(a.rev, here, Path(tmp)) if a.rev else Path(a.root)
        c = count(root)
    if a.json:
        print(json.dumps(c, indent=1))
        return
    print(f"{c['modules']} modules, {c['lines']} lines" + (f" at {a.rev}" if a.rev else ""))
    for key in ("modules_over_500_lines", "functions_over_80_lines", "signatures_over_10_parameters"):
        rows = c[key]
        print(f"{key.replace('_', ' ')}: {len(rows)}")
        for n, name in rows[: a.top]:
            print(f"  {n:5d}  {name}")
    print(f"repeated code blocks (pairs of {LIMITS['block_lines']}+ lines): {c['repeated_block_pairs']}")
    print(f"attrs read by string: {c['attrs_reads_by_string']} reads of {len(c['attrs_keys'])} keys")
    print(f"import cycles: {len(c['import_cycles_module_level'])} at module level, "
          f"{len(c['import_cycles_with_function_imports'])} counting imports inside functions")
    for comp in c["import_cycles_with_function_imports"]:
        print("  " + " <-> ".join(comp))


if __name__ == "__main__":
    main()
