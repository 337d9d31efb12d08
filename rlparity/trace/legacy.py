"""LEGACY: the factors of arms stored before ``attrs["factors"]`` was recorded (rlparity <= 0.x
stores, the shipped examples among them).

Those stores kept an experiment's factors in per-experiment records and in the arm name:

* the LM-head matrix: ``attrs["head_experiment"]``, arm ``rollout-float32_trainer-bfloat16``;
* inflight weight updates: ``attrs["inflight"]``, arm ``keep-noclear-prefix_on``;
* an online RL run: ``attrs["rl"]`` (``profile``, ``old_policy``, ``step``), arm
  ``vllm-v1-defaults+mu@step_007``.

:func:`legacy_factors` reads them, the records first and the name only where no record says; it is
the one place in rlparity that reads factors out of an arm name. New code records factors with
:func:`rlparity.trace.with_factors` and reads them with :func:`rlparity.trace.arm_factors`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rlparity.config.settings import normalize_dtype

_HEAD = re.compile(r"^rollout-(?P<rollout>[a-z0-9]+)_trainer-(?P<trainer>[a-z0-9]+)$")
_INFLIGHT = re.compile(r"^(?P<mode>keep|wait|abort)-(?P<clear>clear|noclear)-prefix_(?P<prefix>on|off)$")
_RL_STEP = re.compile(r"^(?P<run>[A-Za-z0-9_][A-Za-z0-9_.+=,-]*)@step_(?P<step>\d+)$")


def _dtype(v: Any) -> str:
    return normalize_dtype(str(v), what="head dtype")


def legacy_factors(name: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The factors of an arm written before factors were recorded, from its attrs and name.

    The records come first; the name only where no record says.

    Parameters
    ----------
    name : str
        The arm's name (``rollout-float32_trainer-bfloat16``, ``keep-noclear-prefix_on``,
        ``vllm-v1-defaults+mu@step_007``).
    attrs : Mapping[str, Any]
        The arm's attrs (``head_experiment``, ``inflight``, ``rl`` records).

    Returns
    -------
    dict[str, Any]
        ``{"rollout_head", "trainer_head"}``, ``{"mode", "clear_cache", "prefix_caching"}`` or
        ``{"profile", "old_policy", "step"}`` (``old_policy`` ``""`` where neither record nor name
        says); ``{}`` for an arm of none of these experiments.
    """
    head = attrs.get("head_experiment")
    if isinstance(head, Mapping) and {"rollout_head", "trainer_head"} <= set(head):
        return {"rollout_head": _dtype(head["rollout_head"]), "trainer_head": _dtype(head["trainer_head"])}
    inflight = attrs.get("inflight")
    if isinstance(inflight, Mapping) and {"mode", "clear_cache", "prefix_caching"} <= set(inflight):
        return {"mode": str(inflight["mode"]), "clear_cache": bool(inflight["clear_cache"]),
                "prefix_caching": bool(inflight["prefix_caching"])}
    if m := _HEAD.match(name):
        try:
            return {"rollout_head": _dtype(m["rollout"]), "trainer_head": _dtype(m["trainer"])}
        except ValueError:
            return {}
    if m := _INFLIGHT.match(name):
        return {"mode": m["mode"], "clear_cache": m["clear"] == "clear", "prefix_caching": m["prefix"] == "on"}
    if step := legacy_run_step(name):  # the run's record refines what the name says
        rl = attrs.get("rl") if isinstance(attrs.get("rl"), Mapping) else {}
        profile, old = legacy_run_profile(step[0])
        return {"profile": str(rl.get("profile") or profile), "old_policy": str(rl.get("old_policy") or old),
                "step": step[1]}
    return {}


def legacy_run_step(name: str) -> tuple[str, int] | None:
    """The run and step of an RL step arm labelled ``<run>@step_<NNN>``.

    Parameters
    ----------
    name : str
        The arm's name.

    Returns
    -------
    tuple[str, int] or None
        ``(run, step)``; ``None`` for another name.
    """
    m = _RL_STEP.match(str(name))
    return (m["run"], int(m["step"])) if m else None


def legacy_run_profile(run: str) -> tuple[str, str]:
    """The profile and old policy of a run labelled ``<profile>`` or ``<profile>+<old_policy>``.

    Parameters
    ----------
    run : str
        The run's label.

    Returns
    -------
    tuple[str, str]
        ``(profile, old_policy)``; ``old_policy`` ``""`` where the label does not say.
    """
    profile, _, old = str(run).partition("+")
    return profile, old


__all__ = ["legacy_factors", "legacy_run_profile", "legacy_run_step"]
