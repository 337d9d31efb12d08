"""The floors a trace recorded: the trainer's self-check and the engine's batch spread, read from
its attrs (metadata, no computation), and those floors beside the backend gap.

:mod:`rlparity.metrics.floors` measures floors; the summaries (:mod:`rlparity.metrics.summary`)
and the dashboards put the recorded ones beside every gap they report, so this module stands
below both. Units: nats of log-probability.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import xarray as xr

from rlparity.trace import arm_record


# the self-check's readings (rlparity.score.selfcheck): the trainer's batch vs alone, alone twice, alone with a
# second attention implementation (the kernel floor; traces scored before it was measured have none)
SELF_CHECK_FLOORS = ("batch_shape", "run_to_run", "kernel")


def recorded_floors(trace: xr.Dataset, side: str = "processed") -> dict[str, float]:
    """The floors a trace recorded (mean ``|x|`` and RMS, nats; NaN where not measured): the
    trainer's self-check (``batch_shape``: its batch vs alone; ``run_to_run``: alone twice;
    ``kernel``: alone with a second attention implementation; the latest version's for a trace
    scored per version) on the ``side`` reading, and the engine's batch spread (``engine_batch``,
    ``attrs["engine_floor"]``).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    side : {"processed", "raw"}
        The trainer reading.

    Returns
    -------
    dict[str, float]
    """
    rec = arm_record(trace)
    check = rec.scorer.self_check
    if not check:
        per = rec.scorer.self_check_per_version or {}
        check = next((v for v in per.values() if v), None)
    out = {**_self_check_floors(check, side), "engine_batch_rms": float("nan"), "engine_batch_mean_abs": float("nan")}
    eng = (rec.engine_floor or {}).get("batch_shape") or {}
    for stat in ("rms", "mean_abs"):
        if eng.get(stat) is not None:
            out[f"engine_batch_{stat}"] = float(eng[stat])
    return out


def _self_check_floors(check, side: str) -> dict[str, float]:
    """:data:`SELF_CHECK_FLOORS`' mean ``|x|`` and RMS of one self-check record (NaN where absent)."""
    out = {f"{k}_{s}": float("nan") for k in SELF_CHECK_FLOORS for s in ("rms", "mean_abs")}
    if isinstance(check, Mapping):
        for key in SELF_CHECK_FLOORS:
            v = check.get(f"{key}_{side}") or {}
            for stat in ("rms", "mean_abs"):
                if isinstance(v, Mapping) and v.get(stat) is not None:
                    out[f"{key}_{stat}"] = float(v[stat])
    return out


def version_floors(trace: xr.Dataset, side: str = "processed") -> dict[int, float]:
    """The trainer's batch-shape floor (mean ``|x|``, nats) at each policy version of a trace scored
    per version: what its self-check measured with that version's weights.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, scored per version (``attrs["trainer"]["self_check_per_version"]``).
    side : {"processed", "raw"}
        The trainer reading.

    Returns
    -------
    dict[int, float]
        ``{version: floor}`` for the versions whose self-check measured a finite floor above 0;
        empty when none was recorded.
    """
    per = arm_record(trace).scorer.self_check_per_version or {}
    out = {}
    for v, check in per.items():
        f = _self_check_floors(check, side)["batch_shape_mean_abs"]
        if np.isfinite(f) and f > 0:
            out[int(v)] = f
    return out


def floors_beside_gap(trace: xr.Dataset, gap_mean_abs: float, side: str = "processed") -> dict[str, float]:
    """The recorded floors next to the backend gap (mean ``|d|``): ``trainer_floor``,
    ``engine_floor`` (mean ``|x|``, nats) and ``trainer_floor_share`` = the trainer's floor over the
    gap, the share of the gap the trainer alone produces (NaN where not measured).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    gap_mean_abs : float
        The backend gap, mean ``|d|`` (nats).
    side : {"processed", "raw"}
        The trainer reading.

    Returns
    -------
    dict[str, float]
    """
    f = recorded_floors(trace, side)
    tf, ef = f["batch_shape_mean_abs"], f["engine_batch_mean_abs"]
    return {"trainer_floor": tf, "engine_floor": ef,
            "trainer_floor_share": tf / gap_mean_abs if gap_mean_abs and gap_mean_abs > 0 else float("nan")}


def floor_mean_abs(trace: xr.Dataset, side: str = "processed") -> float:
    """The floor of ``|d|`` (nats).

    The larger of the trainer's batch-shape floor and the engine's batch spread (mean ``|x|``),
    when the trainer is deterministic (a trainer whose logprobs move from run to run has no floor
    to speak of: that movement is a cause).

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm with the recorded floors.
    side : str, default "processed"
        The trainer reading.

    Returns
    -------
    float
        The floor; 0 when none was measured or the trainer is not deterministic.
    """
    f = recorded_floors(trace, side)
    run = f["run_to_run_rms"]
    if np.isfinite(run) and run > 0:
        return 0.0
    vals = [v for v in (f["batch_shape_mean_abs"], f["engine_batch_mean_abs"]) if np.isfinite(v)]
    return float(max(vals)) if vals else 0.0


__all__ = ["SELF_CHECK_FLOORS", "floor_mean_abs", "floors_beside_gap", "recorded_floors", "version_floors"]
