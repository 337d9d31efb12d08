"""Reading a lazy arm one block of sequences at a time, validated as the eager open validates it.

:func:`blocks` yields blocks in memory (the first read of an arm validates it whole:
:func:`ensure_validated`), :func:`load_variable` one small variable whole, :func:`load_sample` every
N-th sequence; each checked against the store's CRC-32 record
(:mod:`~rlparity.trace.storage.lazy.digests`). A chunk that no longer decodes is
:class:`~rlparity.trace.storage.StoreDamagedError`."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import xarray as xr

from rlparity.trace.schema import CHECKSUM_MISMATCH, TRAINER_VARS, TraceValidationError
from rlparity.trace.record import arm_name, arm_record as typed_record
from rlparity.trace.validation import validate
from rlparity.trace.storage import StoreDamagedError
from rlparity.trace.storage.paths import decode_failure
from rlparity.trace.storage.integrity import _digest
from rlparity.trace.storage.lazy.arm import LAZY_RECORD, _check, _unchained, arm_record, block_size, is_lazy, is_whole
from rlparity.trace.storage.lazy.digests import StreamDigests, _verify_some


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
    (:meth:`ArmCheck.direct <rlparity.trace.storage.lazy.arm.ArmCheck.direct>`), any other lazy one sliced and computed in one synchronous
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
        Sequences per block; ``None`` takes the trace's chunk (:func:`~rlparity.trace.storage.lazy.arm.block_size`).
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
        Sequences per block; ``None`` takes the trace's chunk (:func:`~rlparity.trace.storage.lazy.arm.block_size`).
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


__all__ = ["blocks", "ensure_validated", "load_sample", "load_variable"]
