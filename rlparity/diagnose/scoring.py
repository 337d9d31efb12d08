"""How often the verdict is right: the diagnosis of a fault matrix scored against its ground truth.

Each arm of a fault matrix (:mod:`rlparity.experiments.faults`) records the causes injected into it
(``attrs["faults"]["causes"]``); :func:`score_matrix` compares them with the causes the report
names (findings at WARNING or above, ``Finding.cause``) and with the arm's headline:

* per cause: **recall** (named at WARNING or above in the arms where it is present) and **false
  alarms** (named in arms where it is absent);
* per arm: **headline right** (the headline's cause is one of the arm's causes; for a clean arm,
  no problem at all), the causes missed, the causes named that are absent, and problems that name
  no cause (``(unattributed)``);
* a recipe the engine's records show did not take effect (:func:`not_injected`: no request in
  flight at the update, no stale cache hit) is left out of the arm's truth and listed; a platform
  floor is scored apart.
* a **confusion matrix** (dims ``true_cause`` x ``named_cause``): for every arm, every true cause
  (``clean`` for none) against every cause named (``(nothing)`` when none is).

The diagnosis never reads the ground truth; only this scoring does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs
from rlparity.diagnose.causes import CAUSES, FLOOR_CAUSES
from rlparity.diagnose.findings import Report

CLEAN = "clean"
NOTHING = "(nothing)"
UNATTRIBUTED = "(unattributed)"
# a finding whose cause names a class of true causes (the side unknown): right for either
EQUIVALENT = {"weights_differ": ("partial_weight_sync", "trainer_stale_weights"),
              "moe_routing_disagreement": ("trainer_bf16_router", "rollout_bf16_router")}


def truth(trace: xr.Dataset) -> tuple[str, ...] | None:
    """The causes injected into an arm of a fault matrix.

    Parameters
    ----------
    trace : xarray.Dataset
        An arm; the truth is ``attrs["faults"]["causes"]``.

    Returns
    -------
    tuple of str or None
        The causes (empty for a clean arm); ``None`` when the arm carries no ground truth.
    """
    f = trace.attrs.get("faults")
    if not isinstance(f, Mapping) or "causes" not in f:
        return None
    return tuple(str(c) for c in f["causes"])


def not_injected(trace: xr.Dataset, causes: tuple[str, ...]) -> dict[str, str]:
    """The recipes of ``causes`` that did not take effect on this capture, with why.

    Read from the engine's own records, never from the diagnosis: KV carried over an update needs a
    request in flight at the pause (on a fast GPU short requests finish before it lands), a stale
    prefix cache needs a prompt that hit it after the update. A platform floor (the engine's batch
    variance) is present on every arm of a GPU run: it is scored apart, not as an injected cause.

    Parameters
    ----------
    trace : xarray.Dataset
        An arm of a fault matrix.
    causes : tuple of str
        The causes injected into it (:func:`truth`).

    Returns
    -------
    dict of str to str
        ``{cause: why it is left out of the arm's truth}``.
    """
    from rlparity.metrics import inflight as mi

    out = {}
    recorded = "sequence" in trace.dims and "policy_version" in trace  # no token records: nothing to show
    if recorded and "kv_carried_over" in causes and not mi.carried_tokens(trace).any():
        out["kv_carried_over"] = "no request was in flight at the update: no token was sampled on older KV"
    if recorded and "stale_prefix_cache" in causes and not mi.stale_sequences(trace).any():
        out["stale_prefix_cache"] = "no prompt hit the prefix cache after the update"
    for c in causes:
        if c in FLOOR_CAUSES:
            out[c] = "a floor of the platform (the batch variance every GPU arm has), scored apart"
    return out


def _resolve(named: set[str], true: tuple[str, ...]) -> set[str]:
    """Named causes with the class-level ones mapped onto the true cause they stand for."""
    out = set()
    for c in named:
        hit = [t for t in EQUIVALENT.get(c, ()) if t in true]
        out.add(hit[0] if hit else c)
    return out


def arm_score(report: Report, arm: str, true: tuple[str, ...]) -> dict[str, Any]:
    """One arm's verdict against its causes (see the module docstring).

    Findings whose cause is a floor of the platform (:data:`rlparity.diagnose.causes.FLOOR_CAUSES`:
    the two sides' batch variance, present on every arm of a GPU run) count for recall when
    injected, are listed apart (``floors``), and are never a false alarm or a clean arm's problem.

    Parameters
    ----------
    report : Report
        The diagnosis of the matrix.
    arm : str
        The arm scored.
    true : tuple of str
        Its causes that took effect (empty for a clean arm).

    Returns
    -------
    dict
        ``arm``, ``true``, ``named``, ``headline``, ``headline_cause``, ``headline_right``,
        ``missed``, ``false``, ``unattributed`` and ``floors``.
    """
    problems = [f for f in report if f.arm == arm and f.severity.rank >= 1]
    named = _resolve({f.cause for f in problems if f.cause}, true)
    real = [f for f in problems if f.cause not in FLOOR_CAUSES or f.cause in true]
    head = report.headline(arm)
    if head is not None and head.cause in FLOOR_CAUSES and head.cause not in true:
        head = next((f for f in report._ordered() if f in real), None)
    head_cause = next(iter(_resolve({head.cause}, true))) if head is not None and head.cause else None
    unattributed = sorted({f.name for f in real if not f.cause})
    right = (not real) if not true else head_cause in true
    return {"arm": arm, "true": list(true), "named": sorted(named), "headline": head.name if head else None,
            "headline_cause": head_cause, "headline_right": bool(right),
            "missed": sorted(set(true) - named), "false": sorted(named - set(true) - set(FLOOR_CAUSES)),
            "unattributed": unattributed, "floors": sorted({f.name for f in problems if f.cause in FLOOR_CAUSES})}


def score_matrix(arms: Mapping[str, xr.Dataset], report: Report) -> xr.Dataset:
    """The scores of a fault matrix: per cause, per arm, and the confusion matrix.

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        The arms of the matrix; those with a ground truth are scored.
    report : Report
        Their diagnosis.

    Returns
    -------
    xarray.Dataset
        Dims ``cause`` (recall, false alarms, headlines), ``arm`` (headline right, missed, false,
        unattributed, floors, not injected) and ``true_cause`` x ``named_cause`` (the confusion
        matrix); the headline rates on single causes and pairs, overall recall and the clean arms'
        problems in its attrs.

    Raises
    ------
    ValueError
        If no arm carries a ground truth.
    """
    rows = []
    for name, ds in arms.items():
        t = truth(ds)
        if t is not None:
            skip = not_injected(ds, t)
            row = arm_score(report, name, tuple(c for c in t if c not in skip))
            row["not_injected"] = sorted(skip)
            rows.append(row)
    if not rows:
        raise ValueError("no arm carries a ground truth (attrs['faults']['causes']): score a fault matrix "
                         "(rlparity faults run)")
    causes = [c for c in CAUSES if any(c in r["true"] or (c in r["named"] and c not in FLOOR_CAUSES) for r in rows)]
    named_all = sorted({c for r in rows for c in r["named"]} | ({UNATTRIBUTED} if any(r["unattributed"] for r in rows)
                                                                else set()))
    true_axis = [CLEAN, *[c for c in causes if any(c in r["true"] for r in rows)]]
    named_axis = [c for c in CAUSES if c in named_all] + [c for c in named_all if c not in CAUSES] + [NOTHING]
    conf = np.zeros((len(true_axis), len(named_axis)), dtype=np.int64)
    for r in rows:
        named = list(r["named"]) + ([UNATTRIBUTED] if r["unattributed"] else [])
        for t in (r["true"] or [CLEAN]):
            for n in (named or [NOTHING]):
                conf[true_axis.index(t), named_axis.index(n)] += 1
    present = np.array([sum(c in r["true"] for r in rows) for c in causes])
    hit = np.array([sum(c in r["true"] and c in r["named"] for r in rows) for c in causes])
    false = np.array([sum(c not in r["true"] and c in r["false"] for r in rows) for c in causes])
    head_of = np.array([sum(r["headline_cause"] == c for r in rows) for c in causes])
    n_true = np.array([len(r["true"]) for r in rows])
    right = np.array([r["headline_right"] for r in rows])
    ds = xr.Dataset(
        {"n_present": ("cause", present), "n_named_when_present": ("cause", hit),
         "recall": ("cause", np.where(present > 0, hit / np.maximum(present, 1), np.nan)),
         "false_alarms": ("cause", false), "n_headline": ("cause", head_of),
         "confusion": (("true_cause", "named_cause"), conf),
         "n_true_causes": ("arm", n_true), "headline_right": ("arm", right),
         "headline": ("arm", np.array([r["headline"] or "" for r in rows], dtype=str)),
         "headline_cause": ("arm", np.array([r["headline_cause"] or "" for r in rows], dtype=str)),
         "missed": ("arm", np.array([", ".join(r["missed"]) for r in rows], dtype=str)),
         "false_named": ("arm", np.array([", ".join(r["false"]) for r in rows], dtype=str)),
         "unattributed": ("arm", np.array([", ".join(r["unattributed"]) for r in rows], dtype=str)),
         "floors": ("arm", np.array([", ".join(r["floors"]) for r in rows], dtype=str)),
         "not_injected": ("arm", np.array([", ".join(r["not_injected"]) for r in rows], dtype=str))},
        coords={"cause": causes, "arm": [r["arm"] for r in rows], "true_cause": true_axis, "named_cause": named_axis})
    ds["recall"].attrs = {"long_name": "share of the arms with the cause where a finding at WARNING or above names it"}
    ds["false_alarms"].attrs = {"long_name": "arms without the cause where a finding at WARNING or above names it"}
    ds["confusion"].attrs = {"long_name": "arms x true cause x cause named at WARNING or above (clean = no cause "
                                          "injected; (nothing) = none named)"}
    ds["headline_right"].attrs = {"long_name": "the headline's cause is a true cause (clean arm: no problem at all)"}

    def rate(sel):
        return float(right[sel].mean()) if sel.any() else float("nan")

    clean = n_true == 0
    ds.attrs = make_attrs(
        headline_right_single=rate(n_true == 1), headline_right_pairs=rate(n_true == 2),
        headline_right_all=rate(n_true > 0),
        recall_overall=float(hit.sum() / max(present.sum(), 1)), false_alarms_total=int(false.sum()),
        clean_arms=int(clean.sum()), clean_arms_with_problems=int((~right[clean]).sum()) if clean.any() else 0,
        unattributed_problems=int(sum(bool(r["unattributed"]) for r in rows)), n_arms=len(rows),
        arms_with_floor_findings=int(sum(bool(r["floors"]) for r in rows)),
        recipes_not_injected=int(sum(len(r["not_injected"]) for r in rows)),
        platforms=sorted({str((arms[r["arm"]].attrs.get("faults") or {}).get("platform")) for r in rows}))
    return ds


# what rlparity's own capture and scorer record about their settings, and a user's own run or a peer's dump
# does not give (issue 41): the diagnosis of a blind view must come from the numbers alone
ECHO_VARIABLES = ("trainer_temperature", "trainer_top_k", "trainer_top_p")
ECHO_TRAINER_ATTRS = ("settings", "head_dtype", "dtype", "training_mode", "dropout", "fp32_gemm", "weight_checksums",
                      "weight_checksums_per_version")
ECHO_ENGINE_ATTRS = ("logprobs_mode", "head_dtype")
ECHO_ATTRS = ("engine_weight_checksums",)


def blind_view(trace: xr.Dataset) -> xr.Dataset:
    """An arm as a user's own run or a peer's dump gives it: every settings echo removed.

    Removed: the trainer's sampling parameters recorded per sequence (:data:`ECHO_VARIABLES`), what
    the scorer records of its own settings (:data:`ECHO_TRAINER_ATTRS`: mode, dropout, dtypes,
    checkpoint-file checksums), the engine's recorded ``logprobs_mode`` and ``head_dtype``
    (:data:`ECHO_ENGINE_ATTRS`, requested and effective) and the engine's checkpoint-file
    checksums. Kept: every number and per-token record (logprobs, cache and version records, the
    trainer's self-check, the engine's floor) and the ground truth, which only the scoring reads.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm.

    Returns
    -------
    xarray.Dataset
        A shallow copy without the echoes (the input is unchanged).
    """
    out = trace.drop_vars([v for v in ECHO_VARIABLES if v in trace.variables])
    attrs = {k: v for k, v in trace.attrs.items() if k not in ECHO_ATTRS}
    if isinstance(attrs.get("trainer"), Mapping):
        attrs["trainer"] = {k: v for k, v in attrs["trainer"].items() if k not in ECHO_TRAINER_ATTRS}
    for key in ("engine_effective", "engine_requested"):
        if isinstance(attrs.get(key), Mapping):
            attrs[key] = {k: v for k, v in attrs[key].items() if k not in ECHO_ENGINE_ATTRS}
    out.attrs = attrs
    return out


def score_views(arms: Mapping[str, xr.Dataset], **options: Any) -> dict[str, xr.Dataset]:
    """A fault matrix scored as recorded and blind (:func:`blind_view`), side by side.

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        The arms of a fault matrix.
    **options
        Passed to :func:`rlparity.diagnose.diagnose` for both views.

    Returns
    -------
    dict of str to xarray.Dataset
        ``{"full": scores, "blind": scores}`` (:func:`score_matrix`).
    """
    from rlparity.diagnose import diagnose

    blind = {a: blind_view(t) for a, t in arms.items()}
    return {"full": score_matrix(arms, diagnose(arms, **options)),
            "blind": score_matrix(blind, diagnose(blind, **options))}


def format_scores(scores: xr.Dataset) -> str:
    """The scores as text.

    Parameters
    ----------
    scores : xarray.Dataset
        :func:`score_matrix`'s result.

    Returns
    -------
    str
        The rates, per cause recall and false alarms, and the arms whose headline is wrong or that
        miss a cause.
    """
    a = scores.attrs
    lines = [f"fault matrix: {a['n_arms']} arms; headline right: single causes {a['headline_right_single']:.0%}, "
             f"pairs {a['headline_right_pairs']:.0%}; recall {a['recall_overall']:.0%}; "
             f"false alarms {a['false_alarms_total']}; clean arms with a problem {a['clean_arms_with_problems']} of "
             f"{a['clean_arms']}; recipes that did not take effect {a['recipes_not_injected']}"]
    lines.append(f"{'cause':<26} {'present':>7} {'recall':>7} {'false':>6} {'headline':>8}")
    for c in scores["cause"].values.tolist():
        r = scores.sel(cause=c)
        lines.append(f"{c:<26} {int(r['n_present']):>7} {float(r['recall']):>7.0%} {int(r['false_alarms']):>6} "
                     f"{int(r['n_headline']):>8}")
    bad = [str(x) for x in scores["arm"].values if not bool(scores["headline_right"].sel(arm=x))
           or scores["missed"].sel(arm=x).item() or scores["false_named"].sel(arm=x).item()]
    for x in bad:
        r = scores.sel(arm=x)
        lines.append(f"  {x}: headline {r['headline'].item() or '-'} ({'right' if bool(r['headline_right']) else 'WRONG'})"
                     + (f"; missed {r['missed'].item()}" if r["missed"].item() else "")
                     + (f"; named but absent {r['false_named'].item()}" if r["false_named"].item() else "")
                     + (f"; unattributed {r['unattributed'].item()}" if r["unattributed"].item() else "")
                     + (f"; not injected {r['not_injected'].item()}" if r["not_injected"].item() else ""))
    return "\n".join(lines)


__all__ = ["CLEAN", "ECHO_ATTRS", "ECHO_ENGINE_ATTRS", "ECHO_TRAINER_ATTRS", "ECHO_VARIABLES", "EQUIVALENT", "NOTHING", "UNATTRIBUTED", "arm_score", "format_scores", "not_injected", "blind_view", "score_matrix", "score_views",
           "truth"]
