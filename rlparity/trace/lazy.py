"""Lazy traces: dask arrays over a store's zarr chunks, read and checked one block at a time.

``rlparity.trace.open_arms(store, chunks=N)`` opens a store without loading it (N sequences per
block). Nothing is trusted unread: :func:`blocks` loads one block of sequences at a time, validates
it against the schema, and keeps a running CRC-32 per variable that equals the digest recorded at
save (:class:`StreamDigests`); after the last block a mismatch raises
:class:`~rlparity.trace.store.StoreDamagedError`. Memory is one block, whatever the trace's size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.schema import CHECKSUM_MISMATCH, TraceValidationError, validate
from rlparity.trace.store import DIGEST_ALGORITHM, digest_start, digest_update, verify_integrity
from rlparity.trace.store_integrity import _canonical_dtype, _digest

LAZY_RECORD = "_rlparity_lazy_integrity"  # the record a lazy tree's arms are checked against as they are read


def lazy_chunks(chunks: Any) -> dict[str, int]:
    """xarray's ``chunks=`` for a lazy trace. Needs dask (``pip install 'rlparity[scale]'``).

    Parameters
    ----------
    chunks : int or Mapping[str, int]
        Sequences per block (every position in one block), or a ``{dim: size}`` mapping passed
        through.

    Returns
    -------
    dict[str, int]
        ``{"sequence": chunks, "position": -1}`` for an int, else the mapping.

    Raises
    ------
    ImportError
        dask is not installed.
    TypeError
        ``chunks`` is neither an int nor a mapping.
    ValueError
        ``chunks`` is below 1.
    """
    try:
        import dask.array  # noqa: F401
    except ImportError as err:
        raise ImportError("lazy traces (chunks=...) need dask: pip install 'rlparity[scale]' (or dask[array])") from err
    if isinstance(chunks, bool) or not isinstance(chunks, (int, Mapping)):
        raise TypeError(f"chunks must be sequences per block (an int) or a {{dim: size}} mapping, not {chunks!r}")
    if isinstance(chunks, int):
        if chunks < 1:
            raise ValueError(f"chunks must be at least 1 sequence per block, not {chunks}")
        return {"sequence": chunks, "position": -1}
    return dict(chunks)


def validate_structure(tree: xr.DataTree, path: Any) -> None:
    """The schema checks that need no values (variables, dims, dtypes) on every arm of a lazy tree.

    An empty block of each arm is validated; its values come block by block later.

    Parameters
    ----------
    tree : xarray.DataTree
        The lazily opened store, one child per arm.
    path : str or os.PathLike
        The store, for the error message.

    Raises
    ------
    TraceValidationError
        An arm does not follow the schema.
    """
    for name, node in tree.children.items():
        ds = node.to_dataset()
        if "sequence" in ds.dims:
            validate(_unchained(ds.isel(sequence=slice(0, 0)).load()), where=f"{path} arm {name!r}")


def _unchained(block: xr.Dataset) -> xr.Dataset:
    """A block without the whole trace's token checksum (checked over all blocks, :func:`blocks`)."""
    if "scored_token_checksum" in block.attrs:
        block = block.copy(deep=False)
        block.attrs = {k: v for k, v in block.attrs.items() if k != "scored_token_checksum"}
    return block


def _scored_checksum(trace: xr.Dataset, size: int) -> str:
    """:func:`rlparity.trace.token_checksum` of a lazy trace, its two token id variables read
    block by block (the prompt ids, then the response ids: the order the checksum hashes them)."""
    h = hashlib.sha256()
    n = trace.sizes["sequence"]
    for var in ("prompt_token_id", "token_id"):
        for start in range(0, n, size):
            h.update(np.ascontiguousarray(trace[var].isel(sequence=slice(start, start + size)).values,
                                          dtype=np.int64).data)
    return h.hexdigest()[:16]


def arm_record(trace: xr.Dataset) -> tuple[str, dict[str, str] | None]:
    """The store path and the CRC-32 record made at save of a lazily opened arm.

    For checking it as it is read.

    Parameters
    ----------
    trace : xarray.Dataset
        A lazily opened arm.

    Returns
    -------
    tuple[str, dict[str, str] or None]
        ``(store path, {variable: CRC-32})``; ``("", None)`` where the trace carries no record.
    """
    rec = trace.encoding.get(LAZY_RECORD) or {}
    return str(rec.get("path", "")), rec.get("digests")


class StreamDigests:
    """The CRC-32 of :func:`dataset_digests` for a trace read block by block along ``dim``.

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
            ``{variable: CRC-32 as 8 hex digits}``; equal to :func:`dataset_digests` of the whole once
            every block was added.
        """
        return {**self.done, **{k: f"{v[0]:08x}" for k, v in self.running.items()}}

    def verify(self, path: Any, arm: str, want: Mapping[str, str] | None) -> None:
        """Raise :class:`StoreDamagedError` unless every block read matches the record of ``arm``.

        Parameters
        ----------
        path : str or os.PathLike
            The store, for the error message.
        arm : str
            The arm's name.
        want : Mapping[str, str] or None
            The arm's record made at save; ``None`` (a store written by hand) checks nothing.

        Raises
        ------
        StoreDamagedError
            A variable's digest differs from the record.
        """
        if want is None:
            return  # a store without a record (written by hand): nothing to check against
        verify_integrity(Path(str(path)), {arm: None}, {"algorithm": DIGEST_ALGORITHM, "arms": {arm: want}},
                         digests={arm: self.result()})


def is_lazy(trace: xr.Dataset) -> bool:
    """Whether the trace's token arrays are lazy (dask), so a reduction must stream.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace, lazily opened (``open_arms(store, chunks=N)``) or in memory.

    Returns
    -------
    bool
        True when ``rollout_logprob`` is chunked (False without it: validation then says what is missing).
    """
    return "rollout_logprob" in trace.variables and trace["rollout_logprob"].chunks is not None


def block_size(trace: xr.Dataset, default: int = 4096) -> int:
    """Sequences per block: the dask chunk along ``sequence`` where the trace has one.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace, lazily opened (``open_arms(store, chunks=N)``) or in memory.
    default : int, default 4096
        The size for a trace in memory.

    Returns
    -------
    int
        Sequences per block.
    """
    chunks = trace["rollout_logprob"].chunks
    return int(chunks[0][0]) if chunks else default


def blocks(trace: xr.Dataset, *, size: int | None = None, progress: Callable | None = None,
           verify: bool = True) -> Iterator[xr.Dataset]:
    """The trace one block of ``size`` sequences at a time, each loaded and validated.

    With ``verify`` every variable's CRC-32 is checked against the record made at save once the last
    block is read (a lazily opened arm: :func:`arm_record`), and the scored token checksum over all
    blocks.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace, lazily opened (``open_arms(store, chunks=N)``) or in memory.
    size : int, optional
        Sequences per block; ``None`` takes the trace's chunk (:func:`block_size`).
    progress : callable, optional
        Wraps the block iterator (e.g. ``tqdm.tqdm``).
    verify : bool, default True
        Check the store's CRC-32 record after the last block.

    Yields
    ------
    xarray.Dataset
        One loaded, validated block of sequences.

    Raises
    ------
    TraceValidationError
        A block does not follow the schema, or the token ids do not match the scored checksum.
    StoreDamagedError
        The values read differ from the record made at save.
    """
    n = trace.sizes["sequence"]
    size = int(size or block_size(trace))
    where = f"trace arm {trace.attrs.get('arm', 'default')!r}"
    path, want = arm_record(trace)
    digests = StreamDigests(trace) if verify and want is not None else None
    starts = range(0, n, max(size, 1))
    for start in (progress(starts) if progress else starts):
        part = trace.isel(sequence=slice(start, min(start + size, n))).load()
        validate(_unchained(part), where=f"{where} sequences {start}:{min(start + size, n)}")
        if digests is not None:
            digests.add(part)
        yield part
    if digests is not None:
        digests.verify(path, str(trace.attrs.get("arm")), want)
    scored = trace.attrs.get("scored_token_checksum")
    if scored is not None and scored != _scored_checksum(trace, size):
        raise TraceValidationError(f"{where} is not a valid rlparity trace: {CHECKSUM_MISMATCH}")


def load_sample(trace: xr.Dataset, *, every: int = 1, progress: Callable | None = None) -> xr.Dataset:
    """A lazy trace in memory: every ``every``-th sequence, read through :func:`blocks`.

    Every block is validated and the store's CRC record checked over the whole trace, sampled or not.
    Memory: the sample plus one block. A sample (``every > 1``) drops the whole trace's token
    checksum (already checked) and says what it is in ``attrs["lazy_sample"]``.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace, lazily opened (``open_arms(store, chunks=N)``) or in memory.
    every : int, default 1
        Keep sequences 0, every, 2 every, ...; 1 keeps all of it (equal to the trace opened eagerly).
    progress : callable, optional
        Wraps the block iterator (e.g. ``tqdm.tqdm``).

    Returns
    -------
    xarray.Dataset
        The sample, in memory.

    Raises
    ------
    ValueError
        ``every`` is below 1.
    """
    if every < 1:
        raise ValueError(f"every must be at least 1 (every sequence), not {every}")
    parts, start = [], 0
    for part in blocks(trace, progress=progress):
        n = part.sizes["sequence"]
        parts.append(part if every == 1 else part.isel(sequence=np.arange(start, start + n) % every == 0))
        start += n
    out = xr.concat(parts, "sequence", data_vars="minimal", coords="minimal", compat="override",
                    combine_attrs="override") if len(parts) > 1 else parts[0]
    out.encoding = {k: v for k, v in out.encoding.items() if k != LAZY_RECORD}
    if every > 1:
        out = _unchained(out)
        out.attrs["lazy_sample"] = (f"one sequence in {every}: {out.sizes['sequence']} of {start} sequences "
                                    "(every block read and checked)")
    return out



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
    """Raise :class:`~rlparity.trace.store.StoreDamagedError` unless the computed chunks'
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
    verify_integrity(Path(str(path)), {str(trace.attrs.get("arm")): None},
                     {"algorithm": DIGEST_ALGORITHM, "arms": {str(trace.attrs.get("arm")): {k: want[k] for k in got}}},
                     digests={str(trace.attrs.get("arm")): got})

__all__ = ["LAZY_RECORD", "StreamDigests", "arm_record", "block_size", "blocks", "chunk_digests", "crc32_combine",
           "is_lazy", "lazy_chunks", "load_sample", "validate_structure", "verify_chunk_digests"]
