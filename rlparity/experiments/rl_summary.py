"""The RL run's numbers as plain data: the curves, the contrast between profiles and the findings of
every run's first step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import xarray as xr

def diagnose_first_steps(arms: Mapping[str, xr.Dataset]):
    """:func:`rlparity.diagnose.diagnose` of the first step of every run.

    Any other step: pick its arms from the store the same way.

    Parameters
    ----------
    arms : Mapping of str to xarray.Dataset
        The arms of an RL run's store (one per run and step).

    Returns
    -------
    Report
        The diagnosis of the arms of the earliest step.
    """
    from rlparity.diagnose import diagnose
    from rlparity.metrics.rl import run_steps

    steps = {a: step for a, (_, step) in run_steps(arms).items()}
    first = min(steps.values())
    return diagnose({a: ds for a, ds in arms.items() if steps[a] == first},
                    title=f"RL run: step {first} of every run")


def summarize(arms: Mapping[str, xr.Dataset], *, reference: str | None = None, findings: bool = True
              ) -> dict[str, Any]:
    """The RL run's numbers as plain data.

    Parameters
    ----------
    arms : Mapping of str to xarray.Dataset
        The arms of an RL run's store.
    reference : str, optional
        The profile each run is contrasted with (same ratio denominator); ``None`` means the first
        profile (:func:`rlparity.metrics.rl.profile_contrast`).
    findings : bool, default True
        Also diagnose the first step of every run (:func:`diagnose_first_steps`).

    Returns
    -------
    dict
        ``curves`` (:func:`rlparity.metrics.rl.curves_records`), ``contrast`` and, with
        ``findings``, ``findings`` and ``verdict``.
    """
    from rlparity.metrics import rl as mrl

    curves = mrl.rl_curves(arms)
    res = {"curves": mrl.curves_records(curves), "contrast": mrl.profile_contrast(curves, reference)}
    if findings:
        report = diagnose_first_steps(arms)
        res.update({"findings": report.to_dict()["findings"], "verdict": report.verdict})
    return res
