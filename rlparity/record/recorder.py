"""The run recorder: a training loop calls :meth:`Recorder.step` once per step with what it already
holds; the step is appended to one run store (:mod:`rlparity.record.store`) and its metrics and
alarms come back for the loop's own logger.

::

    rec = Recorder("run.zarr", model="Qwen/Qwen3-0.6B", sampling={"temperature": 0.7})
    for k, batch in enumerate(loop):
        logs = rec.step(prompt_token_ids=..., token_ids=..., rollout_logprobs=..., trainer_logprobs=...,
                        policy_versions=..., trainer_version=k, rewards=..., advantages=...)
        logger.log(logs)
    rec.close()
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
import weakref
import zlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.provenance import jsonable, make_attrs
from rlparity.config.settings import with_overrides
from rlparity.metrics.dashboard import DASHBOARDS
from rlparity.metrics.objective import policy_variable
from rlparity.record.live import (
    ALARMS,
    LEVELS,
    PREFIX,
    Alarm,
    StepArrays,
    digest_change,
    pooled_ratio_offset,
    ratio_units,
    step_alarms,
    step_metrics,
)
from rlparity.record.store import FINISH_REASONS, RunWriter
from rlparity.trace.schema import POSITIVE_TOLERANCE, pad_rows
from rlparity.trace.storage import StoreError
from rlparity.trace.weights import NOT_FINITE, tensor_checksum


class RunAlarmError(RuntimeError):
    """An alarm at the level the recorder was told to stop on (``stop_on``); the step is committed
    in the store before this is raised.

    Parameters
    ----------
    alarms : sequence of Alarm
        The step's alarms at that level (kept as ``.alarms``).
    """

    def __init__(self, alarms: Sequence[Alarm]):
        self.alarms = list(alarms)
        first = self.alarms[0]
        more = f" (and {len(self.alarms) - 1} more alarms)" if len(self.alarms) > 1 else ""
        super().__init__(f"{first}{more}; the run was stopped because stop_on={first.level!r} (the step is "
                         "recorded: open the store with rlparity.record.open_run)")


class WeightDigest(dict):
    """``{tensor name: CRC-32}`` as :func:`weight_digest` returns it, with the ``stride`` its values
    were sampled at (1: every value), which :meth:`Recorder.step` records beside it.

    Parameters
    ----------
    values : Mapping[str, int]
        The checksums.
    stride : int, default 1
        Every ``stride``-th value of each tensor was checksummed.
    """

    def __init__(self, values: Mapping[str, int], stride: int = 1):
        super().__init__(values)
        self.stride = int(stride)


def digest_value(checksum: str) -> int:
    """A :func:`~rlparity.trace.weights.tensor_checksum` as the integer a run store holds.

    Parameters
    ----------
    checksum : str
        8 hex digits, after :data:`~rlparity.trace.weights.NOT_FINITE` for a tensor with NaN or
        infinite values.

    Returns
    -------
    int
        The CRC-32, plus ``2**32`` for a tensor with NaN or infinite values (never equal to a finite
        tensor's).
    """
    if checksum.startswith(NOT_FINITE):
        return int(checksum[len(NOT_FINITE):], 16) + (1 << 32)
    return int(checksum, 16)


def sample_offset(name: str, stride: int) -> int:
    """The first value :func:`weight_digest` samples of tensor ``name`` at ``stride``: fixed per name
    (the same values at every sync) and spread over names, so a stride that divides a row length
    does not sample the same column of every matrix.

    Parameters
    ----------
    name : str
        The tensor's name.
    stride : int
        Every ``stride``-th value is sampled.

    Returns
    -------
    int
        In ``[0, stride)``; 0 for ``stride`` 1.
    """
    return zlib.crc32(name.encode()) % stride if stride > 1 else 0


def weight_digest(named_tensors: Iterable[tuple[str, Any]], *, sample: int | None = None,
                  stride: int = 1) -> WeightDigest:
    """Per-tensor checksums of weights, as ``rlparity verify-weights`` computes them (CRC-32 of the
    bf16-rounded values, :func:`rlparity.trace.weights.tensor_checksum`), of every tensor or a sample
    of tensors, of every value or a strided sample of values.

    The samples are the same at every call (tensors evenly spaced over the sorted names; in each
    tensor every ``stride``-th value from :func:`sample_offset`), so two syncs' digests compare.
    With ``stride > 1`` a sync is seen to change a tensor only where a sampled value changed: an
    update that moves a handful of bf16 values (a float32 trainer's tiny step) most likely reads as
    no change at all.

    Parameters
    ----------
    named_tensors : iterable of tuple[str, torch.Tensor]
        ``model.named_parameters()``, a state dict's ``items()``, the engine's weights.
    sample : int, optional
        Checksum only this many tensors; ``None`` checksums every one.
    stride : int, default 1
        Checksum every ``stride``-th value of each tensor (1: every value, the checksums
        ``verify-weights`` prints).

    Returns
    -------
    WeightDigest
        ``{name: CRC-32}`` (:func:`digest_value`), ``.stride`` set.
    """
    if int(stride) < 1:
        raise ValueError(f"stride={stride}: checksum every value (1) or every stride-th value (> 1)")
    items = sorted(((str(n), t) for n, t in named_tensors), key=lambda x: x[0])
    if sample is not None and 0 < sample < len(items):
        idx = np.unique(np.linspace(0, len(items) - 1, int(sample)).round().astype(int))
        items = [items[i] for i in idx]
    k = int(stride)
    return WeightDigest({n: digest_value(tensor_checksum(t, stride=k, offset=sample_offset(n, k))) for n, t in items},
                        stride=k)


@dataclass(frozen=True)
class RecorderSettings:
    """What a :class:`Recorder` records with: set once per run.

    Parameters
    ----------
    trainer_side : {"processed", "raw"}, optional
        What the loop's pi_old is: the trainer's logprob after temperature / top-k / top-p as the
        engine samples (``processed``; a TRL / verl loop that divides logits by the temperature) or
        the full-vocabulary temperature-1 logprob (``raw``); ``None``: ``defaults().trainer``.
    model : str, optional
        The model (recorded in the store).
    sampling : Mapping[str, Any], optional
        The run's sampling parameters (``temperature``, ``top_k``, ``top_p``, ...): the default of
        each step's.
    engine : Mapping[str, Any], optional
        The engine's settings (recorded in the store).
    dashboards : sequence of str, default all of :data:`rlparity.metrics.DASHBOARDS`
        Peers whose dashboard names the step's metrics carry.
    eps : float, optional
        The PPO clip range of ``clip_fraction``; ``None``: ``defaults().eps``.
    stop_on : {"error", "warning"} or None, default None
        Raise :class:`RunAlarmError` after a step with an alarm at this level or above (opt-in).
    attrs : Mapping[str, Any], optional
        More attributes for the store.
    background : bool, default True
        Write the store in a background thread (at most two steps queued): ``step()`` returns once
        the metrics and alarms are computed; the step is committed shortly after
        (:meth:`Recorder.flush` waits for it). ``False`` writes and commits inside ``step()``.
    """

    trainer_side: TrainerSide | None = None
    model: str | None = None
    sampling: Mapping[str, Any] | None = None
    engine: Mapping[str, Any] | None = None
    dashboards: Sequence[str] = DASHBOARDS
    eps: float | None = None
    stop_on: str | None = None
    attrs: Mapping[str, Any] | None = None
    background: bool = True


@dataclass
class StepRecord:
    """One step, as the loop holds it. Token arrays are ragged (one list per sequence) or padded 2-d
    arrays with ``response_mask``; numpy arrays, lists or torch tensors.

    Parameters
    ----------
    prompt_token_ids : sequence of sequence of int or array
        The prompts' ids (padded: with ``prompt_mask``; left or right padding).
    token_ids : sequence of sequence of int or array
        The sampled response ids.
    rollout_logprobs : sequence of sequence of float or array
        The engine's logprob of each sampled token (mu, nats).
    trainer_logprobs : sequence of sequence of float or array
        The trainer's pi_old of each token (nats; which reading: ``RecorderSettings.trainer_side``).
    trainer_updated_logprobs : sequence of sequence of float or array, optional
        pi_theta, where the loop has it.
    response_mask : array, optional
        With padded token arrays: True on real tokens.
    prompt_mask : array, optional
        With padded prompts: True on real prompt tokens.
    policy_versions : int or per-token array, optional
        The policy version that generated each token; ``None``: ``trainer_version`` (on-policy).
    trainer_version : int, optional
        The trainer's policy version at this step; ``None``: the step's index.
    scored_version : int or per-token array, optional
        The version whose weights gave pi_old; ``None``: ``trainer_version`` (score each token at its
        own version: pass ``policy_versions``).
    rewards : sequence of float, optional
        One per sequence.
    advantages : sequence of float, optional
        One per sequence.
    temperature : float or sequence of float, optional
        The sampling temperature (one, or one per sequence); ``None``: the recorder's sampling.
    top_k : int or sequence of int, optional
        Top-k (0 = off); ``None``: the recorder's sampling.
    top_p : float or sequence of float, optional
        Top-p (1 = off); ``None``: the recorder's sampling.
    finish_reasons : sequence of str, optional
        Why each generation stopped (``stop``, ``length``, ``abort``).
    prompt_index : sequence of int, optional
        The prompt (group) of each sequence; ``None``: 0, 1, ...
    weight_version : int, optional
        The version the engine held at its last sync (the one the weight digest belongs to);
        ``None``: ``trainer_version``. A digest is compared with the previous sync's when this
        version is newer (the trainer stepped in between).
    weight_digest : Mapping[str, int or str], optional
        The engine's per-tensor checksums at that sync (:func:`weight_digest`; hex strings as
        ``rlparity verify-weights`` prints them are read too).
    digest_stride : int, optional
        The digest checksummed every ``digest_stride``-th value of each tensor; ``None``: the
        digest's own ``.stride`` (:func:`weight_digest`'s), else 1 (every value). Recorded per step;
        digests of two strides are never compared.
    step : int, optional
        The loop's own step number (recorded beside the store's index).
    """

    prompt_token_ids: Any
    token_ids: Any
    rollout_logprobs: Any
    trainer_logprobs: Any
    trainer_updated_logprobs: Any = None
    response_mask: Any = None
    prompt_mask: Any = None
    policy_versions: Any = None
    trainer_version: int | None = None
    scored_version: Any = None
    rewards: Any = None
    advantages: Any = None
    temperature: Any = None
    top_k: Any = None
    top_p: Any = None
    finish_reasons: Sequence[str] | None = None
    prompt_index: Sequence[int] | None = None
    weight_version: int | None = None
    weight_digest: Mapping[str, Any] | None = None
    digest_stride: int | None = None
    step: int | None = None

    @classmethod
    def from_trace(cls, trace: Any, trainer: TrainerSide | None = None, **fields: Any) -> StepRecord:
        """The step a scored rlparity trace holds (what :func:`rlparity.experiments.rl.rl_run` has
        after each optimizer step): its tokens, mu, pi_old (and pi_theta), versions, sampling,
        rewards and advantages; the engine's weight digest of the version that generated its
        tokens, from ``attrs["engine_weight_checksums"]``.

        Parameters
        ----------
        trace : xarray.Dataset
            A scored trace (one step's batch).
        trainer : {"processed", "raw"}, optional
            Which trainer reading is pi_old (the recorder's ``trainer_side``); ``None``:
            ``defaults().trainer``.
        **fields : Any
            Fields of :class:`StepRecord` that replace what the trace gives (e.g. ``step``).

        Returns
        -------
        StepRecord
            The step; ``scored_version`` is the trace's ``policy_version`` when the trainer scored
            each token at its own version (``attrs["trainer"]["scored_by"] == "policy_version"``).
        """
        from rlparity.trace.weights import engine_effective

        side = trainer or defaults().trainer
        mask = trace["response_mask"].values.astype(bool)
        pv = trace["policy_version"].values
        own = (trace.attrs.get("trainer") or {}).get("scored_by") == "policy_version"
        latest = trace.attrs.get("latest_policy_version")
        generated = int(pv[mask].max()) if mask.any() else None
        digests = engine_effective(trace.attrs)
        theta = policy_variable("theta", side)
        values = {
            "prompt_token_ids": trace["prompt_token_id"].values, "prompt_mask": trace["prompt_token_id"].values >= 0,
            "token_ids": trace["token_id"].values, "response_mask": mask,
            "rollout_logprobs": trace["rollout_logprob"].values,
            "trainer_logprobs": trace[policy_variable("old", side)].values,
            "trainer_updated_logprobs": trace[theta].values if theta in trace else None,
            "policy_versions": pv, "trainer_version": None if latest is None else int(latest),
            "scored_version": pv if own else None,
            "rewards": trace["reward"].values if "reward" in trace else None,
            "advantages": trace["advantage"].values if "advantage" in trace else None,
            "temperature": trace["temperature"].values, "top_k": trace["top_k"].values,
            "top_p": trace["top_p"].values, "finish_reasons": [str(x) for x in trace["finish_reason"].values],
            "prompt_index": trace["prompt_index"].values,
            "weight_version": generated if generated in digests else None,
            "weight_digest": digests.get(generated) if generated is not None else None,
        }
        return with_overrides(cls(**values), fields, "StepRecord.from_trace")


class StepMetrics(dict):
    """A step's metrics ``{name: float}`` for the loop's logger, with the step's ``alarms`` (a list
    of :class:`~rlparity.record.live.Alarm`) and ``step`` (its index in the store) as attributes.

    Parameters
    ----------
    values : Mapping[str, float]
        The metrics.
    alarms : list of Alarm
        The step's alarms.
    step : int
        The step's index.
    """

    def __init__(self, values: Mapping[str, float], alarms: list[Alarm], step: int):
        super().__init__(values)
        self.alarms = alarms
        self.step = step


def _numpy(x: Any) -> Any:
    """A torch tensor as numpy (bf16 as float32); anything else as it is."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if x.is_floating_point():
            x = x.float()
        return x.numpy()
    return x


def _rows(x: Any, mask: np.ndarray | None, what: str) -> list[np.ndarray]:
    """Ragged rows, a padded 2-d array with its ``mask``, or a 2-d array of real tokens only, as rows."""
    x = _numpy(x)
    if mask is not None:
        arr = np.asarray(x)
        if arr.shape != mask.shape:
            raise ValueError(f"{what} has shape {arr.shape} but its mask {mask.shape}: pass arrays of one shape")
        return [arr[i][mask[i]] for i in range(arr.shape[0])]
    if isinstance(x, np.ndarray) and x.ndim == 2:
        return list(x)
    return [np.asarray(_numpy(r)).reshape(-1) for r in x]


def _per_seq(x: Any, n: int, dtype: Any, default: Any, what: str) -> np.ndarray:
    x = default if x is None else _numpy(x)
    arr = np.asarray(x, dtype=dtype)
    if arr.ndim == 0:
        return np.full(n, arr, dtype=dtype)
    if arr.shape != (n,):
        raise ValueError(f"{what} has shape {arr.shape}: give one value, or one per sequence ({n})")
    return arr


class _BackgroundWriter:
    """Writes and commits queued steps in order in one thread; a failure is raised at the next call."""

    def __init__(self, writer: RunWriter, depth: int = 2):
        self.writer = writer
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="rlparity-recorder", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                if self.error is None:
                    rows, columns = item
                    self.writer.write_step(rows)
                    self.writer.commit(**columns)
            except BaseException as err:  # kept, raised in the loop's thread
                self.error = err
            finally:
                self.queue.task_done()

    def check(self) -> None:
        if self.error is not None:
            raise StoreError(f"writing the run store {self.writer.path} failed ({type(self.error).__name__}: "
                             f"{self.error}); the steps before it are committed") from self.error

    def submit(self, rows: dict[str, Any], columns: dict[str, list[str]]) -> None:
        self.check()
        self.queue.put((rows, columns))

    def flush(self) -> None:
        self.queue.join()
        self.check()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()


def _finish(background: _BackgroundWriter | None, writer: RunWriter) -> None:
    """Commit what is queued and release the store: at :meth:`Recorder.close`, or at the
    interpreter's exit for a recorder never closed."""
    try:
        if background is not None:
            background.stop()
    finally:
        writer.close()


def _commit_at_exit(rec: Recorder) -> None:
    """At the interpreter's exit, commit a recorder's queued steps before the thread pools stop
    taking work (zarr writes through them; ``weakref.finalize``'s own exit hook runs too late)."""
    ref = weakref.ref(rec)

    def commit() -> None:
        r = ref()
        if r is not None:
            r._finalizer()

    register = getattr(threading, "_register_atexit", None)  # CPython's hook that concurrent.futures uses
    if register is not None:
        register(commit)


class Recorder:
    """Record a training run, one call per step, into one run store; return each step's metrics
    and raise alarms live.

    Close it (or use it as a context manager) to commit the last steps at once; a recorder left
    open commits them when the interpreter exits. Memory is bounded: the recorder keeps the trailing window of the floor (``floor_window``
    numbers), the last weight digest and the column names; every step goes to disk. A run killed
    mid-step leaves the store readable up to the last whole step (:func:`rlparity.record.open_run`).

    Parameters
    ----------
    path : str or os.PathLike
        The run store (a zarr folder), created unless ``resume``.
    settings : RecorderSettings, optional
        What to record with; ``None``: :class:`RecorderSettings` defaults.
    resume : bool, default False
        Append to the run already at ``path`` (after its committed steps).
    overwrite : bool, default False
        Replace a run store at ``path``.
    **overrides : Any
        Fields of :class:`RecorderSettings` as keywords.

    Raises
    ------
    FileExistsError
        A run is at ``path`` and neither ``resume`` nor ``overwrite`` is given.
    StoreError
        Something other than a run store is at ``path``, or another recorder writes it.
    ValueError
        ``stop_on``, ``trainer_side`` or a dashboard name is unknown.
    """

    def __init__(self, path: str | os.PathLike, settings: RecorderSettings | None = None, *, resume: bool = False,
                 overwrite: bool = False, **overrides: Any):
        s = with_overrides(settings or RecorderSettings(), overrides, "Recorder")
        side = s.trainer_side or defaults().trainer
        if side not in ("processed", "raw"):
            raise ValueError(f"trainer_side={side!r}; use 'processed' or 'raw'")
        if s.stop_on not in (None, "error", "warning"):
            raise ValueError(f"stop_on={s.stop_on!r}; use 'error', 'warning' or None (never stop)")
        bad = [p for p in s.dashboards if p not in DASHBOARDS]
        if bad:
            raise ValueError(f"dashboards {bad} unknown; use some of {list(DASHBOARDS)}")
        self.settings = dataclasses.replace(s, trainer_side=side)
        self.trainer_side: TrainerSide = side
        self.old_var, self.theta_var = policy_variable("old", side), policy_variable("theta", side)
        sampling = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, **dict(s.sampling or {})}
        self.sampling = sampling
        attrs = make_attrs(model=s.model, trainer_side=side, sampling=jsonable(sampling),
                           engine=jsonable(dict(s.engine or {})), dashboards=list(s.dashboards),
                           finish_reasons=list(FINISH_REASONS), **dict(s.attrs or {}))
        self.writer = RunWriter(path, attrs, resume=resume, overwrite=overwrite)
        self.path = self.writer.path
        m = self.writer.marker
        self.metric_names: list[str] = list(m.get("metric", []))
        self.tensor_names: list[str] = list(m.get("tensor", []))
        self.alarm_names: list[str] = list(ALARMS)
        window = defaults().record.floor_window
        self._history: deque[float] = deque(maxlen=window)
        # the trailing steps' ratio_units (ratio_offset)
        self._ratio: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=defaults().record.ratio_window)
        self._digest: dict[str, int] | None = None
        self._digest_version: int | None = None  # the version synced with the last digest
        self._digest_stride = 1  # its sampling stride
        self._last_call: float | None = None
        self._next = self.writer.steps
        if self.writer.steps:
            self._restore()
        self._background = _BackgroundWriter(self.writer) if s.background else None
        # a loop that never calls close() still gets its queued steps committed at exit
        self._finalizer = weakref.finalize(self, _finish, self._background, self.writer)
        _commit_at_exit(self)

    # ------------------------------------------------------------------------------ resume
    def _restore(self) -> None:
        """The trailing floor and the last digest, read back from the committed steps."""
        k = self.writer.steps
        g = self.writer.group
        lo = max(0, k - self._history.maxlen)
        if PREFIX + "abs_log_ratio_mean" in self.metric_names:
            col = self.metric_names.index(PREFIX + "abs_log_ratio_mean")
            vals = np.asarray(g["metric_value"][lo:k, col], float)
            self._history.extend(float(v) for v in vals if np.isfinite(v))
        if self.old_var in g:  # the ratio window's steps, from their tokens
            for j in range(max(0, k - self._ratio.maxlen), k):
                n = int(g["n_sequences"][j])
                lengths = np.asarray(g["response_length"][j, :n])
                width = max(1, int(lengths.max(initial=0)))
                mask = np.arange(width)[None, :] < lengths[:, None]
                self._ratio.append(ratio_units(np.asarray(g["rollout_logprob"][j, :n, :width], np.float64),
                                               np.asarray(g[self.old_var][j, :n, :width], np.float64), mask,
                                               np.asarray(g["prompt_index"][j, :n])))
        if self.tensor_names and "weight_digest" in g:
            rows = np.asarray(g["weight_digest"][:k, : len(self.tensor_names)])
            synced = np.asarray(g["weight_version"][:k])
            versions = np.where(synced >= 0, synced, np.asarray(g["trainer_version"][:k]))
            have = np.flatnonzero((rows >= 0).any(axis=1))
            if have.size:
                last = have[-1]
                self._digest = {n: int(v) for n, v in zip(self.tensor_names, rows[last]) if v >= 0}
                self._digest_version = int(versions[last])
                # stores written before strides were recorded digested every value
                self._digest_stride = int(g["digest_stride"][last]) if "digest_stride" in g else 1

    @property
    def steps(self) -> int:
        """The steps recorded so far (committed, or queued to be: :meth:`flush`)."""
        return self._next

    # ------------------------------------------------------------------------------ one step
    def _arrays(self, r: StepRecord, trainer_version: int) -> tuple[dict[str, Any], StepArrays]:
        mask_in = None if r.response_mask is None else np.asarray(_numpy(r.response_mask), bool)
        tok_rows = _rows(r.token_ids, mask_in, "token_ids")
        lengths = np.array([len(t) for t in tok_rows], np.int64)
        # at least one position: a step whose responses are all empty still writes its (padding) chunks
        n, width = len(tok_rows), max(1, int(lengths.max(initial=0)))
        mask = np.arange(width)[None, :] < lengths[:, None]

        def per_token(value: Any, what: str, fill: Any, dtype: Any) -> np.ndarray:
            value = _numpy(value)
            if isinstance(value, (int, float, np.integer, np.floating)) or (isinstance(value, np.ndarray)
                                                                             and value.ndim == 0):  # one value for all
                return np.where(mask, value, fill).astype(dtype)
            rows = _rows(value, mask_in, what)
            if len(rows) != n:
                raise ValueError(f"{what} has {len(rows)} sequences, token_ids {n}: pass one row per sequence")
            bad = [i for i, (row, length) in enumerate(zip(rows, lengths)) if len(row) != length]
            if bad:
                raise ValueError(f"sequence {bad[0]}: {len(rows[bad[0]])} {what} for {lengths[bad[0]]} tokens: pass "
                                 "one per sampled token")
            return pad_rows(rows, fill, dtype, width)

        f64 = {name: per_token(value, name, np.nan, np.float64)
               for name, value in (("rollout_logprobs", r.rollout_logprobs), ("trainer_logprobs", r.trainer_logprobs),
                                   ("trainer_updated_logprobs", r.trainer_updated_logprobs)) if value is not None}
        for name, v in f64.items():  # the trace schema's rule: a step the readers would refuse is refused here
            with np.errstate(invalid="ignore"):
                pos = mask & (v > POSITIVE_TOLERANCE) & np.isfinite(v)
            if pos.any():
                i, j = (int(x[0]) for x in np.nonzero(pos))
                raise ValueError(f"{name} is positive at {int(pos.sum())} tokens (first: sequence {i}, token {j}, "
                                 f"{v[i, j]:+.4g}): pass log-probabilities (nats, <= 0), not probabilities or logits")
        tok = pad_rows(tok_rows, -1, np.int64, width)
        pmask = None if r.prompt_mask is None else np.asarray(_numpy(r.prompt_mask), bool)
        prompt_rows = _rows(r.prompt_token_ids, pmask, "prompt_token_ids")
        if len(prompt_rows) != n:
            raise ValueError(f"prompt_token_ids has {len(prompt_rows)} sequences, token_ids {n}: pass one prompt per "
                             "sequence (repeat a group's prompt for each of its samples)")
        prompt = pad_rows(prompt_rows, -1, np.int64)
        plen = np.array([len(p) for p in prompt_rows], np.int64)
        pv = per_token(trainer_version if r.policy_versions is None else r.policy_versions, "policy_versions", -1,
                       np.int64)
        sv = per_token(trainer_version if r.scored_version is None else r.scored_version, "scored_version", -1,
                       np.int64)
        rewards = None if r.rewards is None else _per_seq(r.rewards, n, np.float64, np.nan, "rewards")
        adv = None if r.advantages is None else _per_seq(r.advantages, n, np.float64, np.nan, "advantages")
        reasons = list(r.finish_reasons) if r.finish_reasons is not None else ["unknown"] * n
        if len(reasons) != n:
            raise ValueError(f"finish_reasons has {len(reasons)} entries for {n} sequences: give one per sequence")
        codes = np.array([FINISH_REASONS.index(x) if x in FINISH_REASONS else 0 for x in reasons], np.int8)
        rows: dict[str, Any] = {
            "token_id": (("sequence", "position"), tok),
            "policy_version": (("sequence", "position"), pv),
            "scored_version": (("sequence", "position"), sv),
            "rollout_logprob": (("sequence", "position"), f64["rollout_logprobs"]),
            self.old_var: (("sequence", "position"), f64["trainer_logprobs"]),
            "prompt_token_id": (("sequence", "prompt_position"), prompt),
            "prompt_length": (("sequence",), plen),
            "response_length": (("sequence",), lengths),
            "prompt_index": (("sequence",), _per_seq(r.prompt_index, n, np.int64, np.arange(n), "prompt_index")),
            "finish_reason": (("sequence",), codes),
            "temperature": (("sequence",), _per_seq(r.temperature, n, np.float64, self.sampling["temperature"],
                                                    "temperature")),
            "top_k": (("sequence",), _per_seq(r.top_k, n, np.int64, self.sampling["top_k"], "top_k")),
            "top_p": (("sequence",), _per_seq(r.top_p, n, np.float64, self.sampling["top_p"], "top_p")),
            "reward": (("sequence",), rewards if rewards is not None else np.full(n, np.nan)),
            "advantage": (("sequence",), adv if adv is not None else np.full(n, np.nan)),
        }
        if "trainer_updated_logprobs" in f64:
            rows[self.theta_var] = (("sequence", "position"), f64["trainer_updated_logprobs"])
        arrays = StepArrays(log_mu=rows["rollout_logprob"][1], log_pi=rows[self.old_var][1], mask=mask,
                            policy_version=pv, scored_version=sv, trainer_version=trainer_version,
                            log_theta=f64.get("trainer_updated_logprobs"), rewards=rewards, advantages=adv,
                            prompt_index=rows["prompt_index"][1])
        return rows, arrays

    def step(self, record: StepRecord | None = None, **fields: Any) -> StepMetrics:
        """Record one step and return its metrics (rlparity's and the peers' dashboard names) with
        its alarms.

        The step's data are written, then committed; then, with ``stop_on`` set and an alarm at
        that level, :class:`RunAlarmError` is raised.

        Parameters
        ----------
        record : StepRecord, optional
            The step; or give its fields as keywords.
        **fields : Any
            Fields of :class:`StepRecord` (they replace those of ``record``).

        Returns
        -------
        StepMetrics
            ``{name: float}``, plus ``rlparity/alarm/<code>`` (0 none, 1 warning, 2 error) for every
            alarm; ``.alarms`` lists the alarms that fired.

        Raises
        ------
        RunAlarmError
            An alarm at the ``stop_on`` level fired (after the step was recorded).
        ValueError
            The arrays do not fit together (the message says which).
        TypeError
            A keyword is no field of :class:`StepRecord`.
        """
        t0 = time.perf_counter()
        if record is None:
            record = StepRecord(**fields)
        elif fields:
            record = with_overrides(record, fields, "Recorder.step")
        if self._background is not None:
            self._background.check()
        k = self._next
        tv = k if record.trainer_version is None else int(record.trainer_version)
        rows, arrays = self._arrays(record, tv)
        d = defaults()
        metrics = step_metrics(arrays, eps=d.eps if self.settings.eps is None else self.settings.eps,
                               dashboards=self.settings.dashboards)
        window = deque(self._ratio, maxlen=self._ratio.maxlen)  # the trailing steps and this one
        window.append(ratio_units(arrays.log_mu, arrays.log_pi, arrays.mask, arrays.prompt_index))
        pooled = pooled_ratio_offset(list(window))
        metrics.update({PREFIX + "ratio_offset_window": pooled["offset"], PREFIX + "ratio_offset_z": pooled["z"],
                        PREFIX + "ratio_offset_units": pooled["units"], PREFIX + "ratio_offset_steps": float(len(window))})
        digest = None
        if record.weight_digest is not None:
            digest = {str(n): (digest_value(v) if isinstance(v, str) else int(v))
                      for n, v in record.weight_digest.items()}
        stride = record.digest_stride if record.digest_stride is not None else getattr(record.weight_digest, "stride", 1)
        stride = int(stride)
        if stride < 1:
            raise ValueError(f"digest_stride={stride}: 1 (every value checksummed) or the sampling stride (> 1)")
        # a digest sampled at another stride than the previous one says nothing about a change
        comparable = self._digest_stride == stride
        changed = digest_change(self._digest, digest) if comparable else float("nan")
        synced = tv if record.weight_version is None else int(record.weight_version)
        # a new sync (a newer version) whose digest is the previous sync's: the weights did not move
        stepped = (digest is not None and comparable and self._digest_version is not None
                   and synced > self._digest_version)
        metrics[PREFIX + "weights_changed_share"] = changed
        alarms = step_alarms(k, arrays, metrics, history=list(self._history), weights_changed=changed,
                             trainer_stepped=stepped, digest_stride=stride, d=d)
        levels = np.zeros(len(self.alarm_names), np.int8)
        values = np.full(len(self.alarm_names), np.nan)
        for a in alarms:
            i = self.alarm_names.index(a.code)
            levels[i], values[i] = LEVELS[a.level], a.value
        for code, lvl in zip(self.alarm_names, levels):
            metrics[f"{PREFIX}alarm/{code}"] = float(lvl)
        for name in metrics:
            if name not in self.metric_names:
                self.metric_names.append(name)
        row = np.array([metrics.get(n, np.nan) for n in self.metric_names], float)
        if digest:
            self.tensor_names.extend(n for n in digest if n not in set(self.tensor_names))
        now = time.time()
        rows.update({
            "step_index": ((), k if record.step is None else int(record.step)),
            "trainer_version": ((), tv),
            "weight_version": ((), -1 if record.weight_version is None else int(record.weight_version)),
            "n_sequences": ((), arrays.mask.shape[0]),
            "wall_time": ((), now),
            "step_seconds": ((), np.nan if self._last_call is None else t0 - self._last_call),
            "metric_value": (("metric",), row),
            "alarm_level": (("alarm",), levels),
            "alarm_value": (("alarm",), values),
        })
        if digest:
            rows["weight_digest"] = (("tensor",), np.array([digest.get(n, -1) for n in self.tensor_names], np.int64))
            rows["digest_stride"] = ((), stride)
        rows["recorder_seconds"] = ((), time.perf_counter() - t0)  # the write and commit come after: see the benchmark
        columns = {"metric": list(self.metric_names), "alarm": list(self.alarm_names), "tensor": list(self.tensor_names)}
        if self._background is not None:
            self._background.submit(rows, columns)
        else:
            self.writer.write_step(rows)
            self.writer.commit(**columns)
        self._next = k + 1
        self._last_call = t0
        gap = metrics.get(PREFIX + "abs_log_ratio_mean", np.nan)
        if np.isfinite(gap):
            self._history.append(float(gap))
        if digest is not None:
            self._digest, self._digest_version, self._digest_stride = digest, synced, stride
        self._ratio = window
        out = StepMetrics(metrics, alarms, k)
        stop = self.settings.stop_on
        if stop is not None:
            hit = [a for a in alarms if LEVELS[a.level] >= LEVELS[stop]]
            if hit:
                self.flush()  # the step is in the store before the run stops
                raise RunAlarmError(hit)
        return out

    def flush(self) -> None:
        """Wait until every step recorded is committed in the store.

        Raises
        ------
        StoreError
            Writing a step failed (the steps before it are committed).
        """
        if self._background is not None:
            self._background.flush()

    def close(self) -> None:
        """Commit the steps still queued and release the store (its writer lock).

        Raises
        ------
        StoreError
            Writing a step failed (the steps before it are committed).
        """
        self._finalizer()
        if self._background is not None:
            self._background.check()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Recorder", "RecorderSettings", "RunAlarmError", "StepMetrics", "StepRecord", "WeightDigest", "digest_value",
           "sample_offset", "weight_digest"]
