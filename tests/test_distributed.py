"""Rescoring across processes (issue 27): real torch.distributed (gloo) with two processes on the
CPU, started by torchrun; the gathered result must equal a single process's scoring exactly (the
ranks score the single-process plan's own micro-batches)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from rlparity.score import STATS, Scorer


@pytest.fixture(scope="module")
def rollout(tiny_model):
    from rlparity.models import make_prompts
    from rlparity.train import generate_trace

    return generate_trace(tiny_model, make_prompts(20, seed=7), n=2, max_new_tokens=12, seed=1)


def test_two_processes_equal_one(tiny_model, rollout, tmp_path, cli):
    from rlparity.trace import open_arms, save

    store = save({"arm": rollout}, tmp_path / "in.zarr")
    single = Scorer(tiny_model, batch_size=4, progress=False).score(rollout)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "rlparity.score.distributed", str(store), "--model", tiny_model, "--batch-size", "4",
           "--out", str(tmp_path / "out.zarr")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    multi = open_arms(tmp_path / "out.zarr")["arm"]
    for var in STATS:
        a, b = single[var].values, multi[var].values
        both_nan = np.isnan(a) & np.isnan(b) if a.dtype.kind == "f" else np.zeros(a.shape, bool)
        assert np.array_equal(a[~both_nan], b[~both_nan]), var
    info = multi.attrs["trainer"]["distributed"]
    assert info["world_size"] == 2 and info["backend"] == "gloo"
    # every micro-batch was scored by exactly one rank: no hole left
    m = rollout["response_mask"].values
    assert np.isfinite(multi["trainer_logprob"].values[m]).all()
    # the CLI starts the same run
    r = cli("score", store, "--model", tiny_model, "--nproc", "2")
    assert r.exit_code == 0, r.output
    again = open_arms(store)["arm"]
    np.testing.assert_array_equal(again["trainer_logprob"].values[m], multi["trainer_logprob"].values[m])
