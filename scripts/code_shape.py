"""The shape of the package in numbers: the longest modules (lines) and the longest signatures
(parameters, ``self``/``cls`` not counted), so a refactor can say what it changed.

    python scripts/code_shape.py [--top N] [--over-params 8] [ROOT]

Prints the N longest modules and the N longest signatures of ``ROOT`` (default: the ``rlparity``
package next to this script) and, with ``--over-params K``, every function with more than K
parameters.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def modules(root: Path) -> list[tuple[int, str]]:
    """``(lines, path)`` of every module under ``root``, longest first."""
    out = [(len(p.read_text().splitlines()), str(p.relative_to(root.parent))) for p in root.rglob("*.py")]
    return sorted(out, reverse=True)


def signatures(root: Path) -> list[tuple[int, str]]:
    """``(parameters, module:function)`` of every function and method under ``root``, longest first."""
    out = []
    for p in root.rglob("*.py"):
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                names += [f"*{a.vararg.arg}"] if a.vararg else []
                names += [f"**{a.kwarg.arg}"] if a.kwarg else []
                names = [n for n in names if n not in ("self", "cls")]
                out.append((len(names), f"{p.relative_to(root.parent)}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parent.parent / "rlparity"))
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--over-params", type=int, default=None)
    a = ap.parse_args()
    root = Path(a.root)
    mods, sigs = modules(root), signatures(root)
    print("longest modules (lines):")
    for n, name in mods[: a.top]:
        print(f"  {n:5d}  {name}")
    print("longest signatures (parameters):")
    for n, name in sigs[: a.top]:
        print(f"  {n:5d}  {name}")
    if a.over_params is not None:
        over = [s for s in sigs if s[0] > a.over_params]
        print(f"{len(over)} functions with more than {a.over_params} parameters:")
        for n, name in over:
            print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
