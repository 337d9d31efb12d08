"""Benchmark (issue 27): the objective table (``rlparity.metrics.objective.objective_summary``) of a
store read lazily block by block against the same call on the trace loaded into memory.

Builds the synthetic scored store of ``benchmarks/lazy_summary.py::build`` (about ``--tokens``
real tokens; the backend pair pi_old / mu), then runs each way in a fresh process: ``eager``
(``open_arms(store)`` then the table: load and table timed) and ``lazy`` (``open_arms(store,
chunks=--block)`` then the table, every block validated and CRC-checked). Reports wall time and
peak RSS (VmHWM) of each, and the largest relative difference between the two tables.

    python benchmarks/lazy_objective.py --tokens 5000000 --out lazy_objective_5m.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure(kind: str, store: str, block: int) -> dict:
    from lazy_summary import peak_rss_mb

    from rlparity.metrics.objective import objective_summary
    from rlparity.trace import open_arms

    t = time.perf_counter()
    table = objective_summary(open_arms(store, chunks=block if kind == "lazy" else None)["big"], trainer="processed")
    wall = time.perf_counter() - t
    return {"wall_s": wall, "peak_rss_mb": peak_rss_mb(),
            "table": {k: table[k].values.tolist() for k in table.data_vars}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=5_000_000)
    ap.add_argument("--block", type=int, default=2048, help="sequences per block of the lazy read")
    ap.add_argument("--store", help="keep the synthetic store here (default: a temporary folder)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.measure[0], a.measure[1], a.block)))
        return
    from lazy_summary import build

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(a.store or tmp) / "objective.zarr"
        tokens = build(a.tokens, store) if not store.exists() else None
        res = {}
        for kind in ("eager", "lazy"):
            out = subprocess.run([sys.executable, __file__, "--block", str(a.block), "--measure", kind, str(store)],
                                 check=True, capture_output=True, text=True).stdout
            res[kind] = json.loads(out.strip().splitlines()[-1])
        diff = max(float(np.nanmax(np.abs(np.subtract(res["lazy"]["table"][k], v)) / np.maximum(np.abs(v), 1e-300)))
                   if np.isfinite(v).any() else 0.0 for k, v in res["eager"]["table"].items())
        summary = {"tokens": tokens, "block": a.block, "max_rel_diff": diff,
                   **{f"{k}_{m}": res[k][m] for k in res for m in ("wall_s", "peak_rss_mb")}}
        print(json.dumps(summary, indent=1))
        if a.out:
            Path(a.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
