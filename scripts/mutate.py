"""A small mutation tester: operator and constant mutations of one module at a time, each run
against a chosen pytest selection, killed or survived recorded.

    PYTHONPATH=. python scripts/mutate.py rlparity/diagnose/trainer.py -- -m "not engine" tests/test_diagnose_units.py
    PYTHONPATH=. python scripts/mutate.py rlparity/metrics/versions.py --functions version_excess,floor_excess_ratio \
        --json out.json -- tests/test_diagnose_units.py

Mutations (one per run, at one place): ``+ <-> -``, ``* <-> /``, ``< <-> <=``, ``> <-> >=``,
``== <-> !=``, ``and <-> or``, ``not x -> x``, a number ``c -> c + 1`` (``c * 2`` for a float
between 0 and 1), ``True <-> False``, ``min <-> max``. ``--functions`` limits them to the bodies
(and defaults) of the named functions or methods; module-level constants are mutated when no
function is named or when ``--constants`` names them.

Why not mutmut: it copies the package into ``mutants/`` and rewrites every function through a
trampoline, which the import-linter contracts and the tests that read the package's source and
docstrings do not survive. Here the parent imports the package once; each mutant runs in a forked
child that swaps the mutated functions' code (``__code__``, defaults) and constants into the live
modules and calls ``pytest.main``, so a mutant costs the tests only (no interpreter start).
Names bound by ``from module import CONSTANT`` elsewhere keep the old value: mutate such a
constant where it is read, or count it as not tested here.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import signal
import sys
import time
import types
from pathlib import Path

SWAP_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
SWAP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
SWAP_CALL = {"min": "max", "max": "min"}


def _scopes(tree: ast.Module, functions: set[str] | None, constants: set[str] | None):
    """The nodes that may be mutated: inside the named functions, or the module's constants."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if functions is None or node.name in functions:
                out.append(node)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        functions is None or sub.name in functions or f"{node.name}.{sub.name}" in functions):
                    out.append(sub)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if (functions is None and constants is None) or (constants and names & constants):
                out.append(node)
    return out


def _skip(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Docstrings, f-string parts and annotations are not behaviour."""
    p = parents.get(node)
    while p is not None:
        if isinstance(p, (ast.JoinedStr, ast.FormattedValue)):
            return True
        if isinstance(p, ast.arg) or (isinstance(p, ast.AnnAssign) and node is p.annotation):
            return True
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) and node is getattr(p, "returns", None):
            return True
        p = parents.get(p)
    return False


def mutations(source: str, functions: set[str] | None, constants: set[str] | None) -> list[dict]:
    """Every single-place mutation of ``source`` as ``{"line", "what", "apply"}`` (apply: tree -> tree)."""
    tree = ast.parse(source)
    parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    found = []
    for scope in _scopes(tree, functions, constants):
        for node in ast.walk(scope):
            if _skip(node, parents):
                continue
            path = _path(tree, node)
            if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
                new = SWAP_BIN[type(node.op)]
                found.append((node, f"{type(node.op).__name__} -> {new.__name__}", path, ("op", new)))
            elif isinstance(node, ast.Compare):
                for i, op in enumerate(node.ops):
                    if type(op) in SWAP_CMP:
                        new = SWAP_CMP[type(op)]
                        found.append((node, f"{type(op).__name__} -> {new.__name__}", path, ("cmp", i, new)))
            elif isinstance(node, ast.BoolOp):
                new = ast.Or if isinstance(node.op, ast.And) else ast.And
                found.append((node, f"{type(node.op).__name__} -> {new.__name__}", path, ("op", new)))
            elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
                found.append((node, "not x -> x", path, ("drop_not",)))
            elif isinstance(node, ast.Constant) and type(node.value) in (int, float) and not isinstance(
                    parents.get(node), ast.Expr):
                v = node.value
                nv = v * 2 if isinstance(v, float) and 0 < v < 1 else v + 1
                found.append((node, f"{v!r} -> {nv!r}", path, ("const", nv)))
            elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
                found.append((node, f"{node.value} -> {not node.value}", path, ("const", not node.value)))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in SWAP_CALL:
                found.append((node, f"{node.func.id} -> {SWAP_CALL[node.func.id]}", path, ("call",)))
    out = []
    for node, what, path, how in found:
        out.append({"line": node.lineno, "what": what, "path": path, "how": how,
                    "scope": _enclosing(tree, node, parents)})
    return out


def _path(tree: ast.AST, target: ast.AST) -> list:
    """Where ``target`` sits in ``tree``: field names and indices from the root."""
    stack = [(tree, [])]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                for i, v in enumerate(value):
                    if isinstance(v, ast.AST):
                        stack.append((v, path + [name, i]))
            elif isinstance(value, ast.AST):
                stack.append((value, path + [name]))
    raise LookupError("node not in tree")


def _enclosing(tree, node, parents) -> str:
    p, names = parents.get(node), []
    while p is not None:
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(p.name)
        p = parents.get(p)
    return ".".join(reversed(names)) or "<module>"


def apply(source: str, m: dict) -> ast.Module:
    """The tree of ``source`` with mutation ``m`` applied."""
    tree = ast.parse(source)
    node = tree
    for step in m["path"]:
        node = node[step] if isinstance(step, int) else getattr(node, step)
    how = m["how"]
    if how[0] == "op":
        node.op = how[1]()
    elif how[0] == "cmp":
        node.ops[how[1]] = how[2]()
    elif how[0] == "drop_not":
        # replace the UnaryOp by its operand in its parent
        parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        parent = parents[node]
        for name, value in ast.iter_fields(parent):
            if value is node:
                setattr(parent, name, node.operand)
            elif isinstance(value, list):
                for i, v in enumerate(value):
                    if v is node:
                        value[i] = node.operand
    elif how[0] == "const":
        node.value = how[1]
    elif how[0] == "call":
        node.func.id = SWAP_CALL[node.func.id]
    return ast.fix_missing_locations(tree)


def _swap_into(module: types.ModuleType, tree: ast.Module) -> None:
    """Swap the code, defaults and constants of the mutated module into the live one."""
    ns: dict = {"__name__": module.__name__, "__file__": module.__file__}
    exec(compile(tree, module.__file__, "exec"), ns)
    for name, new in ns.items():
        old = module.__dict__.get(name)
        if isinstance(new, types.FunctionType) and isinstance(old, types.FunctionType):
            _swap_function(old, new)
        elif isinstance(new, type) and isinstance(old, type):
            for attr, nv in vars(new).items():
                ov = vars(old).get(attr)
                if isinstance(nv, types.FunctionType) and isinstance(ov, types.FunctionType):
                    _swap_function(ov, nv)
                elif isinstance(nv, property) and isinstance(ov, property):
                    for acc in ("fget", "fset"):
                        if getattr(nv, acc) and getattr(ov, acc):
                            _swap_function(getattr(ov, acc), getattr(nv, acc))
        elif isinstance(new, (int, float, str, bool, tuple)) and not name.startswith("__"):
            module.__dict__[name] = new


def _swap_function(old: types.FunctionType, new: types.FunctionType) -> None:
    old = getattr(old, "__wrapped__", old)
    if old.__code__.co_freevars != new.__code__.co_freevars:
        return
    old.__code__ = new.__code__
    old.__defaults__ = new.__defaults__
    old.__kwdefaults__ = new.__kwdefaults__


def run_one(module: types.ModuleType, tree: ast.Module | None, pytest_args: list[str], timeout: int) -> str:
    """``"killed"``, ``"survived"`` or ``"timeout"`` for one mutant (``tree`` None: the original)."""
    pid = os.fork()
    if pid == 0:  # the child: mutate, test, exit with pytest's code
        try:
            import pytest

            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            if tree is not None:
                _swap_into(module, tree)
            code = pytest.main(["-q", "-x", "-p", "no:cacheprovider", *pytest_args])
        except BaseException:
            code = 99
        os._exit(int(code))
    t0 = time.time()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return "survived" if code == 0 else ("killed" if code in (1, 99) or code < 0 else f"error {code}")
        if time.time() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("give the pytest selection after `--` (e.g. `-- -m 'not engine' tests/test_diagnose_units.py`)")
        return 2
    i = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("module", help="a module file, e.g. rlparity/diagnose/trainer.py")
    ap.add_argument("--functions", help="comma-separated functions or methods to mutate (default: all)")
    ap.add_argument("--constants", help="comma-separated module constants to mutate (with --functions)")
    ap.add_argument("--json", help="write the mutants and their fate here")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per mutant (a hang counts as killed)")
    ap.add_argument("--survivors-of", help="a --json of an earlier run on the same source: run only its survivors "
                    "(a larger selection kills at least what a smaller one did)")
    args = ap.parse_args(argv[:i])
    pytest_args = argv[i + 1:]
    path = Path(args.module)
    name = ".".join(path.with_suffix("").parts)
    module = importlib.import_module(name)
    import pytest  # noqa: F401  loaded once here, with the package, before the children fork

    for pre in ("rlparity.diagnose", "rlparity.datasets", "rlparity.experiments.faults", "rlparity.testing"):
        importlib.import_module(pre)
    source = path.read_text()
    functions = set(args.functions.split(",")) if args.functions else None
    constants = set(args.constants.split(",")) if args.constants else None
    muts = mutations(source, functions, constants)
    t0 = time.time()
    base = run_one(module, None, pytest_args, args.timeout)
    print(f"{len(muts)} mutants; the selection passes unmutated in {time.time() - t0:.1f}s", flush=True)
    if base != "survived":
        print(f"the selection fails without any mutation ({base}): fix it first")
        return 2
    earlier = json.loads(Path(args.survivors_of).read_text())["mutants"] if args.survivors_of else None
    if earlier is not None and len(earlier) != len(muts):
        print(f"{args.survivors_of} holds {len(earlier)} mutants, this source {len(muts)}: not the same source")
        return 2
    results = []
    for k, m in enumerate(muts):
        if earlier is not None and earlier[k]["fate"] != "survived":
            results.append({**earlier[k], "fate": earlier[k]["fate"] + " (earlier run)"})
            continue
        fate = run_one(module, apply(source, m), pytest_args, args.timeout)
        fate = "killed" if fate == "timeout" else fate
        results.append({"id": k, "module": str(path), "line": m["line"], "scope": m["scope"], "what": m["what"],
                        "fate": fate})
        print(f"{path}:{m['line']} {m['scope']}: {m['what']}: {fate}", flush=True)
    killed = sum(r["fate"].startswith("killed") for r in results)
    print(f"{path}: {killed}/{len(results)} killed ({killed / max(len(results), 1):.0%})")
    if args.json:
        Path(args.json).write_text(json.dumps({"module": str(path), "pytest": pytest_args, "killed": killed,
                                               "total": len(results), "mutants": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
