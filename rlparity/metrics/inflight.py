"""Inflight weight updates: policy lag, stale prefix-cache hits and their tables.

Per token, ``policy_version`` is the version of the weights that sampled it (see
:class:`rlparity.capture.AsyncEngine`); per sequence, ``prefix_cache_stale`` says its prompt hit a
prefix cache that may hold KV computed by other weights, ``submit_time`` / ``token_time`` place it
in time, and ``attrs["weight_updates"]`` lists the updates (mode, cache reset, times).

* Lag (numpy core :func:`rlparity.metrics.core.lag.token_lag` / :func:`~rlparity.metrics.core.lag.lag_stats`,
  xarray :func:`lag`, :func:`lag_summary` with ``dim=``): latest version minus token version, as
  PipelineRL logs it; per sequence its max and mean; the share of tokens with lag > 0.
* Token groups: :func:`clean_tokens` (computed entirely by the weights that sampled them: the
  noise floor), :func:`carried_tokens` (sampled after an update that kept the in-flight KV of the
  old weights), :func:`stale_sequences`.
* :func:`stale_evidence`: d on stale sequences vs the noise floor (what the stale-cache finding
  reports); :func:`inflight_table`, :func:`gap_by_update_time`, :func:`lag_histogram`: the tables
  of the inflight matrix (:func:`rlparity.experiments.inflight.inflight_matrix`).

d is the backend pair's ``d = log pi_old - log mu`` (nats), with pi_old read per token at the token's
own version when the trace was scored by :func:`rlparity.score.score_versions`; ``d_latest`` uses
the latest weights for every token (``trainer_latest_*``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide
from rlparity.metrics import core
from rlparity.metrics.summary import log_ratio, pair_attrs, reduce, trainer_variable
from rlparity.trace import arm_factors, arm_record, as_arms, latest_version

PAUSE_MODES = ("keep", "wait", "abort")
LATEST_VARIABLE = {"processed": "trainer_latest_processed_logprob", "raw": "trainer_latest_logprob"}
CELL_FACTORS = ("mode", "clear_cache", "prefix_caching")


# ------------------------------------------------------------------------------ arms
def arm_name(mode: str, clear_cache: bool, prefix_caching: bool) -> str:
    """``keep-noclear-prefix_on``: the arm of one cell (pause mode, cache cleared at the update,
    prefix caching on the engine).

    Parameters
    ----------
    mode : {"keep", "wait", "abort"}
        The pause mode of the update.
    clear_cache : bool
        Whether the prefix cache is reset at the update.
    prefix_caching : bool
        Whether the engine caches prefixes.

    Returns
    -------
    str
    """
    if mode not in PAUSE_MODES:
        raise ValueError(f"pause mode {mode!r}: use one of {', '.join(PAUSE_MODES)}")
    return f"{mode}-{'clear' if clear_cache else 'noclear'}-prefix_{'on' if prefix_caching else 'off'}"


def arm_cell(trace: xr.Dataset, name: str | None = None) -> dict[str, Any]:
    """The cell of an arm, ``{"mode", "clear_cache", "prefix_caching"}``: its factors
    (:func:`rlparity.trace.arm_factors`); an arm without them is an error.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    name : str, optional
        The arm's name (default its ``arm`` attr).

    Returns
    -------
    dict[str, Any]
    """
    f = arm_factors(trace)
    if not set(CELL_FACTORS) <= set(f):
        raise ValueError(f"arm {name or arm_record(trace).arm!r} records no inflight cell (factors mode, "
                         "clear_cache, prefix_caching): capture it with rlparity.experiments.inflight.inflight_matrix")
    return {k: f[k] for k in CELL_FACTORS}


def is_inflight(arms) -> bool:
    """Whether ``arms`` come from an inflight matrix (every arm records an inflight cell).

    Parameters
    ----------
    arms : mapping
        ``{arm: trace}`` (or what :func:`rlparity.trace.as_arms` takes).

    Returns
    -------
    bool
    """
    arms = as_arms(arms)
    return bool(arms) and all(set(CELL_FACTORS) <= set(arm_factors(ds)) for ds in arms.values())


def updates(trace: xr.Dataset) -> list[dict[str, Any]]:
    """The weight updates recorded in the trace (``attrs["weight_updates"]``), loads only.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.

    Returns
    -------
    list[dict[str, Any]]
    """
    return [u for u in arm_record(trace).weight_updates or [] if u.get("mode") != "label"]


# ------------------------------------------------------------------------------ lag
def lag(trace: xr.Dataset, latest: int | None = None) -> xr.DataArray:
    """Per-token policy lag ``latest - policy_version`` (NaN on padding).

    ``latest`` defaults to :func:`rlparity.trace.latest_version`.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    latest : int, optional
        The latest policy version (default :func:`rlparity.trace.latest_version`).

    Returns
    -------
    xarray.DataArray
    """
    latest = latest_version(trace) if latest is None else int(latest)
    out = xr.apply_ufunc(core.token_lag, trace["policy_version"], trace["response_mask"], kwargs={"latest": latest})
    out.name = "lag"
    out.attrs = {"long_name": f"policy lag: {latest} (latest version) - version that sampled the token",
                 "units": "versions", "latest_version": latest}
    return out


def lag_summary(trace: xr.Dataset, *, dim: str | Sequence[str] | None = None, latest: int | None = None
                ) -> xr.Dataset:
    """Lag reduced over ``dim``: ``lag_max``, ``lag_mean``, ``offpolicy_share`` (tokens with lag >
    0), ``n_tokens``. ``dim="position"`` gives one value per sequence (PipelineRL's per-sample lag),
    ``None`` one per trace.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    dim : str or sequence of str, optional
        Token dims reduced (``None``: one value per trace; ``"position"``: one per sequence,
        PipelineRL's per-sample lag).
    latest : int, optional
        The latest policy version (default :func:`rlparity.trace.latest_version`).

    Returns
    -------
    xarray.Dataset
    """
    lg = lag(trace, latest)
    mask = trace["response_mask"]
    out = xr.Dataset({k: reduce(lambda x, m, axis, k=k: core.lag_stats(x, m, axis=axis)[k], lg, mask, dim=dim)
                      for k in ("lag_max", "lag_mean", "offpolicy_share", "n_tokens")})
    out["lag_max"].attrs = {"long_name": "largest lag", "units": "versions"}
    out["lag_mean"].attrs = {"long_name": "mean lag", "units": "versions"}
    out["offpolicy_share"].attrs = {"long_name": "share of tokens sampled by older weights than the latest (lag > 0)"}
    out.attrs = {"latest_version": lg.attrs["latest_version"], "arm": arm_record(trace).name}
    return out


# ------------------------------------------------------------------------------ token groups
def first_version(trace: xr.Dataset) -> np.ndarray:
    """Per sequence, the version of its first token (the weights that prefilled it; -1 if empty).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.

    Returns
    -------
    numpy.ndarray
    """
    pv = trace["policy_version"].values
    return np.where(trace["response_length"].values > 0, pv[:, 0] if pv.shape[1] else -1, -1)


def stale_sequences(trace: xr.Dataset) -> np.ndarray:
    """Per sequence: its prompt hit a prefix cache that may hold KV of other weights.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.

    Returns
    -------
    numpy.ndarray
    """
    if "prefix_cache_stale" not in trace:
        return np.zeros(trace.sizes["sequence"], dtype=bool)
    return trace["prefix_cache_stale"].values.astype(bool)


def carried_tokens(trace: xr.Dataset) -> np.ndarray:
    """Tokens sampled after an in-sequence version change whose update kept the cache (no reset):
    the new weights attended to KV the old weights computed for the earlier tokens. An update the
    trace does not record counts as keeping it.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.

    Returns
    -------
    numpy.ndarray
    """
    pv = trace["policy_version"].values
    mask = trace["response_mask"].values.astype(bool)
    # a label-only version change (no weights loaded) carries nothing over
    reset = {int(u["version"]): bool(u.get("cache_reset")) or u.get("mode") == "label"
             for u in arm_record(trace).weight_updates or []}
    changed = mask & (pv != first_version(trace)[:, None])
    kept = np.vectorize(lambda v: not reset.get(int(v), False), otypes=[bool])(pv) if pv.size else pv.astype(bool)
    return changed & kept


def clean_tokens(trace: xr.Dataset) -> np.ndarray:
    """Tokens computed entirely by the weights that sampled them: in sequences without stale cache
    hits, sampled by the version that prefilled the sequence. Their d is the noise floor.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.

    Returns
    -------
    numpy.ndarray
    """
    mask = trace["response_mask"].values.astype(bool)
    same = trace["policy_version"].values == first_version(trace)[:, None]
    return mask & same & ~stale_sequences(trace)[:, None]


def submitted_after_update(trace: xr.Dataset) -> np.ndarray:
    """Per sequence: submitted at or after the pause of the trace's last recorded update (all False
    without an update or submit times).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.

    Returns
    -------
    numpy.ndarray
    """
    ups = updates(trace)
    if not ups or "submit_time" not in trace:
        return np.zeros(trace.sizes["sequence"], dtype=bool)
    return trace["submit_time"].values >= float(ups[-1]["t_pause"])


def _abs_mean(d: np.ndarray, sel: np.ndarray) -> float:
    return float(core.masked_mean(np.abs(d), sel))


def stale_evidence(trace: xr.Dataset, trainer: TrainerSide | None = None) -> dict[str, Any]:
    """d on the sequences with stale prefix-cache hits against the noise floor (mean ``|d|``, nats).

    ``stale_abs_log_ratio_mean`` over every token of the stale sequences; ``floor_abs_log_ratio_mean``
    over :func:`clean_tokens`; their ratio; counts; the share of prompt tokens the stale sequences
    took from the cache. Without a trainer side only the counts are given.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    dict[str, Any]
    """
    stale = stale_sequences(trace)
    mask = trace["response_mask"].values.astype(bool)
    plen = trace["prompt_length"].values
    cached = trace["cached_prompt_tokens"].values if "cached_prompt_tokens" in trace else np.full(plen.shape, -1)
    ev: dict[str, Any] = {"n_sequences": int(stale.size), "n_stale_sequences": int(stale.sum()),
                          "stale_cached_prompt_share": float(np.clip(cached[stale], 0, None).sum() / max(plen[stale].sum(), 1))
                          if stale.any() else 0.0}
    try:
        d = log_ratio(trace, trainer).values
    except Exception:  # unscored: counts only
        return ev
    sel_stale = mask & stale[:, None]
    sel_floor = clean_tokens(trace)
    s, f = _abs_mean(d, sel_stale), _abs_mean(d, sel_floor)
    ev.update({"stale_abs_log_ratio_mean": s, "floor_abs_log_ratio_mean": f,
               "stale_over_floor": s / f if f > 0 else float("inf") if s > 0 else float("nan"),
               "n_stale_tokens": int(core.count(core.finite_mask(d, sel_stale))),
               "n_floor_tokens": int(core.count(core.finite_mask(d, sel_floor))),
               "scored_by": arm_record(trace).scorer.get("scored_by", "one set of weights")})
    return ev


# ------------------------------------------------------------------------------ tables
TABLE_VARIABLES: dict[str, tuple[str, str | None]] = {
    "after_abs_log_ratio_mean": ("mean |d| of requests submitted after the update (first attempts)", "nats"),
    "inflight_abs_log_ratio_mean": ("mean |d| of requests submitted before the update", "nats"),
    "stale_abs_log_ratio_mean": ("mean |d| of sequences with stale prefix-cache hits", "nats"),
    "floor_abs_log_ratio_mean": ("mean |d| of clean tokens (one set of weights computed everything): noise floor",
                                 "nats"),
    "carried_abs_log_ratio_mean": ("mean |d| of tokens sampled on KV the previous weights computed", "nats"),
    "latest_abs_log_ratio_mean": ("mean |d_latest| (every token scored with the latest weights)", "nats"),
    "lagged_latest_abs_log_ratio_mean": ("mean |d_latest| of tokens with lag > 0 (off-policy share)", "nats"),
    "after_cached_prompt_share": ("share of prompt tokens served from the prefix cache, requests after the update",
                                  None),
    "n_sequences": ("sequences", None),
    "n_after": ("first-attempt requests submitted after the update", None),
    "n_stale_sequences": ("sequences with stale prefix-cache hits", None),
    "n_mixed_sequences": ("sequences with tokens of more than one version", None),
    "n_aborted_sequences": ("sequences aborted by the update (finish_reason abort)", None),
    "n_resubmitted_sequences": ("resubmitted attempts of aborted requests", None),
    "aborted_tokens": ("tokens of aborted sequences (sampled, then dropped by an RL loop)", "tokens"),
    "lag_mean": ("mean token lag", "versions"),
    "lag_max": ("largest token lag", "versions"),
    "offpolicy_share": ("share of tokens with lag > 0", None),
    "sequence_lag_mean": ("mean over sequences of the per-sequence mean lag", "versions"),
    "sequence_lag_max_mean": ("mean over sequences of the per-sequence max lag", "versions"),
    "pause_s": ("seconds from pause to resume at the update", "s"),
}


def _row(trace: xr.Dataset, trainer: TrainerSide | None) -> dict[str, float]:
    mask = trace["response_mask"].values.astype(bool)
    n = trace.sizes["sequence"]
    after = submitted_after_update(trace)
    attempt = trace["attempt"].values if "attempt" in trace else np.zeros(n, dtype=np.int64)
    fresh_after = after & (attempt == 0)
    plen = trace["prompt_length"].values
    cached = trace["cached_prompt_tokens"].values if "cached_prompt_tokens" in trace else np.full(n, -1)
    pv = trace["policy_version"].values
    nver = np.array([len(set(pv[i][mask[i]].tolist())) for i in range(n)])
    aborted = trace["finish_reason"].values.astype(str) == "abort"
    ups = updates(trace)
    row: dict[str, float] = {
        "n_sequences": n, "n_after": int(fresh_after.sum()), "n_stale_sequences": int(stale_sequences(trace).sum()),
        "n_mixed_sequences": int((nver > 1).sum()), "n_aborted_sequences": int(aborted.sum()),
        "n_resubmitted_sequences": int((attempt > 0).sum()),
        "aborted_tokens": int(trace["response_length"].values[aborted].sum()),
        "after_cached_prompt_share": float(np.clip(cached[fresh_after], 0, None).sum() / max(plen[fresh_after].sum(), 1))
        if fresh_after.any() else float("nan"),
        "pause_s": float(ups[-1]["pause_s"]) if ups and "pause_s" in ups[-1] else float("nan"),
    }
    lg = lag(trace)
    tot = core.lag_stats(lg.values, mask)
    per_seq = core.lag_stats(lg.values, mask, axis=-1)
    has = per_seq["n_tokens"] > 0
    row.update({"lag_mean": float(tot["lag_mean"]), "lag_max": float(tot["lag_max"]),
                "offpolicy_share": float(tot["offpolicy_share"]),
                "sequence_lag_mean": float(np.mean(per_seq["lag_mean"][has])) if has.any() else float("nan"),
                "sequence_lag_max_mean": float(np.mean(per_seq["lag_max"][has])) if has.any() else float("nan")})
    nan_vars = [k for k in TABLE_VARIABLES if k.endswith("abs_log_ratio_mean")]
    try:
        d = log_ratio(trace, trainer).values
    except Exception:
        return {**row, **{k: float("nan") for k in nan_vars}}
    ev = stale_evidence(trace, trainer)
    row.update({"after_abs_log_ratio_mean": _abs_mean(d, mask & fresh_after[:, None]),
                "inflight_abs_log_ratio_mean": _abs_mean(d, mask & ~after[:, None]),
                "stale_abs_log_ratio_mean": ev["stale_abs_log_ratio_mean"],
                "floor_abs_log_ratio_mean": ev["floor_abs_log_ratio_mean"],
                "carried_abs_log_ratio_mean": _abs_mean(d, carried_tokens(trace))})
    latest_var = LATEST_VARIABLE[_side(trainer)]
    if latest_var in trace:
        dl = (trace[latest_var] - trace["rollout_logprob"]).values
        row["latest_abs_log_ratio_mean"] = _abs_mean(dl, mask)
        row["lagged_latest_abs_log_ratio_mean"] = _abs_mean(dl, mask & (np.nan_to_num(lg.values) > 0))
    else:
        row["latest_abs_log_ratio_mean"] = row["lagged_latest_abs_log_ratio_mean"] = float("nan")
    return row


def _side(trainer: TrainerSide | None) -> str:
    return "processed" if trainer_variable(trainer) == "trainer_processed_logprob" else "raw"


def inflight_table(data, *, trainer: TrainerSide | None = None) -> xr.Dataset:
    """One row per arm of an inflight matrix (dim ``arm``): the cell (``mode``, ``clear_cache``,
    ``prefix_caching``), mean ``|d|`` of requests after the update, of in-flight ones, of stale
    sequences against the noise floor, of tokens sampled on carried-over KV, against the latest
    weights; lag (token and sequence); counts (stale, mixed-version, aborted, resubmitted); the
    pause length. See :data:`TABLE_VARIABLES` for each variable's meaning and units. A row is a
    function of a whole arm (an update splits its requests into before / after, stale / clean):
    there is no ``dim=``; per token see :func:`lag_summary` with ``dim=`` and
    :func:`gap_by_update_time`.

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    xarray.Dataset
    """
    arms = as_arms(data)
    if not arms:
        raise ValueError("no arms given")
    names = list(arms)
    cells = [arm_cell(ds, name) for name, ds in arms.items()]
    rows = [_row(ds, trainer) for ds in arms.values()]
    table = xr.Dataset({k: ("arm", np.array([r[k] for r in rows], dtype=float)) for k in TABLE_VARIABLES},
                       coords={"arm": names})
    table["mode"] = ("arm", np.array([c["mode"] for c in cells], dtype=str))
    table["clear_cache"] = ("arm", np.array([c["clear_cache"] for c in cells], dtype=bool))
    table["prefix_caching"] = ("arm", np.array([c["prefix_caching"] for c in cells], dtype=bool))
    for k, (long_name, units) in TABLE_VARIABLES.items():
        table[k].attrs = {"long_name": long_name, **({"units": units} if units else {})}
    table.attrs = pair_attrs(trainer, long_name="inflight weight updates: one row per arm (pause mode x clear_cache "
                                                "x prefix caching)")
    return table


def reset_ratios(table: xr.Dataset, variable: str = "after_abs_log_ratio_mean") -> dict[str, dict[str, Any]]:
    """For every arm that kept the cache at the update (``clear_cache`` False) and has a twin that
    cleared it (same mode and prefix caching): ``variable`` in both and their ratio (kept over
    cleared). With prefix caching on, the ratio is what the stale cache costs.

    Parameters
    ----------
    table : xarray.Dataset
        An :func:`inflight_table`.
    variable : str
        The table's variable compared.

    Returns
    -------
    dict[str, dict[str, Any]]
    """
    out: dict[str, dict[str, Any]] = {}
    arms = table["arm"].values.tolist()
    cell = {a: (str(table["mode"].sel(arm=a).item()), bool(table["clear_cache"].sel(arm=a).item()),
                bool(table["prefix_caching"].sel(arm=a).item())) for a in arms}
    for a in arms:
        mode, clear, prefix = cell[a]
        twin = next((b for b in arms if cell[b] == (mode, True, prefix)), None)
        if clear or twin is None:
            continue
        x, y = float(table[variable].sel(arm=a)), float(table[variable].sel(arm=twin))
        out[a] = {"reset_arm": twin, "kept": x, "reset": y,
                  "ratio": x / y if y > 0 else (float("inf") if x > 0 else float("nan"))}
    return out


def gap_by_update_time(data, *, trainer: TrainerSide | None = None, n_bins: int = 12,
                       edges: Sequence[float] | None = None) -> xr.Dataset:
    """Mean ``|d|`` of tokens by their time relative to each arm's update (``token_time`` minus the
    update's resume time, seconds; negative = before), dims ``(arm, time_bin)``, with token counts
    and the mean policy version in each bin.

    Bins are shared over arms (quantiles of every arm's token times unless ``edges`` are given).

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    n_bins : int
        Number of bins.
    edges : numpy.ndarray, optional
        Bin edges (seconds from the update; default ``n_bins`` bins over the data).

    Returns
    -------
    xarray.Dataset
    """
    arms = as_arms(data)
    rel: dict[str, np.ndarray] = {}
    for name, ds in arms.items():
        ups = updates(ds)
        if "token_time" not in ds or not ups:
            raise ValueError(f"arm {name!r} has no token_time or no recorded update: capture it with "
                             "rlparity.capture.AsyncEngine and update its weights with update_weights")
        rel[name] = ds["token_time"].values - float(ups[-1]["t_resume"])
    if edges is None:
        allx = np.concatenate([x[np.isfinite(x)] for x in rel.values()])
        if allx.size == 0:
            raise ValueError("no token has a time")
        e = np.unique(np.quantile(allx, np.linspace(0, 1, n_bins + 1)))
        if e.size < 2:
            e = np.array([allx.min() - 0.5, allx.max() + 0.5])
    else:
        e = np.asarray(edges, dtype=float)
        if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
            raise ValueError("edges must be an increasing 1-d sequence of at least 2 values")
    nb = e.size - 1
    bins = e.copy()
    bins[-1] = np.nextafter(bins[-1], np.inf)
    gap = np.full((len(arms), nb), np.nan)
    cnt = np.zeros((len(arms), nb), dtype=np.int64)
    ver = np.full((len(arms), nb), np.nan)
    for a, (name, ds) in enumerate(arms.items()):
        mask = ds["response_mask"].values.astype(bool)
        d = log_ratio(ds, trainer).values
        x = rel[name]
        ok = mask & np.isfinite(d) & np.isfinite(x)
        idx = np.digitize(x[ok], bins) - 1
        dv, pv = np.abs(d[ok]), ds["policy_version"].values[ok].astype(float)
        for b in range(nb):
            sel = idx == b
            cnt[a, b] = int(sel.sum())
            if sel.any():
                gap[a, b], ver[a, b] = float(dv[sel].mean()), float(pv[sel].mean())
    out = xr.Dataset({"abs_log_ratio_mean": (("arm", "time_bin"), gap, {"units": "nats", "long_name": "mean |d| in the bin"}),
                      "n_tokens": (("arm", "time_bin"), cnt, {"long_name": "tokens in the bin"}),
                      "policy_version_mean": (("arm", "time_bin"), ver, {"long_name": "mean policy version in the bin"})},
                     coords={"arm": list(arms), "time_bin": np.arange(nb),
                             "time_low": ("time_bin", e[:-1], {"units": "s"}),
                             "time_high": ("time_bin", e[1:], {"units": "s"}),
                             "time_center": ("time_bin", (e[:-1] + e[1:]) / 2,
                                             {"units": "s", "long_name": "token time relative to the update's resume"})})
    out.attrs = pair_attrs(trainer, binned_by="token_time - update t_resume (s)")
    return out


def lag_histogram(data, *, latest: int | None = None) -> xr.Dataset:
    """Token and sequence counts per lag value, dims ``(arm, lag)``: ``n_tokens`` by token lag,
    ``n_sequences`` by each sequence's max lag (its oldest token).

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path.
    latest : int, optional
        The latest policy version (default :func:`rlparity.trace.latest_version`).

    Returns
    -------
    xarray.Dataset
    """
    arms = as_arms(data)
    per: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    top = 0
    for name, ds in arms.items():
        lg = lag(ds, latest).values
        mask = ds["response_mask"].values.astype(bool)
        tok = lg[mask & np.isfinite(lg)].astype(int)
        seq = core.lag_stats(lg, mask, axis=-1)["lag_max"]
        seq = seq[np.isfinite(seq)].astype(int)
        per[name] = (tok, seq)
        top = max(top, int(tok.max()) if tok.size else 0, int(seq.max()) if seq.size else 0)
    lags = np.arange(0, top + 1)
    tokens = np.array([[int((t == k).sum()) for k in lags] for t, _ in per.values()], dtype=np.int64)
    seqs = np.array([[int((s == k).sum()) for k in lags] for _, s in per.values()], dtype=np.int64)
    return xr.Dataset({"n_tokens": (("arm", "lag"), tokens, {"long_name": "tokens with this lag"}),
                       "n_sequences": (("arm", "lag"), seqs, {"long_name": "sequences whose max lag is this"})},
                      coords={"arm": list(arms), "lag": lags},
                      attrs={"long_name": "policy lag: latest version - version that sampled the token"})


__all__ = ["CELL_FACTORS", "LATEST_VARIABLE", "PAUSE_MODES", "TABLE_VARIABLES", "arm_cell", "arm_name", "carried_tokens",
           "clean_tokens", "first_version", "gap_by_update_time", "inflight_table", "is_inflight", "lag",
           "lag_histogram", "lag_summary", "reset_ratios", "stale_evidence", "stale_sequences",
           "submitted_after_update", "updates"]
