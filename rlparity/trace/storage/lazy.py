"""Lazy traces: dask arrays over a store's zarr chunks, read and checked one block at a time.

``rlparity.trace.open_arms(store, chunks=N)`` opens a store without loading its values (N sequences
per block). Nothing is trusted unread, and a lazy arm is held to the rules of the eager open: the
first read validates it whole, block by block (:func:`ensure_validated`: every block against the
schema, every variable's running CRC-32 against the digest recorded at save (:class:`StreamDigests`),
the trainer's tokens against the scored token checksum; a chunk that no longer decodes, or a record
that does not match, is :class:`~rlparity.trace.storage.StoreDamagedError` before any schema problem).
Every view of the arm shares the outcome (:class:`ArmCheck`), so later reads (:func:`blocks` with
``variables=``, the dask reductions with :func:`chunk_digests`) load only the variables they need,
their CRC-32 still checked. Memory is one block, whatever the trace's size."""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.trace.schema import ALL_VARS, CHECKSUM_MISMATCH, TRAINER_VARS, TraceValidationError
from rlparity.trace.record import arm_name, arm_record as typed_record
from rlparity.trace.validation import validate
from rlparity.trace.storage import (
    DIGEST_ALGORITHM,
    StoreDamagedError,
    digest_start,
    digest_update,
    verify_integrity,
)
from rlparity.trace.storage.paths import decode_failure
from rlparity.trace.storage.integrity import _canonical_dtype, _digest

LAZY_RECORD = "_rlparity_lazy_integrity"  # the record a lazy tree's arms are checked against as they are read


def lazy_chunks(chunks: Any) -> dict[str, int]:
    """xarray's ``chunks=`` for a lazy trace. Needs dask (``pip install 'rlparity[scale]'``).

    Parameters
    ----------
    chunks : int or Mapping[str, int]
        Sequences per block (every position in one block), or a ``{dim: size}`` mapping of the
        schema's dims (a size of at least 1, or -1 for the whole dim).

    Returns
    -------
    dict[str, int]
        ``{"sequence": chunks, "position": -1}`` for an int, else the mapping.

    Raises
    ------
    ImportError
        dask is not installed.
    TypeError
        ``chunks`` is neither an int nor a mapping of dims to ints.
    ValueError
        ``chunks`` (or a size in the mapping) is below 1, or the mapping names a dim traces do not have.
    """
    try:
        import dask.array  # noqa: F401
    except ImportError as err:
        raise ImportError("lazy traces (chunks=...) need dask: pip install 'rlparity[scale]' (or dask[array])") from err
    if isinstance(chunks, bool) or not isinstance(chunks, (numbers.Integral, Mapping)):
        raise TypeError(f"chunks must be sequences per block (an int) or a {{dim: size}} mapping, not {chunks!r}")
    if isinstance(chunks, numbers.Integral):
        if chunks < 1:
            raise ValueError(f"chunks must be at least 1 sequence per block, not {chunks}")
        return {"sequence": int(chunks), "position": -1}
    dims = sorted({d for dims, *_ in ALL_VARS.values() for d in dims})
    out = {}
    for dim, size in chunks.items():
        if dim not in dims:
            raise ValueError(f"chunks names dim {dim!r}, which traces do not have: use {dims}")
        if isinstance(size, bool) or not isinstance(size, numbers.Integral):
            raise TypeError(f"chunks[{dim!r}] must be an int (a size, or -1 for the whole dim), not {size!r}")
        if size < 1 and size != -1:
            raise ValueError(f"chunks[{dim!r}] must be at least 1 (or -1 for the whole dim), not {size}")
        out[str(dim)] = int(size)
    return out


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


class ArmCheck:
    """What is known of one lazily opened arm, shared by every view of it (a selection, a copy).

    ``whole`` is the arm as opened, ``sizes`` its dims, ``valid`` whether it was read whole once and
    found valid (schema, CRC-32 record, scored token checksum: :func:`ensure_validated`). Copies of
    a trace share the one object, so an arm is validated once, whatever view reads it first.

    Parameters
    ----------
    whole : xarray.Dataset
        The arm, lazily opened.
    path : str, optional
        The store, where the arm's blocks can be read without dask (:meth:`direct`).
    arm : str, optional
        The arm's group in the store.
    """

    def __init__(self, whole: xr.Dataset, path: str | None = None, arm: str | None = None):
        self.whole = whole
        self.sizes = dict(whole.sizes)
        self.valid = False
        self.path, self.arm = path, arm
        self._direct: xr.Dataset | None = None

    def __copy__(self) -> ArmCheck:
        return self

    def __deepcopy__(self, memo: dict) -> ArmCheck:
        return self

    def direct(self, trace: xr.Dataset, name: str) -> xr.Variable | None:
        """The arm's variable ``name`` opened without dask (xarray's lazy indexing straight to zarr,
        decoded as the dask one), where ``trace`` holds it unchanged from the arm as opened; else None.

        Parameters
        ----------
        trace : xarray.Dataset
            A view of the arm.
        name : str
            The variable.

        Returns
        -------
        xarray.Variable or None
            The variable, nothing read.
        """
        mine, theirs = self.whole.variables.get(name), trace.variables[name]
        if self.path is None or mine is None or mine.chunks is None or theirs.chunks is None \
                or getattr(mine.data, "name", None) != getattr(theirs.data, "name", 0):
            return None
        if self._direct is None:
            from rlparity.trace.storage.files import _ZARR_OPEN

            self._direct = xr.open_dataset(self.path, group=self.arm, **_ZARR_OPEN)
        return self._direct.variables.get(name)


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

    def verify(self, path: Any, arm: str, want: Mapping[str, str] | None, *, partial: bool = False) -> None:
        """Raise :class:`StoreDamagedError` unless every block read matches the record of ``arm``.

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



def _check(trace: xr.Dataset) -> ArmCheck | None:
    return (trace.encoding.get(LAZY_RECORD) or {}).get("check")


def is_whole(trace: xr.Dataset) -> bool:
    """Whether ``trace`` spans its whole stored arm along every dim it has (not a selection), so
    the CRC-32 record made at save applies to its variables.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace, lazily opened or in memory.

    Returns
    -------
    bool
        True for an arm as opened (or a trace not opened from a store).
    """
    check = _check(trace)
    return check is None or all(check.sizes.get(d) == n for d, n in trace.sizes.items())


def _where(trace: xr.Dataset) -> str:
    path, _ = arm_record(trace)
    return f"{path or 'trace'} arm {str(arm_name(trace))!r}"


def _damaged(trace: xr.Dataset, what: str, err: Exception) -> StoreDamagedError:
    """The error of a store whose chunk files no longer decode (eager: ``open_arms`` says the same)."""
    return StoreDamagedError(f"the store is damaged: reading {_where(trace)} {what} failed ({decode_failure(err)}): "
                             "restore it from a copy or re-create it")


def _read_block(trace: xr.Dataset, names: list[str], start: int, stop: int) -> xr.Dataset:
    """Sequences ``start:stop`` of the variables ``names`` (and the index coordinates of their
    dims), in memory: a variable unchanged from the arm as opened straight from zarr
    (:meth:`ArmCheck.direct`), any other lazy one sliced and computed in one synchronous
    ``dask.compute`` (no per-block ``isel`` of the Dataset, no dask graph per variable)."""
    import dask

    check = _check(trace)
    lazy, ready = {}, {}
    try:
        for name in names:
            var = trace.variables[name]
            key = tuple(slice(start, stop) if d == "sequence" else slice(None) for d in var.dims)
            direct = check.direct(trace, name) if check is not None else None
            if direct is not None:
                ready[name] = np.asarray(direct[key].values)
            elif var.chunks is not None:
                lazy[name] = var.data[key]
            else:
                ready[name] = np.asarray(var.values[key])
        if lazy:
            ready.update(zip(lazy, dask.compute(*lazy.values(), scheduler="sync")))
    except Exception as err:  # noqa: BLE001 - a chunk that no longer decodes (truncated, emptied, swapped)
        raise _damaged(trace, f"sequences {start}:{stop}", err) from err
    dims = {d for n in names for d in trace.variables[n].dims}
    coords = {d: trace.variables[d][slice(start, stop) if d == "sequence" else slice(None)]
              for d in dims if d in trace.coords and d not in ready}
    data, crd = {}, {}
    for name in names:
        var = trace.variables[name]
        (crd if name in trace.coords else data)[name] = xr.Variable(var.dims, ready[name], var.attrs)
    return xr.Dataset(data, coords={**coords, **crd}, attrs=trace.attrs)


def _starts(n: int, size: int, progress: Callable | None):
    starts = range(0, n, max(size, 1))
    return progress(starts) if progress else starts


def _validated_blocks(trace: xr.Dataset, size: int, progress: Callable | None) -> Iterator[xr.Dataset]:
    """Every variable of ``trace`` block by block, each block validated against the schema; after
    the last, the CRC-32 record (every variable) and the scored token checksum. Damage is said before
    a schema problem, as the eager open says it: a block that breaks the schema in a store whose record
    does not match is a damaged store, not a bad capture."""
    n = trace.sizes["sequence"]
    names = [str(k) for k in trace.variables]
    path, want = arm_record(trace)
    where = _where(trace)
    digests = StreamDigests(trace) if want is not None else None
    scored = typed_record(trace).scored_token_checksum
    tied = scored is not None and any(v in trace.variables for v in TRAINER_VARS)
    hashed = hashlib.sha256()  # token_checksum: every prompt id (this pass), then every response id
    problem: TraceValidationError | None = None
    for start in _starts(n, size, progress):
        part = _read_block(trace, names, start, min(start + size, n))
        if digests is not None:
            digests.add(part)
        if tied:
            hashed.update(np.ascontiguousarray(part["prompt_token_id"].values, dtype=np.int64).data)
        if problem is None:
            try:
                validate(_unchained(part), where=f"{where} sequences {start}:{min(start + size, n)}")
            except TraceValidationError as err:
                if digests is None:
                    raise
                problem = err  # read on: damage, if the record says so, is the cause to report
                continue
            yield part
    if digests is not None:
        digests.verify(path, str(arm_name(trace, None)), want)
    if problem is not None:
        raise problem
    if tied:
        for start in range(0, n, max(size, 1)):
            hashed.update(np.ascontiguousarray(_read_block(trace, ["token_id"], start, min(start + size, n))
                                               ["token_id"].values, dtype=np.int64).data)
        if hashed.hexdigest()[:16] != scored:
            raise TraceValidationError(f"{where} is not a valid rlparity trace: {CHECKSUM_MISMATCH}")
    check = _check(trace)
    if check is not None and check.whole is trace:
        check.valid = True


def ensure_validated(trace: xr.Dataset, *, size: int | None = None, progress: Callable | None = None) -> None:
    """Validate the lazily opened arm behind ``trace`` once, as the eager open validates it.

    The whole arm is read block by block (bounded memory): every block against the schema, every
    variable against the CRC-32 record made at save, the trainer's tokens against the scored token
    checksum. Every view of the arm (a selection, a copy) shares the outcome, so later reads load
    only the variables they need. A trace in memory is left alone (validated when it was opened).

    Parameters
    ----------
    trace : xarray.Dataset
        A trace, lazily opened (``open_arms(store, chunks=N)``) or in memory.
    size : int, optional
        Sequences per block; ``None`` takes the trace's chunk (:func:`block_size`).
    progress : callable, optional
        Wraps the block iterator (e.g. ``tqdm.tqdm``).

    Raises
    ------
    TraceValidationError
        A block does not follow the schema, or the token ids do not match the scored checksum.
    StoreDamagedError
        The values read differ from the record made at save, or a chunk no longer decodes.
    """
    if not is_lazy(trace):
        return
    check = _check(trace)
    if check is not None and check.valid:
        return
    whole = check.whole if check is not None else trace
    for _ in _validated_blocks(whole, int(size or block_size(whole)), progress):
        pass


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
           verify: bool = True, variables: Iterable[str] | None = None) -> Iterator[xr.Dataset]:
    """The trace one block of ``size`` sequences at a time, in memory.

    The first read of a lazily opened arm validates it whole, as the eager open does
    (:func:`ensure_validated`: every variable of every block against the schema, the CRC-32 record,
    the scored token checksum); its blocks are the ones yielded, with every variable. Once the arm is
    valid, a read loads only ``variables`` and checks their CRC-32 against the record after the last
    block (an arm read whole; a selection was checked with its arm).

    Parameters
    ----------
    trace : xarray.Dataset
        A trace, lazily opened (``open_arms(store, chunks=N)``) or in memory.
    size : int, optional
        Sequences per block; ``None`` takes the trace's chunk (:func:`block_size`).
    progress : callable, optional
        Wraps the block iterator (e.g. ``tqdm.tqdm``).
    verify : bool, default True
        Validate the arm (once) and check the CRC-32 record of what is read; False reads unchecked.
    variables : iterable of str, optional
        The variables the caller needs (those the trace lacks are left out); ``None`` reads all.

    Yields
    ------
    xarray.Dataset
        One block of sequences, in memory: at least ``variables`` and their index coordinates.

    Raises
    ------
    TraceValidationError
        A block does not follow the schema, or the token ids do not match the scored checksum.
    StoreDamagedError
        The values read differ from the record made at save, or a chunk no longer decodes.
    """
    n = trace.sizes["sequence"]
    size = int(size or block_size(trace))
    check = _check(trace)
    if verify and is_lazy(trace) and not (check is not None and check.valid):
        if check is None or check.whole is trace:
            yield from _validated_blocks(trace, size, progress)
            return
        ensure_validated(trace, size=size)
    names = [str(k) for k in trace.variables] if variables is None else \
        [v for v in dict.fromkeys(variables) if v in trace.variables]
    path, want = arm_record(trace)
    digests = StreamDigests(trace[names]) if verify and want is not None and is_whole(trace) else None
    for start in _starts(n, size, progress):
        part = _read_block(trace, names, start, min(start + size, n))
        if digests is not None:
            digests.add(part)
        yield part
    if digests is not None:
        digests.verify(path, str(arm_name(trace, None)), want, partial=True)


def load_variable(trace: xr.Dataset, name: str) -> np.ndarray:
    """One (small) variable of a trace in memory, checked against the store's CRC-32 record.

    For what a streamed computation takes whole (one value per sequence, e.g. ``advantage``).

    Parameters
    ----------
    trace : xarray.Dataset
        A trace, lazily opened or in memory.
    name : str
        The variable.

    Returns
    -------
    numpy.ndarray
        Its values.

    Raises
    ------
    StoreDamagedError
        The values differ from the record made at save, or a chunk no longer decodes.
    """
    try:
        values = np.asarray(trace[name].values)
    except Exception as err:  # noqa: BLE001 - a chunk that no longer decodes
        if not is_lazy(trace):
            raise
        raise _damaged(trace, name, err) from err
    path, want = arm_record(trace)
    if want is not None and name in want and is_whole(trace):
        _verify_some(path, str(arm_name(trace, None)), want, {name: _digest(values)})
    return values


def _verify_some(path: Any, arm: str, want: Mapping[str, str], got: Mapping[str, str | None]) -> None:
    """:func:`verify_integrity` of the variables read (``got``), against their part of the record."""
    got = {k: v for k, v in got.items() if k in want and v is not None}
    if got:
        verify_integrity(Path(str(path)), {arm: None}, {"algorithm": DIGEST_ALGORITHM,
                                                        "arms": {arm: {k: want[k] for k in got}}},
                         digests={arm: got})


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


__all__ = ["LAZY_RECORD", "ArmCheck", "StreamDigests", "arm_record", "block_size", "blocks", "chunk_digests",
           "crc32_combine", "ensure_validated", "is_lazy", "is_whole", "lazy_chunks", "load_sample", "load_variable",
           "validate_structure", "verify_chunk_digests"]
