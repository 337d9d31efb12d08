"""`rlparity check`: the parity gate fails on raw logprobs at T=0.7 and passes on processed ones
(real vLLM captures, the same ones test_engine.py uses, so no extra engine start)."""

import json
import subprocess
import sys

import pytest

from rlparity.diagnose.check import Thresholds, check, load_thresholds
from rlparity.trace import save
from test_engine import PROCESSED, RAW, SAMPLING


def run_check(*args):
    return subprocess.run([sys.executable, "-m", "rlparity", "check", *map(str, args)],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def store(capture_trace, scorer_fp32, tmp_path_factory):
    arms = {"processed": scorer_fp32.score(capture_trace(PROCESSED, SAMPLING, arm="processed")),
            "raw": scorer_fp32.score(capture_trace(RAW, SAMPLING, arm="raw"))}
    path = tmp_path_factory.mktemp("check") / "exp.zarr"
    save(arms, path)
    return path, arms


@pytest.mark.engine
def test_check_fails_on_raw_and_passes_on_processed(store):
    path, arms = store
    good, bad = check(arms["processed"]), check(arms["raw"])
    assert good.passed, str(good)
    assert not bad.passed
    failed = {c.name for c in bad.checks if not c.passed}
    assert {"mean_ratio", "forbidden_findings"} <= failed, failed
    r = run_check(path)
    assert r.returncode == 1 and "FAIL" in r.stdout and "raw/mean_ratio" in r.stdout
    assert "--logprobs-mode processed_logprobs" in r.stdout


@pytest.mark.engine
def test_check_cli_on_one_arm_and_json(store, tmp_path):
    path, arms = store
    save({"processed": arms["processed"]}, tmp_path / "good.zarr")
    r = run_check(tmp_path / "good.zarr", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["passed"] is True
    # a looser file can let raw logprobs through: thresholds really come from the YAML
    loose = tmp_path / "loose.yaml"
    loose.write_text("max_abs_log_ratio_mean: null\nmax_abs_log_ratio_rms: null\nmean_ratio: null\n"
                     "max_kl_k3: null\nmax_clip_fraction: null\nforbid_findings: []\nfail_on: none\n")
    save({"raw": arms["raw"]}, tmp_path / "raw.zarr")
    assert run_check(tmp_path / "raw.zarr", "--thresholds", loose).returncode == 0
    assert run_check(tmp_path / "raw.zarr").returncode == 1


def test_threshold_file_errors_name_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_abs_log_ratio_men: 0.1\n")
    with pytest.raises(ValueError, match="max_abs_log_ratio_men"):
        load_thresholds(bad)
    r = run_check(tmp_path / "x.zarr", "--thresholds", bad)
    assert r.returncode == 2 and "valid keys" in r.stderr
    with pytest.raises(ValueError, match="must contain 1.0"):
        Thresholds(mean_ratio=(1.1, 1.2))
    assert load_thresholds().max_zero_prob_share == 0.0  # the shipped defaults load
    from rlparity.config import defaults
    from rlparity.diagnose.check import default_thresholds_path

    assert load_thresholds(default_thresholds_path()) == defaults().check  # the shipped file is the defaults
    assert run_check().returncode == 2  # neither a trace nor --model
