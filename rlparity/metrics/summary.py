"""The parity summary: a thin xarray layer over :mod:`rlparity.metrics.core`.

Every reduction takes ``dim``, the dims it reduces (ArviZ's ``sample_dims``): ``None`` reduces
``sequence`` and ``position`` (scalars), ``dim="position"`` gives one value per sequence,
``dim="sequence"`` one value per position. Every variable names its pair and direction in the
dataset attrs: the backend pair is ``(pi_old, mu)`` = (trainer, rollout engine) and
``d = log pi_old - log mu`` (nats).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs
from rlparity.config.defaults import TrainerSide, defaults
from rlparity.metrics import core
from rlparity.metrics.objective import token_clip_fraction
from rlparity.metrics.floor_records import floors_beside_gap
from rlparity.metrics.stream import summary_stream
from rlparity.trace import arm_record, has_trainer, is_lazy, TraceValidationError

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
    """The trace variable of a trainer reading.

    Parameters
    ----------
    trainer : {"processed", "raw"}, optional
        The trainer reading to compare with; ``None`` is ``defaults().trainer``.

    Returns
    -------
    str
        ``"trainer_processed_logprob"`` or ``"trainer_logprob"``.

    Raises
    ------
    ValueError
        ``trainer`` is neither ``"processed"`` nor ``"raw"``.
    """
    trainer = trainer or defaults().trainer
    if trainer not in TRAINER_VARIABLE:
        raise ValueError(f"trainer={trainer!r}; use 'processed' or 'raw'")
    return TRAINER_VARIABLE[trainer]


def trainer_readings(trace: xr.Dataset) -> list[str]:
    """The trainer readings a trace holds, ``processed`` first (imported dumps may hold one).

    Parameters
    ----------
    trace : xarray.Dataset
        A trace.

    Returns
    -------
    list[str]
        ``"processed"`` and/or ``"raw"``; empty for a trace without a trainer side.
    """
    return [side for side, var in TRAINER_VARIABLE.items() if var in trace]


def trainer_side(trace: xr.Dataset, preferred: TrainerSide | None = None) -> TrainerSide:
    """``preferred`` when the trace holds that reading, else the one it holds.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with at least one trainer reading.
    preferred : {"processed", "raw"}, optional
        The reading wanted; ``None`` is ``defaults().trainer``.

    Returns
    -------
    {"processed", "raw"}
        The reading to use.

    Raises
    ------
    TraceValidationError
        The trace has no trainer side.
    """
    preferred = preferred or defaults().trainer
    have = trainer_readings(trace)
    if not have:
        raise TraceValidationError("the trace has no trainer side: run `rlparity score TRACE --model MODEL` first")
    return preferred if preferred in have else have[0]  # type: ignore[return-value]


def pair_attrs(trainer: TrainerSide | None = None, **extra: Any) -> dict[str, Any]:
    """Provenance attrs of a backend-pair result: pair, direction, trainer side, units.

    Parameters
    ----------
    trainer : {"processed", "raw"}, optional
        The trainer reading to compare with; ``None`` is ``defaults().trainer``.
    **extra : Any
        More attrs.

    Returns
    -------
    dict[str, Any]
        :func:`~rlparity.config.provenance.make_attrs` with ``pair``, ``direction``, ``trainer_side``,
        ``units="nats"`` and ``extra``.
    """
    var = trainer_variable(trainer)
    return make_attrs(pair=BACKEND_PAIR, direction=f"{var} - rollout_logprob",
                      trainer_side=trainer or defaults().trainer, units="nats", **extra)


def reduce_dims(dim: str | Sequence[str] | None) -> tuple[str, ...]:
    """``dim`` as a tuple of token dims.

    Parameters
    ----------
    dim : str, sequence of str or None, default None
        Token dims to reduce (``"sequence"``, ``"position"``); ``None`` reduces both.

    Returns
    -------
    tuple[str, ...]
        The dims to reduce.

    Raises
    ------
    ValueError
        A dim is not a token dim, or none is given.
    """
    dims = TOKEN_DIMS if dim is None else ((dim,) if isinstance(dim, str) else tuple(dim))
    bad = [d for d in dims if d not in TOKEN_DIMS]
    if bad or not dims:
        raise ValueError(f"dim={dim!r}: reduce over 'sequence', 'position' or both (None)")
    return dims


def reduce(func: Callable[..., Any], *arrays: xr.DataArray, dim: str | Sequence[str] | None = None,
           **kwargs: Any) -> xr.DataArray:
    """Apply a numpy core reduction ``func(*arrays, axis=...)`` over ``dim`` (the xarray layer).

    Parameters
    ----------
    func : callable
        A reduction of :mod:`rlparity.metrics.core` taking ``axis``.
    *arrays : xarray.DataArray
        Its array arguments, each with the dims in ``dim``.
    dim : str, sequence of str or None, default None
        Token dims to reduce (``"sequence"``, ``"position"``); ``None`` reduces both.
    **kwargs : Any
        Further keyword arguments of ``func``.

    Returns
    -------
    xarray.DataArray
        The result, with the reduced dims gone.
    """
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
    """Per-token ``d = log pi_old - log mu`` (nats), NaN on padding, -inf where pi_old = 0.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace (``rlparity.trace`` schema) with a trainer side.
    trainer : {"processed", "raw"}, optional
        The trainer reading to compare with; ``None`` is ``defaults().trainer``.

    Returns
    -------
    xarray.DataArray
        ``log_ratio`` over ``(sequence, position)``, with ``units``, ``pair`` and ``direction`` attrs.

    Raises
    ------
    TraceValidationError
        The trace has no trainer side, or not the reading asked for.
    """
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

    Parameters
    ----------
    trace : xarray.Dataset
        A trace (``rlparity.trace`` schema) with a trainer side.
    trainer : {"processed", "raw"}, optional
        The trainer reading to compare with; ``None`` is ``defaults().trainer``.
    eps : float, optional
        PPO clip range of ``clip_fraction``; ``None`` is ``defaults().eps``.
    dim : str, sequence of str or None, default None
        Token dims to reduce (``"sequence"``, ``"position"``); ``None`` reduces both.
    progress : callable, optional
        Wraps the iterable of blocks of a lazy trace (e.g. ``tqdm.tqdm``).

    Returns
    -------
    xarray.Dataset
        The variables of :data:`SUMMARY_VARIABLES` (nats where a logprob quantity) reduced over
        ``dim``, plus the floors of :data:`FLOOR_SUMMARY_VARIABLES` (scalars), with pair attrs.

    Raises
    ------
    TraceValidationError
        The trace has no trainer side, or not the reading asked for.
    ValueError
        A lazy trace with ``dim`` other than ``None``, or an unknown ``dim``.
    """
    eps = defaults().eps if eps is None else float(eps)
    var = trainer_variable(trainer)
    _require_trainer(trace, var)
    if is_lazy(trace):  # a trace larger than memory (open_arms(..., chunks=)): one block at a time
        if dim is not None:
            raise ValueError(f"a lazy trace (opened with chunks=) is summarised over every token only (dim=None), "
                             f"not dim={dim!r}: open it without chunks=, or select fewer sequences and .load()")
        values = summary_stream(trace, var, eps, progress=progress)
        streamed = xr.Dataset({k: ((), values[k] if k.startswith("n_") else np.float64(values[k]))
                               for k in SUMMARY_VARIABLES})
        return _finish(streamed, trace, trainer, eps, dim)
    arrays = [trace[var], trace["rollout_logprob"], trace["response_mask"]]
    if dim is None and all(set(a.dims) == set(TOKEN_DIMS) for a in arrays) \
            and arrays[0].dtype == arrays[1].dtype == np.float64:
        # every token: the real ones compressed to 1-d once (padding costs nothing), then the same code.
        # Float64 only: compressing changes the order of the sums, which float64 absorbs (1e-12) and a
        # float32 trace would not (1e-7), so a float32 trace is reduced in place and its numbers stay
        # what they were (the shipped CPU examples are float32).
        mask = arrays[2].transpose(*TOKEN_DIMS).values.astype(bool)
        lp, lm = (a.transpose(*TOKEN_DIMS).values[mask] for a in arrays[:2])
        values = token_statistics(lp, lm, np.ones(lp.shape, bool), eps=eps)
        out = xr.Dataset({k: ((), v) for k, v in values.items()})
    else:
        dims = list(reduce_dims(dim))
        axis = tuple(range(-len(dims), 0))
        names = list(SUMMARY_VARIABLES)
        results = xr.apply_ufunc(lambda *a, axis: tuple(token_statistics(*a, eps=eps, axis=axis).values()), *arrays,
                                 input_core_dims=[dims] * 3, output_core_dims=[[] for _ in names],
                                 kwargs={"axis": axis})
        out = xr.Dataset(dict(zip(names, results)))
    return _finish(out, trace, trainer, eps, dim)


def token_statistics(log_pi: np.ndarray, log_mu: np.ndarray, mask: np.ndarray, *, eps: float,
                     axis=None) -> dict[str, Any]:
    """Every statistic of :data:`SUMMARY_VARIABLES` (in that order) over ``axis``.

    From the numpy core (:mod:`rlparity.metrics.core`): the one definition :func:`summary` uses for
    every ``dim`` (``dim=None`` on a float64 trace: on its real tokens compressed to 1-d). Computed
    in the arrays' dtype (float32 traces accumulate in float32, as before issue 23).

    Parameters
    ----------
    log_pi : numpy.ndarray
        The trainer's logprob per token (nats).
    log_mu : numpy.ndarray
        The rollout's logprob per token (nats).
    mask : numpy.ndarray
        Boolean, True on real tokens.
    eps : float
        PPO clip range of ``clip_fraction``.
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    dict[str, Any]
        One array per name of :data:`SUMMARY_VARIABLES`: ``n_*`` int64 counts, the rest float64.
    """
    mask = np.asarray(mask, bool)
    with np.errstate(invalid="ignore"):
        d = np.where(mask, log_pi - log_mu, np.nan)
    finite = core.finite_mask(d, mask)
    out: dict[str, Any] = {
        "n_tokens": core.count(mask, axis),
        "n_used": core.count(finite, axis),
        "n_zero_prob": core.zero_prob_count(log_pi, mask, axis),
        "log_ratio_mean": core.masked_mean(d, mask, axis),
        "abs_log_ratio_mean": core.masked_mean(np.abs(d), mask, axis),
        "abs_log_ratio_rms": core.masked_rms(d, mask, axis),
        "abs_log_ratio_max": core.masked_max_abs(d, mask, axis),
    }
    qs = core.masked_quantile(d, mask, core.QUANTILES, axis=axis)
    for k, q in enumerate(core.QUANTILES):
        out[f"log_ratio_q{int(q * 100):02d}"] = qs[k]
    out["mean_ratio"] = core.mean_ratio(d, mask, axis)
    for k, v in core.kl_estimators(d, mask, axis=axis).items():
        out[f"kl_{k}"] = v
    out["clip_fraction"] = token_clip_fraction(d, mask, eps_low=eps, eps_high=eps, axis=axis).value
    out["ess_token"] = core.ess(np.exp(np.where(finite, d, 0.0)), finite, axis=axis)
    out.update(core.prob_stats(log_pi, log_mu, mask, axis=axis))
    ints = {"n_tokens", "n_used", "n_zero_prob"}
    return {k: np.asarray(out[k], np.int64 if k in ints else np.float64)[()] for k in SUMMARY_VARIABLES}


def _finish(ds: xr.Dataset, trace: xr.Dataset, trainer: TrainerSide | None, eps: float,
            dim: str | Sequence[str] | None) -> xr.Dataset:
    """Names, units and provenance of a summary dataset."""
    gap = float(ds["abs_log_ratio_mean"]) if ds["abs_log_ratio_mean"].ndim == 0 else float(
        core.masked_mean(np.abs(log_ratio(trace, trainer).values), trace["response_mask"].values))
    for k, v in floors_beside_gap(trace, gap, trainer_side(trace, trainer)).items():
        ds[k] = v  # scalars whatever dim was reduced: a floor is one number per rescoring
    for name, (long_name, units) in {**SUMMARY_VARIABLES, **FLOOR_SUMMARY_VARIABLES}.items():
        ds[name].attrs = {"long_name": long_name.replace("eps]", f"eps] (eps={eps:g})") if name == "clip_fraction"
                          else long_name, **({"units": units} if units else {})}
    ds.attrs = pair_attrs(trainer, arm=arm_record(trace).name, eps=eps,
                          reduced_dims=list(reduce_dims(dim)))
    return ds


def scalars(s: xr.Dataset) -> dict[str, float | int]:
    """The 0-d variables of a summary as plain Python numbers (NaN stays NaN).

    Parameters
    ----------
    s : xarray.Dataset
        A summary (:func:`summary`) or any dataset.

    Returns
    -------
    dict[str, float or int]
        Name to value, for the 0-d variables only.
    """
    return {str(k): v.item() for k, v in s.data_vars.items() if v.ndim == 0}


def table_records(table: xr.Dataset, index: str | None = None) -> dict[str, dict[str, Any]] | list[dict[str, Any]]:
    """A 1-d table as plain rows (NaN as ``None``).

    Parameters
    ----------
    table : xarray.Dataset
        A table, e.g. :func:`~rlparity.metrics.ablation.ablation_table`.
    index : str, optional
        The dim whose labels key the rows; ``None`` takes the table's only dim.

    Returns
    -------
    dict[str, dict[str, Any]] or list[dict[str, Any]]
        Rows keyed by ``index``; a table of other shape as a list of flat records.
    """
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
    """One line per arm of the headline numbers (backend pair, nats).

    What a terminal shows for a store before the verdicts (:func:`format_summary` has the full
    block of one arm).

    Parameters
    ----------
    arms : Mapping[str, xarray.Dataset], xarray.Dataset or path
        The arms (anything :func:`~rlparity.trace.as_arms` accepts).
    trainer : {"processed", "raw"}, optional
        The trainer reading to compare with; ``None`` is ``defaults().trainer``.
    eps : float, optional
        PPO clip range of ``clip_fraction``; ``None`` is ``defaults().eps``.

    Returns
    -------
    str
        A header and one line per arm: the :data:`COMPACT_COLUMNS`.
    """
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
    """A readable text block (what ``rlparity summary`` prints).

    The scalars, then where the probability-0 tokens are and the worst sequences and positions.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace (``rlparity.trace`` schema) with a trainer side.
    trainer : {"processed", "raw"}, optional
        The trainer reading to compare with; ``None`` is ``defaults().trainer``.
    eps : float, optional
        PPO clip range of ``clip_fraction``; ``None`` is ``defaults().eps``.
    top : int, default 5
        How many sequences and positions to list.

    Returns
    -------
    str
        The block; for a lazy trace the scalars only.
    """
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
           "format_summary", "format_summary_table", "log_ratio", "pair_attrs", "reduce", "reduce_dims", "scalars", "summary",
           "table_records", "token_statistics", "trainer_readings", "trainer_side", "trainer_variable"]
