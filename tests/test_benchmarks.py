"""Every script in benchmarks/ runs once at a small size, so none can rot (a smoke run: no timing
asserts; the speed targets are ratios each script reports, read by hand). A new benchmark without a
smoke row here fails the first test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# script -> (small-size arguments, what its JSON output must hold); "{out}" is a JSON file path
SMOKE = {
    "metrics.py": (["--tokens", "20000", "--repeats", "1", "--out", "{out}"],
                   lambda r: r["tokens"] > 10000 and r["max_abs_diff_vs_numpy"] < 1e-9
                   and r["max_abs_diff_fast_vs_general"] < 1e-9),
    "head_chunking.py": (["--vocab", "4096", "--tokens", "64", "--hidden", "32", "--chunks", "16"], None),
    "rescoring.py": (["--vocab", "1024", "--sequences", "4", "--length", "48", "--prompt", "16", "--batch", "2",
                      "--repeats", "1", "--no-memory", "--out", "{out}"],
                     lambda r: r["tokens"] == 4 * 48 and {row["method"] for row in r["rows"]} >= {"bare", "scorer_fp32_new"}),
    "lazy_summary.py": (["--tokens", "100000", "--block", "32", "--repeats", "1", "--out", "{out}"],
                        lambda r: r["same_count"] and r["same_mean_abs"] < 1e-9 and r["q99_diff"] < 1e-9
                        and r["peak_rss_mb"]["lazy"] > 0),
    "lazy_objective.py": (["--tokens", "60000", "--block", "16", "--out", "{out}"],
                          lambda r: r["max_rel_diff"] < 1e-12 and r["lazy_peak_rss_mb"] > 0),
    "store_integrity.py": (["--tokens", "20000", "--repeats", "1", "--out", "{out}"],
                           lambda r: r["same_values"] and r["tokens"] > 10000),
    "recorder.py": (["--steps", "3", "--sequences", "8", "--length", "16", "--step-seconds", "0.05", "--weights-mb", "1",
                     "--tensors", "8", "--repeats", "1", "--out", "{out}"],
                    lambda r: r["tokens"] > 0 and r["bytes_per_token"] > 0 and r["modes"]["inline"]["store_files"] > 0
                    and r["median_step_s"] > 0),
    # starts one vLLM engine (the engine tests' lane)
    "layer_capture.py": (["--sequences", "1", "--length", "32", "--repeats", "1", "--out", "{out}"],
                         lambda r: r["sequences"] == 1 and r["length"] == 32),
}
ENGINE = {"layer_capture.py"}


def test_every_benchmark_has_a_smoke_run():
    assert sorted(SMOKE) == sorted(p.name for p in BENCH.glob("*.py"))


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.engine) if s in ENGINE else s for s in sorted(SMOKE)])
def test_benchmark_runs_at_a_small_size(script, tmp_path, request):
    if script in ("head_chunking.py", "rescoring.py", *ENGINE):
        pytest.importorskip("torch")
    if script in ENGINE:
        request.getfixturevalue("release_engines")()  # the script's engine needs the engine lock
    args, holds = SMOKE[script]
    res, out = _run(script, args, tmp_path)
    if script == "head_chunking.py":
        rows = json.loads(res.stdout)["rows"]
        assert len(rows) == 2 and all(r["same_result"] for r in rows)  # chunked = unchunked
    if holds is not None:
        assert holds(json.loads(out.read_text())), out.read_text()[:2000]


def test_lazy_benchmark_of_summary_dashboard_and_diagnose_runs_at_a_small_size(tmp_path):
    """``lazy_summary.py --all``: the streamed summary + verl dashboard + diagnose agree with the
    same calls in memory (a sample small enough that diagnose judges one sequence in 4)."""
    _, out = _run("lazy_summary.py", ["--all", "--tokens", "60000", "--block", "16", "--repeats", "1",
                                      "--sample-tokens", "16000", "--out", "{out}"], tmp_path)
    r = json.loads(out.read_text())
    assert r["same_count"] and r["same_findings"] and r["n_findings"] > 0, r
    assert r["dashboard_max_rel_diff"] < 1e-9 and "one sequence in 4" in r["sample"], r
    assert r["peak_rss_mb"]["lazy"] > 0 and set(r["parts_s"]["lazy"]) == {"summary", "dashboard", "diagnose"}


def _run(script, args, tmp_path):
    out = tmp_path / "result.json"
    argv = [a.replace("{out}", str(out)) for a in args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, str(BENCH / script), *argv], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{script} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res, out
