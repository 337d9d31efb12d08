"""The objective layer: three policies, their ratios, the corrections trainers apply to them, and
the health of the importance weights (each definition in its function's docstring).

Three policies per response token:

* mu = ``rollout_logprob``: the engine that sampled the token (behaviour policy);
* pi_old = the trainer at the rollout's weights: ``trainer_processed_logprob``
  (``trainer="processed"``) or ``trainer_logprob`` (``trainer="raw"``); ``trainer=None`` (every
  function's default) is ``defaults().trainer``;
* pi_theta = the trainer after an optimizer step: ``trainer_updated_processed_logprob`` /
  ``trainer_updated_logprob`` (written by :func:`rlparity.train.train_step`).

Three pairs, each with ``d = log numerator - log denominator`` per token (nats) and
``rho = exp(d)``:

* ``backend``: (pi_old, mu), d = log pi_old - log mu: the backend mismatch, and the weight a
  decoupled trainer uses to correct for it;
* ``update``: (pi_theta, pi_old), d = log pi_theta - log pi_old: the policy change PPO / GSPO clip;
* ``bypass``: (pi_theta, mu), d = log pi_theta - log mu: the two-policy form of a trainer that
  never recomputes pi_old (the decoupled weight pi_old/mu x pi_theta/pi_old equals it exactly
  when nothing is truncated).

Layers, as in ArviZ: a numpy core whose functions take ``d`` (any shape, response positions along
``axis``, default the last) and a boolean ``mask`` of real tokens (``None``: every non-NaN entry),
then a thin xarray layer on traces whose reductions take ``dim=`` (``None``: everything,
``"position"``: one value per sequence, ``"sequence"``: one value per position).

Tokens a policy gives probability 0 (``d = -inf`` or ``+inf``, or NaN where both do) are never
averaged away. Token-level results leave such a token out and count it (``n_excluded``);
sequence-level results leave out the whole sequence, whose product or geometric ratio is 0 or
infinite, and count it. A rejection mask never keeps an excluded token. Every core reduction
returns :class:`Measured` (value, how many entries it used, how many it excluded); the xarray
layer puts ``n_used`` / ``n_excluded`` on the result as coordinates and names the pair and the
direction in its attrs.

All thresholds default to :data:`OBJECTIVE_DEFAULTS`.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import numpy as np
import xarray as xr

from rlparity.config.defaults import Level, TrainerSide, defaults
from rlparity.config.provenance import make_attrs
from rlparity.metrics import core

Kind = Literal["product", "geometric"]
PairName = Literal["backend", "update", "bypass"]
KL_RULES = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
            "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
BAND_RULES = ("token_band", "geometric_band", "product_band")
RULES = BAND_RULES + KL_RULES


class _ObjectiveDefaults:
    """The objective layer's defaults in effect: ``defaults().objective`` (see
    :class:`rlparity.config.ObjectiveDefaults`) plus the PPO clip range ``defaults().eps``; read at
    each call, so :func:`rlparity.config.defaults_context` applies."""

    def __getattr__(self, name: str):
        if name == "ppo_eps":
            return defaults().eps
        return getattr(defaults().objective, name)

    def eps(self, level: Level) -> tuple[float, float]:
        """(eps_low, eps_high) of the PPO token clip (``"token"``) or the GSPO sequence clip."""
        od = defaults().objective
        return (defaults().eps, defaults().eps) if level == "token" else (od.gspo_eps_low, od.gspo_eps_high)

    def band(self, rule: str) -> tuple[float, float]:
        return defaults().objective.band(rule)


OBJECTIVE_DEFAULTS = _ObjectiveDefaults()


class Measured(NamedTuple):
    """A reduction and what it rests on: ``value``, ``n_used`` entries, ``n_excluded`` entries
    (tokens or sequences, as the function says) left out because a policy gives probability 0."""

    value: Any
    n_used: Any
    n_excluded: Any


# ----------------------------------------------------------------------------------------------
# numpy core
# ----------------------------------------------------------------------------------------------

def logprob_difference(log_num: np.ndarray, log_den: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """``d = log_num - log_den`` per token (nats), NaN outside ``mask``; ``-inf`` where the
    numerator policy gives probability 0, ``+inf`` where the denominator does (NaN where both do)."""
    num = np.asarray(log_num, dtype=float)
    den = np.asarray(log_den, dtype=float)
    with np.errstate(invalid="ignore"):
        d = num - den
    return d if mask is None else np.where(np.asarray(mask, bool), d, np.nan)


def real(d: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """The real-token mask: ``mask``, or every non-NaN entry of ``d`` when ``mask`` is None."""
    return ~np.isnan(d) if mask is None else np.asarray(mask, bool)


def usable(d: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Real tokens with a finite ``d`` (the ones averages use)."""
    return real(d, mask) & np.isfinite(d)


def token_counts(d: np.ndarray, mask: np.ndarray | None = None, axis=None) -> tuple[Any, Any]:
    """(tokens used, tokens excluded because ``d`` is not finite) over ``axis``."""
    m = real(d, mask)
    u = m & np.isfinite(d)
    return u.sum(axis=axis), (m & ~u).sum(axis=axis)


def _share(hit: np.ndarray, used: np.ndarray, axis=None):
    n = used.sum(axis=axis)
    k = (hit & used).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, k / np.maximum(n, 1), np.nan)


def _safe_exp(x: np.ndarray, ok: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(np.where(ok, x, 0.0))


def token_mean(x: np.ndarray, d: np.ndarray, mask: np.ndarray | None = None, axis=None) -> Measured:
    """Mean of ``x`` over the usable tokens of ``d`` (real, finite d)."""
    u = usable(d, mask) & np.isfinite(x)
    n = u.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        v = np.where(n > 0, np.where(u, x, 0.0).sum(axis=axis) / np.maximum(n, 1), np.nan)
    return Measured(v, *token_counts(d, mask, axis))


def sequence_log_ratio(d: np.ndarray, mask: np.ndarray | None = None, *, kind: Kind = "geometric",
                       axis: int = -1) -> Measured:
    """Per sequence (``axis`` reduced): ``sum_t d`` (log of the product ratio) or ``mean_t d`` (log
    of the geometric ratio, GSPO's ``log s_i``). NaN for a sequence without tokens or with a
    non-finite token; ``n_used`` = its real tokens, ``n_excluded`` = its non-finite tokens."""
    if kind not in ("product", "geometric"):
        raise ValueError(f"kind={kind!r}; use 'product' or 'geometric'")
    m = real(d, mask)
    u = m & np.isfinite(d)
    n_tok = m.sum(axis=axis)
    n_bad = (m & ~u).sum(axis=axis)
    total = np.where(u, d, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        val = total if kind == "product" else total / np.maximum(n_tok, 1)
    return Measured(np.where((n_tok > 0) & (n_bad == 0), val, np.nan), n_tok, n_bad)


def _sequence_counts(s: Measured) -> tuple[int, int]:
    ok = np.isfinite(s.value)
    return int(ok.sum()), int((np.asarray(s.n_excluded) > 0).sum())


def token_clip_fraction(d: np.ndarray, mask: np.ndarray | None = None, *, eps_low: float | None = None,
                        eps_high: float | None = None, axis=None) -> Measured:
    """PPO clip fraction: share of usable tokens with ``rho = exp(d)`` outside
    ``[1 - eps_low, 1 + eps_high]`` (default ``OBJECTIVE_DEFAULTS.ppo_eps``)."""
    lo, hi = _eps(eps_low, eps_high, "token")
    u = usable(d, mask)
    r = _safe_exp(d, u)
    return Measured(_share((r < lo) | (r > hi), u, axis), *token_counts(d, mask, axis))


def sequence_clip_fraction(d: np.ndarray, mask: np.ndarray | None = None, *, eps_low: float | None = None,
                           eps_high: float | None = None, kind: Kind = "geometric", axis: int = -1) -> Measured:
    """GSPO clip fraction: share of sequences with ``s_i = exp(mean_t d)`` (``kind="geometric"``)
    outside ``[1 - eps_low, 1 + eps_high]`` (default the GSPO paper's 3e-4 / 4e-4).
    Counts are sequences."""
    lo, hi = _eps(eps_low, eps_high, "sequence")
    s = sequence_log_ratio(d, mask, kind=kind, axis=axis)
    ok = np.isfinite(s.value)
    r = _safe_exp(s.value, ok)
    return Measured(float(_share((r < lo) | (r > hi), ok)), *_sequence_counts(s))


def _eps(eps_low, eps_high, level):
    dl, dh = OBJECTIVE_DEFAULTS.eps(level)
    return 1.0 - (dl if eps_low is None else eps_low), 1.0 + (dh if eps_high is None else eps_high)


def importance_weights(d: np.ndarray, mask: np.ndarray | None = None, *, level: Level = "token",
                       kind: Kind = "product", cap: float | None = None, axis: int = -1) -> np.ndarray:
    """Importance weights shaped like ``d``: token ``w_t = exp(d_t)``; sequence ``w_i = exp(sum_t d)``
    (``kind="product"``) or ``exp(mean_t d)`` (``"geometric"``) on every token of the sequence.
    With ``cap`` the weights are truncated, ``min(w, cap)`` (TIS). NaN at padding, at excluded
    tokens and on every token of an excluded sequence."""
    if level == "token":
        u = usable(d, mask)
        w = np.where(u, _safe_exp(d, u), np.nan)
    elif level == "sequence":
        s = sequence_log_ratio(d, mask, kind=kind, axis=axis)
        ok = np.isfinite(s.value)
        ws = np.where(ok, _safe_exp(s.value, ok), np.nan)
        w = np.where(real(d, mask), np.expand_dims(ws, axis), np.nan)
    else:
        raise ValueError(f"level={level!r}; use 'token' or 'sequence'")
    return w if cap is None else np.minimum(w, cap)


def tis_weights(d: np.ndarray, mask: np.ndarray | None = None, *, cap: float | None = None) -> np.ndarray:
    """Token truncated importance sampling: ``w = min(rho, C)`` (``C`` default
    ``OBJECTIVE_DEFAULTS.is_cap``)."""
    return importance_weights(d, mask, level="token", cap=OBJECTIVE_DEFAULTS.is_cap if cap is None else cap)


def band_keep(d: np.ndarray, mask: np.ndarray | None = None, *, band: tuple[float, float],
              level: Level = "token", kind: Kind = "geometric", axis: int = -1) -> np.ndarray:
    """Rejection by a ratio band: keep a usable token whose ``rho`` (``level="token"``), or every
    token of a sequence whose product / geometric ratio (``"sequence"``), lies in ``band``.
    Excluded tokens and padding are never kept."""
    lo, hi = band
    w = importance_weights(d, mask, level=level, kind=kind, axis=axis)
    with np.errstate(invalid="ignore"):
        return np.isfinite(w) & (w >= lo) & (w <= hi) & usable(d, mask)


def kl_statistic(d: np.ndarray, estimator: str) -> np.ndarray:
    """Schulman's estimators per token with ``r = exp(d)``: ``k1 = -d``, ``k2 = d^2 / 2``,
    ``k3 = r - 1 - d`` (samples from the denominator policy; k1 and k3 estimate
    KL(denominator || numerator))."""
    with np.errstate(invalid="ignore", over="ignore"):
        if estimator == "k1":
            return -d
        if estimator == "k2":
            return 0.5 * d ** 2
        if estimator == "k3":
            return np.expm1(d) - d
    raise ValueError(f"estimator={estimator!r}; use 'k1', 'k2' or 'k3'")


def kl_keep(d: np.ndarray, mask: np.ndarray | None = None, *, rule: str = "token_k3",
            threshold: float | tuple[float, float] | None = None, axis: int = -1) -> np.ndarray:
    """Rejection by a KL estimator (verl's ``rollout_rs`` options): ``rule`` is
    ``<level>_<k>`` with level ``token`` | ``seq_sum`` | ``seq_mean`` | ``seq_max``. The statistic
    is the token's k value, or its sum / mean / max over the sequence. ``k1`` keeps a statistic
    inside the band ``threshold = (low, high)``; ``k2`` / ``k3`` keep it ``<= threshold``.
    Defaults: ``OBJECTIVE_DEFAULTS.kl_thresholds[rule]``. Excluded tokens are never kept, and a
    sequence rule drops every token of a sequence with an excluded token."""
    if rule not in KL_RULES:
        raise ValueError(f"rule={rule!r}; use one of {list(KL_RULES)}")
    level, est = rule.rsplit("_", 1)
    thr = OBJECTIVE_DEFAULTS.kl_thresholds[rule] if threshold is None else threshold
    if est == "k1":
        if np.ndim(thr) != 1 or len(thr) != 2:
            raise ValueError(f"{rule}: threshold must be a (low, high) band on k1 = -d in nats, got {thr!r}")
        lo, hi = thr
    else:
        if np.ndim(thr) != 0:
            raise ValueError(f"{rule}: threshold must be one upper bound (nats), got {thr!r}")
        lo, hi = -np.inf, float(thr)
    m = real(d, mask)
    u = m & np.isfinite(d)
    k = np.where(u, kl_statistic(np.where(u, d, 0.0), est), np.nan)
    if level == "token":
        stat = k
    else:
        bad = (m & ~u).any(axis=axis)
        if level == "seq_sum":
            s = np.where(u, k, 0.0).sum(axis=axis)
        elif level == "seq_mean":
            n = m.sum(axis=axis)
            s = np.where(u, k, 0.0).sum(axis=axis) / np.maximum(n, 1)
        else:
            s = np.where(u, k, -np.inf).max(axis=axis)
        s = np.where(bad | (m.sum(axis=axis) == 0), np.nan, s)
        stat = np.expand_dims(s, axis)
    with np.errstate(invalid="ignore"):
        return u & np.isfinite(stat) & (stat >= lo) & (stat <= hi)


def rejection_keep(d: np.ndarray, mask: np.ndarray | None = None, *, rule: str = "token_band",
                   threshold: Any = None, axis: int = -1) -> np.ndarray:
    """One rejection rule: ``token_band`` (rho in ``[1/C, C]``), ``geometric_band`` and
    ``product_band`` (sequence ratio in a band), or a KL rule of :func:`kl_keep`. ``threshold`` is
    the band or bound (default from :data:`OBJECTIVE_DEFAULTS`)."""
    if rule in BAND_RULES:
        band = OBJECTIVE_DEFAULTS.band(rule) if threshold is None else tuple(threshold)
        level: Level = "token" if rule == "token_band" else "sequence"
        kind: Kind = "product" if rule == "product_band" else "geometric"
        return band_keep(d, mask, band=band, level=level, kind=kind, axis=axis)
    if rule in KL_RULES:
        return kl_keep(d, mask, rule=rule, threshold=threshold, axis=axis)
    raise ValueError(f"rule={rule!r}; use one of {list(RULES)}")


def rejected_fraction(keep: np.ndarray, d: np.ndarray, mask: np.ndarray | None = None, *,
                      level: Level = "token", axis=None, position_axis: int = -1) -> Measured:
    """Share rejected. ``level="token"``: usable tokens not kept (over ``axis``). ``"sequence"``:
    sequences (with a usable token) that lose at least one usable token; counts are sequences.
    Excluded tokens are reported in ``n_excluded``, not as rejected; the other tokens of a
    sequence that a sequence rule drops because its ratio is undefined do count as rejected."""
    u = usable(d, mask)
    dropped = u & ~np.asarray(keep, bool)
    if level == "token":
        return Measured(_share(dropped, u, axis), *token_counts(d, mask, axis))
    if level != "sequence":
        raise ValueError(f"level={level!r}; use 'token' or 'sequence'")
    has = u.any(axis=position_axis)
    hit = dropped.any(axis=position_axis)
    excl = (real(d, mask) & ~u).any(axis=position_axis)
    return Measured(float(_share(hit, has)), int(has.sum()), int(excl.sum()))


def weights_ess(weights: np.ndarray, valid: np.ndarray | None = None, axis=None) -> Measured:
    """:func:`rlparity.metrics.core.ess` (``(sum w)^2 / (n sum w^2)`` in (0, 1] over the finite,
    ``valid`` weights) with its counts: weights used, and valid weights left out as not finite.
    Give it raw weights: truncation hides a collapse."""
    w = np.asarray(weights, dtype=float)
    ok = np.isfinite(w) & (True if valid is None else np.asarray(valid, bool))
    excl = ((~np.isfinite(w)) & (True if valid is None else np.asarray(valid, bool))).sum(axis=axis)
    return Measured(core.ess(w, valid, axis=axis), ok.sum(axis=axis), excl)


def token_ess(d: np.ndarray, mask: np.ndarray | None = None, axis=None) -> Measured:
    """ESS of the raw token weights ``exp(d)`` (scale-free: computed as ``exp(d - max d)``)."""
    u = usable(d, mask)
    top = np.max(np.where(u, d, -np.inf), axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    w = np.where(u, _safe_exp(d - top, u), np.nan)
    out = weights_ess(w, u, axis)
    return Measured(out.value, *token_counts(d, mask, axis))


def sequence_ess(d: np.ndarray, mask: np.ndarray | None = None, *, kind: Kind = "product",
                 axis: int = -1) -> Measured:
    """ESS over sequences of the raw sequence weights (product or geometric ratio), computed in
    log space so a long sequence cannot overflow it. Counts are sequences."""
    s = sequence_log_ratio(d, mask, kind=kind, axis=axis)
    ok = np.isfinite(s.value)
    top = np.max(np.where(ok, s.value, -np.inf)) if ok.any() else 0.0
    w = np.where(ok, _safe_exp(s.value - top, ok), np.nan)
    return Measured(float(weights_ess(w, ok).value), *_sequence_counts(s))


def decoupled_weights(log_mu: np.ndarray, log_old: np.ndarray, log_theta: np.ndarray,
                      mask: np.ndarray | None = None, *, cap: float | None = None) -> dict[str, np.ndarray]:
    """The decoupled (three-policy) token weight and its parts, shaped like the inputs:

    * ``correction_weight`` = pi_old / mu (backend pair), truncated at ``cap`` when given;
    * ``update_ratio`` = pi_theta / pi_old (update pair, what PPO clips);
    * ``weight`` = their product, the factor on the advantage;
    * ``bypass_ratio`` = pi_theta / mu (two-policy form; equals ``weight`` when ``cap`` is None).
    """
    m = real(logprob_difference(log_old, log_mu), mask) if mask is None else np.asarray(mask, bool)
    corr = importance_weights(logprob_difference(log_old, log_mu, m), m, cap=cap)
    upd = importance_weights(logprob_difference(log_theta, log_old, m), m)
    return {"correction_weight": corr, "update_ratio": upd, "weight": corr * upd,
            "bypass_ratio": importance_weights(logprob_difference(log_theta, log_mu, m), m)}


# ----------------------------------------------------------------------------------------------
# xarray layer
# ----------------------------------------------------------------------------------------------

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


def policy_logprob(trace: xr.Dataset, policy: str, trainer: TrainerSide | None = None) -> np.ndarray:
    """The per-token log-probabilities of ``policy`` as a float array (NaN on padding)."""
    var = policy_variable(policy, trainer)
    if var not in trace:
        raise ValueError(f"the trace has no {var} ({POLICY_NAMES[policy]}): {_NEEDS.get(policy, '')}")
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


def _wrap(m: Measured, d: xr.DataArray, axes, name: str, attrs: dict, counts: str = "tokens") -> xr.DataArray:
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
    m = Measured(np.where(ok, _safe_exp(s.value, ok), np.nan), s.n_used, s.n_excluded)
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
        u = usable(d)
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


__all__ = [
    "BAND_RULES", "KL_RULES", "OBJECTIVE_DEFAULTS", "PAIRS", "RULES", "Measured",
    "available_pairs", "band_keep", "clip_fraction", "decoupled", "decoupled_weights", "effective_sample_size",
    "importance_weights", "is_weights", "kl_keep", "kl_statistic", "logprob_difference", "masked_fraction",
    "objective_summary", "pair_direction", "pair_log_ratio", "policy_logprob",
    "policy_variable", "ratio", "real", "rejected_fraction", "rejection_keep", "sequence_clip_fraction",
    "sequence_ess", "sequence_log_ratio", "tis_weights", "token_clip_fraction", "token_counts", "token_ess",
    "token_mean", "usable", "weights_ess",
]
