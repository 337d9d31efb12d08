"""Saving and loading traces as zarr (format 2, consolidated), crash-safely and under a lock.

A store is an ``xarray.DataTree`` with one child group per arm (``/<arm>``); each arm is a
trace ``Dataset``. :func:`save` writes to a temporary folder beside the target and swaps it into
place (:func:`rlparity.trace.storage.install_store`), so a crash leaves the old store or the complete
new one, never a half-written one, and never deletes anything that is not an rlparity store.
Opening a store recovers an interrupted save, checks every chunk is present and every variable
reads back what was saved (CRC-32 recorded at save), then validates every arm.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity.trace.storage.lazy.arm import LAZY_RECORD, ArmCheck, lazy_chunks, validate_structure
from rlparity.trace.record import arm_name
from rlparity.trace.validation import validate
from rlparity.trace.storage import (
    DIGEST_ALGORITHM,
    INTEGRITY_ATTR,
    STORE_FORMAT,
    STORE_MARKER,
    StoreDamagedError,
    StoreError,
    check_arm_name,
    check_chunks,
    check_target,
    consolidate,
    dataset_digests,
    install_store,
    link_tree,
    recover_if_needed,
    round_trip_changes,
    store_kind,
    store_lock,
    store_path,
    temp_store,
    verify_integrity,
    write_root,
)
from rlparity.trace.storage.files import _open_tree
from rlparity.trace.storage.integrity import _lossless
from rlparity.trace.storage.paths import _read_meta, decode_failure

_ARM_ATTR = "rlparity_arm"
_WRITE = {"zarr_format": 2, "write_empty_chunks": True}


def _arms_to_save(data: xr.Dataset | xr.DataTree | Mapping[str, xr.Dataset]) -> dict[str, xr.Dataset]:
    if isinstance(data, xr.Dataset):
        arms = {str(arm_name(data)): data}
    elif isinstance(data, xr.DataTree):
        if data.ds.data_vars:
            raise StoreError(f"the DataTree's root holds variables {list(data.ds.data_vars)}; a store holds "
                             "traces only in child groups, one per arm")
        deep = [f"{name}/{sub}" for name, node in data.children.items() for sub in node.children]
        if deep:
            raise StoreError(f"the DataTree has nested groups {deep[:5]}; a store holds one level of arms: "
                             "flatten it to {arm: trace}")
        arms = {name: node.to_dataset() for name, node in data.children.items()}
    elif isinstance(data, Mapping):
        arms = dict(data)
        bad = [type(v).__name__ for v in arms.values() if not isinstance(v, xr.Dataset)]
        if bad:
            raise TypeError(f"save takes a mapping arm -> Dataset; got values of type {sorted(set(bad))}")
    else:
        raise TypeError(f"save takes a Dataset, a DataTree or a mapping arm -> Dataset, not {type(data).__name__}")
    _check_names(arms)
    return arms


def _check_names(names: Iterable[Any]) -> None:
    folded: dict[str, str] = {}
    for name in names:
        check_arm_name(name)
        if name.lower() in folded:  # case-insensitive file systems (macOS, Windows) would merge these
            raise StoreError(f"arm names {folded[name.lower()]!r} and {name!r} differ only in case; on a "
                             "case-insensitive file system they are one folder: rename one")
        folded[name.lower()] = name


def _write(arms: dict[str, xr.Dataset], p: Path, *, overwrite: bool, root_attrs: Mapping | None = None,
           validated: Iterable[str] = (),
           carry: tuple[Path, Mapping[str, Any], Mapping[str, Any]] | None = None) -> Path:
    """Write ``arms`` to a temporary store beside ``p`` and install it. With ``carry=(store, meta,
    record)`` the arms of ``record`` are linked from ``store`` unchanged, with their metadata and
    integrity record."""
    if not arms and not carry:
        raise StoreError("nothing to save: no arms given")
    done = set(validated)
    for name, ds in arms.items():
        if name not in done:
            validate(ds, where=f"arm {name!r}")
    check_target(p, overwrite=overwrite)  # refuse before writing anything
    attrs = {k: v for k, v in (root_attrs or {}).items() if k not in (STORE_MARKER, INTEGRITY_ATTR)}
    record: dict[str, Any] = {}
    with temp_store(p) as tmp:
        write_root(tmp, {})
        for name, ds in arms.items():
            ds.to_zarr(tmp, group=name, mode="w-", consolidated=False, **_WRITE)
            if _lossless(ds):
                record[name] = dataset_digests(ds)
            else:  # encodings that may change values on the way: read back before anything is replaced
                back = xr.open_dataset(tmp, group=name, engine="zarr", consolidated=False, zarr_format=2).load()
                changed = round_trip_changes(ds, back)
                if changed:
                    var, how = next(iter(changed.items()))
                    more = f" (and {len(changed) - 1} more variables)" if len(changed) > 1 else ""
                    raise StoreError(
                        f"arm {name!r}: saving would change {var} {how}{more}; rlparity stores values exactly, "
                        f"so nothing was written: drop the encoding (ds[{var!r}].encoding = {{}}) and save again")
                validate(back, where=f"arm {name!r} as it would read back")
                record[name] = dataset_digests(back)
        src, meta, old = carry if carry is not None else (None, None, {})
        for name, digests in old.items():
            link_tree(src / name, tmp / name)
            record[name] = digests
        write_root(tmp, {**attrs, STORE_MARKER: STORE_FORMAT,
                         INTEGRITY_ATTR: {"algorithm": DIGEST_ALGORITHM, "arms": record}})
        consolidate(tmp, reuse=meta, reused_arms=old)
        install_store(tmp, p, overwrite=overwrite)
    return p


def save(data: xr.Dataset | xr.DataTree | Mapping[str, xr.Dataset], path: str | os.PathLike,
         *, overwrite: bool = True) -> Path:
    """Write a trace (one arm) or an experiment (several arms) to ``path``.

    Every arm is validated first. ``path`` may be missing, an empty directory, or (with
    ``overwrite``) an rlparity store, which is replaced whole; anything else is refused
    (:class:`~rlparity.trace.storage.StoreError`) and left untouched. The write goes to a temporary
    store beside ``path`` and is swapped in under the store lock, crash-safely.

    Parameters
    ----------
    data : xarray.Dataset, xarray.DataTree or Mapping[str, xarray.Dataset]
        One trace (its ``attrs["arm"]`` names it, default ``"default"``), a DataTree (one child per
        arm, its attrs kept as the root's) or ``{arm: trace}``.
    path : str or os.PathLike
        The store (a zarr directory).
    overwrite : bool, default True
        Whether an existing rlparity store at ``path`` may be replaced.

    Returns
    -------
    pathlib.Path
        The store's resolved path.

    Raises
    ------
    TraceValidationError
        An arm does not follow the schema.
    StoreError
        Something other than an rlparity store is at ``path``, an arm name is not allowed (or two
        differ only in case), or a DataTree has root variables or nested groups.
    TypeError
        ``data`` is not a Dataset, a DataTree or a mapping of Datasets.
    FileExistsError
        A store is at ``path`` and ``overwrite`` is False.
    """
    arms = _arms_to_save(data)
    root = dict(data.attrs) if isinstance(data, xr.DataTree) else None
    return _write(arms, store_path(path), overwrite=overwrite, root_attrs=root)


def add_arm(ds: xr.Dataset, path: str | os.PathLike, arm: str | None = None) -> Path:
    """Add (or replace) one arm in a store, creating it if needed; the other arms are kept as they are.

    Holds the store lock from reading to swapping, so concurrent ``add_arm`` calls on one store keep
    every arm. The other arms are not re-encoded: their files are linked into the new store with
    their integrity record (a store written before the record existed is loaded and rewritten).

    Parameters
    ----------
    ds : xarray.Dataset
        The arm's trace.
    path : str or os.PathLike
        The store.
    arm : str, optional
        The arm's name; ``None`` takes ``ds.attrs["arm"]`` (default ``"default"``).

    Returns
    -------
    pathlib.Path
        The store's resolved path.

    Raises
    ------
    StoreError
        Something other than an rlparity store is at ``path``, an arm name is not allowed, or the
        store is damaged.
    TraceValidationError
        The trace does not follow the schema.
    """
    arm = check_arm_name(arm if arm is not None else str(arm_name(ds)))
    p = store_path(path)
    with store_lock(p):
        recover_if_needed(p)
        kind = store_kind(p)
        if kind in ("file", "other"):
            check_target(p, overwrite=True)  # raises with the reason
        new = ds.assign_attrs(arm=arm)
        meta = _read_meta(p) if kind == "rlparity" else None
        root = (meta or {}).get(".zattrs") or {}
        record = _integrity(root, str(p)) if root.get(STORE_MARKER) == STORE_FORMAT else None
        if meta is not None and root.get(STORE_MARKER) == STORE_FORMAT and isinstance(record, Mapping) \
                and record.get("algorithm") == DIGEST_ALGORITHM:
            check_chunks(p, meta)  # never carry a damaged arm forward silently
            kept = {k: v for k, v in record.get("arms", {}).items() if k != arm}
            _check_names([*kept, arm])  # case clashes before anything is written
            root_attrs = {k: v for k, v in root.items() if k not in (STORE_MARKER, INTEGRITY_ATTR)}
            return _write({arm: new}, p, overwrite=True, root_attrs=root_attrs, carry=(p, meta, kept))
        arms = open_arms(p) if kind == "rlparity" else {}
        kept_names = [k for k in arms if k != arm]
        arms[arm] = new
        _check_names(arms)
        return _write(arms, p, overwrite=True, validated=kept_names)


def _integrity(root: Mapping[str, Any], shown: str) -> Mapping[str, Any] | None:
    """The store's integrity record, its shape checked: ``{"algorithm": str, "arms": {arm: {var: digest}}}``.

    None when the root has none; a record of another shape is damage (one line), never a KeyError or
    an AttributeError later.
    """
    record = root.get(INTEGRITY_ATTR)
    if record is None:
        return None
    arms = record.get("arms") if isinstance(record, Mapping) else None
    if not (isinstance(arms, Mapping) and all(isinstance(a, str) and isinstance(v, Mapping)
                                              and all(isinstance(d, str) for d in v.values())
                                              for a, v in arms.items())):
        raise StoreDamagedError(f"the store is damaged: {shown}'s integrity record is malformed (it must map each arm "
                                "to its variables' digests): restore it from a copy or re-create it")
    return record


def _read(p: Path, shown: str, chunks: Any = None) -> xr.DataTree:
    meta = _read_meta(p)
    if meta is None:
        raise StoreError(f"{shown} is not a readable rlparity zarr store: it has no readable consolidated metadata "
                         "(.zmetadata missing, not JSON or nested past what a parser reads), so rlparity.trace.save "
                         "did not write it as it is")
    root = meta.get(".zattrs") or {}
    fmt = root.get(STORE_MARKER)
    if fmt is not None and fmt != STORE_FORMAT:
        newer = isinstance(fmt, int) and fmt > STORE_FORMAT
        raise StoreError(f"{shown} has store format {fmt!r}; this release of rlparity reads store format "
                         f"{STORE_FORMAT}" + (": upgrade rlparity" if newer else ""))
    if fmt is not None:
        check_chunks(p, meta)
    try:
        tree = _open_tree(p, chunks)
    except Exception as err:  # zarr raises several kinds for a store that is not one, or a broken chunk
        if fmt is not None:
            raise StoreDamagedError(f"the store is damaged: reading {shown} failed ({decode_failure(err)}): "
                                    "restore it from a copy or re-create it") from err
        raise StoreError(f"{shown} is not a readable rlparity zarr store: {err}") from err
    if not tree.children:
        raise StoreError(f"{shown} holds no arms: it was not written by rlparity.trace.save")
    if fmt is not None:
        record = _integrity(root, shown)
        if not isinstance(record, Mapping):
            raise StoreDamagedError(f"the store is damaged: {shown} is marked as an rlparity store but has no "
                                    "integrity record: restore it from a copy or re-create it")
        if chunks is None:
            verify_integrity(p, {k: v.to_dataset() for k, v in tree.children.items()}, record)
        else:  # lazy: checked block by block as it is read (rlparity.trace.storage.lazy.ensure_validated)
            want = record.get("arms") or {}  # the algorithm and the arms now; the values as they are read
            verify_integrity(p, dict.fromkeys(tree.children), record,
                             digests={k: want.get(k) or {} for k in tree.children})
            tree.encoding[LAZY_RECORD] = {"path": str(p), "algorithm": record.get("algorithm"),
                                          "arms": record.get("arms") or {}}
    elif chunks is not None:  # a store written by hand: no record, still validated as it is read
        tree.encoding[LAZY_RECORD] = {"path": str(p), "arms": None}
    return tree


def open_experiment(path: str | os.PathLike, *, chunks: Any = None) -> xr.DataTree:
    """Open a store as a DataTree (one child per arm), loaded into memory and validated.

    Recovers an interrupted save first; reads under the shared store lock; a missing chunk or data
    that differs from what was saved raises :class:`~rlparity.trace.storage.StoreDamagedError`.

    With ``chunks`` the store opens lazily: the structure, the chunk files and the record's arms are
    checked now; the values by the same rules as the eager open (schema, CRC-32 against the record
    made at save, the scored token checksum) the first time an arm is read, whole and block by block
    (:func:`rlparity.trace.storage.lazy.ensure_validated`); later reads load only what they need, their
    CRC-32 still checked.

    Parameters
    ----------
    path : str or os.PathLike
        The store.
    chunks : int or Mapping[str, int], optional
        Sequences per block (or xarray's ``chunks=`` mapping): open lazily (dask arrays over the zarr
        chunks, nothing loaded; needs dask); ``None`` loads into memory.

    Returns
    -------
    xarray.DataTree
        One child per arm.

    Raises
    ------
    FileNotFoundError
        Nothing is at ``path``.
    StoreError
        ``path`` is a file or not a readable rlparity store, or its format is another release's.
    StoreDamagedError
        A chunk is missing or the data differ from what was saved.
    TraceValidationError
        An arm does not follow the schema.
    """
    if chunks is not None:
        chunks = lazy_chunks(chunks)
    p = store_path(path)
    recover_if_needed(p)
    if not os.path.lexists(p):
        raise FileNotFoundError(f"no trace at {path}: capture one with `rlparity capture` first")
    if not p.is_dir():
        raise StoreError(f"{path} is a file, not an rlparity store (a zarr directory written by rlparity.trace.save)")
    tries = 3
    for attempt in range(tries):
        with store_lock(p, shared=True) as locked:
            try:
                tree = _read(p, str(path), chunks)
                break
            except (StoreError, OSError):
                # without a lock (read-only location) a writer may have swapped the store under us
                if locked or attempt == tries - 1:
                    raise
        time.sleep(0.05 * (attempt + 1))
    if chunks is not None:
        validate_structure(tree, path)
        return tree
    for name, node in tree.children.items():
        validate(node.to_dataset(), where=f"{path} arm {name!r}")
    return tree


def named_arms(arms: Mapping[str, xr.Dataset]) -> dict[str, xr.Dataset]:
    """``arms`` with each trace's ``arm`` attribute set to its name.

    The name in the store (or the mapping) is the arm's name, whatever attribute the trace was saved
    with.

    Parameters
    ----------
    arms : Mapping[str, xarray.Dataset]
        ``{arm: trace}``.

    Returns
    -------
    dict[str, xarray.Dataset]
        The same arms; a trace whose ``arm`` attribute differs is replaced by a relabelled copy (the
        inputs are unchanged).
    """
    return {name: ds.assign_attrs(arm=name) if isinstance(ds, xr.Dataset) and arm_name(ds, None) != name else ds
            for name, ds in arms.items()}


def open_arms(path: str | os.PathLike, *, chunks: Any = None) -> dict[str, xr.Dataset]:
    """All arms of a store as ``{arm: Dataset}`` in stored order, each labelled with its arm name.

    See :func:`open_experiment` for the checks and errors.

    Parameters
    ----------
    path : str or os.PathLike
        The store.
    chunks : int or Mapping[str, int], optional
        Sequences per block (or xarray's ``chunks=`` mapping): open lazily (dask arrays over the zarr
        chunks, nothing loaded; needs dask); ``None`` loads into memory.

    Returns
    -------
    dict[str, xarray.Dataset]
        The arms; lazy ones carry the record their blocks are checked against.
    """
    tree = open_experiment(path, chunks=chunks)
    arms = {name: node.to_dataset() for name, node in tree.children.items()}
    if chunks is not None:  # each arm carries the record its blocks are checked against
        rec = tree.encoding.get(LAZY_RECORD) or {}
        arms = named_arms(arms)
        for k, v in arms.items():
            v.encoding[LAZY_RECORD] = {"path": rec.get("path", str(path)),
                                       "digests": (rec.get("arms") or {}).get(k),
                                       "check": ArmCheck(v, rec.get("path"), k)}
        return arms
    return named_arms(arms)


def load(path: str | os.PathLike, arm: str | None = None) -> xr.Dataset:
    """Load one arm of a store as a trace Dataset.

    Parameters
    ----------
    path : str or os.PathLike
        The store.
    arm : str, optional
        The arm's name; ``None`` takes the only arm.

    Returns
    -------
    xarray.Dataset
        The arm, in memory and validated.

    Raises
    ------
    ValueError
        ``arm`` is ``None`` and the store holds several arms.
    KeyError
        The store has no arm ``arm``.
    """
    arms = open_arms(path)
    if arm is None:
        if len(arms) != 1:
            raise ValueError(f"{path} holds arms {list(arms)}; pass arm=... to choose one")
        return next(iter(arms.values()))
    if arm not in arms:
        raise KeyError(f"{path} has no arm {arm!r}; it holds {list(arms)}")
    return arms[arm]


def as_arms(data) -> dict[str, xr.Dataset]:
    """``{arm: trace}`` from one trace, a mapping, a DataTree or a store path.

    What every multi-arm function accepts; each trace's ``arm`` attribute is its name
    (:func:`named_arms`).

    Parameters
    ----------
    data : xarray.Dataset, Mapping[str, xarray.Dataset], xarray.DataTree, str or os.PathLike
        One trace (keyed by its ``attrs["arm"]``, default ``"default"``), arms, a DataTree or a store
        path (opened with :func:`open_arms`).

    Returns
    -------
    dict[str, xarray.Dataset]
        The arms.

    Raises
    ------
    TypeError
        ``data`` is none of these.
    """
    if isinstance(data, xr.Dataset):
        return {arm_name(data): data}
    if isinstance(data, (str, os.PathLike)):
        return open_arms(data)
    if isinstance(data, xr.DataTree):
        return named_arms({k: v.to_dataset() for k, v in data.children.items()})
    if isinstance(data, Mapping):
        return named_arms(data)
    raise TypeError(f"expected a trace Dataset, a {{arm: trace}} mapping, a DataTree or a store path, "
                    f"not {type(data).__name__}")
