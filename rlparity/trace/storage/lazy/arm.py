"""Opening a store lazily, and what is known of a lazily opened arm.

The ``chunks=`` of :func:`rlparity.trace.open_arms` (:func:`lazy_chunks`), the schema checks that need
no values (:func:`validate_structure`), the record every arm carries in its encoding
(:data:`LAZY_RECORD`: the store, the CRC-32 record made at save, the :class:`ArmCheck` its views
share), and what a reader asks of a trace before it reads: :func:`is_lazy`, :func:`is_whole`,
:func:`block_size`. Reading is :mod:`~rlparity.trace.storage.lazy.reading`; the CRC-32 checks are
:mod:`~rlparity.trace.storage.lazy.digests`."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import xarray as xr

from rlparity.trace.schema import ALL_VARS
from rlparity.trace.validation import validate

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
    """A block without the whole trace's token checksum (checked over all blocks, :func:`~rlparity.trace.storage.lazy.reading.blocks`)."""
    if "scored_token_checksum" in block.attrs:
        block = block.copy(deep=False)
        block.attrs = {k: v for k, v in block.attrs.items() if k != "scored_token_checksum"}
    return block


class ArmCheck:
    """What is known of one lazily opened arm, shared by every view of it (a selection, a copy).

    ``whole`` is the arm as opened, ``sizes`` its dims, ``valid`` whether it was read whole once and
    found valid (schema, CRC-32 record, scored token checksum: :func:`~rlparity.trace.storage.lazy.reading.ensure_validated`). Copies of
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


__all__ = ["LAZY_RECORD", "ArmCheck", "arm_record", "block_size", "is_lazy", "is_whole", "lazy_chunks",
           "validate_structure"]
