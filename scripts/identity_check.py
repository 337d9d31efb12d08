"""Refactor identity check: the diagnose report of every shipped example, and the results JSON of
every notebook, written by one version of the code and compared with another's.

    PYTHONPATH=<checkout A> python scripts/identity_check.py reports OUT_A
    PYTHONPATH=<checkout B> python scripts/identity_check.py reports OUT_B
    python scripts/identity_check.py compare OUT_A OUT_B            # numbers equal to 1e-12 relative

    PYTHONPATH=<checkout> python scripts/identity_check.py notebooks OUT [NAME ...]   # papermill, ci=True

``reports`` writes, per example, ``report-<name>.json`` (the diagnose report) and ``tables-<name>.json``
(every experiment table of ``rlparity.metrics`` tried on it; a table the example cannot give is its
error). ``compare`` leaves out timings (``elapsed_s``, any key ending ``_s``), dates and paths, and
compares two errors by their exception type only (messages may be reworded).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path

SKIP_KEY = re.compile(r"(^elapsed_s$|_s$|^date$|_date$|^created_at$|path|^dir$|^out$|^out_dir$)")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}.*)?$")


def reports(out: Path) -> None:
    import rlparity
    from rlparity.datasets import example_path, list_examples
    from rlparity.diagnose import diagnose

    out.mkdir(parents=True, exist_ok=True)
    print("rlparity from", rlparity.__file__)
    for name in list_examples():
        t0 = time.time()
        report = diagnose(example_path(name))
        (out / f"report-{name}.json").write_text(json.dumps(report.to_dict(), indent=1, sort_keys=True, default=str))
        print(f"{name}: {len(report)} findings, {time.time() - t0:.1f}s", flush=True)
        (out / f"tables-{name}.json").write_text(json.dumps(tables(name), indent=1, sort_keys=True, default=str))


TABLES = {  # the experiment tables of rlparity.metrics, each tried on every example (an error is a result too)
    "head_table": ("rlparity.metrics.head_precision", "head_table"),
    "head_gap_by_position": ("rlparity.metrics.head_precision", "gap_by_position"),
    "head_gap_by_logit": ("rlparity.metrics.head_precision", "gap_by_logit"),
    "inflight_table": ("rlparity.metrics.inflight", "inflight_table"),
    "inflight_lag_histogram": ("rlparity.metrics.inflight", "lag_histogram"),
    "inflight_gap_by_update_time": ("rlparity.metrics.inflight", "gap_by_update_time"),
    "rl_curves": ("rlparity.metrics.rl", "rl_curves"),
}


def tables(name: str) -> dict:
    """Every table of :data:`TABLES` on example ``name`` as plain data (``Dataset.to_dict``), or its error;
    the inflight table's reset ratios and the RL curves' profile contrast too."""
    import importlib

    from rlparity.datasets import load_example

    arms = load_example(name)
    out: dict = {}
    for key, (mod, fn) in TABLES.items():
        try:
            ds = getattr(importlib.import_module(mod), fn)(arms)
        except Exception as err:  # noqa: BLE001 - the error is what is compared
            out[key] = f"error: {type(err).__name__}: {err}"
            continue
        out[key] = ds.to_dict(data="list")
        if key == "inflight_table":
            out["inflight_reset_ratios"] = importlib.import_module(mod).reset_ratios(ds)
        if key == "rl_curves":
            out["rl_profile_contrast"] = importlib.import_module(mod).profile_contrast(ds)
    return out


def notebooks(out: Path, names: list[str]) -> None:
    import rlparity
    from rlparity.cli.notebooks import run_notebook

    root = Path(rlparity.__file__).resolve().parent.parent / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    paths = sorted(root.glob("[0-9][0-9]_*.py"))
    if names:
        paths = [p for p in paths if any(p.stem.startswith(n) for n in names)]
    for path in paths:
        t0 = time.time()
        run_notebook(path, out / f"{path.stem}.ipynb", out / path.stem, parameters={"ci": True})
        print(f"{path.stem}: {time.time() - t0:.0f}s", flush=True)


def _diff(a, b, where: str, out: list[str], rtol: float) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if SKIP_KEY.search(str(k)):
                continue
            if k not in a or k not in b:
                out.append(f"{where}/{k}: only in {'b' if k not in a else 'a'}")
            else:
                _diff(a[k], b[k], f"{where}/{k}", out, rtol)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            _diff(x, y, f"{where}[{i}]", out, rtol)
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        if (isinstance(a, float) and math.isnan(a)) and (isinstance(b, float) and math.isnan(b)):
            return
        if not math.isclose(a, b, rel_tol=rtol, abs_tol=0.0) and a != b:
            out.append(f"{where}: {a!r} != {b!r}")
    elif isinstance(a, str) and isinstance(b, str) and DATE.match(a) and DATE.match(b):
        return
    elif isinstance(a, str) and isinstance(b, str) and a.startswith("error: ") and b.startswith("error: "):
        if a.split(":")[1] != b.split(":")[1]:  # a table both versions refuse: the same exception type
            out.append(f"{where}: {a!r} != {b!r}")
    elif a != b:
        out.append(f"{where}: {a!r} != {b!r}")


def compare(a: Path, b: Path, rtol: float = 1e-12) -> int:
    files = sorted({p.relative_to(a) for p in a.rglob("*.json")} | {p.relative_to(b) for p in b.rglob("*.json")})
    bad = 0
    for rel in files:
        if not (a / rel).exists() or not (b / rel).exists():
            print(f"{rel}: only in {'b' if not (a / rel).exists() else 'a'}")
            bad += 1
            continue
        diffs: list[str] = []
        _diff(json.loads((a / rel).read_text()), json.loads((b / rel).read_text()), "", diffs, rtol)
        print(f"{rel}: {'identical' if not diffs else f'{len(diffs)} differences'}")
        for d in diffs[:20]:
            print("   ", d)
        bad += bool(diffs)
    print(f"{len(files)} files compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "reports":
        reports(Path(rest[0]))
    elif cmd == "notebooks":
        notebooks(Path(rest[0]), rest[1:])
    elif cmd == "compare":
        sys.exit(compare(Path(rest[0]), Path(rest[1])))
    else:
        sys.exit(__doc__)
