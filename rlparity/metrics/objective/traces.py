"""The objective layer on traces (xarray): the core's reductions of a pair with ``dim=`` (``None``:
everything, ``"position"``: one value per sequence, ``"sequence"``: one value per position), counts
as coordinates, pair and direction in attrs. The policies and pairs they read, and the blocks they
read them in, are :mod:`~rlparity.metrics.objective.pairs`.

A lazy trace (``rlparity.trace.open_arms(store, chunks=N)``) is reduced with bounded memory: the
reductions read it one block of whole sequences at a time through :func:`rlparity.trace.blocks`
(each block validated, the store's CRC-32 record checked once the last is read) and merge the
blocks' parts (counts and sums, :func:`~rlparity.metrics.objective.arrays.share_parts`,
:func:`~rlparity.metrics.objective.arrays.ess_parts`; per-sequence values concatenated). Memory
is one block plus one number per sequence (or per position). Per-token results (:func:`ratio`,
:func:`is_weights`, :func:`decoupled`) of a lazy trace are lazy (dask, chunk by chunk); their
chunks must hold whole sequences (``chunks=N``), or they are refused with a one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import reduce
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import Level, TrainerSide, defaults
from rlparity.config.provenance import make_attrs
from rlparity.metrics.objective.arrays.ess import ess_of, ess_parts, merge_ess_parts, sequences_ess
from rlparity.metrics.objective.arrays.rejection import rejected_sequences, rejection_keep, sequences_rejected
from rlparity.metrics.objective.arrays.tokens import (
    ValueWithCounts,
    _safe_exp,
    finite_tokens,
    logprob_difference,
    share_of,
    share_parts,
    token_counts,
)
from rlparity.metrics.objective.arrays.weights import (
    _eps,
    decoupled_weights,
    importance_weights,
    sequences_clip_fraction,
)
from rlparity.metrics.objective.pairs import (
    DIMS,
    PAIRS,
    concat_sequences,
    pair_blocks,
    pair_direction,
    pair_sequences,
    policy_logprob,
    policy_variable,
)
from rlparity.metrics.objective.settings import BAND_RULES, OBJECTIVE_DEFAULTS, Kind, PairName
from rlparity.trace import arm_record, is_lazy
from rlparity.trace.storage.lazy.reading import ensure_validated


def _axes(dim, dims: tuple[str, ...]):
    if dim is None:
        return None
    names = (dim,) if isinstance(dim, str) else tuple(dim)
    bad = [n for n in names if n not in dims]
    if bad:
        raise ValueError(f"dim={dim!r}: unknown dim {bad}; use one of {list(dims)} or None")
    return tuple(dims.index(n) for n in names)


def _wrap(m: ValueWithCounts, trace: xr.Dataset, pair_attrs: dict, axes, name: str, attrs: dict,
          counts: str = "tokens") -> xr.DataArray:
    keep = [n for i, n in enumerate(DIMS) if axes is not None and i not in axes]
    coords = {n: trace[n] for n in keep}
    da = xr.DataArray(np.asarray(m.value, dtype=float), dims=keep, coords=coords, name=name)
    da = da.assign_coords(n_used=(keep, np.asarray(m.n_used)), n_excluded=(keep, np.asarray(m.n_excluded)))
    da.attrs = {**{k: v for k, v in pair_attrs.items() if k in ("pair", "direction", "trainer_side")},
                "counts": counts, **attrs}
    return da


def _token_reduction(trace: xr.Dataset, pair: PairName, trainer: TrainerSide | None, dim,
                     parts: Callable[[np.ndarray, Any], dict], finish: Callable[[dict], ValueWithCounts],
                     merge: Callable[[dict, dict], dict] | None = None) -> tuple[ValueWithCounts, Any]:
    """A token reduction over ``dim`` block by block: a reduction that keeps ``sequence`` finishes
    each block and concatenates; one over ``sequence`` merges the blocks' parts (summed unless
    ``merge`` says otherwise), then finishes."""
    axes = _axes(dim, DIMS)
    if axes is not None and 0 not in axes:  # one value per sequence: blocks are whole sequences
        done = [finish(parts(d, axes)) for d in pair_blocks(trace, pair, trainer)]
        return concat_sequences(done), axes
    merge = merge or (lambda a, b: {k: a[k] + b[k] for k in a})
    return finish(reduce(merge, (parts(d, axes) for d in pair_blocks(trace, pair, trainer)))), axes


def _lazy_tokens(trace: xr.Dataset, func: Callable[..., np.ndarray], variables: list[str]):
    """``func(mask, *variables)`` per token: on the arrays of a trace in memory, or chunk by chunk
    (dask, lazy) on a lazy trace whose chunks hold whole sequences."""
    arrays = [trace["response_mask"]] + [trace[v] for v in variables]
    if not is_lazy(trace):
        return func(*(a.values for a in arrays))
    chunks = trace["rollout_logprob"].chunks
    if len(chunks) > 1 and any(len(c) > 1 for c in chunks[1:]):
        raise ValueError("this lazy trace is chunked along position, which splits its sequences; the objective "
                         "metrics need whole sequences per chunk: open it with open_arms(store, chunks=N) "
                         "(N sequences per chunk)")
    import dask.array as da

    ensure_validated(trace)  # the arm read whole once, as the eager open reads it, before a lazy result
    return da.map_blocks(func, *(a.data for a in arrays), dtype=float)


def _masked(mask, *logprobs):
    m = np.asarray(mask).astype(bool)
    return m, [np.where(m, np.asarray(lp, dtype=float), np.nan) for lp in logprobs]


def ratio(trace: xr.Dataset, pair: PairName = "backend", *, level: Level = "token", kind: Kind = "geometric",
          trainer: TrainerSide | None = None) -> xr.DataArray:
    """The pair's ratio per token or per sequence.

    Per token ``rho = exp(d)`` (0 or inf where a policy gives probability 0); per sequence the
    geometric (GSPO, ``exp(mean_t d)``) or product ratio (NaN for an excluded sequence). A lazy
    trace gives a lazy (dask) token ratio, computed chunk by chunk; its sequence ratio (one value
    per sequence) is read block by block.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy.
    pair : {"backend", "update", "bypass"}
        The pair of policies.
    level : {"token", "sequence"}
        Per token, or per sequence.
    kind : {"geometric", "product"}
        The sequence ratio (``level="sequence"`` only).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    xarray.DataArray
        ``(sequence, position)`` token ratios, or ``(sequence,)`` sequence ratios with coordinates
        ``n_used`` tokens and ``n_excluded`` tokens.
    """
    attrs = pair_direction(pair, trainer)
    num, den = PAIRS[pair]
    if level == "token":
        def token_ratio(mask, a, b):
            m, (la, lb) = _masked(mask, a, b)
            with np.errstate(over="ignore"):
                return np.exp(logprob_difference(la, lb, m))

        values = _lazy_tokens(trace, token_ratio, [policy_variable(num, trainer), policy_variable(den, trainer)])
        return xr.DataArray(values, dims=DIMS, coords={n: trace[n] for n in DIMS}, name="ratio",
                            attrs={**attrs, "units": "1", "long_name": f"token ratio, {attrs['pair']}"})
    s = pair_sequences(trace, pair, trainer, kind=kind)
    ok = np.isfinite(s.value)
    m = ValueWithCounts(np.where(ok, _safe_exp(s.value, ok), np.nan), s.n_used, s.n_excluded)
    return _wrap(m, trace, attrs, (1,), "ratio", {"units": "1", "level": "sequence", "kind": kind,
                                                 "long_name": f"{kind} sequence ratio, {attrs['pair']}"})


def clip_fraction(trace: xr.Dataset, pair: PairName = "update", *, level: Level = "token",
                  eps_low: float | None = None, eps_high: float | None = None, dim=None,
                  trainer: TrainerSide | None = None) -> xr.DataArray:
    """PPO token clip fraction, or GSPO sequence clip fraction.

    ``level="token"``: share of usable tokens with ``rho`` outside ``[1 - eps_low, 1 + eps_high]``
    (eps default 0.2), reduced over ``dim``. ``level="sequence"``: share of sequences whose
    geometric ratio lies outside the band (eps default 3e-4 / 4e-4); one value. A lazy trace is
    read block by block (bounded memory).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy.
    pair : {"backend", "update", "bypass"}
        The pair of policies (default ``"update"``, what PPO clips).
    level : {"token", "sequence"}
        PPO (token) or GSPO (sequence).
    eps_low, eps_high : float, optional
        The clip range (defaults from :data:`OBJECTIVE_DEFAULTS`).
    dim : str or sequence of str, optional
        Dims reduced (``None``: all; ``"position"``: one value per sequence; ``"sequence"``: one
        per position). A sequence-level fraction takes only ``None``.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    xarray.DataArray
        The fraction, with coordinates ``n_used`` and ``n_excluded`` (tokens, or sequences).
    """
    lo, hi = OBJECTIVE_DEFAULTS.eps(level)
    eps_low, eps_high = (lo if eps_low is None else eps_low), (hi if eps_high is None else eps_high)
    attrs = {"units": "1", "level": level, "eps_low": eps_low, "eps_high": eps_high}
    pattrs = pair_direction(pair, trainer)
    if level == "token":
        low, high = _eps(eps_low, eps_high, "token")

        def parts(d, axes):
            u = finite_tokens(d)
            r = _safe_exp(d, u)
            return share_parts((r < low) | (r > high), d, axis=axes)

        m, axes = _token_reduction(trace, pair, trainer, dim, parts, share_of)
        return _wrap(m, trace, pattrs, axes, "clip_fraction", {**attrs, "long_name": (
            f"share of tokens with ratio outside [1-{eps_low:g}, 1+{eps_high:g}]")})
    if dim not in (None, "sequence"):
        raise ValueError("a sequence-level clip fraction reduces over sequences: use dim=None")
    low, high = _eps(eps_low, eps_high, "sequence")
    m = sequences_clip_fraction(pair_sequences(trace, pair, trainer), low, high)
    return _wrap(m, trace, pattrs, (0, 1), "clip_fraction", {**attrs, "long_name": (
        f"share of sequences with geometric ratio outside [1-{eps_low:g}, 1+{eps_high:g}]")}, "sequences")


def is_weights(trace: xr.Dataset, pair: PairName = "backend", *, level: Level = "token", kind: Kind = "product",
               cap: float | None = None, truncate: bool = True, trainer: TrainerSide | None = None) -> xr.DataArray:
    """Importance weights of a pair per token.

    Token ``rho`` or the sequence's product / geometric ratio, truncated at ``cap`` unless
    ``truncate=False``; NaN at padding and at excluded tokens / sequences. A lazy trace gives a
    lazy (dask) result, computed chunk by chunk (chunks of whole sequences).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy.
    pair : {"backend", "update", "bypass"}
        The pair of policies.
    level : {"token", "sequence"}
        Token weights, or the sequence's weight on each of its tokens.
    kind : {"product", "geometric"}
        The sequence weight (``level="sequence"`` only).
    cap : float, optional
        The truncation (default ``OBJECTIVE_DEFAULTS.is_cap``).
    truncate : bool
        Truncate at ``cap`` (False: raw weights).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    xarray.DataArray
        ``(sequence, position)`` weights.
    """
    attrs = pair_direction(pair, trainer)
    num, den = PAIRS[pair]
    c = (OBJECTIVE_DEFAULTS.is_cap if cap is None else cap) if truncate else None
    if level not in ("token", "sequence"):
        raise ValueError(f"level={level!r}; use 'token' or 'sequence'")

    def weights(mask, a, b):
        m, (la, lb) = _masked(mask, a, b)
        return importance_weights(logprob_difference(la, lb, m), level=level, kind=kind, cap=c)

    w = _lazy_tokens(trace, weights, [policy_variable(num, trainer), policy_variable(den, trainer)])
    return xr.DataArray(w, dims=DIMS, coords={n: trace[n] for n in DIMS}, name="is_weight", attrs={
        **attrs, "units": "1", "level": level,
        "kind": kind if level == "sequence" else "token", "cap": "none" if c is None else c,
        "long_name": ("truncated " if c is not None else "raw ") + "importance weight"})


def _default_threshold(rule: str):
    return OBJECTIVE_DEFAULTS.band(rule) if rule in BAND_RULES else OBJECTIVE_DEFAULTS.kl_thresholds[rule]


def masked_fraction(trace: xr.Dataset, rule: str = "token_band", pair: PairName = "backend", *,
                    level: Level = "token", threshold: Any = None, dim=None,
                    trainer: TrainerSide | None = None) -> xr.DataArray:
    """Share of usable tokens, or of sequences, that a rejection rule rejects.

    ``level="token"``: usable tokens not kept, reduced over ``dim``; ``"sequence"``: sequences
    losing at least one token. A lazy trace is read block by block (bounded memory).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy.
    rule : str
        One of :data:`~rlparity.metrics.objective.settings.RULES` (see :func:`~rlparity.metrics.objective.arrays.rejection_keep`).
    pair : {"backend", "update", "bypass"}
        The pair of policies.
    level : {"token", "sequence"}
        Share of tokens, or of sequences.
    threshold : optional
        The rule's band or bound (default from :data:`OBJECTIVE_DEFAULTS`).
    dim : str or sequence of str, optional
        Dims reduced (token level; ``None``: all). A sequence-level share takes only ``None``.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    xarray.DataArray
        The share, with coordinates ``n_used`` and ``n_excluded`` (tokens, or sequences).
    """
    rejection_keep(np.zeros((1, 1)), rule=rule, threshold=threshold)  # a bad rule or threshold: said before reading
    pattrs = pair_direction(pair, trainer)
    attrs = {"units": "1", "rule": rule, "level": level,
             "threshold": str(threshold if threshold is not None else _default_threshold(rule)),
             "long_name": f"share of {level}s rejected by {rule}"}
    if level == "token":
        def parts(d, axes):
            return share_parts(~rejection_keep(d, rule=rule, threshold=threshold), d, axis=axes)

        m, axes = _token_reduction(trace, pair, trainer, dim, parts, share_of)
        return _wrap(m, trace, pattrs, axes, "masked_fraction", attrs)
    if level != "sequence":
        raise ValueError(f"level={level!r}; use 'token' or 'sequence'")
    if dim not in (None, "sequence"):
        raise ValueError("a sequence-level masked fraction reduces over sequences: use dim=None")
    per_seq = [rejected_sequences(rejection_keep(d, rule=rule, threshold=threshold), d)
               for d in pair_blocks(trace, pair, trainer)]
    merged = {k: np.concatenate([p[k] for p in per_seq]) for k in per_seq[0]}
    return _wrap(sequences_rejected(merged), trace, pattrs, (0, 1), "masked_fraction", attrs, "sequences")


def effective_sample_size(trace: xr.Dataset, pair: PairName = "backend", *, level: Level = "token",
                          kind: Kind = "product", dim=None, trainer: TrainerSide | None = None) -> xr.DataArray:
    """Normalised ESS ``(sum w)^2 / (n sum w^2)`` of the raw (untruncated) weights of a pair.

    Token weights reduced over ``dim``, or sequence weights (product / geometric) over all
    sequences. A lazy trace is read block by block (bounded memory; blocks' sums in log space
    rescaled to the largest weight).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm, in memory or lazy.
    pair : {"backend", "update", "bypass"}
        The pair of policies.
    level : {"token", "sequence"}
        Token weights, or sequence weights.
    kind : {"product", "geometric"}
        The sequence weight (``level="sequence"`` only).
    dim : str or sequence of str, optional
        Dims reduced (token level; ``None``: all). A sequence-level ESS takes only ``None``.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    xarray.DataArray
        The ESS in (0, 1], with coordinates ``n_used`` and ``n_excluded`` (tokens, or sequences).
    """
    pattrs = pair_direction(pair, trainer)
    attrs = {"units": "1", "level": level, "long_name": "normalised ESS (sum w)^2 / (n sum w^2), raw weights"}
    if level == "token":
        def parts(d, axes):
            return {**ess_parts(d, finite_tokens(d), axes), **dict(zip(("used", "excluded"), token_counts(d, axis=axes)))}

        def merge(a, b):
            return {**merge_ess_parts(a, b), "used": a["used"] + b["used"], "excluded": a["excluded"] + b["excluded"]}

        def finish(p):
            return ValueWithCounts(ess_of(p), p["used"], p["excluded"])

        m, axes = _token_reduction(trace, pair, trainer, dim, parts, finish, merge)
        return _wrap(m, trace, pattrs, axes, "ess", attrs)
    if dim not in (None, "sequence"):
        raise ValueError("a sequence-level ESS reduces over sequences: use dim=None")
    m = sequences_ess(pair_sequences(trace, pair, trainer, kind=kind))
    return _wrap(m, trace, pattrs, (0, 1), "ess", {**attrs, "kind": kind}, "sequences")


def decoupled(trace: xr.Dataset, *, cap: float | None = None, trainer: TrainerSide | None = None) -> xr.Dataset:
    """The decoupled three-policy weights per token (see :func:`~rlparity.metrics.objective.arrays.weights.decoupled_weights`).

    A lazy trace gives lazy (dask) variables, computed chunk by chunk (chunks of whole sequences).

    Parameters
    ----------
    trace : xarray.Dataset
        One arm holding mu, pi_old and pi_theta, in memory or lazy.
    cap : float, optional
        Truncation of the correction weight (None: raw).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).

    Returns
    -------
    xarray.Dataset
        ``correction_weight`` (pi_old/mu, truncated at ``cap`` when given), ``update_ratio``
        (pi_theta/pi_old), ``weight`` (their product) and ``bypass_ratio`` (pi_theta/mu), each
        ``(sequence, position)``.
    """
    trainer = trainer or defaults().trainer
    names = [policy_variable(p, trainer) for p in ("mu", "old", "theta")]
    for p in ("mu", "old", "theta"):
        policy_logprob(trace.isel(sequence=slice(0, 0)), p, trainer)  # a missing policy: said here
    pairs = {"correction_weight": "backend", "update_ratio": "update", "weight": "backend x update",
             "bypass_ratio": "bypass"}
    ds = xr.Dataset(coords={"sequence": trace["sequence"], "position": trace["position"]})
    for k, p in pairs.items():
        def part(mask, mu, old, theta, key=k):
            m, (lmu, lold, ltheta) = _masked(mask, mu, old, theta)
            return decoupled_weights(lmu, lold, ltheta, m, cap=cap)[key]

        attrs = pair_direction(p, trainer) if p in PAIRS else {
            "pair": "backend (pi_old, mu) x update (pi_theta, pi_old)",
            "direction": "exp(correction) * exp(update)", "trainer_side": trainer}
        ds[k] = (DIMS, _lazy_tokens(trace, part, names), {**attrs, "units": "1"})
    ds.attrs = make_attrs(cap="none" if cap is None else cap, trainer_side=trainer,
                          arm=arm_record(trace).name)
    return ds
