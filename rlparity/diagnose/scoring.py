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
from rlparity.diagnose.report import Report
from rlparity.trace import arm_record

CLEAN = "clean"
NOTHING = "(nothing)"
UNATTRIBUTED = "(unattributed)"
# the per-arm columns of a fault-matrix result file (faults.json: the CLI, scripts/gpu_matrices.py)
ARM_RESULT_COLUMNS = ("headline", "headline_cause", "headline_right", "missed", "false_named", "unattributed")
# a finding whose cause names a class of true causes (the side unknown): right for either
EQUIVALENT = {"weights_differ": ("partial_weight_sync", "trainer_stale_weights"),
              "bf16_head_rounding": ("rollout_bf16_head", "trainer_bf16_head"),
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
    f = arm_record(trace).faults
    if f is None or "causes" not in f:
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


# causes that change one side's reading only, and the reading they change: their effect is measured against
# the clean arm's reading of the same tokens (same prompts and seeds), a record the diagnosis of the arm never reads
READING_OF = {"trainer_top_k": "trainer_processed_logprob", "trainer_temperature": "trainer_processed_logprob",
              "trainer_bf16_head": "trainer_processed_logprob", "rollout_bf16_head": "rollout_logprob",
              "raw_logprobs": "rollout_logprob"}
TIE_SHARE = 0.1  # two causes whose single arms' excess mean |d| are within 10% of the larger: a tie
# a one-side cause that moved its reading by under a thousandth of the clean arm's mean |d| took no effect either,
# whatever the floors: on the CPU matrices the floors are ~5e-7 nats (a hundredth of that is no bar) and a trainer
# that skips the engine's top-k 20 moves its reading by 4e-8 to 3e-6 nats against gaps of 0.014-0.031 (at most
# 2.3e-4 of the gap) where the cut removes no mass, and by 0.0023-0.025 nats (0.11-1.8 of the gap) where it does.
# Chosen on CPU seeds 0-4 (largest idle share 1.7e-4, smallest real one 0.11); seeds 5-9 held out (issue 41)
NO_EFFECT_GAP_SHARE = 1e-3


def _clean_arm(arms: Mapping[str, xr.Dataset]) -> xr.Dataset | None:
    return next((ds for ds in arms.values() if truth(ds) == ()), None)


def _mean_abs_d(ds: xr.Dataset) -> float:
    from rlparity.metrics import core, log_ratio

    if "trainer_processed_logprob" not in ds:
        return float("nan")
    return float(core.masked_mean(np.abs(log_ratio(ds, "processed").values), ds["response_mask"].values.astype(bool)))


def reading_effect(arm: xr.Dataset, clean: xr.Dataset, cause: str) -> float | None:
    """How far a one-side cause moved that side's reading: mean ``|reading - clean arm's|`` (nats).

    Over the tokens both arms sampled alike (same sequence, position and token id). ``None`` when the
    cause has no single reading (:data:`READING_OF`) or the arms share no token.

    Parameters
    ----------
    arm, clean : xarray.Dataset
        An arm of a fault matrix and the matrix's clean arm.
    cause : str
        One cause injected into ``arm``.

    Returns
    -------
    float or None
        The mean absolute change (nats).
    """
    var = READING_OF.get(cause)
    if var is None or var not in arm or var not in clean or arm["token_id"].shape != clean["token_id"].shape:
        return None
    same = (arm["response_mask"].values & clean["response_mask"].values
            & (arm["token_id"].values == clean["token_id"].values))
    a, b = arm[var].values.astype(float), clean[var].values.astype(float)
    ok = same & np.isfinite(a) & np.isfinite(b)
    return float(np.mean(np.abs(a[ok] - b[ok]))) if ok.any() else None


def no_effect(arms: Mapping[str, xr.Dataset]) -> dict[str, dict[str, str]]:
    """Per arm, the one-side causes whose recipe moved no number: ``{arm: {cause: why}}``.

    A cause of :data:`READING_OF` took no effect when it moved its side's reading by less than a
    hundredth of that side's own floor against the clean arm (:func:`reading_effect`), or by less
    than :data:`NO_EFFECT_GAP_SHARE` of the clean arm's mean ``|d|`` (where the floors are at
    float32's rounding, as on CPU), e.g. a trainer that skips a top-k cut the engine applies where
    the cut removes e^-6 of the mass.
    Measured on records the diagnosis of the arm never reads (the clean arm); only arms whose other
    causes leave that reading alone are checked.

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        The arms of a fault matrix.

    Returns
    -------
    dict
        ``{arm: {cause: why it is left out}}``; empty without a clean arm.
    """
    from rlparity.metrics.floor_records import floor_mean_abs, recorded_floors

    clean = _clean_arm(arms)
    if clean is None:
        return {}
    out: dict[str, dict[str, str]] = {}
    gap = _mean_abs_d(clean)
    for name, ds in arms.items():
        t = truth(ds) or ()
        for c in t:
            var = READING_OF.get(c)
            if var is None or any(READING_OF.get(o) == var for o in t if o != c):
                continue
            eff = reading_effect(ds, clean, c)
            floor = (floor_mean_abs(clean) if var != "rollout_logprob"
                     else recorded_floors(clean)["engine_batch_mean_abs"])
            if eff is None:
                continue
            if np.isfinite(floor) and floor > 0 and eff < 0.01 * floor:
                out.setdefault(name, {})[c] = (f"moved the {var} of the clean arm's tokens by {eff:.2g} nats on average, "
                                               f"under a hundredth of that side's floor ({floor:.2g}): nothing to find")
            elif np.isfinite(gap) and gap > 0 and eff < NO_EFFECT_GAP_SHARE * gap:
                out.setdefault(name, {})[c] = (f"moved the {var} of the clean arm's tokens by {eff:.2g} nats on average, "
                                               f"under {NO_EFFECT_GAP_SHARE:g} of the clean arm's mean |d| ({gap:.2g}): "
                                               "nothing to find")
    return out


def dominance(arms: Mapping[str, xr.Dataset]) -> dict[str, dict[str, Any]]:
    """Per pair arm, which cause explains most, from the matrix's single-cause arms.

    The cause whose single arm has the larger excess mean ``|d|`` over the clean arm dominates; within
    :data:`TIE_SHARE` of the larger it is a tie (either headline counts). Read from other arms, never
    from the pair's own diagnosis.

    Parameters
    ----------
    arms : mapping of str to xarray.Dataset
        The arms of a fault matrix.

    Returns
    -------
    dict
        ``{pair arm: {"excess": {cause: nats}, "dominant": cause or None, "tie": bool}}`` for the pairs
        whose two single arms and a clean arm are in the matrix.
    """
    clean = _clean_arm(arms)
    if clean is None:
        return {}
    base = _mean_abs_d(clean)
    singles = {truth(ds)[0]: _mean_abs_d(ds) - base for ds in arms.values() if truth(ds) is not None
               and len(truth(ds)) == 1}
    out = {}
    for name, ds in arms.items():
        t = truth(ds)
        if t is None or len(t) != 2 or not all(c in singles and np.isfinite(singles[c]) for c in t):
            continue
        ex = {c: float(singles[c]) for c in t}
        big, small = sorted(t, key=lambda c: -ex[c])
        tie = ex[big] <= 0 or (ex[big] - ex[small]) <= TIE_SHARE * abs(ex[big])
        out[name] = {"excess": ex, "dominant": None if tie else big, "tie": bool(tie)}
    return out


def _resolve(named: set[str], true: tuple[str, ...]) -> set[str]:
    """Named causes with the class-level ones mapped onto the true cause they stand for."""
    out = set()
    for c in named:
        hit = [t for t in EQUIVALENT.get(c, ()) if t in true]
        out.add(hit[0] if hit else c)
    return out


def arm_score(report: Report, arm: str, true: tuple[str, ...], excluded: tuple[str, ...] = ()) -> dict[str, Any]:
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
    excluded : tuple of str, default ()
        Causes injected into it that took no effect (:func:`not_injected`, :func:`no_effect`): a finding
        naming one is listed apart like a floor, neither right nor a false alarm.

    Returns
    -------
    dict
        ``arm``, ``true``, ``named``, ``headline``, ``headline_cause``, ``headline_right``,
        ``missed``, ``false``, ``unattributed`` and ``floors``.
    """
    problems = [f for f in report if f.arm == arm and f.severity.rank >= 1]
    named = _resolve({f.cause for f in problems if f.cause}, true)
    apart = set(FLOOR_CAUSES) | set(excluded)
    real = [f for f in problems if f.cause not in apart or f.cause in true]
    head = report.headline(arm)
    if head is not None and head.cause in apart and head.cause not in true:
        head = next((f for f in report._ordered() if f in real), None)
    head_cause = next(iter(_resolve({head.cause}, true))) if head is not None and head.cause else None
    unattributed = sorted({f.name for f in real if not f.cause})
    right = (not real) if not true else head_cause in true
    return {"arm": arm, "true": list(true), "named": sorted(named), "headline": head.name if head else None,
            "headline_cause": head_cause, "headline_right": bool(right),
            "missed": sorted(set(true) - named), "false": sorted(named - set(true) - apart),
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
    rows, every = _score_rows(arms, report)
    if not rows:
        raise ValueError("no arm carries a ground truth (attrs['faults']['causes']): score a fault matrix "
                         "(rlparity experiment faults)")
    causes = [c for c in CAUSES if any(c in r["true"] or (c in r["named"] and c not in FLOOR_CAUSES) for r in rows)]
    true_axis, named_axis, conf = _confusion(rows, causes)
    counts = _cause_counts(rows, causes)
    n_true = np.array([len(r["true"]) for r in rows])
    right = np.array([r["headline_right"] for r in rows])
    ds = _score_dataset(rows, causes, true_axis, named_axis, conf, counts, n_true, right)
    ds.attrs = make_attrs(**_score_attrs(arms, rows, every, counts, n_true, right))
    return ds


def _score_rows(arms: Mapping[str, xr.Dataset], report: Report) -> tuple[list[dict], list[dict]]:
    """The :func:`arm_score` of every arm with a ground truth: with the causes not injected or without
    effect left out (and the dominant cause of a pair), and against every injected cause."""
    rows, every = [], []
    idle = no_effect(arms)
    dom = dominance(arms)
    for name, ds in arms.items():
        t = truth(ds)
        if t is not None:
            skip = {**not_injected(ds, t), **idle.get(name, {})}
            row = arm_score(report, name, tuple(c for c in t if c not in skip), excluded=tuple(skip))
            row["not_injected"] = sorted(skip)
            d = dom.get(name)
            row["dominant"] = ("(tie)" if d["tie"] else d["dominant"]) if d else ""
            row["headline_dominant"] = (row["headline_cause"] in t if d["tie"] else row["headline_cause"] == d["dominant"]
                                        ) if d else None
            rows.append(row)
            every.append(arm_score(report, name, tuple(t)))
    return rows, every


def _confusion(rows: list[dict], causes: list[str]) -> tuple[list[str], list[str], np.ndarray]:
    """The confusion matrix's axes (true causes with ``clean``; named causes with ``(unattributed)``
    and ``(nothing)``) and its counts of arms."""
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
    return true_axis, named_axis, conf


def _cause_counts(rows: list[dict], causes: list[str]) -> dict[str, np.ndarray]:
    """Per cause, the arms it is present in, named when present, named falsely, and headlined."""
    return {"present": np.array([sum(c in r["true"] for r in rows) for c in causes]),
            "hit": np.array([sum(c in r["true"] and c in r["named"] for r in rows) for c in causes]),
            "false": np.array([sum(c not in r["true"] and c in r["false"] for r in rows) for c in causes]),
            "head_of": np.array([sum(r["headline_cause"] == c for r in rows) for c in causes])}


def _score_dataset(rows: list[dict], causes: list[str], true_axis: list[str], named_axis: list[str],
                   conf: np.ndarray, counts: dict[str, np.ndarray], n_true: np.ndarray,
                   right: np.ndarray) -> xr.Dataset:
    """The variables of :func:`score_matrix` (per cause, per arm, the confusion matrix), attrs of
    the variables included."""
    present, hit = counts["present"], counts["hit"]
    ds = xr.Dataset(
        {"n_present": ("cause", present), "n_named_when_present": ("cause", hit),
         "recall": ("cause", np.where(present > 0, hit / np.maximum(present, 1), np.nan)),
         "false_alarms": ("cause", counts["false"]), "n_headline": ("cause", counts["head_of"]),
         "confusion": (("true_cause", "named_cause"), conf),
         "n_true_causes": ("arm", n_true), "headline_right": ("arm", right),
         "headline": ("arm", np.array([r["headline"] or "" for r in rows], dtype=str)),
         "headline_cause": ("arm", np.array([r["headline_cause"] or "" for r in rows], dtype=str)),
         "missed": ("arm", np.array([", ".join(r["missed"]) for r in rows], dtype=str)),
         "false_named": ("arm", np.array([", ".join(r["false"]) for r in rows], dtype=str)),
         "unattributed": ("arm", np.array([", ".join(r["unattributed"]) for r in rows], dtype=str)),
         "floors": ("arm", np.array([", ".join(r["floors"]) for r in rows], dtype=str)),
         "not_injected": ("arm", np.array([", ".join(r["not_injected"]) for r in rows], dtype=str)),
         "dominant_cause": ("arm", np.array([r["dominant"] for r in rows], dtype=str))},
        coords={"cause": causes, "arm": [r["arm"] for r in rows], "true_cause": true_axis, "named_cause": named_axis})
    ds["recall"].attrs = {"long_name": "share of the arms with the cause where a finding at WARNING or above names it"}
    ds["false_alarms"].attrs = {"long_name": "arms without the cause where a finding at WARNING or above names it"}
    ds["confusion"].attrs = {"long_name": "arms x true cause x cause named at WARNING or above (clean = no cause "
                                          "injected; (nothing) = none named)"}
    ds["headline_right"].attrs = {"long_name": "the headline's cause is a true cause (clean arm: no problem at all)"}
    return ds


def _score_attrs(arms: Mapping[str, xr.Dataset], rows: list[dict], every: list[dict], counts: dict[str, np.ndarray],
                 n_true: np.ndarray, right: np.ndarray) -> dict:
    """The summary of :func:`score_matrix` (its attrs): headline rates on single causes and pairs,
    overall recall, false alarms, the clean arms' problems, and the same against every cause."""

    def rate(sel, right=right):
        return float(right[sel].mean()) if sel.any() else float("nan")

    hit, present, false = counts["hit"], counts["present"], counts["false"]
    # the same report scored against every injected cause, nothing left out (issue 41: every score with and
    # without exclusions)
    n_all = np.array([len(r["true"]) for r in every])
    right_all = np.array([r["headline_right"] for r in every])
    present_all = sum(len(r["true"]) for r in every)
    hit_all = sum(len(set(r["true"]) & set(r["named"])) for r in every)
    decided = [r for r in rows if r["headline_dominant"] is not None]
    clean = n_true == 0
    return dict(
        headline_right_single=rate(n_true == 1), headline_right_pairs=rate(n_true == 2),
        headline_right_all=rate(n_true > 0),
        recall_overall=float(hit.sum() / max(present.sum(), 1)), false_alarms_total=int(false.sum()),
        clean_arms=int(clean.sum()), clean_arms_with_problems=int((~right[clean]).sum()) if clean.any() else 0,
        unattributed_problems=int(sum(bool(r["unattributed"]) for r in rows)), n_arms=len(rows),
        arms_with_floor_findings=int(sum(bool(r["floors"]) for r in rows)),
        # a floor finding at WARNING on an arm where nothing was injected: never a false alarm above, but a
        # warning a user at parity would read (issue 41)
        clean_arms_with_floor_warnings=int(sum(bool(r["floors"]) for r in rows if not r["true"])),
        recipes_not_injected=int(sum(len(r["not_injected"]) for r in rows)),
        every_cause_headline_right_single=rate(n_all == 1, right_all),
        every_cause_headline_right_pairs=rate(n_all == 2, right_all),
        every_cause_recall=float(hit_all / max(present_all, 1)),
        pairs_with_dominance=len(decided), dominance_ties=int(sum(r["dominant"] == "(tie)" for r in decided)),
        dominance_agreement=(float(np.mean([r["headline_dominant"] for r in decided])) if decided else float("nan")),
        platforms=sorted({str((arm_record(arms[r["arm"]]).faults or {}).get("platform")) for r in rows}))


# what rlparity's own capture and scorer record about their settings, and a user's own run or a peer's dump
# does not give (issue 41): the diagnosis of a blind view must come from the numbers alone
ECHO_VARIABLES = ("trainer_temperature", "trainer_top_k", "trainer_top_p")
ECHO_TRAINER_ATTRS = ("settings", "head_dtype", "dtype", "training_mode", "dropout", "fp32_gemm", "weight_checksums",
                      "weight_checksums_per_version", "shape")
# what a weight-update record names of the checkpoint it loaded (a fault's folder name can say what was done)
ECHO_UPDATE_FIELDS = ("source",)
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
    Also removed: the scorer's batch shape record (it can carry the head's and the body's dtype) and
    the checkpoint path of each weight update (:data:`ECHO_UPDATE_FIELDS`: a fault's folder name).

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
    if isinstance(attrs.get("weight_updates"), list):
        attrs["weight_updates"] = [{k: v for k, v in u.items() if k not in ECHO_UPDATE_FIELDS}
                                   if isinstance(u, Mapping) else u for u in attrs["weight_updates"]]
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
             f"{a['clean_arms']} (with a floor warning {a.get('clean_arms_with_floor_warnings', 0)}); recipes that did "
             f"not take effect {a['recipes_not_injected']}",
             f"counting every injected cause: single {a['every_cause_headline_right_single']:.0%}, pairs "
             f"{a['every_cause_headline_right_pairs']:.0%}, recall {a['every_cause_recall']:.0%}; the headline names the "
             f"dominant cause on {a['dominance_agreement']:.0%} of {a['pairs_with_dominance']} pairs "
             f"({a['dominance_ties']} ties)"]
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


__all__ = ["ARM_RESULT_COLUMNS", "CLEAN", "NO_EFFECT_GAP_SHARE", "READING_OF", "TIE_SHARE", "dominance", "no_effect", "reading_effect", "ECHO_ATTRS", "ECHO_ENGINE_ATTRS", "ECHO_TRAINER_ATTRS", "ECHO_VARIABLES", "EQUIVALENT", "NOTHING", "UNATTRIBUTED", "arm_score", "format_scores", "not_injected", "blind_view", "score_matrix", "score_views",
           "truth"]
