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
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.provenance import jsonable, make_attrs
from rlparity.config.settings import with_overrides
from rlparity.metrics.dashboard.traces import DASHBOARDS
from rlparity.metrics.objective import policy_variable
from rlparity.record._background import BackgroundWriter, commit_at_exit, finish_writer
from rlparity.record.digest import digest_value
from rlparity.record.live import ALARMS, LEVELS, PREFIX, Alarm, RatioWindow, digest_change, step_alarms, step_metrics
from rlparity.record.step_record import StepRecord, step_rows
from rlparity.record.store import FINISH_REASONS, RunWriter


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
        The engine's settings (recorded in the store as given, ``engine``, and what they name of the
        floor, ``engine_given``: :func:`rlparity.record.run_record.given_settings`; the doctor's
        baseline key reads it).
    dashboards : sequence of str, default all of :data:`rlparity.metrics.DASHBOARDS`
        Peers whose dashboard names the step's metrics carry.
    eps : float, optional
        The PPO clip range of ``clip_fraction``; ``None``: ``defaults().eps``.
    stop_on : {"error", "warning"} or None, default None
        Raise :class:`RunAlarmError` after a step with an alarm at this level or above (opt-in).
    attrs : Mapping[str, Any], optional
        More attributes for the store (:class:`rlparity.record.run_record.RunRecord`'s keys, typed);
        ``trainer`` (``dtype``, ``head_dtype``, ``device``) is the trainer's side of the doctor's
        baseline key, carried to every step's trace.
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
        self._ratio = RatioWindow(defaults().record.ratio_window)  # the ratio_offset alarm's trailing steps
        self._digest: dict[str, int] | None = None
        self._digest_version: int | None = None  # the version synced with the last digest
        self._digest_stride = 1  # its sampling stride
        self._last_call: float | None = None
        self._next = self.writer.steps
        if self.writer.steps:
            self._restore()
        self._background = BackgroundWriter(self.writer) if s.background else None
        # a loop that never calls close() still gets its queued steps committed at exit
        self._finalizer = weakref.finalize(self, finish_writer, self._background, self.writer)
        commit_at_exit(self)

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
            self._ratio.restore(g, self.old_var, k)
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
            Fields of :class:`~rlparity.record.step_record.StepRecord` (they replace those of ``record``).

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
            A keyword is no field of :class:`~rlparity.record.step_record.StepRecord`.
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
        rows, arrays = step_rows(record, tv, old_var=self.old_var, theta_var=self.theta_var,
                                 sampling=self.sampling)
        d = defaults()
        metrics = step_metrics(arrays, eps=d.eps if self.settings.eps is None else self.settings.eps,
                               dashboards=self.settings.dashboards)
        window, pooled = self._ratio.with_step(arrays)  # the trailing steps and this one
        metrics.update(pooled)
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
        self._ratio.keep(window)
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


__all__ = ["Recorder", "RecorderSettings", "RunAlarmError", "StepMetrics"]
