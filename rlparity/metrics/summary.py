"""The parity summary: a thin xarray layer over :mod:`rlparity.metrics.core`.

Every reduction takes ``dim``, the dims it reduces (ArviZ's ``sample_dims``): ``None`` reduces
``sequence`` and ``position`` (scalars), ``dim="position"`` gives one value per sequence,
``dim="sequence"`` one value per position. Every variable names its pair and direction in the
dataset attrs: the backend pair is ``(pi_old, mu)`` = (trainer, rollout engine) and
``d = log pi_old - log mu`` (nats).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs
from rlparity.config.defaults import TrainerSide, defaults
from rlparity.metrics import core
from rlparity.metrics.objective import token_clip_fraction
from rlparity.metrics.stream import summary_stream
from rlparity.trace import TraceValidationError, has_trainer, is_lazy

TRAINER_VARIABLE = {"processed": "trainer_processed_logprob", "raw": "trainer_logprob"}
BACKEND_PAIR = "backend (pi_old, mu)"
BACKEND_PAIR_D = "backend (pi_old, mu), d = log pi_old - log mu"
REFERENCE_PAIR_D = "arm vs reference arm, d_ref = log mu_arm - log mu_reference"
TOKEN_DIMS = ("sequence", "position")

# name -> (long name, units); the order is the order of the text summary
SUMMARY_VARIABLES: dict[str, tuple[str, str | None]] = {
    "n_tokens": ("real response tokens", "tokens"),
    "n_used": ("tokens the statistics of d use (finite d)", "tokens"),
    "n_zero_prob": ("tokens excluded because the trainer gives them probability 0 (d = -inf), counted here",
                    "tokens"),
    "log_ratio_mean": ("mean of d over tokens", "nats"),
    "abs_log_ratio_mean": ("mean of |d|", "nats"),
    "abs_log_ratio_rms": ("RMS of d", "nats"),
    "abs_log_ratio_max": ("max of |d|", "nats"),
    "log_ratio_q01": ("1% quantile of d", "nats"),
    "log_ratio_q05": ("5% quantile of d", "nats"),
    "log_ratio_q50": ("50% quantile of d", "nats"),
    "log_ratio_q95": ("95% quantile of d", "nats"),
    "log_ratio_q99": ("99% quantile of d", "nats"),
    "mean_ratio": ("mean of exp(d) = pi_old/mu", None),
    "kl_k1": ("Schulman k1, samples from mu, r = pi_old/mu (estimates KL(mu||pi_old))", "nats"),
    "kl_k2": ("Schulman k2, samples from mu, r = pi_old/mu", "nats"),
    "kl_k3": ("Schulman k3, samples from mu, r = pi_old/mu (estimates KL(mu||pi_old))", "nats"),
    "clip_fraction": ("share of tokens with pi_old/mu outside [1-eps, 1+eps]", None),
    "ess_token": ("normalised ESS of token weights pi_old/mu (raw, untruncated)", None),
    "prob_diff_mean": ("mean |pi_old - mu|", None),
    "prob_diff_max": ("max |pi_old - mu|", None),
    "prob_diff_std": ("std |pi_old - mu|", None),
    "prob_pearson": ("Pearson corr(pi_old, mu) of sampled-token probabilities", None),
}
# beside the gap, from what the rescoring and the capture recorded (one number per trace, whatever dim)
FLOOR_SUMMARY_VARIABLES: dict[str, tuple[str, str | None]] = {
    "trainer_floor": ("the trainer's own floor: mean |x| between its batch and the same sequences alone "
                      "(self-check; NaN = not measured)", "nats"),
    "engine_floor": ("the engine's own floor: mean |x| between its batch and the same requests alone "
                     "(NaN = not measured)", "nats"),
    "trainer_floor_share": ("the share of the gap (mean |d|) the trainer's batch shape alone produces", None),
}
_TEXT_ORDER = ["n_tokens", "n_zero_prob", "log_ratio_mean", "abs_log_ratio_mean", "abs_log_ratio_rms",
               "abs_log_ratio_max", "log_ratio_q01", "log_ratio_q50", "log_ratio_q99", "mean_ratio", "kl_k1",
               "kl_k3", "clip_fraction", "ess_token", "prob_pearson", "trainer_floor", "engine_floor",
               "trainer_floor_share"]


def trainer_variable(trainer: TrainerSide | None = None) -> str:
    """The trace variable of a trainer reading: ``processed`` or ``raw`` (default: the defaults')."""
    trainer = trainer or defaults().trainer
    if trainer not in TRAINER_VARIABLE:
        raise ValueError(f"trainer={trainer!r}; use 'processed' or 'raw'")
    return TRAINER_VARIABLE[trainer]


def trainer_readings(trace: xr.Dataset) -> list[str]:
    """The trainer readings a trace holds, ``processed`` first (imported dumps may hold one)."""
    return [side for side, var in TRAINER_VARIABLE.items() if var in trace]


def trainer_side(trace: xr.Dataset, preferred: TrainerSide | None = None) -> TrainerSide:
    """``preferred`` (default: the defaults') when the trace holds that reading, else the one it holds."""
    preferred = preferred or defaults().trainer
    have = trainer_readings(trace)
    if not have:
        raise TraceValidationError("the trace has no trainer side: run `rlparity score TRACE --model MODEL` first")
    return preferred if preferred in have else have[0]  # type: ignore[return-value]


def pair_attrs(trainer: TrainerSide | None = None, **extra: Any) -> dict[str, Any]:
    """Provenance attrs of a backend-pair result: pair, direction, trainer side, units."""
    var = trainer_variable(trainer)
    return make_attrs(pair=BACKEND_PAIR, direction=f"{var} - rollout_logprob",
                      trainer_side=trainer or defaults().trainer, units="nats", **extra)


def reduce_dims(dim: str | Sequence[str] | None) -> tuple[str, ...]:
    """``dim`` as a tuple of token dims (``None`` = both)."""
    dims = TOKEN_DIMS if dim is None else ((dim,) if isinstance(dim, str) else tuple(dim))
    bad = [d for d in dims if d not in TOKEN_DIMS]
    if bad or not dims:
        raise ValueError(f"dim={dim!r}: reduce over 'sequence', 'position' or both (None)")
    return dims


def reduce(func: Callable[..., Any], *arrays: xr.DataArray, dim: str | Sequence[str] | None = None,
           **kwargs: Any) -> xr.DataArray:
    """Apply a numpy core reduction ``func(*arrays, axis=...)`` over ``dim`` (the xarray layer)."""
    dims = reduce_dims(dim)
    axis = tuple(range(-len(dims), 0))
    return xr.apply_ufunc(func, *arrays, input_core_dims=[list(dims)] * len(arrays),
                          kwargs={"axis": axis, **kwargs})


def _require_trainer(trace: xr.Dataset, var: str) -> None:
    if not has_trainer(trace):
        raise TraceValidationError("the trace has no trainer side: run `rlparity score TRACE --model MODEL` first")
    if var not in trace:
        other = next(k for k, v in TRAINER_VARIABLE.items() if v != var)
        raise TraceValidationError(f"the trace has no {var}: use trainer={other!r} (the reading it has) "
                                   "or rescore it with `rlparity score`")


def log_ratio(trace: xr.Dataset, trainer: TrainerSide | None = None) -> xr.DataArray:
    """Per-token ``d = log pi_old - log mu`` (nats), NaN on padding, -inf where pi_old = 0."""
    var = trainer_variable(trainer)
    _require_trainer(trace, var)
    d = (trace[var] - trace["rollout_logprob"]).where(trace["response_mask"])
    d.name = "log_ratio"
    d.attrs = {"units": "nats", "pair": BACKEND_PAIR, "direction": f"{var} - rollout_logprob",
               "long_name": "log pi_old - log mu"}
    return d


def summary(trace: xr.Dataset, trainer: TrainerSide | None = None, eps: float | None = None, *,
            dim: str | Sequence[str] | None = None, progress: Callable | None = None) -> xr.Dataset:
    """Parity summary of one trace, reduced over ``dim`` (default: every token, scalars).

    Token stats of d (mean, ``|d|`` mean / RMS / max, quantiles), mean ratio, Schulman's KL
    estimators, clip fraction at ``eps``, token ESS, probability differences and their Pearson
    correlation; ``n_tokens`` real tokens, ``n_used`` of them with a finite d, ``n_zero_prob``
    excluded because the trainer gives them probability 0 (counted, never averaged away).

    A lazy trace (``rlparity.trace.open_arms(store, chunks=N)``) is read one block of sequences at a
    time (:mod:`rlparity.metrics.stream`; memory is one block; ``progress`` wraps the blocks, e.g.
    ``tqdm.tqdm``): every statistic is exact except the five quantiles beyond 5M tokens, which
    come from a fine histogram (within one bin, 3.7%, of the order statistics they fall between).
    """
    eps = defaults().eps if eps is None else float(eps)
    if is_lazy(trace):  # a trace larger than memory (open_arms(..., chunks=)): one block at a time
        if dim is not None:
            raise ValueError(f"a lazy trace (opened with chunks=) is summarised over every token only (dim=None), "
                             f"not dim={dim!r}: open it without chunks=, or select fewer sequences and .load()")
        var = trainer_variable(trainer)
        _require_trainer(trace, var)
        values = summary_stream(trace, var, eps, progress=progress)
        streamed = xr.Dataset({k: ((), values[k] if k.startswith("n_") else np.float64(values[k]))
                               for k in SUMMARY_VARIABLES})
        return _finish(streamed, trace, trainer, eps, dim)
    if dim is None:
        fast = scalar_summary(trace, trainer, eps)
        if fast is not None:
            return _finish(fast, trace, trainer, eps, dim)
    d = log_ratio(trace, trainer)
    mask = trace["response_mask"]
    log_pi = trace[trainer_variable(trainer)]
    log_mu = trace["rollout_logprob"]
    finite = xr.apply_ufunc(core.finite_mask, d, mask)

    def red(func, *arrays, **kw):
        return reduce(func, *arrays, dim=dim, **kw)

    out: dict[Hashable, xr.DataArray] = {
        "n_tokens": red(core.count, mask),
        "n_used": red(core.count, finite),
        "n_zero_prob": red(core.zero_prob_count, log_pi, mask),
        "log_ratio_mean": red(core.masked_mean, d, mask),
        "abs_log_ratio_mean": red(core.masked_mean, abs(d), mask),
        "abs_log_ratio_rms": red(core.masked_rms, d, mask),
        "abs_log_ratio_max": red(core.masked_max_abs, d, mask),
    }
    for q in core.QUANTILES:
        out[f"log_ratio_q{int(q * 100):02d}"] = red(core.masked_quantile, d, mask, q=q)
    out["mean_ratio"] = red(core.mean_ratio, d, mask)
    for k in ("k1", "k2", "k3"):
        out[f"kl_{k}"] = red(lambda x, m, axis, k=k: core.kl_estimators(x, m, axis=axis)[k], d, mask)
    out["clip_fraction"] = red(lambda x, m, axis: token_clip_fraction(x, m, eps_low=eps, eps_high=eps, axis=axis).value,
                               d, mask)
    out["ess_token"] = red(lambda x, m, axis: core.ess(np.exp(np.where(m, x, 0.0)), m, axis=axis), d, finite)
    for k in ("prob_diff_mean", "prob_diff_max", "prob_diff_std", "prob_pearson"):
        out[k] = red(lambda a, b, m, axis, k=k: core.prob_stats(a, b, m, axis=axis)[k], log_pi, log_mu, mask)
    return _finish(xr.Dataset(out), trace, trainer, eps, dim)


def _finish(ds: xr.Dataset, trace: xr.Dataset, trainer: TrainerSide | None, eps: float,
            dim: str | Sequence[str] | None) -> xr.Dataset:
    """Names, units and provenance of a summary dataset."""
    from rlparity.metrics.floors import floors_beside_gap

    gap = float(ds["abs_log_ratio_mean"]) if ds["abs_log_ratio_mean"].ndim == 0 else float(
        core.masked_mean(np.abs(log_ratio(trace, trainer).values), trace["response_mask"].values))
    for k, v in floors_beside_gap(trace, gap, trainer_side(trace, trainer)).items():
        ds[k] = v  # scalars whatever dim was reduced: a floor is one number per rescoring
    for name, (long_name, units) in {**SUMMARY_VARIABLES, **FLOOR_SUMMARY_VARIABLES}.items():
        ds[name].attrs = {"long_name": long_name.replace("eps]", f"eps] (eps={eps:g})") if name == "clip_fraction"
                          else long_name, **({"units": units} if units else {})}
    ds.attrs = pair_attrs(trainer, arm=trace.attrs.get("arm", "default"), eps=eps,
                          reduced_dims=list(reduce_dims(dim)))
    return ds


def _finite_mean(v: np.ndarray, all_finite: bool = False) -> tuple[float, np.ndarray | None]:
    """(mean over the finite entries of a 1-d array, or NaN; the finite mask, None when all are),
    as :func:`rlparity.metrics.core.masked_mean` computes it (``all_finite``: known, skip the check)."""
    f = None if all_finite else np.isfinite(v)
    if f is None or f.all():
        return (float(np.sum(v) / v.size) if v.size else np.nan), None
    n = int(np.count_nonzero(f))
    return (float(np.sum(v[f]) / n) if n else np.nan), f


def _finite_max(v: np.ndarray) -> float:
    """Largest entry of a 1-d array of finite values (NaN when empty)."""
    return float(np.max(v)) if v.size else np.nan


EXP_SAFE = 700.0  # |x| below this: exp, expm1 and x**2 of float64 stay finite


def scalar_summary(trace: xr.Dataset, trainer: TrainerSide | None = None, eps: float | None = None
                   ) -> xr.Dataset | None:
    """:func:`summary` over every token (``dim=None``) in a few passes over 1-d arrays.

    The real tokens are compressed once; every statistic is then computed on 1-d arrays with the
    same definitions as :mod:`rlparity.metrics.core` (finite entries only, ``-inf`` counted) and
    the five quantiles come from one ``np.quantile`` call. Returns the variables without attrs, or
    ``None`` when the trace's arrays are not float64 ``(sequence, position)`` (the general path
    handles those). Equal to the general path to rounding (1e-12; ``tests/test_score_fast.py``).
    """
    eps = defaults().eps if eps is None else float(eps)
    var = trainer_variable(trainer)
    _require_trainer(trace, var)
    arrays = [trace[var], trace["rollout_logprob"], trace["response_mask"]]
    if any(a.dims != TOKEN_DIMS for a in arrays) or arrays[0].dtype != np.float64 \
            or arrays[1].dtype != np.float64 or arrays[2].dtype != bool:
        return None
    mask = arrays[2].values
    lp, lm = arrays[0].values[mask], arrays[1].values[mask]  # the real tokens, in order
    n_tokens = lp.size
    d = lp - lm
    fin = np.isfinite(d)
    all_fin = bool(fin.all())  # then log pi and log mu are finite on every real token too
    x = d if all_fin else d[fin]
    n = x.size
    nan = np.nan
    zero_prob = 0 if all_fin else int(np.count_nonzero(np.isneginf(lp)))
    out: dict[str, Any] = {"n_tokens": np.int64(n_tokens), "n_used": np.int64(n), "n_zero_prob": np.int64(zero_prob)}
    sx = float(np.sum(x))
    ax = np.abs(x)
    out["log_ratio_mean"] = sx / n if n else nan
    out["abs_log_ratio_mean"] = float(np.sum(ax)) / n if n else nan
    out["abs_log_ratio_max"] = big = _finite_max(ax)
    del ax
    safe = n == 0 or big < EXP_SAFE
    sq = x * x
    out["abs_log_ratio_rms"] = float(np.sqrt(np.sum(sq) / n)) if n else nan
    out["kl_k2"] = _finite_mean(np.multiply(sq, 0.5, out=sq), all_finite=safe)[0]
    del sq
    qs = np.quantile(x, core.QUANTILES) if n else np.full(len(core.QUANTILES), nan)
    for q, v in zip(core.QUANTILES, qs):
        out[f"log_ratio_q{int(q * 100):02d}"] = float(v)
    out["kl_k1"] = -sx / n if n else nan
    k3 = np.expm1(x)
    out["kl_k3"] = _finite_mean(np.subtract(k3, x, out=k3), all_finite=safe)[0]
    del k3
    r = np.exp(x)
    out["mean_ratio"], rfin = _finite_mean(r, all_finite=safe)
    out["clip_fraction"] = float(np.count_nonzero((r < 1 - eps) | (r > 1 + eps))) / n if n else nan
    w = r if rfin is None else r[rfin]
    s1, s2 = float(np.sum(w)), float(np.sum(np.multiply(w, w, out=w)))
    out["ess_token"] = s1 ** 2 / (w.size * s2) if w.size and s2 > 0 else nan
    del r, w
    # probabilities: every real token with a finite mu and a non-NaN pi (pi = 0 counts)
    if all_fin:
        pi, mu = np.exp(lp), np.exp(lm)
    else:
        pm = np.isfinite(lm) & ~np.isnan(lp)
        pi, mu = np.exp(lp[pm]), np.exp(lm[pm])
    diff = np.abs(pi - mu)
    dfin = np.isfinite(diff)
    dd = diff if dfin.all() else diff[dfin]
    mean = float(np.sum(dd) / dd.size) if dd.size else nan
    out["prob_diff_mean"] = mean
    out["prob_diff_max"] = _finite_max(dd)
    dev = np.subtract(dd, mean, out=dd)
    out["prob_diff_std"] = float(np.sqrt(np.sum(np.multiply(dev, dev, out=dev)) / dd.size)) if dd.size else nan
    del diff, dd, dev
    both = np.isfinite(pi) & np.isfinite(mu)
    if not both.all():
        pi, mu = pi[both], mu[both]
    if pi.size:
        dx = np.subtract(pi, np.sum(pi) / pi.size, out=pi)
        dy = np.subtract(mu, np.sum(mu) / mu.size, out=mu)
        sxy, sxx, syy = float(np.sum(dx * dy)), float(np.sum(dx * dx)), float(np.sum(dy * dy))
        out["prob_pearson"] = sxy / np.sqrt(sxx * syy) if pi.size > 1 and sxx > 0 and syy > 0 else nan
    else:
        out["prob_pearson"] = nan
    return xr.Dataset({k: ((), out[k] if k.startswith("n_") else np.float64(out[k])) for k in SUMMARY_VARIABLES})


def scalars(s: xr.Dataset) -> dict[str, float | int]:
    """The 0-d variables of a summary as plain Python numbers (NaN stays NaN)."""
    return {str(k): v.item() for k, v in s.data_vars.items() if v.ndim == 0}


def table_records(table: xr.Dataset, index: str | None = None) -> dict[str, dict[str, Any]] | list[dict[str, Any]]:
    """A 1-d table (e.g. :func:`~rlparity.metrics.ablation.ablation_table`) as plain rows: a dict of
    rows keyed by ``index`` (default: the table's only dim), NaN as ``None``; a table of other
    shape as a list of flat records."""
    import math

    def clean(v):
        v = v.item() if hasattr(v, "item") else v
        return None if isinstance(v, float) and not math.isfinite(v) else v

    frame = table.to_dataframe()
    if index is None and len(table.dims) == 1:
        index = next(iter(table.dims))
    if index is not None and frame.index.name == index:
        return {str(k): {c: clean(v) for c, v in row.items()} for k, row in frame.iterrows()}
    return [{c: clean(v) for c, v in row.items()} for row in frame.reset_index().to_dict(orient="records")]


COMPACT_COLUMNS = (("abs_log_ratio_mean", "mean |d|"), ("abs_log_ratio_rms", "RMS d"), ("mean_ratio", "mean ratio"),
                   ("kl_k3", "k3 KL"), ("clip_fraction", "clip@eps"), ("n_zero_prob", "p=0 tokens"),
                   ("n_tokens", "tokens"), ("trainer_floor_share", "trn floor"))


def format_summary_table(arms, trainer: TrainerSide | None = None, eps: float | None = None) -> str:
    """One line per arm of the headline numbers (backend pair, nats): what a terminal shows for a
    store before the verdicts (``format_summary`` has the full block of one arm)."""
    from rlparity.trace import as_arms

    arms = as_arms(arms)
    width = max([len(a) for a in arms] + [4])
    head = f"{'arm':<{width}}  " + "  ".join(f"{label:>10}" for _, label in COMPACT_COLUMNS)
    lines = [head]
    for name, ds in arms.items():
        s = summary(ds, trainer_side(ds, trainer), eps)
        cells = [f"{s[k].item():>10.4g}" if s[k].dtype.kind == "f" else f"{s[k].item():>10d}" for k, _ in COMPACT_COLUMNS]
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)


def _scalar_lines(s: xr.Dataset) -> list[str]:
    """The header and one line per scalar of a summary, as ``rlparity summary`` prints them."""
    lines = [f"parity summary  arm={s.attrs.get('arm')}  pair={s.attrs['pair']}  "
             f"d = {s.attrs['direction']} (nats)"]
    for k in _TEXT_ORDER:
        lines.append(f"  {k:<22} {s[k].item():>12.6g}   {s[k].attrs.get('long_name', '')}")
    return lines


def format_summary(trace: xr.Dataset, trainer: TrainerSide | None = None, eps: float | None = None, *,
                   top: int = 5) -> str:
    """A readable text block (what ``rlparity summary`` prints): the scalars, then where the
    probability-0 tokens are and the worst sequences and positions."""
    s = summary(trace, trainer, eps)
    if is_lazy(trace):  # one streamed pass: the scalars only
        return "\n".join(_scalar_lines(s) + ["  (a lazy trace: per-sequence and per-position views need it in memory)"])
    per_seq = summary(trace, trainer, eps, dim="position")
    per_pos = summary(trace, trainer, eps, dim="sequence")
    lines = _scalar_lines(s)
    zs = per_seq["n_zero_prob"].values
    if zs.sum():
        idx = np.flatnonzero(zs)[:top]
        lines.append(f"  probability-0 tokens by sequence: {dict(zip(idx.tolist(), zs[idx].tolist()))}")
        zp = per_pos["n_zero_prob"].values
        idp = np.flatnonzero(zp)[:top]
        lines.append(f"  probability-0 tokens by position: {dict(zip(idp.tolist(), zp[idp].tolist()))}")
    by_seq = per_seq["log_ratio_mean"].values
    if np.isfinite(by_seq).any():
        worst = np.argsort(-np.nan_to_num(np.abs(by_seq)))[:top]
        lines.append("  worst sequences (mean d): " + ", ".join(f"{i}:{by_seq[i]:+.4f}" for i in worst))
    by_pos = per_pos["log_ratio_mean"].values
    if by_pos.size:
        k = min(8, by_pos.size)
        lines.append("  mean d by position[:%d]: " % k + " ".join(f"{v:+.4f}" for v in by_pos[:k]))
    return "\n".join(lines)


__all__ = ["BACKEND_PAIR", "BACKEND_PAIR_D", "FLOOR_SUMMARY_VARIABLES", "REFERENCE_PAIR_D", "SUMMARY_VARIABLES", "TRAINER_VARIABLE",
           "format_summary", "format_summary_table", "log_ratio", "pair_attrs", "reduce", "reduce_dims", "scalar_summary", "scalars", "summary",
           "table_records", "trainer_readings", "trainer_side", "trainer_variable"]
