"""Storage under faults and concurrency: kill -9 during a save, concurrent writers, readers during
swaps (real processes, synthetic traces, no engine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from rlparity import trace as T
from rlparity.testing import synthetic_trace
from rlparity.trace import storage as S
from rlparity.trace.storage import locking as store_locking, paths as store_paths
from rlparity.trace.storage import dataset_digests

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

TILED = """
import numpy as np, xarray as xr
from rlparity.testing import synthetic_trace
from rlparity.trace import token_checksum

def tiled(reps, seed, n=32, max_len=256):
    base = synthetic_trace(n_sequences=n, max_len=max_len, seed=seed)
    data = {k: (v.dims, np.concatenate([v.values] * reps) if "sequence" in v.dims else v.values, v.attrs)
            for k, v in base.data_vars.items()}
    ds = xr.Dataset(data, coords={"sequence": np.arange(n * reps), "position": base.position.values,
                                  "prompt_position": base.prompt_position.values}, attrs=base.attrs)
    ds.attrs["scored_token_checksum"] = token_checksum(ds)
    return ds
"""
_ns: dict = {}
exec(TILED, _ns)  # the same helper here and in the child processes
tiled = _ns["tiled"]


def child(code: str, *args: str) -> subprocess.Popen:
    src = TILED + "\nimport sys, time\nfrom rlparity import trace as T\n" + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", src, *args], env=ENV, stdout=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    proc.stdout.close()


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def test_kill_9_during_large_saves_keeps_the_previous_store(tmp_path):
    """A writer replacing a store with a ~1M-token trace is killed at several moments; every time the
    store then loads as the previous version or, if the swap had finished, the complete new one."""
    store = tmp_path / "s.zarr"
    old = synthetic_trace(seed=1)
    T.save(old, store)
    new = tiled(128, seed=2)  # 4096 sequences, ~0.8M tokens
    want_old, want_new = dataset_digests(old), dataset_digests(new)
    mid_write = 0
    for delay in (0.0, 0.05, 0.2, 0.5, 1.0):
        proc = child("""
            ds = tiled(128, seed=2)
            print("ready", flush=True)
            T.save(ds, sys.argv[1])
            print("saved", flush=True)
            time.sleep(30)
        """, str(store))
        try:
            assert proc.stdout.readline().strip() == "ready"
            t0 = time.monotonic()
            while not any(n.startswith(".s.zarr.tmp-") for n in os.listdir(tmp_path)):
                assert time.monotonic() - t0 < 60 and proc.poll() is None
                time.sleep(0.002)
            time.sleep(delay)
            writing = any(n.startswith(".s.zarr.tmp-") for n in os.listdir(tmp_path))
            proc.send_signal(signal.SIGKILL)
        finally:
            stop(proc)
        got = dataset_digests(T.load(store))
        assert got in (want_old, want_new)
        if writing and got == want_old:
            mid_write += 1
        assert leftovers(tmp_path) == [], "the next open cleans the killed writer's orphans"
        T.save(old, store)  # back to the previous version for the next round
    assert mid_write >= 3, "most kills must land while the new copy was being written"


def test_two_processes_add_15_arms_each(tmp_path):
    store = tmp_path / "s.zarr"
    go = tmp_path / "go"
    procs = [child("""
        from pathlib import Path
        from rlparity.testing import synthetic_trace
        k = sys.argv[2]
        ds = synthetic_trace(n_sequences=2, max_len=4, seed=int(k), scored=False)
        print("ready", flush=True)
        while not Path(sys.argv[3]).exists():
            time.sleep(0.005)
        for i in range(15):
            T.add_arm(ds, sys.argv[1], f"p{k}_{i:02d}")
        print("done", flush=True)
    """, str(store), k, str(go)) for k in ("1", "2")]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        go.touch()
        for p in procs:
            assert p.stdout.readline().strip() == "done"
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            stop(p)
    arms = T.open_arms(store)
    assert sorted(arms) == sorted(f"p{k}_{i:02d}" for k in "12" for i in range(15))
    for k in "12":
        want = dataset_digests(synthetic_trace(n_sequences=2, max_len=4, seed=int(k), scored=False))
        assert all(dataset_digests(arms[f"p{k}_{i:02d}"]) == want for i in range(15))
    assert [n for n in leftovers(tmp_path) if n != "go"] == []


def _reader_during_swaps(tmp_path, n_loads: int, min_swaps: int = 5):
    """Load ``n_loads`` times while another process swaps versions A and B in; returns how many
    loads saw A, B, or raised StoreDamagedError (any other outcome fails the test)."""
    store = tmp_path / "s.zarr"
    a, b = tiled(8, seed=5, n=32, max_len=128), tiled(8, seed=6, n=32, max_len=128)
    T.save(a, store)
    versions = {"A": dataset_digests(a), "B": dataset_digests(b)}
    writer = child("""
        from pathlib import Path
        a, b = tiled(8, seed=5, n=32, max_len=128), tiled(8, seed=6, n=32, max_len=128)
        print("ready", flush=True)
        i = 0
        while not Path(sys.argv[2]).exists():
            T.save(b if i % 2 == 0 else a, sys.argv[1])
            i += 1
        print(i, flush=True)
    """, str(store), str(tmp_path / "stop"))
    seen = {"A": 0, "B": 0, "damaged": 0}
    try:
        assert writer.stdout.readline().strip() == "ready"
        for _ in range(n_loads):
            try:
                got = dataset_digests(T.load(store))
            except T.StoreDamagedError:
                seen["damaged"] += 1
                continue
            match = [k for k, v in versions.items() if v == got]
            assert match, "a load mixed two versions"
            seen[match[0]] += 1
        (tmp_path / "stop").touch()
        swaps = int(writer.stdout.readline())
        assert writer.wait(timeout=60) == 0
    finally:
        stop(writer)
    assert swaps >= min_swaps, f"only {swaps} swaps happened during the reads"
    print(f"{n_loads} loads during {swaps} swaps: {seen}")
    return seen


def test_readers_never_see_a_torn_store(tmp_path):
    seen = _reader_during_swaps(tmp_path, 100)
    assert seen["damaged"] == 0, seen  # the shared lock: every read is whole
    assert seen["A"] > 0 and seen["B"] > 0, seen
    assert leftovers(tmp_path) == []


def test_unlocked_readers_are_caught_not_fooled(tmp_path, monkeypatch):
    """Where no lock can be taken (a read-only location), the integrity record catches a read torn
    by a swap: the load retries, and raises rather than return mixed data."""
    from rlparity.trace.storage import zarr_io as io

    real, real_read = store_locking._open_lock_file, io._read
    caught = []

    def counting_read(p, shown, chunks=None):
        try:
            return real_read(p, shown, chunks)
        except T.StoreDamagedError as err:
            caught.append(str(err))
            raise

    monkeypatch.setattr(store_locking, "_open_lock_file", lambda lf, shared: None if shared else real(lf, shared))
    monkeypatch.setattr(io, "_read", counting_read)
    seen = _reader_during_swaps(tmp_path, 60, min_swaps=3)
    assert seen["A"] + seen["B"] + seen["damaged"] == 60
    print(f"torn reads caught by the integrity record and retried: {len(caught)}")
    assert all("read back other values" in m or "missing" in m or "failed" in m for m in caught)


def test_store_lock_excludes_writers_across_processes(tmp_path):
    store = T.save(synthetic_trace(seed=1), tmp_path / "s.zarr")
    done = tmp_path / "holder-done"
    holder = child("""
        from pathlib import Path
        from rlparity.trace import store_lock
        with store_lock(sys.argv[1]):
            print("held", flush=True)
            time.sleep(1.0)
            Path(sys.argv[2]).write_text("done")  # the last thing done under the lock
    """, str(store), str(done))
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError, match="held by another process"):
            with T.store_lock(store, timeout=0.2):
                pass
        T.add_arm(synthetic_trace(seed=2), store, "second")  # waits for the holder, then writes
        assert done.exists()  # it got the lock only after the holder's last step under it (no clock involved)
    finally:
        stop(holder)
    assert set(T.open_arms(store)) == {"synthetic", "second"}
    assert leftovers(tmp_path) == []


def test_large_store_integrity_check_finds_nothing_on_a_good_store(tmp_path):
    """The chunk check and the CRC-32 on ~0.8M tokens pass on an intact store and load the same
    values (their cost relative to the load is a benchmark: benchmarks/store_integrity.py)."""
    ds = tiled(128, seed=3)
    store = T.save(ds, tmp_path / "s.zarr")
    meta = store_paths._read_meta(store)
    assert S.missing_chunks(store, meta) == []
    got = T.load(store)
    assert dataset_digests(got) == dataset_digests(ds)
    assert isinstance(got, xr.Dataset) and np.array_equal(got["token_id"].values, ds["token_id"].values)

def test_recovery_leaves_a_live_writers_folder_alone_before_its_lock(tmp_path):
    """temp_store makes its folder, then locks it: a recovery between the two must not take it.
    A .tmp- folder named by a live process (not locked) stays; one named by a process that has
    exited is removed, as is an unlocked .old- folder (the pid in its name does not protect it)."""
    import subprocess

    store = T.save(synthetic_trace(seed=1), tmp_path / "s.zarr")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        mine = tmp_path / f".s.zarr.tmp-{live.pid}-0123abcd"
        gone = tmp_path / f".s.zarr.tmp-{dead.pid}-0123abcd"
        old = tmp_path / f".s.zarr.old-{live.pid}-0123abcd"
        for d in (mine, gone, old):
            d.mkdir()
        done = T.recover(store)
        assert mine.exists() and not gone.exists() and not old.exists(), done
        assert f"removed orphan {gone.name}" in done
        T.load(store)  # the store itself untouched
    finally:
        live.kill()
        live.wait()
    T.recover(store)
    assert not mine.exists()  # its writer is gone now
