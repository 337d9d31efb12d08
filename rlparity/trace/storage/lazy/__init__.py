"""Lazy traces: dask arrays over a store's zarr chunks, read and checked one block at a time.

``rlparity.trace.open_arms(store, chunks=N)`` opens a store without loading its values (N sequences
per block). Nothing is trusted unread, and a lazy arm is held to the rules of the eager open: the
first read validates it whole, block by block (:func:`ensure_validated`: every block against the
schema, every variable's running CRC-32 against the digest recorded at save (:class:`StreamDigests`),
the trainer's tokens against the scored token checksum; a chunk that no longer decodes, or a record
that does not match, is :class:`~rlparity.trace.storage.StoreDamagedError` before any schema problem).
Every view of the arm shares the outcome (:class:`ArmCheck`), so later reads (:func:`blocks` with
``variables=``, the dask reductions with :func:`chunk_digests`) load only the variables they need,
their CRC-32 still checked. Memory is one block, whatever the trace's size.

One topic a module, every public name importable from here: :mod:`~rlparity.trace.storage.lazy.arm`
(the open path: ``chunks=``, the structure checks, the record an arm carries, :class:`ArmCheck`),
:mod:`~rlparity.trace.storage.lazy.digests` (the CRC-32 record checked block by block or chunk by
chunk) and :mod:`~rlparity.trace.storage.lazy.reading` (the block reader, :func:`ensure_validated`)."""

from __future__ import annotations

from rlparity.trace.storage.lazy.arm import (
    LAZY_RECORD,
    ArmCheck,
    arm_record,
    block_size,
    is_lazy,
    is_whole,
    lazy_chunks,
    validate_structure,
)
from rlparity.trace.storage.lazy.digests import StreamDigests, chunk_digests, crc32_combine, verify_chunk_digests
from rlparity.trace.storage.lazy.reading import blocks, ensure_validated, load_sample, load_variable

__all__ = ["LAZY_RECORD", "ArmCheck", "StreamDigests", "arm_record", "block_size", "blocks", "chunk_digests",
           "crc32_combine", "ensure_validated", "is_lazy", "is_whole", "lazy_chunks", "load_sample", "load_variable",
           "validate_structure", "verify_chunk_digests"]
