"""One validation, whichever way a store is read (issue 40): every rule of the eager open
(``open_arms(path)``: chunk files present, values equal to the CRC-32 record made at save, the
schema, the scored token checksum) holds on the lazy path (``open_arms(path, chunks=N)``) through
every kind of lazy reader (the block reader behind ``summary`` and the objective table, the dask
dashboards, the lazy per-token results, ``load_sample`` behind ``diagnose``).

Each damaged store is built in ``tmp_path`` from a valid one; both paths must refuse it with the
same error class and a one-line message naming the same problem, and never return a number."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from rlparity import trace as rt
from rlparity.metrics import as_dashboard, summary
from rlparity.metrics import objective as ob
from rlparity.testing import synthetic_trace
from rlparity.trace import StoreDamagedError, StoreError, TraceValidationError
from rlparity.trace.storage import integrity_record
from rlparity.trace.storage.files import _write_root_attrs

pytest.importorskip("dask")

ARM, VAR = "big", "rollout_logprob"


def _trace(seed=3, n=24, max_len=16):
    return synthetic_trace(n_sequences=n, max_len=max_len, noise=0.05, seed=seed, arm=ARM)


def _save(ds, path, chunk=None):
    """Save ``ds``; with ``chunk`` every per-sequence variable is stored ``chunk`` sequences a file."""
    ds = ds.copy()
    if chunk is not None:
        for name, var in ds.variables.items():
            if var.dims and var.dims[0] == "sequence":
                var.encoding["chunks"] = (chunk,) + tuple(var.shape[1:])
    rt.save(ds, path)
    return path


def _rewrite(path, name, values, ds):
    """Write ``values`` into the stored variable and record the new values' CRC-32, as a writer
    that bypassed validation would: the store is intact (its record matches), its data break the
    schema."""
    zarr.open_array(str(path / ARM / name), mode="r+")[...] = values
    bad = ds.copy()
    bad[name] = (bad[name].dims, values)
    _write_root_attrs(path, {"rlparity_integrity": integrity_record({ARM: bad})})


def _chunk_files(path, name=VAR):
    return sorted(p for p in (path / ARM / name).iterdir() if not p.name.startswith("."))


# ---- the damaged stores: each returns (path, the error class, a phrase both messages hold) ----

def positive_rollout_logprob(tmp_path):
    ds = _trace()
    path = _save(ds, tmp_path / "s.zarr")
    lp = ds[VAR].values.copy()
    lp[5, 0] = 0.25  # a probability above 1: the capture is wrong, the store intact
    _rewrite(path, VAR, lp, ds)
    return path, TraceValidationError, "rollout_logprob is positive"


def token_changed_after_scoring(tmp_path):
    ds = _trace()
    path = _save(ds, tmp_path / "s.zarr")
    tok = ds["token_id"].values.copy()
    tok[7, 1] = tok[7, 1] + 1  # still a real token: only the scored checksum ties it to the trainer
    _rewrite(path, "token_id", tok, ds)
    return path, TraceValidationError, "checksum mismatch"


def flipped_value(tmp_path):
    path = _save(_trace(), tmp_path / "s.zarr")
    arr = zarr.open_array(str(path / ARM / VAR), mode="r+")
    arr[20, 1] = arr[20, 1] - 0.5  # valid values, other than saved: only the record can tell
    return path, StoreDamagedError, "['rollout_logprob'] read back other values"


def chunk_from_a_sibling_run(tmp_path):
    ds = _trace()
    path = _save(ds, tmp_path / "s.zarr", chunk=8)
    other = ds.copy(deep=True)  # the same prompts captured again: the same shapes, other valid values
    for name in ("rollout_logprob", "trainer_processed_logprob"):
        other[name] = other[name] - 0.01 * other["response_mask"]
    sibling = _save(other, tmp_path / "sibling.zarr", chunk=8)
    for name in ("rollout_logprob", "trainer_processed_logprob"):  # the same shape, valid values
        src, dst = _chunk_files(sibling, name)[1], _chunk_files(path, name)[1]
        dst.write_bytes(src.read_bytes())
    return path, StoreDamagedError, "read back other values"


def chunk_from_an_unrelated_store(tmp_path):
    path = _save(_trace(), tmp_path / "s.zarr", chunk=8)
    other = _save(synthetic_trace(n_sequences=5, max_len=40, seed=9, arm=ARM), tmp_path / "other.zarr")
    _chunk_files(path)[1].write_bytes(_chunk_files(other)[0].read_bytes())
    return path, StoreDamagedError, "the store is damaged"


def chunk_from_another_capture(tmp_path):
    """Another capture of the same shapes whose responses end elsewhere: the chunk decodes, and its
    NaN padding falls on real tokens of this store. The schema would blame the engine ("no logprob
    there"); the record says the store is damaged, and damage is said first, on both paths."""
    path = _save(_trace(seed=3), tmp_path / "s.zarr", chunk=8)
    other = _save(_trace(seed=16), tmp_path / "other.zarr", chunk=8)  # seed 16: the same sizes as seed 3
    _chunk_files(path)[1].write_bytes(_chunk_files(other)[1].read_bytes())
    mask = _trace(seed=3)["response_mask"].values[8:16]
    assert (np.isnan(zarr.open_array(str(path / ARM / VAR), mode="r")[8:16]) & mask).any()  # NaN on real tokens
    return path, StoreDamagedError, "['rollout_logprob'] read back other values"


def truncated_chunk(tmp_path):
    path = _save(_trace(), tmp_path / "s.zarr", chunk=8)
    f = _chunk_files(path)[1]
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    return path, StoreDamagedError, "the store is damaged"


def emptied_chunk(tmp_path):
    path = _save(_trace(), tmp_path / "s.zarr", chunk=8)
    _chunk_files(path)[2].write_bytes(b"")
    return path, StoreDamagedError, "the store is damaged"


def missing_chunk(tmp_path):
    path = _save(_trace(), tmp_path / "s.zarr", chunk=8)
    _chunk_files(path)[1].unlink()
    return path, StoreDamagedError, "chunks of 'big/rollout_logprob' are missing"


DAMAGE = [positive_rollout_logprob, token_changed_after_scoring, flipped_value, chunk_from_a_sibling_run,
          chunk_from_another_capture, chunk_from_an_unrelated_store, truncated_chunk, emptied_chunk, missing_chunk]


# ---- the read paths: the eager open, and the lazy open through each kind of reader ----

def _eager(path):
    arm = rt.open_arms(path)[ARM]
    return float(summary(arm)["log_ratio_mean"])


def _lazy(reader):
    def read(path):
        return reader(rt.open_arms(path, chunks=5)[ARM])
    read.__name__ = f"lazy_{reader.__name__}"
    return read


def summary_blocks(ds):
    return float(summary(ds)["log_ratio_mean"])


def objective_table(ds):
    return float(ob.objective_summary(ds)["mean_ratio"][0])


def verl_dashboard(ds):
    return as_dashboard(ds, "verl")["rollout_corr/rollout_is_mean"]


def token_ratio_mean(ds):
    return float(ob.ratio(ds, "backend").mean())  # a lazy per-token result, reduced by the caller


def sample_for_diagnose(ds):
    return float(rt.load_sample(ds, every=2)[VAR].sum())


def a_selection(ds):
    return float(summary(ds.isel(sequence=slice(0, 4)))["log_ratio_mean"])  # the arm is checked whole


PATHS = [_eager] + [_lazy(f) for f in (summary_blocks, objective_table, verl_dashboard, token_ratio_mean,
                                       sample_for_diagnose, a_selection)]


@pytest.mark.parametrize("damage", DAMAGE, ids=[f.__name__ for f in DAMAGE])
@pytest.mark.parametrize("read", PATHS, ids=[f.__name__.strip("_") for f in PATHS])
def test_both_read_paths_refuse_a_damaged_store_alike(tmp_path, damage, read):
    path, kind, phrase = damage(tmp_path)
    with pytest.raises(TraceValidationError) as err:
        read(path)
    assert type(err.value) is kind, (type(err.value).__name__, str(err.value))
    msg = str(err.value)
    assert phrase in msg and "\n" not in msg, msg
    if kind is StoreDamagedError:
        assert msg.endswith("restore it from a copy or re-create it") or "restore" in msg, msg


@pytest.mark.parametrize("read", PATHS, ids=[f.__name__.strip("_") for f in PATHS])
def test_both_read_paths_agree_on_an_intact_store(tmp_path, read):
    """The control: the same builders without damage give numbers, equal on both paths."""
    path = _save(_trace(), tmp_path / "s.zarr", chunk=8)
    eager = rt.open_arms(path)[ARM]
    lazy = rt.open_arms(path, chunks=5)[ARM]
    assert np.isfinite(read(path))
    assert summary_blocks(lazy) == pytest.approx(summary_blocks(eager), rel=1e-12, abs=1e-15)
    assert token_ratio_mean(lazy) == pytest.approx(token_ratio_mean(eager), rel=1e-12)


@pytest.mark.parametrize("chunks, kind, phrase", [
    (-5, ValueError, "at least 1"), (0, ValueError, "at least 1"), ("x", TypeError, "sequences per block"),
    (2.5, TypeError, "sequences per block"), (True, TypeError, "sequences per block"),
    ({"sequence": -5}, ValueError, "at least 1"), ({"sequence": "x"}, TypeError, "must be an int"),
    ({"bogus": 3}, ValueError, "traces do not have"),
])
def test_a_bad_chunks_argument_is_an_argument_error_not_damage(tmp_path, chunks, kind, phrase):
    path = _save(_trace(), tmp_path / "s.zarr")
    with pytest.raises(kind, match=phrase) as err:
        rt.open_arms(path, chunks=chunks)
    assert not isinstance(err.value, StoreError) and "\n" not in str(err.value)
    assert np.isfinite(_eager(path))  # the store is good
    assert rt.open_arms(path, chunks=np.int64(5))[ARM].chunks["sequence"][0] == 5  # a numpy int is an int


def test_a_lazy_arm_is_validated_once_then_reads_only_what_it_needs(tmp_path):
    path = _save(_trace(), tmp_path / "s.zarr", chunk=8)
    lazy = rt.open_arms(path, chunks=5)[ARM]
    view = lazy.isel(sequence=slice(0, 10))
    check = view.encoding[rt.storage.lazy.LAZY_RECORD]["check"]
    assert check is lazy.encoding[rt.storage.lazy.LAZY_RECORD]["check"] and not check.valid
    summary(lazy)
    assert check.valid  # every view shares it
    parts = list(rt.blocks(lazy, variables=["response_mask", VAR]))
    assert len(parts) == 5 and all(set(p.data_vars) == {"response_mask", VAR} for p in parts)
    np.testing.assert_array_equal(np.concatenate([p[VAR].values for p in parts]),
                                  rt.open_arms(path)[ARM][VAR].values)


def test_a_change_after_validation_is_still_found_by_the_crc_of_what_is_read(tmp_path):
    path = _save(_trace(), tmp_path / "s.zarr", chunk=8)
    lazy = rt.open_arms(path, chunks=5)[ARM]
    before = summary_blocks(lazy)  # validated whole
    arr = zarr.open_array(str(path / ARM / VAR), mode="r+")
    arr[20, 1] = arr[20, 1] - 0.5
    for call in (summary_blocks, verl_dashboard):
        with pytest.raises(StoreDamagedError, match="rollout_logprob"):
            call(lazy)
    assert np.isfinite(before)


def test_prime_rl_advantage_is_checked_against_the_record(tmp_path):
    ds = _trace()
    ds["advantage"] = ("sequence", np.linspace(-1.0, 1.0, ds.sizes["sequence"]))
    path = _save(ds, tmp_path / "s.zarr")
    lazy = rt.open_arms(path, chunks=5)[ARM]
    eager = as_dashboard(rt.open_arms(path)[ARM], "prime-rl")
    got = as_dashboard(lazy, "prime-rl")
    assert got.keys() == eager.keys() and any("masked" in k for k in got)
    for k in eager:
        assert got[k] == pytest.approx(eager[k], rel=1e-12, nan_ok=True), k
    arr = zarr.open_array(str(path / ARM / "advantage"), mode="r+")
    arr[3] = -arr[3]  # after the arm was validated: only the CRC of what is read can tell
    with pytest.raises(StoreDamagedError, match="advantage"):
        as_dashboard(lazy, "prime-rl")


def test_the_cli_says_a_truncated_chunk_is_damage_with_exit_2(tmp_path, cli):
    path, _, _ = truncated_chunk(tmp_path)
    for extra in ((), ("--chunks", "4"), ("--chunks", "4", "--names", "verl")):
        res = cli("summary", str(path), *extra)
        assert res.exit_code == 2, (extra, res.stderr)
        assert "the store is damaged" in res.stderr and "internal error" not in res.stderr
