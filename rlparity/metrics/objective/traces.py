"""The objective layer on traces (xarray): the three policies and their pairs as trace variables,
and the core's reductions with ``dim=`` (``None``: everything, ``"position"``: one value per
sequence, ``"sequence"``: one value per position), counts as coordinates, pair and direction in
attrs."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import Level, TrainerSide, defaults
from rlparity.config.provenance import make_attrs
from rlparity.metrics.objective.arrays import (
    ValueWithCounts,
    _safe_exp,
    decoupled_weights,
    importance_weights,
    logprob_difference,
    rejected_fraction,
    rejection_keep,
    sequence_clip_fraction,
    sequence_ess,
    sequence_log_ratio,
    token_clip_fraction,
    token_ess,
)
from rlparity.metrics.objective.settings import BAND_RULES, OBJECTIVE_DEFAULTS, Kind, PairName

POLICY_VARIABLES = {
    "processed": {"mu": "rollout_logprob", "old": "trainer_processed_logprob",
                  "theta": "trainer_updated_processed_logprob"},
    "raw": {"mu": "rollout_logprob", "old": "trainer_logprob", "theta": "trainer_updated_logprob"},
}
PAIRS: dict[str, tuple[str, str]] = {"backend": ("old", "mu"), "update": ("theta", "old"),
                                     "bypass": ("theta", "mu")}
POLICY_NAMES = {"mu": "mu", "old": "pi_old", "theta": "pi_theta"}
_NEEDS = {"old": "run rlparity.score(trace, model) first",
          "theta": "run rlparity.train.train_step(model, trace) first (it adds pi_theta)"}


def policy_variable(policy: str, trainer: TrainerSide | None = None) -> str:
    """The trace variable holding ``policy`` (``"mu"``, ``"old"``, ``"theta"``) on the ``trainer``
    side (``"processed"`` or ``"raw"``; default ``defaults().trainer``)."""
    trainer = trainer or defaults().trainer
    if trainer not in POLICY_VARIABLES:
        raise ValueError(f"trainer={trainer!r}; use 'processed' or 'raw'")
    if policy not in POLICY_VARIABLES[trainer]:
        raise ValueError(f"policy={policy!r}; use 'mu', 'old' or 'theta'")
    return POLICY_VARIABLES[trainer][policy]


def policy_logprob(trace: xr.Dataset, policy: str, trainer: TrainerSide | None = None, *,
                   lazy: bool = False) -> np.ndarray:
    """The per-token log-probabilities of ``policy`` as a float array (NaN on padding).
    ``lazy=True`` keeps a lazy trace lazy: a dask array (nothing read) for a formula that streams."""
    var = policy_variable(policy, trainer)
    if var not in trace:
        raise ValueError(f"the trace has no {var} ({POLICY_NAMES[policy]}): {_NEEDS.get(policy, '')}")
    if lazy:
        return np.where(trace["response_mask"].data.astype(bool), trace[var].data.astype(float), np.nan)
    return np.where(trace["response_mask"].values.astype(bool), trace[var].values.astype(float), np.nan)


def available_pairs(trace: xr.Dataset, trainer: TrainerSide | None = None) -> list[str]:
    """The pairs whose two policies the trace holds."""
    have = {p for p in ("mu", "old", "theta") if policy_variable(p, trainer) in trace}
    return [name for name, (a, b) in PAIRS.items() if a in have and b in have]


def pair_direction(pair: str, trainer: TrainerSide | None = None) -> dict[str, str]:
    """attrs naming a pair and its direction, e.g. ``pair="backend (pi_old, mu)"``,
    ``direction="trainer_processed_logprob - rollout_logprob"``."""
    if pair not in PAIRS:
        raise ValueError(f"pair={pair!r}; use one of {list(PAIRS)}")
    trainer = trainer or defaults().trainer
    num, den = PAIRS[pair]
    return {"pair": f"{pair} ({POLICY_NAMES[num]}, {POLICY_NAMES[den]})",
            "direction": f"{policy_variable(num, trainer)} - {policy_variable(den, trainer)}",
            "trainer_side": trainer}


def pair_log_ratio(trace: xr.Dataset, pair: PairName = "backend", trainer: TrainerSide | None = None
                   ) -> xr.DataArray:
    """Per-token ``d`` of ``pair`` (nats), dims ``(sequence, position)``; NaN on padding."""
    attrs = pair_direction(pair, trainer)
    num, den = PAIRS[pair]
    mask = trace["response_mask"].values.astype(bool)
    d = logprob_difference(policy_logprob(trace, num, trainer), policy_logprob(trace, den, trainer), mask)
    return xr.DataArray(d, dims=("sequence", "position"),
                        coords={"sequence": trace["sequence"], "position": trace["position"]},
                        name="log_ratio", attrs={**attrs, "units": "nats",
                                                 "long_name": f"log {POLICY_NAMES[num]} - log {POLICY_NAMES[den]}"})


def _axes(dim, dims: tuple[str, ...]):
    if dim is None:
        return None
    names = (dim,) if isinstance(dim, str) else tuple(dim)
    bad = [n for n in names if n not in dims]
    if bad:
        raise ValueError(f"dim={dim!r}: unknown dim {bad}; use one of {list(dims)} or None")
    return tuple(dims.index(n) for n in names)


def _wrap(m: ValueWithCounts, d: xr.DataArray, axes, name: str, attrs: dict, counts: str = "tokens") -> xr.DataArray:
    keep = [n for i, n in enumerate(d.dims) if axes is not None and i not in axes]
    coords = {n: d[n] for n in keep}
    da = xr.DataArray(np.asarray(m.value, dtype=float), dims=keep, coords=coords, name=name)
    da = da.assign_coords(n_used=(keep, np.asarray(m.n_used)), n_excluded=(keep, np.asarray(m.n_excluded)))
    da.attrs = {**{k: v for k, v in d.attrs.items() if k in ("pair", "direction", "trainer_side")},
                "counts": counts, **attrs}
    return da


def ratio(trace: xr.Dataset, pair: PairName = "backend", *, level: Level = "token", kind: Kind = "geometric",
          trainer: TrainerSide | None = None) -> xr.DataArray:
    """The pair's ratio: per token ``rho = exp(d)`` (0 or inf where a policy gives probability 0),
    or per sequence the geometric (GSPO, ``exp(mean_t d)``) or product ratio (NaN for an excluded
    sequence; coordinates ``n_used`` tokens and ``n_excluded`` tokens)."""
    d = pair_log_ratio(trace, pair, trainer)
    if level == "token":
        with np.errstate(over="ignore"):
            out = np.exp(d)
        out.name = "ratio"
        out.attrs = {**d.attrs, "units": "1", "long_name": f"token ratio, {d.attrs['pair']}"}
        return out
    s = sequence_log_ratio(d.values, kind=kind)
    ok = np.isfinite(s.value)
    m = ValueWithCounts(np.where(ok, _safe_exp(s.value, ok), np.nan), s.n_used, s.n_excluded)
    return _wrap(m, d, (1,), "ratio", {"units": "1", "level": "sequence", "kind": kind,
                                      "long_name": f"{kind} sequence ratio, {d.attrs['pair']}"})


def clip_fraction(trace: xr.Dataset, pair: PairName = "update", *, level: Level = "token",
                  eps_low: float | None = None, eps_high: float | None = None, dim=None,
                  trainer: TrainerSide | None = None) -> xr.DataArray:
    """PPO token clip fraction (``level="token"``, eps default 0.2, reduced over ``dim``) or GSPO
    sequence clip fraction (``"sequence"``, geometric ratio, eps default 3e-4 / 4e-4; one value)."""
    d = pair_log_ratio(trace, pair, trainer)
    lo, hi = OBJECTIVE_DEFAULTS.eps(level)
    eps_low, eps_high = (lo if eps_low is None else eps_low), (hi if eps_high is None else eps_high)
    attrs = {"units": "1", "level": level, "eps_low": eps_low, "eps_high": eps_high}
    if level == "token":
        axes = _axes(dim, d.dims)
        m = token_clip_fraction(d.values, eps_low=eps_low, eps_high=eps_high, axis=axes)
        return _wrap(m, d, axes, "clip_fraction", {**attrs, "long_name": (
            f"share of tokens with ratio outside [1-{eps_low:g}, 1+{eps_high:g}]")})
    if dim not in (None, "sequence"):
        raise ValueError("a sequence-level clip fraction reduces over sequences: use dim=None")
    m = sequence_clip_fraction(d.values, eps_low=eps_low, eps_high=eps_high)
    return _wrap(m, d, (0, 1), "clip_fraction", {**attrs, "long_name": (
        f"share of sequences with geometric ratio outside [1-{eps_low:g}, 1+{eps_high:g}]")}, "sequences")


def is_weights(trace: xr.Dataset, pair: PairName = "backend", *, level: Level = "token", kind: Kind = "product",
               cap: float | None = None, truncate: bool = True, trainer: TrainerSide | None = None) -> xr.DataArray:
    """Importance weights of ``pair`` per token, ``(sequence, position)``: token ``rho`` or the
    sequence's product / geometric ratio; truncated at ``cap`` (default ``is_cap``) unless
    ``truncate=False``. NaN at padding and at excluded tokens / sequences."""
    d = pair_log_ratio(trace, pair, trainer)
    c = (OBJECTIVE_DEFAULTS.is_cap if cap is None else cap) if truncate else None
    w = importance_weights(d.values, level=level, kind=kind, cap=c)
    return xr.DataArray(w, dims=d.dims, coords=d.coords, name="is_weight", attrs={
        **{k: d.attrs[k] for k in ("pair", "direction", "trainer_side")}, "units": "1", "level": level,
        "kind": kind if level == "sequence" else "token", "cap": "none" if c is None else c,
        "long_name": ("truncated " if c is not None else "raw ") + "importance weight"})


def _default_threshold(rule: str):
    return OBJECTIVE_DEFAULTS.band(rule) if rule in BAND_RULES else OBJECTIVE_DEFAULTS.kl_thresholds[rule]


def masked_fraction(trace: xr.Dataset, rule: str = "token_band", pair: PairName = "backend", *,
                    level: Level = "token", threshold: Any = None, dim=None,
                    trainer: TrainerSide | None = None) -> xr.DataArray:
    """Share of usable tokens (``level="token"``, reduced over ``dim``) or of sequences
    (``"sequence"``: losing at least one token) that ``rule`` rejects."""
    d = pair_log_ratio(trace, pair, trainer)
    keep = rejection_keep(d.values, rule=rule, threshold=threshold)
    attrs = {"units": "1", "rule": rule, "level": level,
             "threshold": str(threshold if threshold is not None else _default_threshold(rule)),
             "long_name": f"share of {level}s rejected by {rule}"}
    if level == "token":
        axes = _axes(dim, d.dims)
        return _wrap(rejected_fraction(keep, d.values, axis=axes), d, axes, "masked_fraction", attrs)
    if dim not in (None, "sequence"):
        raise ValueError("a sequence-level masked fraction reduces over sequences: use dim=None")
    return _wrap(rejected_fraction(keep, d.values, level="sequence"), d, (0, 1), "masked_fraction", attrs,
                 "sequences")


def effective_sample_size(trace: xr.Dataset, pair: PairName = "backend", *, level: Level = "token",
                          kind: Kind = "product", dim=None, trainer: TrainerSide | None = None) -> xr.DataArray:
    """Normalised ESS of the raw (untruncated) weights of ``pair``: token weights reduced over
    ``dim``, or sequence weights (product / geometric) over all sequences."""
    d = pair_log_ratio(trace, pair, trainer)
    attrs = {"units": "1", "level": level, "long_name": "normalised ESS (sum w)^2 / (n sum w^2), raw weights"}
    if level == "token":
        axes = _axes(dim, d.dims)
        return _wrap(token_ess(d.values, axis=axes), d, axes, "ess", attrs)
    if dim not in (None, "sequence"):
        raise ValueError("a sequence-level ESS reduces over sequences: use dim=None")
    return _wrap(sequence_ess(d.values, kind=kind), d, (0, 1), "ess", {**attrs, "kind": kind}, "sequences")


def decoupled(trace: xr.Dataset, *, cap: float | None = None, trainer: TrainerSide | None = None) -> xr.Dataset:
    """The decoupled three-policy weights per token (see :func:`decoupled_weights`):
    ``correction_weight`` (pi_old/mu, truncated at ``cap`` when given), ``update_ratio``
    (pi_theta/pi_old), ``weight`` (their product) and ``bypass_ratio`` (pi_theta/mu)."""
    trainer = trainer or defaults().trainer
    mask = trace["response_mask"].values.astype(bool)
    parts = decoupled_weights(policy_logprob(trace, "mu", trainer), policy_logprob(trace, "old", trainer),
                              policy_logprob(trace, "theta", trainer), mask, cap=cap)
    pairs = {"correction_weight": "backend", "update_ratio": "update", "weight": "backend x update",
             "bypass_ratio": "bypass"}
    ds = xr.Dataset(coords={"sequence": trace["sequence"], "position": trace["position"]})
    for k, v in parts.items():
        p = pairs[k]
        attrs = pair_direction(p, trainer) if p in PAIRS else {
            "pair": "backend (pi_old, mu) x update (pi_theta, pi_old)",
            "direction": "exp(correction) * exp(update)", "trainer_side": trainer}
        ds[k] = (("sequence", "position"), v, {**attrs, "units": "1"})
    ds.attrs = make_attrs(cap="none" if cap is None else cap, trainer_side=trainer,
                          arm=trace.attrs.get("arm", "default"))
    return ds
