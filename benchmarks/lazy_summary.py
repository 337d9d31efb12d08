"""Benchmark (issue 27): the parity summary of a trace larger than memory, read lazily block by
block, against a plain numpy pass over the same tokens held in memory.

Writes a synthetic scored store of about ``--tokens`` response tokens (compact dtypes: int32 ids,
float32 logprobs; the rollout variables and the trainer's processed reading), then runs, each in a
fresh process, ``--repeats`` times (median wall, largest peak RSS):

- ``numpy``: the three arrays read from the store into memory, the real tokens compressed, the
  statistics of ``benchmarks/metrics.py::numpy_stats`` (the baseline: only the pass is timed);
- ``lazy``: ``open_arms(store, chunks=--block)`` and ``rlparity.metrics.summary`` (every block read,
  validated, CRC-checked against the store's record, and accumulated; the whole call is timed).

Targets: the lazy peak RSS <= 2 GiB at 100M tokens, its time <= 3x the numpy pass.

    python benchmarks/lazy_summary.py --tokens 10000000 --out lazy_10m.json
    python benchmarks/lazy_summary.py --tokens 100000000 --repeats 1 --out lazy_100m.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KEEP = ("token_id", "response_mask", "rollout_logprob", "policy_version", "prompt_token_id", "prompt_length",
        "response_length", "finish_reason", "prompt_index", "sample_index", "temperature", "top_k", "top_p",
        "request_seed", "trainer_processed_logprob")


def _numpy_stats():
    spec = importlib.util.spec_from_file_location("bench_metrics", Path(__file__).with_name("metrics.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.numpy_stats


def build(tokens: int, path: Path, seed: int = 5) -> int:
    """A scored store of about ``tokens`` real tokens: one synthetic block tiled (the values
    repeat, the work does not); returns the real token count."""
    import xarray as xr

    from rlparity.testing import synthetic_trace
    from rlparity.trace import save, token_checksum

    base = synthetic_trace(n_sequences=64, max_len=1024, seed=seed, noise=0.02)
    per = int(base["response_mask"].sum())
    reps = max(1, round(tokens / per))
    small = {"i": np.int32, "f": np.float32}
    data = {}
    for k in KEEP:
        v = base[k]
        vals = v.values.astype(small.get(v.dtype.kind, v.dtype)) if v.dims[-1] in ("position", "prompt_position") \
            else v.values
        data[k] = (v.dims, np.concatenate([vals] * reps), v.attrs)
    ds = xr.Dataset(data, coords={"sequence": np.arange(64 * reps), "position": base.position.values,
                                  "prompt_position": base.prompt_position.values}, attrs=base.attrs)
    ds.attrs["scored_token_checksum"] = token_checksum(ds)
    save(ds.assign_attrs(arm="big"), path)
    return per * reps


def measure(kind: str, store: str, block: int) -> dict:
    import xarray as xr

    from rlparity.metrics import summary
    from rlparity.trace import open_arms

    if kind == "numpy":
        tree = xr.open_datatree(store, engine="zarr", consolidated=True, zarr_format=2)["big"]
        mask = tree["response_mask"].values.astype(bool)
        lp = tree["trainer_processed_logprob"].values[mask].astype(np.float64)
        lm = tree["rollout_logprob"].values[mask].astype(np.float64)
        stats = _numpy_stats()
        t = time.perf_counter()
        out = stats(lp, lm)
        wall = time.perf_counter() - t
        values = {"abs_log_ratio_mean": out["abs_mean"], "log_ratio_q99": out["q0.99"], "n": int(lp.size)}
    else:
        t = time.perf_counter()
        s = summary(open_arms(store, chunks=block)["big"], trainer="processed")
        wall = time.perf_counter() - t
        values = {"abs_log_ratio_mean": float(s["abs_log_ratio_mean"]), "log_ratio_q99": float(s["log_ratio_q99"]),
                  "n": int(s["n_tokens"])}
    return {"wall_s": wall, "peak_rss_mb": peak_rss_mb(), **values}


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``: its own address space; ``ru_maxrss`` would carry the
    parent's peak across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--block", type=int, default=2048, help="sequences per block of the lazy read")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--store", help="keep the synthetic store here (default: a temporary folder)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--measure", choices=["numpy", "lazy"], help=argparse.SUPPRESS)  # the child process
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.measure, a.store, a.block)))
        return

    tmp = Path(tempfile.mkdtemp(prefix="rlparity-lazy-"))
    store = Path(a.store) if a.store else tmp / "big.zarr"
    try:
        t = time.perf_counter()
        n = build(a.tokens, store)
        build_s = time.perf_counter() - t
        print(f"# {n} real tokens written in {build_s:.1f} s", file=sys.stderr)
        runs: dict[str, list[dict]] = {"numpy": [], "lazy": []}
        for _ in range(a.repeats):
            for kind in runs:
                res = subprocess.run([sys.executable, __file__, "--measure", kind, "--store", str(store),
                                      "--block", str(a.block)], capture_output=True, text=True, check=True)
                runs[kind].append(json.loads(res.stdout.strip().splitlines()[-1]))
        med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
        peak = {k: max(r["peak_rss_mb"] for r in v) for k, v in runs.items()}
        result = {"tokens": n, "block_sequences": a.block, "build_s": build_s, "wall_s": med, "peak_rss_mb": peak,
                  "time_ratio_lazy_to_numpy": med["lazy"] / med["numpy"],
                  "same_mean_abs": abs(runs["lazy"][0]["abs_log_ratio_mean"] - runs["numpy"][0]["abs_log_ratio_mean"]),
                  "q99_diff": abs(runs["lazy"][0]["log_ratio_q99"] - runs["numpy"][0]["log_ratio_q99"]),
                  "same_count": runs["lazy"][0]["n"] == runs["numpy"][0]["n"] == n}
        print(json.dumps(result, indent=1))
        if a.out:
            Path(a.out).write_text(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
