"""Store mechanics under :mod:`rlparity.trace.storage.zarr_io`: the per-store lock, the crash-safe swap, the
integrity record and the recovery of an interrupted save.

A store ``DIR/NAME`` is a zarr (format 2, consolidated) group with one child group per arm. Beside
it, in ``DIR``, rlparity uses three kinds of names, all hidden:

``.NAME.lock``
    the store lock (``flock``): writers hold it exclusively, readers shared. The file is removed by
    the last holder, so an idle store has nothing beside it.
``.NAME.tmp-<pid>-<id>``
    a store being written; its writer holds a ``flock`` on the directory while it lives, so an
    orphan (its writer died) is told apart from a live write.
``.NAME.old-<pid>-<id>``
    the previous store during a swap (a few microseconds in a normal run).
``.NAME.staging-<pid>-<id>``
    an importer's chunks before they are assembled into ``.NAME.tmp-*``; guarded like it.

Recovery removes every one of these whose writer has died (no ``flock`` on it), never a live one.

The root attributes of a store written here carry ``rlparity_store`` (the store format, 1) and
``rlparity_integrity`` (a CRC-32 of every variable's values per arm, recorded at save). Opening a
store checks that every chunk file exists (stores are written with ``write_empty_chunks=True``, so a
missing chunk is damage, never padding) and, after loading, that every variable's values match the
record: a damaged store or a read torn by a concurrent writer is an error, never silent NaN.

A streaming writer uses the same pieces as :func:`rlparity.trace.save`::

    with temp_store(path) as tmp:                 # .NAME.tmp-..., guarded against cleaning
        tree.to_zarr(tmp, mode="w-", consolidated=True, zarr_format=2, write_empty_chunks=True)
        ...                                       # append as data arrives (mode="a")
        install_store(tmp, path, overwrite=True)  # integrity record, lock, crash-safe swap

One topic a module, every public name importable from here: :mod:`~rlparity.trace.storage.paths`
(names, paths, errors, what is at a path), :mod:`~rlparity.trace.storage.locking` (the lock),
:mod:`~rlparity.trace.storage.integrity` (digests and chunk checks), :mod:`~rlparity.trace.storage.files`
(metadata files, links, opening) and :mod:`~rlparity.trace.storage.recovery` (temporary store, swap,
recovery).
"""

from __future__ import annotations

from rlparity.trace.storage.files import consolidate, link_tree, write_root
from rlparity.trace.storage.integrity import (
    DIGEST_ALGORITHM,
    check_chunks,
    dataset_digests,
    digest_start,
    digest_update,
    integrity_record,
    missing_chunks,
    round_trip_changes,
    verify_integrity,
)
from rlparity.trace.storage.locking import store_lock
from rlparity.trace.storage.paths import (
    ARM_NAME_PATTERN,
    INTEGRITY_ATTR,
    STORE_FORMAT,
    STORE_MARKER,
    StoreDamagedError,
    StoreError,
    check_arm_name,
    check_target,
    lock_file,
    store_kind,
    store_path,
)
from rlparity.trace.storage.recovery import install_store, recover, recover_if_needed, temp_store

__all__ = [
    "ARM_NAME_PATTERN", "DIGEST_ALGORITHM", "INTEGRITY_ATTR", "STORE_FORMAT", "STORE_MARKER", "StoreDamagedError",
    "StoreError", "check_arm_name", "check_chunks", "check_target", "consolidate", "dataset_digests",
    "digest_start", "digest_update", "install_store", "integrity_record", "link_tree", "lock_file",
    "missing_chunks", "recover", "recover_if_needed", "round_trip_changes", "store_kind", "store_lock",
    "store_path", "temp_store", "verify_integrity", "write_root",
]
