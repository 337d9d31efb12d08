"""The objective layer's table: :func:`objective_summary`, one row per pair of policies.

Every row is computed from parts that merge across blocks of whole sequences (counts and sums,
ESS sums in log space, the ratio's variance by Chan's merge, one value per sequence), so a lazy
trace is summarised one block at a time (:func:`~rlparity.metrics.objective.pairs.trace_blocks`:
each block validated, the store's CRC-32 record checked) and a trace in memory is one block.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.provenance import make_attrs
from rlparity.metrics.objective.arrays.ess import ess_of, ess_parts, merge_ess_parts, sequences_ess
from rlparity.metrics.objective.arrays.rejection import rejected_sequences, rejection_keep, sequences_rejected
from rlparity.metrics.objective.arrays.tokens import (
    ValueWithCounts,
    _safe_exp,
    finite_tokens,
    sequence_log_ratio,
    share_of,
    share_parts,
)
from rlparity.metrics.objective.arrays.weights import _eps, sequences_clip_fraction
from rlparity.metrics.objective.settings import BAND_RULES, OBJECTIVE_DEFAULTS
from rlparity.trace import arm_record
from rlparity.metrics.objective.pairs import (available_pairs, concat_sequences, pair_direction, pair_log_ratio,
                                             pair_variables, trace_blocks)


def _spread(x: np.ndarray) -> tuple[int, float, float]:
    """(n, mean, sum of squared deviations) of ``x``: Chan's parts of a variance."""
    if not x.size:
        return 0, 0.0, 0.0
    mean = x.mean()
    return x.size, mean, float(((x - mean) ** 2).sum())


def _merge_spread(a, b):
    n = a[0] + b[0]
    if not a[0] or not b[0]:
        return a if b[0] == 0 else b
    delta = b[1] - a[1]
    return n, a[1] + delta * b[0] / n, a[2] + b[2] + delta ** 2 * a[0] * b[0] / n


def _pair_parts(d: np.ndarray) -> dict[str, Any]:
    """One block of ``d`` -> the parts of one pair's row (merged by :func:`_merge_parts`)."""
    o = OBJECTIVE_DEFAULTS
    u = finite_tokens(d)
    r = _safe_exp(d, u)
    lo, hi = _eps(o.ppo_eps, o.ppo_eps, "token")
    fin_r = u & np.isfinite(r)
    parts: dict[str, Any] = {
        "clip": share_parts((r < lo) | (r > hi), d),
        "truncated": share_parts(r > o.is_cap, d),
        "sum_d": np.where(u, d, 0.0).sum(),
        "sum_r": np.where(fin_r, r, 0.0).sum(), "n_r": fin_r.sum(),
        "sum_tis": np.where(u, np.minimum(np.where(u, r, np.nan), o.is_cap), 0.0).sum(),
        "spread": _spread(r[u]),
        "ess": ess_parts(d, u),
        "geometric": sequence_log_ratio(d, kind="geometric"),
        "product": sequence_log_ratio(d, kind="product"),
    }
    for rule in BAND_RULES:
        keep = rejection_keep(d, rule=rule, threshold=o.band(rule))
        parts[f"token_{rule}"] = share_parts(~keep, d)
        parts[f"sequence_{rule}"] = rejected_sequences(keep, d)
    return parts


def _merge_parts(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, x in a.items():
        y = b[k]
        if k == "ess":
            out[k] = merge_ess_parts(x, y)
        elif k == "spread":
            out[k] = _merge_spread(x, y)
        elif isinstance(x, ValueWithCounts):
            out[k] = concat_sequences([x, y])
        elif k.startswith("sequence_"):
            out[k] = {j: np.concatenate([x[j], y[j]]) for j in x}
        elif isinstance(x, dict):
            out[k] = {j: x[j] + y[j] for j in x}
        else:
            out[k] = x + y
    return out


def _pair_row(p: dict[str, Any]) -> dict[str, float]:
    """The row of one pair from its merged parts."""
    o = OBJECTIVE_DEFAULTS
    clip = share_of(p["clip"])
    n = clip.n_used
    with np.errstate(invalid="ignore", divide="ignore"):
        row = {"n_tokens": n, "n_excluded_tokens": clip.n_excluded,
               "mean_log_ratio": np.where(n > 0, p["sum_d"] / np.maximum(n, 1), np.nan),
               "mean_ratio": np.where(p["n_r"] > 0, p["sum_r"] / np.maximum(p["n_r"], 1), np.nan)}
    m, _, m2 = p["spread"]
    row["std_ratio"] = float(np.sqrt(m2 / m)) if n > 1 else np.nan
    row["token_clip_fraction"] = clip.value
    sc = sequences_clip_fraction(p["geometric"], *_eps(o.gspo_eps_low, o.gspo_eps_high, "sequence"))
    row.update(sequence_clip_fraction=sc.value, n_sequences=sc.n_used, n_excluded_sequences=sc.n_excluded)
    g = p["geometric"].value
    row["mean_geometric_ratio"] = np.nanmean(np.exp(g)) if np.isfinite(g).any() else np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        row["tis_weight_mean"] = np.where(n > 0, p["sum_tis"] / np.maximum(n, 1), np.nan)
    row["tis_truncated_fraction"] = share_of(p["truncated"]).value
    row["ess_token"] = ess_of(p["ess"])
    row["ess_sequence_product"] = sequences_ess(p["product"]).value
    row["ess_sequence_geometric"] = sequences_ess(p["geometric"]).value
    for rule in BAND_RULES:
        row[f"masked_fraction_{rule}"] = share_of(p[f"token_{rule}"]).value
        row[f"masked_sequence_fraction_{rule}"] = sequences_rejected(p[f"sequence_{rule}"]).value
    return {k: float(v) for k, v in row.items()}


def objective_summary(trace: xr.Dataset, *, trainer: TrainerSide | None = None, pairs: list[str] | None = None,
                      progress=None) -> xr.Dataset:
    """One row per pair of policies the trace holds.

    Mean ratio and log-ratio, PPO token and GSPO sequence clip fractions, mean truncated (TIS)
    weight, ESS of raw token / product / geometric weights, the masked fractions of the three
    band rules (tokens and sequences), and the token and sequence counts used and excluded.
    Thresholds: :data:`OBJECTIVE_DEFAULTS` (change them with
    :func:`rlparity.config.defaults_context`). A lazy trace is read once, block by block, with
    bounded memory (one block plus one number per sequence); a table of the whole arm
    (``dim=`` makes no sense here).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy (``open_arms(store, chunks=N)``).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    pairs : list of str, optional
        The pairs (default: every pair the trace holds, :func:`~rlparity.metrics.objective.pairs.available_pairs`).
    progress : callable, optional
        Wraps the block iterator of a lazy trace (e.g. ``tqdm.tqdm``).

    Returns
    -------
    xarray.Dataset
        One variable per statistic, dim ``pair``, with ``pair_name`` and ``direction``
        coordinates and provenance attrs.
    """
    o = OBJECTIVE_DEFAULTS
    trainer = trainer or defaults().trainer
    pairs = pairs or available_pairs(trace, trainer)
    if not pairs:
        raise ValueError("the trace holds no pair of policies: score it (rlparity.score) first")
    for p in pairs:
        pair_log_ratio(trace.isel(sequence=slice(0, 0)), p, trainer)  # a pair the trace lacks: said before reading
    merged = reduce(lambda a, b: {p: _merge_parts(a[p], b[p]) for p in pairs},
                    ({p: _pair_parts(pair_log_ratio(part, p, trainer).values) for p in pairs}
                     for part in trace_blocks(trace, progress=progress,
                                              variables=pair_variables(pairs, trainer))))
    table = {p: _pair_row(merged[p]) for p in pairs}
    rows: dict[str, list[float]] = {k: [table[p][k] for p in pairs] for k in table[pairs[0]]}
    long = {
        "mean_ratio": "mean of rho over usable tokens", "mean_log_ratio": "mean of d (nats)",
        "std_ratio": "std of rho", "token_clip_fraction": f"PPO: share of tokens outside [1-{o.ppo_eps:g}, 1+{o.ppo_eps:g}]",
        "sequence_clip_fraction": f"GSPO: share of sequences outside [1-{o.gspo_eps_low:g}, 1+{o.gspo_eps_high:g}]",
        "mean_geometric_ratio": "mean over sequences of exp(mean_t d)",
        "tis_weight_mean": f"mean of min(rho, {o.is_cap:g})", "tis_truncated_fraction": f"share of tokens with rho > {o.is_cap:g}",
        "ess_token": "normalised ESS of raw token weights", "ess_sequence_product": "ESS of raw product sequence weights",
        "ess_sequence_geometric": "ESS of raw geometric sequence weights",
        "n_tokens": "usable tokens", "n_excluded_tokens": "tokens a policy gives probability 0 (left out)",
        "n_sequences": "usable sequences", "n_excluded_sequences": "sequences with a probability-0 token (left out)",
    }
    ds = xr.Dataset({k: ("pair", np.asarray(v), {"long_name": long.get(k, k.replace("_", " "))})
                     for k, v in rows.items()}, coords={"pair": list(pairs)})
    ds = ds.assign_coords(pair_name=("pair", [pair_direction(p, trainer)["pair"] for p in pairs]),
                          direction=("pair", [pair_direction(p, trainer)["direction"] for p in pairs]))
    ds["mean_log_ratio"].attrs["units"] = "nats"
    ds.attrs = make_attrs(trainer_side=trainer, arm=arm_record(trace).name,
                          defaults={"eps": defaults().eps, **defaults().objective.model_dump(mode="json")})
    return ds
