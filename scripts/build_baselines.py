"""Build rlparity/data/baselines.json, the baseline table of `rlparity doctor` (is my number normal).

Reads the shipped examples (rlparity/data/examples, every clean arm or RL step: rlparity.metrics.
baselines.is_clean) and any run store or store of arms given on the command line, and writes one
row per key (model family, dtype, engine, attention backend, head precision, device) with the unit
values and what each row was measured on.

    python scripts/build_baselines.py [--out PATH] [STORE ...]

The device of a shipped example is read from its name (h100-*, h200-*, cpu-*): the arms' attrs
name only cuda / cpu. Stores given on the command line use the trainer's device from their attrs.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rlparity.datasets import example_path, list_examples
from rlparity.metrics.baselines import build_rows
from rlparity.trace import open_arms

DEVICE_OF_PREFIX = {"h100": "H100", "h200": "H200", "cpu": "cpu"}
STEP = re.compile(r"^(?P<run>.+)@step_(?P<step>\d+)$")


def store_units(name: str, path: Path, device: str | None):
    """(store, run, unit, trace, device) of every arm of a store of arms, or every step of a run store."""
    from rlparity.record import is_run_store, open_run, step_trace

    if is_run_store(path):
        run = open_run(path)
        for k in range(int(run.attrs["steps"])):
            yield name, name, f"{name}@step_{k:03d}", step_trace(run, k), device
        return
    for arm, trace in open_arms(path).items():
        m = STEP.match(arm)
        yield name, m["run"] if m else arm, arm, trace, device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs="*", type=Path, help="more run stores or stores of arms")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "rlparity/data/baselines.json")
    a = ap.parse_args()
    units = []
    sources = []
    for ex in list_examples():
        path = Path(example_path(ex))
        if not path.name.endswith(".zarr"):
            continue
        units.extend(store_units(ex, path, DEVICE_OF_PREFIX.get(ex.split("-")[0])))
        sources.append(ex)
    for p in a.stores:
        units.extend(store_units(p.name, p, None))
        sources.append(str(p))
    rows = build_rows(units)
    a.out.write_text(json.dumps({"built_from": sources, "builder": "scripts/build_baselines.py",
                                 "unit": "one clean batch: an arm of a capture or a step of a run",
                                 "rows": [r.to_dict() for r in rows]}, indent=1) + "\n")
    for r in rows:
        print(f"{len(r.runs):3d} runs {r.n_units:3d} units {r.n_tokens:7d} tokens  {r.key}")


if __name__ == "__main__":
    main()
