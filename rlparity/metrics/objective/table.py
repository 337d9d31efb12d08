"""The objective layer's table: :func:`objective_summary`, one row per pair of policies."""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.provenance import make_attrs
from rlparity.metrics.objective.arrays import (
    _safe_exp,
    _share,
    finite_tokens,
    rejected_fraction,
    rejection_keep,
    sequence_clip_fraction,
    sequence_ess,
    sequence_log_ratio,
    tis_weights,
    token_clip_fraction,
    token_counts,
    token_ess,
    token_mean,
)
from rlparity.metrics.objective.settings import BAND_RULES, OBJECTIVE_DEFAULTS
from rlparity.metrics.objective.traces import available_pairs, pair_direction, pair_log_ratio

def objective_summary(trace: xr.Dataset, *, trainer: TrainerSide | None = None, pairs: list[str] | None = None
                      ) -> xr.Dataset:
    """One row per pair the trace holds (dim ``pair``): mean ratio and log-ratio, PPO token and
    GSPO sequence clip fractions, mean truncated (TIS) weight, ESS of raw token / product /
    geometric weights, the masked fractions of the three band rules (tokens and sequences), and
    the token and sequence counts used and excluded. Thresholds: :data:`OBJECTIVE_DEFAULTS` (change
    them with :func:`rlparity.config.defaults_context`)."""
    o = OBJECTIVE_DEFAULTS
    trainer = trainer or defaults().trainer
    pairs = pairs or available_pairs(trace, trainer)
    if not pairs:
        raise ValueError("the trace holds no pair of policies: score it (rlparity.score) first")
    rows: dict[str, list[float]] = {}

    def put(k, v):
        rows.setdefault(k, []).append(float(v))

    for p in pairs:
        d = pair_log_ratio(trace, p, trainer).values
        u = finite_tokens(d)
        n_used, n_excl = token_counts(d)
        put("n_tokens", n_used)
        put("n_excluded_tokens", n_excl)
        put("mean_log_ratio", token_mean(d, d).value)
        r = _safe_exp(d, u)
        put("mean_ratio", token_mean(r, d).value)
        put("std_ratio", float(np.std(r[u])) if u.sum() > 1 else np.nan)
        put("token_clip_fraction", token_clip_fraction(d, eps_low=o.ppo_eps, eps_high=o.ppo_eps).value)
        sc = sequence_clip_fraction(d, eps_low=o.gspo_eps_low, eps_high=o.gspo_eps_high)
        put("sequence_clip_fraction", sc.value)
        put("n_sequences", sc.n_used)
        put("n_excluded_sequences", sc.n_excluded)
        g = sequence_log_ratio(d, kind="geometric").value
        put("mean_geometric_ratio", np.nanmean(np.exp(g)) if np.isfinite(g).any() else np.nan)
        put("tis_weight_mean", token_mean(tis_weights(d, cap=o.is_cap), d).value)
        put("tis_truncated_fraction", _share(r > o.is_cap, u))
        put("ess_token", token_ess(d).value)
        put("ess_sequence_product", sequence_ess(d, kind="product").value)
        put("ess_sequence_geometric", sequence_ess(d, kind="geometric").value)
        for rule in BAND_RULES:
            keep = rejection_keep(d, rule=rule, threshold=o.band(rule))
            put(f"masked_fraction_{rule}", rejected_fraction(keep, d).value)
            put(f"masked_sequence_fraction_{rule}", rejected_fraction(keep, d, level="sequence").value)
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
    ds.attrs = make_attrs(trainer_side=trainer, arm=trace.attrs.get("arm", "default"),
                          defaults={"eps": defaults().eps, **defaults().objective.model_dump(mode="json")})
    return ds
