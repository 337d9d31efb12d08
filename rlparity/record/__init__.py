"""The run recorder: record a user's training run per step, per token, and watch it live.

A training loop calls :meth:`Recorder.step` once per step with what it already holds (prompt and
response ids, the engine's logprobs mu, the trainer's pi_old and pi_theta, versions, sampling,
rewards, advantages, the engine's weight digest); the step goes to one run store
(:mod:`~rlparity.record.store`: zarr, appended along ``step``, crash-safe) and its metrics and
alarms (:mod:`~rlparity.record.live`) come back for the loop's logger. :func:`open_run` opens the
store (lazily with ``chunks=``); :func:`run_record` reads its attributes as one typed record;
:func:`step_trace` turns one step into a trace for ``rlparity.diagnose``.
"""

from rlparity.record.digest import weight_digest
from rlparity.record.live import ALARMS, Alarm
from rlparity.record.recorder import Recorder, RecorderSettings, RunAlarmError, StepMetrics
from rlparity.record.run_record import RunRecord, run_record
from rlparity.record.step_record import StepRecord
from rlparity.record.store import is_run_store, open_run, step_trace

__all__ = ["ALARMS", "Alarm", "Recorder", "RecorderSettings", "RunAlarmError", "RunRecord", "StepMetrics", "StepRecord",
           "is_run_store", "open_run", "run_record", "step_trace", "weight_digest"]
