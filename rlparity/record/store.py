"""The run store: one zarr (format 2) group that a training run appends to, one step at a time.

Layout (every array's first dim is ``step``; each has ``_ARRAY_DIMENSIONS`` so xarray reads it):

``(step, sequence, position)``
    ``token_id``, ``policy_version``, ``scored_version`` (the version whose weights gave the
    token's pi_old; stores written before it was recorded lack it), ``rollout_logprob`` (mu) and the trainer's readings
    (pi_old; pi_theta where the loop gave it) under the trace schema's names for the trainer side;
    one chunk file per step (and per block of sequences / positions).
``(step, sequence, prompt_position)``
    ``prompt_token_id``.
``(step, sequence)``
    ``prompt_length``, ``response_length`` (-1: no sequence at that index in the step),
    ``prompt_index``, ``finish_reason`` (a code into :data:`FINISH_REASONS`), ``temperature``,
    ``top_k``, ``top_p``, ``reward``, ``advantage``.
``(step,)``, ``(step, metric)``, ``(step, alarm)``, ``(step, tensor)``
    what the step was (versions, sizes, times), its live metrics, its alarms and the engine's
    weight digest (CRC-32 per tensor, -1 = none; ``digest_stride``: every how many values of each
    tensor it checksummed, -1 = no digest that step, absent in stores written before it was
    recorded: every value), in chunks of :data:`STEP_CHUNK` steps.

Crash safety: a step's arrays are written first (zarr writes every chunk through a temporary file
and a rename, so a chunk is never torn), then the root attribute :data:`RUN_MARKER` is replaced
(also through a rename) with the new count of committed steps and the names of the metric /
tensor columns. Readers trust only the committed steps: a run killed mid-step leaves its rows
beyond the count, which are ignored (and overwritten when the run resumes).
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.record.run_record import RunRecord, run_record
from rlparity.trace.storage import StoreDamagedError, StoreError, write_root

RUN_MARKER = "rlparity_run"
RUN_FORMAT = 1
STEP_CHUNK = 256
TABLE_STEP_CHUNK = 32  # a table row is rewritten with its chunk each step: keep the chunk small
COLUMN_CHUNK = 64
FINISH_REASONS = ("unknown", "stop", "length", "abort")

# name -> (dims after "step", dtype, fill)
TOKEN_DIMS = ("sequence", "position")
SEQ_DIMS = ("sequence",)
STEP_VARS: dict[str, tuple[tuple[str, ...], str, Any]] = {
    "step_index": ((), "int64", -1),
    "trainer_version": ((), "int64", -1),
    "weight_version": ((), "int64", -1),
    "n_sequences": ((), "int32", 0),
    "wall_time": ((), "float64", np.nan),
    "step_seconds": ((), "float64", np.nan),
    "recorder_seconds": ((), "float64", np.nan),
    "metric_value": (("metric",), "float64", np.nan),
    "alarm_level": (("alarm",), "int8", 0),
    "alarm_value": (("alarm",), "float64", np.nan),
    "weight_digest": (("tensor",), "int64", -1),
    "digest_stride": ((), "int32", -1),
}
SEQUENCE_VARS: dict[str, tuple[tuple[str, ...], str, Any]] = {
    "prompt_length": (SEQ_DIMS, "int32", -1),
    "response_length": (SEQ_DIMS, "int32", -1),
    "prompt_index": (SEQ_DIMS, "int32", -1),
    "finish_reason": (SEQ_DIMS, "int8", -1),
    "temperature": (SEQ_DIMS, "float32", np.nan),
    "top_k": (SEQ_DIMS, "int32", -1),
    "top_p": (SEQ_DIMS, "float32", np.nan),
    "reward": (SEQ_DIMS, "float64", np.nan),
    "advantage": (SEQ_DIMS, "float64", np.nan),
    "prompt_token_id": (("sequence", "prompt_position"), "int32", -1),
    "token_id": (TOKEN_DIMS, "int32", -1),
    "policy_version": (TOKEN_DIMS, "int32", -1),
    "scored_version": (TOKEN_DIMS, "int32", -1),
    "rollout_logprob": (TOKEN_DIMS, "float32", np.nan),
}
# the trainer's readings: their names depend on the trainer side (the trace schema's)
TRAINER_FILL = ("float32", np.nan)
TABLE_DIMS = ("metric", "alarm", "tensor")


async def _gather(coros: list[Any]) -> None:
    import asyncio

    await asyncio.gather(*coros)


def _marker_of(p: Path) -> dict[str, Any] | None:
    """The run marker of the store at ``p`` (None: not a run store)."""
    try:
        with open(p / ".zattrs") as fh:
            attrs = json.load(fh)
    except (OSError, ValueError):
        return None
    marker = attrs.get(RUN_MARKER)
    return marker if isinstance(marker, dict) else None


def is_run_store(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a run store (written by :class:`rlparity.record.Recorder`).

    Parameters
    ----------
    path : str or os.PathLike
        A folder.

    Returns
    -------
    bool
        True when its root attributes carry the run marker.
    """
    return _marker_of(Path(path)) is not None


class RunWriter:
    """The low-level writer of a run store: creates the arrays, grows them, writes one step's rows
    and commits. One per store at a time (an exclusive ``flock`` on ``DIR/.NAME.recorder-lock``
    beside the store ``DIR/NAME``).

    Parameters
    ----------
    path : str or os.PathLike
        The store.
    attrs : Mapping[str, Any]
        The run's attributes (provenance, engine, sampling, trainer side: a
        :class:`~rlparity.record.run_record.RunRecord`'s keys), written at creation through the record
        (a value of the wrong type is refused).
    resume : bool, default False
        Append after the committed steps of an existing run store.
    overwrite : bool, default False
        Replace an existing run store (never anything else).
    """

    def __init__(self, path: str | os.PathLike, attrs: Mapping[str, Any], *, resume: bool = False,
                 overwrite: bool = False):
        import zarr

        self.path = Path(path)
        existing = _marker_of(self.path) if self.path.exists() else None
        if self.path.exists() and existing is None and (not self.path.is_dir() or any(self.path.iterdir())):
            raise StoreError(f"{self.path} exists and is not a run store: record into a new path")
        if existing is not None and not (resume or overwrite):
            raise FileExistsError(f"{self.path} already holds a run ({existing.get('steps', 0)} steps): pass "
                                  "resume=True to append to it or overwrite=True to replace it")
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.path.parent / f".{self.path.name}.recorder-lock"
        self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreError(f"another process is recording into {self.path}: one recorder per run store "
                             "(close the other, or record into another path)") from None
        if existing is not None and overwrite and not resume:
            self._clear()
            existing = None
        for leftover in self.path.rglob("*.partial"):  # temporary chunk files of a killed write
            leftover.unlink(missing_ok=True)
        self.group = zarr.open_group(str(self.path), mode="a", zarr_format=2)
        self.arrays: dict[str, Any] = {}
        if existing is None:
            self.attrs = RunRecord.from_attrs(attrs, where=str(self.path)).to_attrs()
            self.marker: dict[str, Any] = {"format": RUN_FORMAT, "steps": 0, "metric": [], "tensor": [],
                                           "alarm": [], "variables": {}}
            self._commit_attrs()
        else:
            if existing.get("format") != RUN_FORMAT:
                raise StoreError(f"{self.path} has run format {existing.get('format')!r}; this release writes "
                                 f"format {RUN_FORMAT}: record into a new path")
            with open(self.path / ".zattrs") as fh:
                root = json.load(fh)
            self.attrs = run_record({k: v for k, v in root.items() if k != RUN_MARKER}, where=str(self.path)).to_attrs()
            self.marker = dict(existing)
            for name in self.marker.get("variables", {}):
                self.arrays[name] = self.group[name]

    def _clear(self) -> None:
        import shutil

        for child in self.path.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()

    @property
    def steps(self) -> int:
        """The committed steps."""
        return int(self.marker["steps"])

    def _commit_attrs(self) -> None:
        write_root(self.path, {**self.attrs, RUN_MARKER: self.marker})

    def _array(self, name: str, dims: tuple[str, ...], dtype: str, fill: Any, shape: tuple[int, ...]) -> Any:
        """The array ``name`` (created with ``shape`` after the step dim), grown to hold step
        ``steps`` and ``shape``."""
        k = self.steps
        rows = ((k // STEP_CHUNK) + 1) * STEP_CHUNK  # the step dim grows a block at a time: one metadata write a block
        arr = self.arrays.get(name)
        if arr is None:
            if dims and dims[0] in TABLE_DIMS:
                chunks = (TABLE_STEP_CHUNK, COLUMN_CHUNK)
            elif dims:
                chunks = (1, *(max(1, n) for n in shape))
            else:
                chunks = (STEP_CHUNK,)
            arr = self.group.create_array(name, shape=(rows, *shape), chunks=chunks, dtype=dtype,
                                          fill_value=fill, attributes={"_ARRAY_DIMENSIONS": ["step", *dims]},
                                          config={"write_empty_chunks": True}, overwrite=True)
            self.arrays[name] = arr
            self.marker["variables"][name] = ["step", *dims]
            return arr
        cur = arr.shape
        want = (max(cur[0], rows), *(max(a, b) for a, b in zip(cur[1:], shape)))
        if want != cur:
            arr.resize(want)
        return arr

    def write_step(self, rows: Mapping[str, tuple[tuple[str, ...], np.ndarray]]) -> None:
        """Write the next step's rows (not yet committed).

        Parameters
        ----------
        rows : Mapping[str, tuple]
            ``{name: (dims after step, array)}``; a name new to the store is created with the
            array's dtype; its fill is the table's (-1 for ints, NaN for floats).
        """
        from zarr.core.sync import sync

        k = self.steps
        writes = []
        for name, (dims, value) in rows.items():
            value = np.asarray(value)
            spec = STEP_VARS.get(name) or SEQUENCE_VARS.get(name)
            dtype, fill = (spec[1], spec[2]) if spec else TRAINER_FILL
            arr = self._array(name, dims, dtype, fill, value.shape)
            if dims:
                full = np.full(arr.shape[1:], fill, dtype=arr.dtype)  # the whole row: no leftovers of a killed step
                full[tuple(slice(0, n) for n in value.shape)] = value
                value = full
            writes.append(arr.async_array.setitem(k, value))
        sync(_gather(writes))  # every array's chunks at once: one round trip to zarr's event loop, not one each

    def commit(self, **columns: list[str]) -> None:
        """Commit the step written: the marker's step count (and column names) replaced last.

        Parameters
        ----------
        **columns : list of str
            The names along ``metric``, ``alarm`` and ``tensor`` as they are now.
        """
        self.marker = {**self.marker, **{k: list(v) for k, v in columns.items()}, "steps": self.steps + 1}
        self._commit_attrs()

    def close(self) -> None:
        """Release the store's writer lock (the store stays as committed)."""
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None  # the lock file stays: removing it would let two writers lock two files


def _check_step_chunks(p: Path, names: list[str], steps: int) -> None:
    """Every committed step has its chunk files (written with empty chunks kept, so a missing one is
    damage, never padding)."""
    for name in names:
        folder = p / name
        have = set()
        try:
            for f in os.listdir(folder):
                head = f.split(".", 1)[0]
                if head.isdigit():
                    have.add(int(head))
        except FileNotFoundError:
            raise StoreDamagedError(f"the run store {p} is damaged: {name} has no chunks: restore it from a copy") from None
        missing = [k for k in range(steps) if k not in have]
        if missing:
            raise StoreDamagedError(f"the run store {p} is damaged: {name} lacks the chunks of steps {missing[:5]}"
                                    f"{' ...' if len(missing) > 5 else ''}: restore it from a copy")


def open_run(path: str | os.PathLike, *, chunks: Any = None) -> xr.Dataset:
    """Open a run store: its committed steps as one ``xarray.Dataset`` (dims ``step``, ``sequence``,
    ``position``, ``prompt_position``, ``metric``, ``alarm``, ``tensor``).

    Rows past the committed count (a step a killed run did not finish) are left out. Every
    committed step's chunk files are checked to exist. ``response_mask`` is derived from
    ``response_length``.

    Parameters
    ----------
    path : str or os.PathLike
        The store (:class:`rlparity.record.Recorder`'s path).
    chunks : int or Mapping[str, int], optional
        Open lazily: dask arrays, ``chunks`` steps per block (an int) or xarray's mapping; nothing
        is read until computed. ``None`` loads the committed steps into memory.

    Returns
    -------
    xarray.Dataset
        The run, the run's attributes in ``attrs`` (as :func:`~rlparity.record.run_record.run_record`
        reads them: an old store's converted) and the committed step count in ``attrs["steps"]``.

    Raises
    ------
    FileNotFoundError
        Nothing is at ``path``.
    StoreError
        ``path`` is not a run store, or it holds no committed step.
    StoreDamagedError
        A committed step's chunk file is missing.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no run store at {path}: record one with rlparity.record.Recorder")
    marker = _marker_of(p)
    if marker is None:
        raise StoreError(f"{path} is not a run store (no {RUN_MARKER!r} attribute): open a trace store with "
                         "rlparity.trace.open_arms")
    steps = int(marker.get("steps", 0))
    if steps == 0:
        raise StoreError(f"{path} holds no committed step yet: the run was stopped before its first step ended")
    token_vars = [n for n, dims in marker.get("variables", {}).items() if len(dims) > 1 and dims[1] == "sequence"]
    _check_step_chunks(p, token_vars, steps)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The specified chunks separate")
        xr_chunks = {"step": int(chunks)} if isinstance(chunks, (int, np.integer)) else chunks
        ds = xr.open_zarr(p, consolidated=False, zarr_format=2, mask_and_scale=False, chunks=xr_chunks)
    ds = ds.isel(step=slice(0, steps))
    for dim in ("metric", "alarm", "tensor"):
        names = list(marker.get(dim, []))
        if dim in ds.dims:
            ds = ds.isel({dim: slice(0, len(names))}).assign_coords({dim: names})
    ds = ds.assign_coords(step=np.arange(steps))
    if "position" in ds.dims:
        mask = xr.DataArray(np.arange(ds.sizes["position"]), dims="position") < ds["response_length"]
        ds["response_mask"] = mask.transpose("step", "sequence", "position")
    if chunks is None:
        ds = ds.load()
    rec = run_record({k: v for k, v in ds.attrs.items() if k != RUN_MARKER}, where=str(path))
    ds.attrs = {**rec.to_attrs(), "steps": steps}
    return ds


def step_trace(run: xr.Dataset, step: int) -> xr.Dataset:
    """One step of a run as a trace (the :mod:`rlparity.trace` schema), for every analysis of a trace
    (``rlparity.metrics.summary``, ``rlparity.diagnose``).

    Parameters
    ----------
    run : xarray.Dataset
        A run (:func:`open_run`), in memory or lazy (the step is loaded).
    step : int
        The step's index.

    Returns
    -------
    xarray.Dataset
        The step's sequences (float64 logprobs), validated, its metrics in ``attrs["record_metrics"]``,
        the alarms that fired at it in ``attrs["record_alarms"]`` (``{code: "warning" | "error"}``)
        and the floors the run recorded (the run's ``trainer`` and ``engine_floor`` attributes, as a
        trace carries them, where the loop gave them), the floor's engine settings the loop named
        (``engine_given``: partial, so never ``engine_requested``, a capture's full settings) and
        the run's library ``versions``. ``attrs["trainer"]["scored_by"]`` is
        ``"policy_version"`` when the store's ``scored_version`` says every token's pi_old came from
        the weights that generated it (a lagged step scored per version); absent otherwise (one set
        of weights, a mix, or a store written before ``scored_version`` was recorded).
    """
    from rlparity.config.provenance import make_attrs
    from rlparity.trace.schema import SCHEMA_VERSION, annotate
    from rlparity.trace.validation import validate

    one = run.isel(step=int(step)).load()
    n = int(one["n_sequences"])
    lengths = one["response_length"].values[:n].astype(np.int64)
    plen = one["prompt_length"].values[:n].astype(np.int64)
    width, pwidth = int(lengths.max(initial=0)), int(plen.max(initial=0))
    tok = one.isel(sequence=slice(0, n), position=slice(0, width))
    data: dict[str, Any] = {}
    for name, var in tok.data_vars.items():
        dims = var.dims
        if dims == ("sequence", "position") and name != "scored_version":
            values = var.values
            if values.dtype.kind == "f":
                values = values.astype(np.float64)
            elif values.dtype.kind == "i":
                values = values.astype(np.int64)
            data[name] = (dims, values)
    data["response_mask"] = (("sequence", "position"), np.arange(width)[None, :] < lengths[:, None])
    data["prompt_token_id"] = (("sequence", "prompt_position"),
                               tok["prompt_token_id"].values[:, :pwidth].astype(np.int64))
    rec = run_record(run)
    reasons = list(FINISH_REASONS if rec.finish_reasons is None else rec.finish_reasons)
    codes = tok["finish_reason"].values
    data.update({
        "prompt_length": (("sequence",), plen), "response_length": (("sequence",), lengths),
        "finish_reason": (("sequence",), np.array([reasons[c] if 0 <= c < len(reasons) else "unknown" for c in codes],
                                                  dtype=str)),
        "prompt_index": (("sequence",), tok["prompt_index"].values.astype(np.int64)),
        "sample_index": (("sequence",), np.zeros(n, np.int64)),
        "temperature": (("sequence",), tok["temperature"].values.astype(np.float64)),
        "top_k": (("sequence",), tok["top_k"].values.astype(np.int64)),
        "top_p": (("sequence",), tok["top_p"].values.astype(np.float64)),
        "request_seed": (("sequence",), np.full(n, -1, np.int64)),
        "reward": (("sequence",), tok["reward"].values.astype(np.float64)),
        "advantage": (("sequence",), tok["advantage"].values.astype(np.float64)),
    })
    metrics = {str(k): float(v) for k, v in zip(one["metric"].values, one["metric_value"].values)} \
        if "metric" in one.dims else {}
    levels = {1: "warning", 2: "error"}
    alarms = {str(c): levels.get(int(v), "error") for c, v in zip(one["alarm"].values, one["alarm_level"].values)
              if int(v) > 0} if "alarm" in one.dims else {}
    # the run's floors, the engine settings it named and its versions, where recorded (a dict: an empty one too)
    floors = {k: v for k, v in rec.to_attrs().items()
              if k in ("trainer", "engine_floor", "engine_given", "versions") and isinstance(v, dict)}
    if "scored_version" in tok and "policy_version" in data:  # stores before it was recorded: no claim
        real = data["response_mask"][1]
        scored = tok["scored_version"].values[real]
        own = (scored == data["policy_version"][1][real]) & (scored >= 0)  # negative: unknown (a peer's dump)
        if real.any() and own.all():  # every token's pi_old came from the weights that generated it
            floors["trainer"] = {**floors.get("trainer", {}), "scored_by": "policy_version"}
    attrs = make_attrs(schema_version=SCHEMA_VERSION, arm=f"step_{int(step):06d}",
                       latest_policy_version=int(one["trainer_version"]), record_step=int(step),
                       record_metrics=metrics, record_alarms=alarms, model=rec.model, **floors)
    ds = xr.Dataset(data, coords={"sequence": np.arange(n), "position": np.arange(width),
                                  "prompt_position": np.arange(pwidth)}, attrs=attrs)
    return validate(annotate(ds), where=f"step {step} of the run")


__all__ = ["FINISH_REASONS", "RUN_FORMAT", "RUN_MARKER", "RunWriter", "is_run_store", "open_run", "step_trace"]
