"""The objective metrics on a lazy trace (``open_arms(store, chunks=N)``): read block by block with
bounded memory, equal to the same functions on the trace in memory (tight tolerance) and to float64
formulas; the store's CRC record checked as they read (and by the dashboards' dask pass)."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
import zarr

from rlparity import trace as rt
from rlparity.metrics import as_dashboard
from rlparity.metrics import objective as ob
from rlparity.testing import synthetic_trace
from rlparity.trace import StoreDamagedError, with_trainer
from rlparity.trace.storage.lazy.digests import crc32_combine

pytest.importorskip("dask")


def _three_policies(n_sequences=37, max_len=30, seed=3):
    """A scored trace with pi_theta (the trainer moved by a seeded step), one probability-0 token."""
    ds = synthetic_trace(n_sequences=n_sequences, max_len=max_len, noise=0.05, seed=seed, arm="big")
    rng = np.random.default_rng(seed)
    old = ds["trainer_processed_logprob"].values.copy()
    old[2, 0] = -np.inf
    delta = rng.normal(0, 0.1, old.shape)
    return with_trainer(ds, {"trainer_processed_logprob": old,
                             "trainer_updated_processed_logprob": np.minimum(old + delta, 0.0),
                             "trainer_updated_logprob": ds["trainer_logprob"].values + delta})


@pytest.fixture()
def store(tmp_path):
    ds = _three_policies()
    path = tmp_path / "t.zarr"
    rt.save(ds, path)
    return path, ds


def _same(a, b):
    np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-12, atol=1e-15)


def test_lazy_objective_table_in_blocks_of_one_sequence(store):
    path, _ = store
    got, want = ob.objective_summary(rt.open_arms(path, chunks=1)["big"]), ob.objective_summary(rt.open_arms(path)["big"])
    for k in want.data_vars:
        _same(got[k], want[k])


@pytest.mark.parametrize("chunks", [6, 100])
def test_lazy_objective_metrics_equal_the_eager_ones(store, chunks):
    path, _ = store
    lazy, eager = rt.open_arms(path, chunks=chunks)["big"], rt.open_arms(path)["big"]
    got, want = ob.objective_summary(lazy), ob.objective_summary(eager)
    assert list(got.data_vars) == list(want.data_vars) and got.sizes["pair"] == 3
    for k in want.data_vars:
        _same(got[k], want[k])
    for pair in ("backend", "update", "bypass"):
        for dim in (None, "position", "sequence", ("sequence", "position")):
            for f in (ob.clip_fraction, ob.effective_sample_size, ob.masked_fraction):
                g, w = f(lazy, pair=pair, dim=dim), f(eager, pair=pair, dim=dim)
                assert g.dims == w.dims
                _same(g, w)
                assert (g.n_used.values == w.n_used.values).all() and (g.n_excluded.values == w.n_excluded.values).all()
        for f in (ob.clip_fraction, ob.effective_sample_size, ob.ratio):
            _same(f(lazy, pair=pair, level="sequence"), f(eager, pair=pair, level="sequence"))
        for rule in ("geometric_band", "seq_max_k3", "token_k2"):
            for level in ("token", "sequence"):
                _same(ob.masked_fraction(lazy, rule, pair, level=level), ob.masked_fraction(eager, rule, pair, level=level))


def test_lazy_per_token_results_stay_lazy_and_equal_the_eager_ones(store):
    path, _ = store
    lazy, eager = rt.open_arms(path, chunks=6)["big"], rt.open_arms(path)["big"]
    for pair in ("backend", "update"):
        got = ob.ratio(lazy, pair)
        assert hasattr(got.data, "dask")  # nothing read yet
        np.testing.assert_array_equal(got.values, ob.ratio(eager, pair).values)
        for level in ("token", "sequence"):
            got = ob.is_weights(lazy, pair, level=level, kind="geometric")
            assert hasattr(got.data, "dask")
            np.testing.assert_array_equal(got.values, ob.is_weights(eager, pair, level=level, kind="geometric").values)
    got, want = ob.decoupled(lazy, cap=2.0), ob.decoupled(eager, cap=2.0)
    for k in want.data_vars:
        np.testing.assert_array_equal(got[k].values, want[k].values)


def test_lazy_objective_metrics_equal_a_float64_reference(store):
    """Token ESS, PPO clip fraction and the GSPO sequence clip fraction by their formulas, per
    sequence in a Python loop over the real tokens (independent of the vectorised core)."""
    path, ds = store
    lazy = rt.open_arms(path, chunks=4)["big"]
    m = ds["response_mask"].values.astype(bool)
    old = ds["trainer_processed_logprob"].values.astype(np.float64)
    mu = ds["rollout_logprob"].values.astype(np.float64)
    rows = [old[i][m[i]] - mu[i][m[i]] for i in range(len(m))]
    d = np.concatenate(rows)
    d = d[np.isfinite(d)]
    r = np.exp(d)
    ess = r.sum() ** 2 / (r.size * (r ** 2).sum())
    assert float(ob.effective_sample_size(lazy)) == pytest.approx(ess, rel=1e-12)
    assert float(ob.clip_fraction(lazy, "backend", eps_low=0.05, eps_high=0.05)) == pytest.approx(
        np.mean((r < 0.95) | (r > 1.05)), rel=1e-12)
    s = np.array([np.exp(x.mean()) for x in rows if x.size and np.isfinite(x).all()])
    got = ob.clip_fraction(lazy, "backend", level="sequence", eps_low=0.01, eps_high=0.01)
    assert float(got) == pytest.approx(np.mean((s < 0.99) | (s > 1.01)), rel=1e-12)
    assert int(got.n_used) == s.size and int(got.n_excluded) == 1


def test_a_chunking_that_splits_sequences_is_refused_for_per_token_results(store):
    path, _ = store
    split = rt.open_arms(path, chunks={"sequence": 5, "position": 7})["big"]
    with pytest.raises(ValueError, match="open_arms\\(store, chunks=N\\)"):
        ob.is_weights(split, level="sequence")
    # the block reader reads whole sequences whatever the chunks: the reductions still hold
    _same(ob.objective_summary(split)["ess_sequence_product"],
          ob.objective_summary(rt.open_arms(path)["big"])["ess_sequence_product"])


def _flip_a_byte(path, var="rollout_logprob"):
    """Corrupt one chunk file of a real store in place (one byte of its compressed data flipped)
    and return the values read back before and after."""
    before = zarr.open_array(str(path / "big" / var), mode="r")[:]
    chunk = sorted(p for p in (path / "big" / var).iterdir() if not p.name.startswith("."))[0]
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    return before, zarr.open_array(str(path / "big" / var), mode="r")[:]


def test_a_corrupted_chunk_stops_the_lazy_objective_metrics_and_dashboards(store):
    path, _ = store
    before, after = _flip_a_byte(path)
    assert not np.array_equal(before, after, equal_nan=True)  # the chunk decodes, to other numbers
    lazy = rt.open_arms(path, chunks=5)["big"]
    for call in (lambda: ob.objective_summary(lazy), lambda: ob.clip_fraction(lazy, "backend"),
                 lambda: ob.effective_sample_size(lazy, level="sequence"),
                 lambda: as_dashboard(lazy, "verl", trainer="processed"),
                 lambda: as_dashboard(lazy, "trl", trainer="processed")):
        with pytest.raises(StoreDamagedError, match="rollout_logprob.*restore it from a copy") as err:
            call()
        assert "\n" not in str(err.value)


def test_a_changed_valid_chunk_stops_the_lazy_dashboard(store):
    """A chunk rewritten with other values (valid, so only the CRC record can tell)."""
    path, _ = store
    arr = zarr.open_array(str(path / "big" / "trainer_processed_logprob"), mode="r+")
    arr[30, 1] = arr[30, 1] - 0.5
    with pytest.raises(StoreDamagedError, match="trainer_processed_logprob"):
        as_dashboard(rt.open_arms(path, chunks=8)["big"], "slime", trainer="processed")


def test_crc32_combine_equals_zlib():
    for la, lb in ((0, 5), (3, 0), (100, 4096), (7, 123_457)):
        a, b = os.urandom(la), os.urandom(lb)
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), lb) == zlib.crc32(a + b)
        assert crc32_combine(12345, zlib.crc32(b), lb) == zlib.crc32(b, 12345)


_PEAKS = """
import json, sys, tracemalloc
from rlparity import trace as rt
from rlparity.metrics import objective as ob

path, small = sys.argv[1], sys.argv[2]
ob.objective_summary(rt.open_arms(small)["big"])  # warm every cache (imports, dask, zarr) on a small store
ob.objective_summary(rt.open_arms(small, chunks=5)["big"])


def peak(fn):
    tracemalloc.start()
    fn()
    out = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out


lazy = rt.open_arms(path, chunks=20)["big"]
print(json.dumps({"eager": peak(lambda: ob.objective_summary(rt.open_arms(path)["big"])),
                  "lazy": peak(lambda: ob.objective_summary(lazy))}))
"""


def test_lazy_objective_summary_has_bounded_memory(tmp_path):
    """Peak traced memory (tracemalloc: numpy's buffers and zarr's) of the lazy table is a small
    fraction of the eager one's on a store 40 blocks long, and within a few blocks' worth. Measured
    in a fresh process after a warm-up on a small store, so no earlier test's caches (or their
    absence) move the numbers: the order-dependence seen in CI (issue 42)."""
    import json
    import subprocess
    import sys

    path, small = tmp_path / "m.zarr", tmp_path / "small.zarr"
    rt.save(_three_policies(n_sequences=800, max_len=256, seed=1), path)
    rt.save(_three_policies(n_sequences=20, max_len=16, seed=2), small)
    block_bytes = 20 * 256 * 8  # one block of one float64 variable
    run = subprocess.run([sys.executable, "-c", _PEAKS, str(path), str(small)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    p = json.loads(run.stdout.strip().splitlines()[-1])
    assert p["lazy"] < p["eager"] / 5, p
    assert p["lazy"] < 200 * block_bytes, (p, block_bytes)


def test_a_dashboard_refuses_dim():
    """A peer's dashboard is a function of the whole arm: ``dim=`` is not one of its options."""
    with pytest.raises(ValueError, match=r"verl has no option \['dim'\]"):
        as_dashboard(synthetic_trace(n_sequences=4, max_len=6), "verl", dim="sequence")
