"""Benchmark (issue 27): the parity summary of a trace larger than memory, read lazily block by
block, against a plain numpy pass over the same tokens held in memory.

Writes a synthetic scored store of about ``--tokens`` response tokens (compact dtypes: int32 ids,
float32 logprobs; the rollout variables and the trainer's processed reading), then runs, each in a
fresh process, ``--repeats`` times (median wall, largest peak RSS):

- ``numpy``: the three arrays read from the store into memory, the real tokens compressed, the
  statistics of ``benchmarks/metrics.py::numpy_stats`` (the baseline: only the pass is timed);
- ``lazy``: ``open_arms(store, chunks=--block)`` and ``rlparity.metrics.summary`` (every block read,
  validated, CRC-checked against the store's record, and accumulated; the whole call is timed).

With ``--all`` both runs time ``summary`` + ``as_dashboard(names="verl")`` + ``diagnose`` instead
(``numpy_all`` on the trace loaded into memory, load untimed; ``lazy_all`` streaming, opening
included; :func:`measure_all`), and the dashboard and the findings of the two are compared.

Targets: the lazy peak RSS <= 2 GiB at 100M tokens, its time <= 3x the numpy pass.

    python benchmarks/lazy_summary.py --tokens 10000000 --out lazy_10m.json
    python benchmarks/lazy_summary.py --tokens 100000000 --repeats 1 --out lazy_100m.json
    python benchmarks/lazy_summary.py --all --tokens 10000000 --out lazy_all_10m.json
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


def measure(kind: str, store: str, block: int, sample_tokens: int = 2_000_000) -> dict:
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
    elif kind == "lazy":
        t = time.perf_counter()
        s = summary(open_arms(store, chunks=block)["big"], trainer="processed")
        wall = time.perf_counter() - t
        values = {"abs_log_ratio_mean": float(s["abs_log_ratio_mean"]), "log_ratio_q99": float(s["log_ratio_q99"]),
                  "n": int(s["n_tokens"])}
    else:  # all three: summary + verl's dashboard + diagnose, lazily or on the trace held in memory
        return measure_all(kind, store, block, sample_tokens)
    return {"wall_s": wall, "peak_rss_mb": peak_rss_mb(), **values}


def measure_all(kind: str, store: str, block: int, sample_tokens: int) -> dict:
    """``lazy_all``: ``summary`` + ``as_dashboard(names="verl")`` + ``diagnose`` on the store opened
    lazily (the whole sequence timed, opening included). ``numpy_all``: the same three calls on the
    trace loaded into memory first (the load not timed); its ``diagnose`` gets the sequences the
    lazy one judges (one in k, the same k), so both judge the same tokens and the difference is the
    streaming."""
    from rlparity.diagnose import diagnose
    from rlparity.metrics import as_dashboard, summary
    from rlparity.trace import open_arms

    if kind == "numpy_all":
        trace = open_arms(store)["big"]
        tokens = int(trace["response_mask"].sum())
        every = max(1, -(-tokens // sample_tokens))
        sample = trace.isel(sequence=slice(0, None, every))
        sample.attrs = {k: v for k, v in sample.attrs.items() if k != "scored_token_checksum"} if every > 1 \
            else sample.attrs
        t = time.perf_counter()
        s = summary(trace, trainer="processed")
        t1 = time.perf_counter()
        dash = as_dashboard(trace, "verl", trainer="processed")
        t2 = time.perf_counter()
        report = diagnose(sample if every > 1 else trace)
    else:
        t = time.perf_counter()
        arms = open_arms(store, chunks=block)
        s = summary(arms["big"], trainer="processed")
        t1 = time.perf_counter()
        dash = as_dashboard(arms["big"], "verl", trainer="processed")
        t2 = time.perf_counter()
        report = diagnose(arms, lazy_tokens=sample_tokens)
    t3 = time.perf_counter()
    return {"wall_s": t3 - t, "parts_s": {"summary": t1 - t, "dashboard": t2 - t1, "diagnose": t3 - t2},
            "peak_rss_mb": peak_rss_mb(), "abs_log_ratio_mean": float(s["abs_log_ratio_mean"]),
            "log_ratio_q99": float(s["log_ratio_q99"]), "n": int(s["n_tokens"]), "dashboard": dict(dash),
            "findings": [(f.name, f.severity.name) for f in report],
            "sample": report.context.get("lazy_sample", {}).get("big", "")}


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
    ap.add_argument("--all", action="store_true", help="time summary + as_dashboard(names='verl') + diagnose "
                                                       "(kinds numpy_all / lazy_all) instead of the summary alone")
    ap.add_argument("--lazy-only", action="store_true", help="skip the in-memory run (when it cannot fit)")
    ap.add_argument("--sample-tokens", type=int, default=2_000_000, help="diagnose's lazy_tokens (--all)")
    ap.add_argument("--measure", choices=["numpy", "lazy", "numpy_all", "lazy_all"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure(a.measure, a.store, a.block, a.sample_tokens)))
        return

    tmp = Path(tempfile.mkdtemp(prefix="rlparity-lazy-"))
    store = Path(a.store) if a.store else tmp / "big.zarr"
    try:
        t = time.perf_counter()
        n = build(a.tokens, store)
        build_s = time.perf_counter() - t
        print(f"# {n} real tokens written in {build_s:.1f} s", file=sys.stderr)
        kinds = ("numpy_all", "lazy_all") if a.all else ("numpy", "lazy")
        runs: dict[str, list[dict]] = {"numpy": [], "lazy": []}
        for _ in range(a.repeats):
            for key, kind in zip(runs, kinds):
                if a.lazy_only and key == "numpy":
                    continue
                res = subprocess.run([sys.executable, __file__, "--measure", kind, "--store", str(store),
                                      "--block", str(a.block), "--sample-tokens", str(a.sample_tokens)],
                                     capture_output=True, text=True)
                if res.returncode:
                    raise SystemExit(f"{kind} failed (exit {res.returncode}): {res.stderr.strip()[-2000:]}")
                runs[key].append(json.loads(res.stdout.strip().splitlines()[-1]))
        if a.lazy_only:  # the in-memory run would not fit beside the others: the lazy run's numbers alone
            result = {"tokens": n, "block_sequences": a.block, "build_s": build_s, "runs": runs["lazy"]}
            print(json.dumps(result, indent=1))
            if a.out:
                Path(a.out).write_text(json.dumps(result, indent=1))
            return
        med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
        peak = {k: max(r["peak_rss_mb"] for r in v) for k, v in runs.items()}
        lazy, eager = runs["lazy"][0], runs["numpy"][0]
        result = {"tokens": n, "block_sequences": a.block, "build_s": build_s, "wall_s": med, "peak_rss_mb": peak,
                  "time_ratio_lazy_to_numpy": med["lazy"] / med["numpy"],
                  "same_mean_abs": abs(lazy["abs_log_ratio_mean"] - eager["abs_log_ratio_mean"]),
                  "q99_diff": abs(lazy["log_ratio_q99"] - eager["log_ratio_q99"]),
                  "same_count": lazy["n"] == eager["n"] == n}
        if a.all:
            result.update(timed="summary + as_dashboard(names='verl') + diagnose", sample=lazy["sample"],
                          dashboard_max_rel_diff=max(abs(v - eager["dashboard"][k]) / max(1.0, abs(v))
                                                     for k, v in lazy["dashboard"].items() if v == v),
                          same_findings=lazy["findings"] == eager["findings"], n_findings=len(lazy["findings"]),
                          parts_s={k: runs[k][0]["parts_s"] for k in runs})
        print(json.dumps(result, indent=1))
        if a.out:
            Path(a.out).write_text(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
