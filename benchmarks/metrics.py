"""Benchmark: ``rlparity.metrics.summary`` at scale against a plain numpy pass (issue 16).

Builds a synthetic scored trace of about ``--tokens`` real response tokens (ragged sequences,
padding included) with :func:`rlparity.trace.from_rollouts` and
:func:`rlparity.trace.with_trainer`, then times, in one process, round-robin, ``--repeats``
times each (median):

* ``numpy``: the same scalar statistics with plain numpy on the real-token arrays, already
  compressed to 1-d (mean, |d| mean / RMS / max, five quantiles from one ``np.quantile``, mean
  ratio, k1 / k2 / k3, clip fraction, ESS, |pi - mu| mean / max / std, Pearson): the baseline;
* ``numpy+compress``: the same with the compression of the 2-d arrays by the response mask;
* ``summary``: ``rlparity.metrics.summary(trace)`` (``dim=None``: the real tokens compressed, then
  ``token_statistics``);
* ``summary_general``: ``summary(trace, dim=("sequence", "position"))``, the same reduction
  through the general ``xr.apply_ufunc`` path (what ``dim=None`` did before issue 16).

    python benchmarks/metrics.py --tokens 10000000
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)


def build(tokens: int, seed: int = 0):
    from rlparity.trace import from_rollouts, with_trainer

    rng = np.random.default_rng(seed)
    mean_len = 400
    n = max(1, tokens // mean_len)
    lengths = rng.integers(mean_len // 2, 3 * mean_len // 2 + 1, size=n)
    total = int(lengths.sum())
    mu = -rng.exponential(1.0, total)  # log mu of the sampled tokens
    pi = np.minimum(mu + rng.normal(0, 0.05, total), 0.0)  # trainer: a small mismatch, still a log-probability
    raw = pi - rng.exponential(0.1, total)
    cut = np.cumsum(lengths)[:-1]
    trace = from_rollouts(prompt_token_ids=[[1, 2, 3]] * n,
                          token_ids=np.split(rng.integers(3, 1000, total), cut),
                          rollout_logprobs=np.split(mu, cut), temperature=0.7, top_k=50)
    mask = trace["response_mask"].values
    arrays = {}
    for name, v in (("trainer_processed_logprob", pi), ("trainer_logprob", raw)):
        full = np.full(mask.shape, np.nan)
        full[mask] = v
        arrays[name] = full
    return with_trainer(trace, arrays, {"trainer": {"model": "synthetic"}})


def numpy_stats(lp: np.ndarray, lm: np.ndarray, eps: float = 0.2) -> dict[str, float]:
    """The summary's scalars on 1-d real-token arrays, plain numpy (the baseline)."""
    d = lp - lm
    n = d.size
    out = {"mean": d.sum() / n, "abs_mean": np.abs(d).sum() / n, "rms": np.sqrt((d * d).sum() / n),
           "max_abs": np.abs(d).max()}
    out.update(zip([f"q{q}" for q in QUANTILES], np.quantile(d, QUANTILES)))
    r = np.exp(d)
    out["mean_ratio"] = r.sum() / n
    out["k1"], out["k2"], out["k3"] = -d.sum() / n, (d * d / 2).sum() / n, (np.expm1(d) - d).sum() / n
    out["clip"] = np.count_nonzero((r < 1 - eps) | (r > 1 + eps)) / n
    out["ess"] = r.sum() ** 2 / (n * (r * r).sum())
    pi, mu = np.exp(lp), np.exp(lm)
    diff = np.abs(pi - mu)
    m = diff.sum() / n
    out.update(prob_mean=m, prob_max=diff.max(), prob_std=np.sqrt(((diff - m) ** 2).sum() / n))
    dx, dy = pi - pi.mean(), mu - mu.mean()
    out["pearson"] = (dx * dy).sum() / np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--general", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the general apply_ufunc path (slow)")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()

    import xarray as xr

    from rlparity.metrics import summary

    t0 = time.perf_counter()
    trace = build(a.tokens)
    build_s = time.perf_counter() - t0
    mask = trace["response_mask"].values
    lp2, lm2 = trace["trainer_processed_logprob"].values, trace["rollout_logprob"].values
    lp, lm = lp2[mask], lm2[mask]
    n_tokens = int(mask.sum())
    print(f"# {n_tokens} real tokens in {mask.shape[0]} x {mask.shape[1]} cells (built in {build_s:.1f} s)",
          file=sys.stderr)

    methods = {
        "numpy": lambda: numpy_stats(lp, lm),
        "numpy+compress": lambda: numpy_stats(lp2[mask], lm2[mask]),
        "summary": lambda: summary(trace),
    }
    if a.general:
        methods["summary_general"] = lambda: summary(trace, dim=("sequence", "position"))
    times: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(a.repeats):
        for name, fn in methods.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    fast = summary(trace)
    ref = numpy_stats(lp, lm)
    check = max(abs(fast["log_ratio_mean"].item() - ref["mean"]), abs(fast["log_ratio_q99"].item() - ref["q0.99"]),
                abs(fast["prob_pearson"].item() - ref["pearson"]), abs(fast["ess_token"].item() - ref["ess"]))
    agree = None
    if a.general:
        gen = summary(trace, dim=("sequence", "position"))
        agree = max(abs(float(fast[k]) - float(gen[k])) for k in fast.data_vars
                    if np.isfinite(float(gen[k])))
    result = {"date": time.strftime("%Y-%m-%d"), "tokens": n_tokens, "cells": int(mask.size),
              "versions": {"python": platform.python_version(), "numpy": np.__version__, "xarray": xr.__version__,
                           "machine": platform.machine()},
              "median_s": med, "times_s": times,
              "summary_vs_numpy": med["summary"] / med["numpy"],
              "summary_vs_numpy_compress": med["summary"] / med["numpy+compress"],
              "max_abs_diff_vs_numpy": check, "max_abs_diff_fast_vs_general": agree}
    if a.general:
        result["general_vs_numpy"] = med["summary_general"] / med["numpy"]
    print(f"\n{n_tokens} tokens, median of {a.repeats}\n")
    print("| method | s | vs numpy |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {v / med['numpy']:.2f} |")
    print(f"\nfast vs plain numpy max |diff| {check:.1e}; fast vs general path max |diff| {agree}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
