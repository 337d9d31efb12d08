"""Tables of the inference-path ablation (arms from :func:`rlparity.experiments.ablation.ablation`).

* :func:`ablation_table`: per setting, how it moves the rollout logprobs against the trainer
  (backend pair, d = log pi_old - log mu) and against the reference arm (d_ref = log mu_arm -
  log mu_reference, on the tokens both arms sampled identically);
* :func:`reference_diff` / :func:`reference_log_ratio`: one arm against the reference arm;
* :func:`batch_summary` / :func:`batch_table`: determinism by batch composition.

The plan (which knob ran, which was not applicable and why) is read from the arms' attrs, so a
store alone rebuilds every table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs
from rlparity.config.defaults import TrainerSide, defaults
from rlparity.metrics import core
from rlparity.metrics.summary import BACKEND_PAIR_D, REFERENCE_PAIR_D, summary
from rlparity.trace import arm_record, as_arms, has_trainer

REFERENCE = "reference"


def ablation_plan(arms: Mapping[str, xr.Dataset]) -> list[dict[str, Any]]:
    """The plan recorded in the arms' attrs: per knob its field, typed value, status and reason.

    Parameters
    ----------
    arms : mapping
        ``{arm: trace}`` of an ablation (:func:`rlparity.experiments.ablation.ablation`).

    Returns
    -------
    list of dict
        One entry per knob (``arm``, ``field``, ``value``, ``status``, ``reason``...).
    """
    for tr in arms.values():
        rec = arm_record(tr).ablation
        if rec:
            return list(rec["plan"])
    raise ValueError("these arms were not made by rlparity.experiments.ablation.ablation "
                     "(no 'ablation' attr); run ablation() or pass its store")


def is_ablation(arms: Mapping[str, xr.Dataset]) -> bool:
    """Whether the arms come from an ablation (an ``ablation`` attr on any arm).

    Parameters
    ----------
    arms : mapping
        ``{arm: trace}`` of an ablation (:func:`rlparity.experiments.ablation.ablation`).

    Returns
    -------
    bool
    """
    return any("ablation" in tr.attrs for tr in arms.values())


def align_with_reference(trace: xr.Dataset, reference: xr.Dataset) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """``d_ref`` per (arm sequence, position) on identically sampled tokens.

    Up to each sequence's first divergence (NaN elsewhere), and per matched pair its divergence and
    token counts. Sequences are matched by ``(prompt_index, sample_index)``.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    reference : xarray.Dataset
        The reference arm.

    Returns
    -------
    tuple
        ``d_ref`` (``(sequence, position)`` of ``trace``, nats) and one dict per matched pair
        (``first_divergence``, ``n_both``, ``n_compared``, ``identical``, ``prompt_same``).
    """
    def key(ds):
        return list(zip(ds["prompt_index"].values.tolist(), ds["sample_index"].values.tolist()))

    idx_r = {k: i for i, k in enumerate(key(reference))}
    common = [(i, idx_r[k]) for i, k in enumerate(key(trace)) if k in idx_r]
    if not common:
        raise ValueError("the arm and the reference share no (prompt_index, sample_index)")
    ta, tr_ = trace["token_id"].values, reference["token_id"].values
    la, lr = trace["rollout_logprob"].values, reference["rollout_logprob"].values
    ma, mr = trace["response_mask"].values.astype(bool), reference["response_mask"].values.astype(bool)
    pa, pr = trace["prompt_token_id"].values, reference["prompt_token_id"].values
    T = min(ta.shape[1], tr_.shape[1])
    d = np.full((ta.shape[0], T), np.nan)
    pairs = []
    for i, j in common:
        both = ma[i, :T] & mr[j, :T]
        bad = np.flatnonzero(both & (ta[i, :T] != tr_[j, :T]))
        L = int(bad[0]) if bad.size else T
        sel = both.copy()
        sel[L:] = False
        d[i, sel] = la[i, :T][sel] - lr[j, :T][sel]
        n_both = int(both.sum())
        pairs.append({"first_divergence": L, "n_both": n_both, "n_compared": int(sel.sum()),
                      "identical": not bad.size and n_both == int(ma[i].sum()) == int(mr[j].sum()),
                      "prompt_same": pa.shape == pr.shape and np.array_equal(pa[i], pr[j])})
    return d, pairs


def reference_log_ratio(trace: xr.Dataset, reference: xr.Dataset) -> np.ndarray:
    """``d_ref = log mu_arm - log mu_reference`` (nats) per (sequence, position) of ``trace``.

    On the tokens both arms sampled identically up to the first divergence; NaN elsewhere.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    reference : xarray.Dataset
        The reference arm.

    Returns
    -------
    numpy.ndarray
        ``(sequence, position)`` of ``trace``.
    """
    return align_with_reference(trace, reference)[0]


def reference_diff(trace: xr.Dataset, reference: xr.Dataset) -> dict[str, Any]:
    """Rollout logprobs of ``trace`` against the reference arm on identically sampled tokens.

    Sequences are matched by ``(prompt_index, sample_index)``; per sequence the comparison runs
    up to the first position where the sampled token ids differ (after it the two arms condition
    on different text). ``d_ref = log mu_arm - log mu_reference`` (nats).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    reference : xarray.Dataset
        The reference arm.

    Returns
    -------
    dict
        ``abs_log_ratio_mean``, ``abs_log_ratio_max``, ``mean_ratio``, ``bitwise_equal_share``,
        ``identical_sequences``, ``first_divergence_mean``, ``compared_token_share``,
        ``n_sequences``, ``prompts_identical``.
    """
    d, pairs = align_with_reference(trace, reference)
    d = d[np.isfinite(d)]
    n = len(pairs)
    first_div = [p["first_divergence"] for p in pairs if not p["identical"]]
    total = sum(p["n_both"] for p in pairs)
    return {
        "abs_log_ratio_mean": float(np.abs(d).mean()) if d.size else float("nan"),
        "abs_log_ratio_max": float(np.abs(d).max()) if d.size else float("nan"),
        "mean_ratio": float(np.exp(d).mean()) if d.size else float("nan"),
        "bitwise_equal_share": float((d == 0).mean()) if d.size else float("nan"),
        "identical_sequences": sum(p["identical"] for p in pairs) / n,
        "first_divergence_mean": float(np.mean(first_div)) if first_div else float("nan"),
        "compared_token_share": sum(p["n_compared"] for p in pairs) / total if total else float("nan"),
        "n_sequences": n,
        "prompts_identical": sum(p["prompt_same"] for p in pairs) / n,
    }


TABLE_VARIABLES = {
    "trainer_abs_log_ratio_mean": "mean |d| vs trainer (d = log pi_old - log mu)",
    "trainer_mean_ratio": "mean pi_old/mu vs trainer",
    "trainer_abs_log_ratio_max": "max |d| vs trainer",
    "reference_abs_log_ratio_mean": "mean |d_ref| vs reference arm (d_ref = log mu_arm - log mu_ref)",
    "reference_mean_ratio": "mean mu_arm/mu_ref on identically sampled tokens",
    "reference_abs_log_ratio_max": "max |d_ref| vs reference arm",
    "reference_identical_sequences": "share of sequences with the reference's exact tokens",
    "reference_first_divergence_mean": "mean position of the first token that differs from the reference",
    "reference_bitwise_equal_share": "share of compared tokens with bitwise-equal logprobs",
    "cached_prompt_token_share": "share of prompt tokens served from the prefix cache",
    "batch_distinct_outputs": "distinct greedy outputs of one prompt over batch sizes",
    "batch_logprob_spread": "max over positions of (max - min) greedy logprob over batch sizes",
}


def reference_arm(arms: Mapping[str, xr.Dataset], reference: str | None = None) -> str:
    """The name of the arm others are compared with; an error if absent.

    Parameters
    ----------
    arms : mapping
        ``{arm: trace}`` of an ablation (:func:`rlparity.experiments.ablation.ablation`).
    reference : str, optional
        The arm's name (default ``"reference"``).

    Returns
    -------
    str
    """
    reference = reference or REFERENCE
    if reference not in arms:
        raise ValueError(f"no {reference!r} arm in the store (arms: {', '.join(arms)})")
    return reference


def ablation_table(data, *, trainer: TrainerSide | None = None, reference: str | None = None) -> xr.Dataset:
    """Per setting: how the arm moves the logprobs vs the trainer and vs the reference arm.

    Per setting (dim ``setting``, the reference first): status, field, value, and how the arm
    moves the logprobs vs the trainer and vs the ``reference`` arm (default: the store's
    ``reference`` arm); not-applicable knobs keep their row with NaN metrics and the reason. A row
    is a function of a whole arm (matched against the reference's sequences), so there is no ``dim=``;
    per position see :func:`reference_gap_by_position`, per token of one arm
    :func:`rlparity.metrics.summary` with ``dim=``.

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path of an ablation.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    reference : str, optional
        The reference arm (default ``"reference"``).

    Returns
    -------
    xarray.Dataset
        Dim ``setting``: the plan's text columns and :data:`TABLE_VARIABLES`.
    """
    arms = as_arms(data)
    plan = ablation_plan(arms)
    reference = reference_arm(arms, reference)
    ref = arms[reference]
    rows = []
    for entry in plan:
        row = {"setting": entry["arm"], "status": entry["status"], "field": entry.get("field", ""),
               "value": str(entry.get("value", "")), "reference_value": str(entry.get("reference_value", "")),
               "reason": entry.get("reason", "")}
        tr = arms.get(entry["arm"]) if entry["status"] == "ran" else None
        nums = dict.fromkeys(TABLE_VARIABLES, np.nan)
        if tr is not None:
            if has_trainer(tr):
                s = summary(tr, trainer)  # type: ignore[arg-type]
                nums["trainer_abs_log_ratio_mean"] = float(s["abs_log_ratio_mean"])
                nums["trainer_mean_ratio"] = float(s["mean_ratio"])
                nums["trainer_abs_log_ratio_max"] = float(s["abs_log_ratio_max"])
            cached = tr["cached_prompt_tokens"].values if "cached_prompt_tokens" in tr else np.array([-1])
            if (cached >= 0).all():
                nums["cached_prompt_token_share"] = float(cached.sum() / max(int(tr["prompt_length"].sum()), 1))
            r = reference_diff(tr, ref)
            for k in ("abs_log_ratio_mean", "mean_ratio", "abs_log_ratio_max", "identical_sequences",
                      "first_divergence_mean", "bitwise_equal_share"):
                nums[f"reference_{k}"] = r[k]
            if "batch_token_id" in tr:
                b = batch_summary(tr)
                nums["batch_distinct_outputs"] = b["distinct_outputs"]
                nums["batch_logprob_spread"] = b["logprob_spread"]
        rows.append({**row, **nums})
    settings = [r["setting"] for r in rows]
    out = xr.Dataset(coords={"setting": settings})
    for k in ("status", "field", "value", "reference_value", "reason"):
        out[k] = ("setting", np.array([r[k] for r in rows], dtype=object).astype(str))
    for k, desc in TABLE_VARIABLES.items():
        out[k] = ("setting", np.array([r[k] for r in rows], dtype=float))
        out[k].attrs["long_name"] = desc
        if "log_ratio" in k or k.endswith("spread"):
            out[k].attrs["units"] = "nats"
    out.attrs = make_attrs(kind="ablation_table", trainer=trainer or defaults().trainer, reference=reference,
                           pair_trainer=BACKEND_PAIR_D, pair_reference=REFERENCE_PAIR_D)
    return out


def reference_gap_by_position(data, *, reference: str | None = None) -> xr.Dataset:
    """Mean ``|d_ref|`` (nats) per response position for every arm against the reference arm.

    On the tokens both sampled identically; NaN where no token was compared.

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path of an ablation.
    reference : str, optional
        The reference arm (default ``"reference"``).

    Returns
    -------
    xarray.Dataset
        ``reference_abs_log_ratio_mean``, dims ``(setting, position)``.
    """
    arms = as_arms(data)
    reference = reference_arm(arms, reference)
    rows = {}
    for name, tr in arms.items():
        if name == reference:
            continue
        d = reference_log_ratio(tr, arms[reference])
        rows[name] = xr.DataArray(core.masked_mean(np.abs(d), np.isfinite(d), axis=0), dims="position",
                                  coords={"position": np.arange(d.shape[1])})
    if not rows:
        raise ValueError("no arm besides the reference to compare")
    out = xr.concat(list(rows.values()), dim=xr.DataArray(list(rows), dims="setting", name="setting"), join="outer")
    ds = out.to_dataset(name="reference_abs_log_ratio_mean")
    ds["reference_abs_log_ratio_mean"].attrs = {"units": "nats", "long_name": "mean |d_ref| at the position"}
    ds.attrs = make_attrs(reference=reference, pair_reference=REFERENCE_PAIR_D)
    return ds


def batch_summary(trace: xr.Dataset) -> dict[str, Any]:
    """Distinct greedy outputs over batch sizes and the logprob spread on the common prefix.

    A probe of one prompt over batch sizes is a property of the whole arm (no ``dim=``).

    Parameters
    ----------
    trace : xarray.Dataset
        An arm with ``batch_token_id`` and ``batch_logprob`` (``ablation(..., batch=BatchProbe(...))``).

    Returns
    -------
    dict
        ``distinct_outputs``, ``common_prefix``, ``logprob_spread`` (nats), ``batch_sizes``.
    """
    tok = trace["batch_token_id"].values
    lp = trace["batch_logprob"].values
    distinct = len({tuple(r.tolist()) for r in tok})
    same = np.all(tok == tok[:1], axis=0)
    L = int(np.argmin(same)) if not same.all() else tok.shape[1]
    spread = lp[:, :L].max(axis=0) - lp[:, :L].min(axis=0) if L else np.zeros(0)
    spread = spread[np.isfinite(spread)]
    return {"distinct_outputs": distinct, "common_prefix": L,
            "logprob_spread": float(spread.max()) if spread.size else 0.0,
            "batch_sizes": trace["batch_size"].values.tolist()}


def batch_table(data) -> xr.Dataset:
    """Per setting that ran: distinct greedy outputs, common prefix length, logprob spread.

    A table of whole-arm probes (no ``dim=``).

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path of an ablation.

    Returns
    -------
    xarray.Dataset
        Dim ``setting``: ``distinct_outputs``, ``common_prefix``, ``logprob_spread``.
    """
    arms = as_arms(data)
    rows = {k: batch_summary(v) for k, v in arms.items() if "batch_token_id" in v}
    if not rows:
        raise ValueError("no arm has batch-composition data (run ablation(..., batch=BatchProbe(...)))")
    names = list(rows)
    out = xr.Dataset(
        {"distinct_outputs": ("setting", [rows[k]["distinct_outputs"] for k in names]),
         "common_prefix": ("setting", [rows[k]["common_prefix"] for k in names]),
         "logprob_spread": ("setting", [rows[k]["logprob_spread"] for k in names], {"units": "nats"})},
        coords={"setting": names})
    out.attrs = make_attrs(kind="batch_composition_table",
                           batch_sizes=next(iter(rows.values()))["batch_sizes"])
    return out


__all__ = ["REFERENCE", "TABLE_VARIABLES", "ablation_plan", "ablation_table", "align_with_reference", "batch_summary",
           "batch_table", "is_ablation", "reference_arm", "reference_diff", "reference_gap_by_position", "reference_log_ratio"]
