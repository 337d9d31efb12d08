"""Benchmark: what the store's integrity checks cost against the load they guard (issue 13's
targets, moved here from the tests: no wall-clock asserts in tests).

Saves a synthetic scored trace of about ``--tokens`` response tokens, then times, ``--repeats``
times each (median): the chunk-file check (:func:`rlparity.trace.storage.check_chunks`), a full
:func:`rlparity.trace.load` (which includes both checks), and the CRC-32 of every variable
(:func:`rlparity.trace.storage.dataset_digests`). Targets: the chunk check under 0.2 s and the CRC
under 0.35x of the load at about 0.8M tokens.

    python benchmarks/store_integrity.py --tokens 800000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build(tokens: int, seed: int = 3):
    import xarray as xr

    from rlparity.testing import synthetic_trace
    from rlparity.trace import token_checksum

    base = synthetic_trace(n_sequences=32, max_len=256, seed=seed)
    per = int(base["response_mask"].sum())
    reps = max(1, round(tokens / per))
    data = {k: (v.dims, np.concatenate([v.values] * reps) if "sequence" in v.dims else v.values, v.attrs)
            for k, v in base.data_vars.items()}
    ds = xr.Dataset(data, coords={"sequence": np.arange(32 * reps), "position": base.position.values,
                                  "prompt_position": base.prompt_position.values}, attrs=base.attrs)
    ds.attrs["scored_token_checksum"] = token_checksum(ds)
    return ds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=800_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()

    from rlparity import trace as T
    from rlparity.trace import storage as S
    from rlparity.trace.storage.paths import _read_meta

    ds = build(a.tokens)
    with tempfile.TemporaryDirectory() as d:
        store = T.save(ds, Path(d) / "s.zarr")
        meta = _read_meta(store)
        times: dict[str, list[float]] = {"check_chunks": [], "load": [], "crc": []}
        got = None
        for _ in range(a.repeats):
            t = time.perf_counter()
            S.check_chunks(store, meta)
            times["check_chunks"].append(time.perf_counter() - t)
            t = time.perf_counter()
            got = T.load(store)
            times["load"].append(time.perf_counter() - t)
            t = time.perf_counter()
            S.dataset_digests(got)
            times["crc"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {"tokens": int(ds["response_mask"].sum()), "median_s": med, "times_s": times,
              "crc_vs_load": med["crc"] / med["load"], "targets": {"check_chunks_s": 0.2, "crc_vs_load": 0.35},
              "same_values": S.dataset_digests(got) == S.dataset_digests(ds)}
    print(f"{result['tokens']} tokens, median of {a.repeats}: chunk check {med['check_chunks']:.3f} s "
          f"(target < 0.2), load {med['load']:.3f} s, CRC {med['crc']:.3f} s = {result['crc_vs_load']:.2f}x "
          f"the load (target < 0.35); values equal: {result['same_values']}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
