"""The CRC-32 record made at save, checked as a lazy arm is read.

Block by block (:class:`StreamDigests`: one running CRC-32 per variable, for
:func:`~rlparity.trace.storage.lazy.reading.blocks`), or inside a dask computation
(:func:`chunk_digests`: one CRC-32 per chunk, taken in the same ``dask.compute`` as a reduction over
the same variables, then combined in order by :func:`crc32_combine` and checked by
:func:`verify_chunk_digests`). A mismatch is :class:`~rlparity.trace.storage.StoreDamagedError`."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.record import arm_name
from rlparity.trace.storage import DIGEST_ALGORITHM, digest_start, digest_update, verify_integrity
from rlparity.trace.storage.integrity import _canonical_dtype, _digest
from rlparity.trace.storage.lazy.arm import arm_record, is_whole


class StreamDigests:
    """The CRC-32 of :func:`~rlparity.trace.storage.integrity.dataset_digests` for a trace read block by block along ``dim``.

    A C-ordered array split along its first axis is the concatenation of its blocks' bytes, so one
    running CRC per variable equals the digest of the whole. Variables without ``dim`` first are
    digested whole at the start (they are small: coordinates, per-position values). :meth:`add` each
    block in order, then :meth:`verify` against the record made at save.

    Parameters
    ----------
    ds : xarray.Dataset
        The whole (lazy) trace, for the variables, dtypes and shapes.
    dim : str, default "sequence"
        The dim the blocks split.
    """

    def __init__(self, ds: xr.Dataset, dim: str = "sequence"):
        self.running: dict[str, list[int]] = {}  # name -> [crc so far, items read so far]
        self.done: dict[str, str] = {}
        for name in sorted(map(str, ds.variables)):
            var = ds.variables[name]
            start = digest_start(var.dtype, var.shape) if var.dims and var.dims[0] == dim else None
            if start is not None:
                self.running[name] = [start, 0]
            else:
                d = _digest(var.values)
                if d is not None:
                    self.done[name] = d

    def add(self, block: xr.Dataset) -> None:
        """Add the next block along ``dim`` (loaded), in order.

        Parameters
        ----------
        block : xarray.Dataset
            The block, with every variable of the trace.
        """
        for name, state in self.running.items():
            values = block.variables[name].values
            state[0] = digest_update(state[0], values, first=state[1] == 0)
            state[1] += values.size

    def result(self) -> dict[str, str]:
        """The digests so far.

        Returns
        -------
        dict[str, str]
            ``{variable: CRC-32 as 8 hex digits}``; equal to :func:`~rlparity.trace.storage.integrity.dataset_digests` of the whole once
            every block was added.
        """
        return {**self.done, **{k: f"{v[0]:08x}" for k, v in self.running.items()}}

    def verify(self, path: Any, arm: str, want: Mapping[str, str] | None, *, partial: bool = False) -> None:
        """Raise :class:`~rlparity.trace.storage.paths.StoreDamagedError` unless every block read matches the record of ``arm``.

        Parameters
        ----------
        path : str or os.PathLike
            The store, for the error message.
        arm : str
            The arm's name.
        want : Mapping[str, str] or None
            The arm's record made at save; ``None`` (a store written by hand) checks nothing.
        partial : bool, default False
            Only the variables digested were read: check those against their part of the record
            (False: every variable of the record must be there, and no other).

        Raises
        ------
        StoreDamagedError
            A variable's digest differs from the record.
        """
        if want is None:
            return  # a store without a record (written by hand): nothing to check against
        if partial:
            _verify_some(path, arm, want, self.result())
            return
        verify_integrity(Path(str(path)), {arm: None}, {"algorithm": DIGEST_ALGORITHM, "arms": {arm: want}},
                         digests={arm: self.result()})


def _verify_some(path: Any, arm: str, want: Mapping[str, str], got: Mapping[str, str | None]) -> None:
    """:func:`~rlparity.trace.storage.integrity.verify_integrity` of the variables read (``got``), against their part of the record."""
    got = {k: v for k, v in got.items() if k in want and v is not None}
    if got:
        verify_integrity(Path(str(path)), {arm: None}, {"algorithm": DIGEST_ALGORITHM,
                                                        "arms": {arm: {k: want[k] for k in got}}},
                         digests={arm: got})


# ---- the CRC record checked inside a dask computation: per-chunk CRC-32s, combined in order ----

def _gf2_times(mat: tuple[int, ...], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_compose(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The operator ``a`` after ``b`` (32x32 matrices over GF(2), one column an int)."""
    return tuple(_gf2_times(a, col) for col in b)


@lru_cache(maxsize=64)
def _zeros_operator(nbytes: int) -> tuple[int, ...]:
    """The linear map a CRC-32 register undergoes over ``nbytes`` zero bytes (zlib's
    ``crc32_combine``, its operator kept: blocks of a trace mostly have one length)."""
    op = (0xEDB88320,) + tuple(1 << n for n in range(31))  # one zero bit
    for _ in range(3):
        op = _gf2_compose(op, op)  # one zero byte
    out = tuple(1 << n for n in range(32))  # identity
    while nbytes:
        if nbytes & 1:
            out = _gf2_compose(op, out)
        nbytes >>= 1
        if nbytes:
            op = _gf2_compose(op, op)
    return out


def crc32_combine(crc1: int, crc2: int, nbytes2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1`` = CRC-32 of ``A`` (or any running CRC), ``crc2`` =
    CRC-32 of ``B`` and ``nbytes2`` = the length of ``B`` (zlib's ``crc32_combine``).

    Parameters
    ----------
    crc1 : int
        The CRC-32 so far.
    crc2 : int
        The CRC-32 of the next bytes, computed from 0.
    nbytes2 : int
        How many bytes ``crc2`` covers.

    Returns
    -------
    int
        ``zlib.crc32(B, crc1)``, without ``B``.
    """
    return crc2 ^ _gf2_times(_zeros_operator(nbytes2), crc1) if nbytes2 else crc1


def _chunk_crc(block: np.ndarray) -> tuple[int, int]:
    a = np.asarray(block)
    return digest_update(0, a), a.size * _canonical_dtype(a.dtype).itemsize


def chunk_digests(trace: xr.Dataset, names: list[str]) -> dict[str, list[Any]]:
    """Per variable of a lazy arm, one delayed ``(CRC-32, bytes)`` per chunk along ``sequence``.

    Computed in the same ``dask.compute`` as a reduction over the same variables, each chunk is
    read once for both; :func:`verify_chunk_digests` then checks them against the store's record.
    Variables the record lacks, and text, are left out.

    Parameters
    ----------
    trace : xarray.Dataset
        A lazily opened arm (``open_arms(store, chunks=N)``).
    names : list of str
        The variables the computation reads.

    Returns
    -------
    dict
        ``{variable: [delayed (crc, nbytes), ...]}`` in the order of the variable's bytes.
    """
    import dask

    _, want = arm_record(trace)
    out: dict[str, list[Any]] = {}
    if not is_whole(trace):
        return out  # a selection: its arm was validated whole (ensure_validated), the record is the arm's
    for name in names:
        var = trace[name]
        if want is None or name not in want or var.chunks is None or _canonical_dtype(var.dtype) is None:
            continue
        arr = var.data
        if arr.ndim > 1 and any(len(c) > 1 for c in arr.chunks[1:]):
            arr = arr.rechunk({i: -1 for i in range(1, arr.ndim)})  # contiguous bytes per chunk
        out[name] = [dask.delayed(_chunk_crc)(b) for b in arr.to_delayed().ravel()]
    return out


def verify_chunk_digests(trace: xr.Dataset, computed: Mapping[str, list[tuple[int, int]]]) -> None:
    """Raise :class:`~rlparity.trace.storage.StoreDamagedError` unless the computed chunks'
    CRC-32s, combined in order, equal the store's record for those variables.

    Parameters
    ----------
    trace : xarray.Dataset
        The lazily opened arm the digests were computed on.
    computed : mapping
        :func:`chunk_digests`, computed: ``{variable: [(crc, nbytes), ...]}``.

    Returns
    -------
    None
    """
    path, want = arm_record(trace)
    if want is None or not computed:
        return
    got = {}
    for name, parts in computed.items():
        var = trace[name]
        crc = digest_start(var.dtype, var.shape)
        for c, n in parts:
            crc = crc32_combine(crc, int(c), int(n))
        got[name] = f"{crc:08x}"
    _verify_some(path, str(arm_name(trace, None)), want, got)


__all__ = ["StreamDigests", "chunk_digests", "crc32_combine", "verify_chunk_digests"]
