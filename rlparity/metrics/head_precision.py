"""Tables of the LM-head precision matrix (arms from :func:`rlparity.experiments.head_precision.head_matrix`).

Each arm is one cell: the rollout engine's LM-head dtype x the trainer's. The dtypes are read from
the trace attrs (the rollout's ``engine_effective``, read back from the running engine, and the
trainer's ``head_dtype``), falling back to the arm's factors (:func:`rlparity.trace.arm_factors`,
written by the runner). The arm name ``rollout-<dtype>_trainer-<dtype>`` is a label only.

* :func:`head_table`: the per-cell parity table (dims ``rollout_head``, ``trainer_head``);
* :func:`gap_by_logit` / :func:`gap_by_position`: the gap by the trainer's largest logit and by
  response position;
* :func:`matched_advantage`: by how much the matched fp32/fp32 cell beats the others;
* :func:`probability_pairs`: per-token probabilities for scatter plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide, defaults
from rlparity.config.settings import normalize_dtype
from rlparity.metrics import core
from rlparity.metrics.summary import SUMMARY_VARIABLES, log_ratio, pair_attrs, reduce, summary, trainer_variable
from rlparity.trace import arm_factors, arm_record, as_arms, stack_cells

DEFAULT_HEADS = ("bfloat16", "float32")
CELL_DIMS = ("rollout_head", "trainer_head")
# per-cell variables of head_table (summary variables)
TABLE_VARIABLES = ("abs_log_ratio_rms", "abs_log_ratio_max", "abs_log_ratio_mean", "log_ratio_mean", "mean_ratio",
                   "prob_pearson", "prob_diff_mean", "clip_fraction", "kl_k3", "n_tokens", "n_zero_prob")


def arm_name(rollout_head: str, trainer_head: str) -> str:
    """``rollout-float32_trainer-bfloat16``: the arm of one cell.

    Parameters
    ----------
    rollout_head : str
        The rollout's LM-head dtype.
    trainer_head : str
        The trainer's LM-head dtype.

    Returns
    -------
    str
    """
    return (f"rollout-{normalize_dtype(rollout_head, what='head dtype')}"
            f"_trainer-{normalize_dtype(trainer_head, what='head dtype')}")


def cell_dtypes(trace: xr.Dataset) -> dict[str, str | None]:
    """Head and body dtypes of both sides, from the trace attrs (None where not recorded).

    The rollout side is what the engine reported it ran (``engine_effective``), falling back to
    what was requested; the trainer side is what the scorer recorded.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.

    Returns
    -------
    dict[str, str | None]
    """
    rec = arm_record(trace)
    eff, req, trainer = rec.effective, rec.requested, rec.scorer

    def norm(v):
        if v in (None, "", "model"):
            return None
        try:
            return normalize_dtype(v)
        except ValueError:
            return str(v)

    rollout_head = eff.head_dtype or req.head_dtype
    if rollout_head == "model":  # vLLM's "same as the body"
        rollout_head = eff.dtype or req.dtype
    return {"rollout_head": norm(rollout_head), "trainer_head": norm(trainer.head_dtype),
            "rollout_body": norm(eff.dtype or req.dtype), "trainer_body": norm(trainer.dtype)}


BF16_SIGNIFICAND_BITS = 8


def bf16_spacing(x: np.ndarray) -> np.ndarray:
    """The spacing of bfloat16 numbers at ``|x|`` (8 significant bits): ``2^(floor(log2 |x|) - 7)``.

    Parameters
    ----------
    x : numpy.ndarray
        Values (logits).

    Returns
    -------
    numpy.ndarray
        The unit in the last place of bfloat16 at each value (same units as ``x``); NaN where ``x``
        is not finite.
    """
    a = np.abs(np.asarray(x, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, np.nan)))
    return np.where(np.isfinite(e), 2.0 ** (e - (BF16_SIGNIFICAND_BITS - 1)), np.nan)


def bf16_representable(x: np.ndarray) -> np.ndarray:
    """Whether each value is exactly a bfloat16 number (8 significant bits, float32's exponent range).

    A value is one when it survives the cast to float32 unchanged and the low 16 bits of that
    float32 are zero (bfloat16 is the high half of a float32). Logits an LM head wrote in bfloat16
    and upcast keep this; float32 logits have it with probability about ``2**-16`` each.

    Parameters
    ----------
    x : numpy.ndarray
        Values of any float dtype.

    Returns
    -------
    numpy.ndarray
        Boolean, False where ``x`` is not finite.
    """
    a = np.asarray(x, dtype=np.float64)
    fin = np.isfinite(a)
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = np.where(fin, a, 0.0).astype(np.float32)
    exact = fin & (f32.astype(np.float64) == a)
    return exact & ((f32.view(np.uint32) & np.uint32(0xFFFF)) == 0)


def quantised_share(max_logit: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    """The share of the trainer's largest logits that are bfloat16 numbers, on the tokens of ``mask``.

    An LM head computed in bfloat16 writes every logit, its largest included, with 8 significant
    bits: the share is 1. A float32 head leaves about ``2**-16`` of them on the bfloat16 grid by chance.

    Parameters
    ----------
    max_logit : numpy.ndarray
        The trainer's largest logit per token (``trainer_max_logit``).
    mask : numpy.ndarray
        Boolean, True on the tokens to read.

    Returns
    -------
    dict
        ``share`` (NaN without a finite value), ``n_tokens`` (finite values read) and
        ``n_bf16`` (of them on the bfloat16 grid).
    """
    x = np.asarray(max_logit, dtype=np.float64)
    sel = np.asarray(mask, bool) & np.isfinite(x)
    n = int(sel.sum())
    k = int(bf16_representable(x[sel]).sum())
    return {"share": k / n if n else float("nan"), "n_tokens": n, "n_bf16": k}


def student_t_level(z: float, dof: int, *, intervals: int = 2000) -> float:
    """The Student-t quantile with ``dof`` degrees of freedom at the one-sided level of a standard normal ``z``.

    A delete-a-group jackknife over ``K`` groups gives an error with ``K - 1`` degrees of freedom: a bar
    of ``z`` errors read on the normal law is met by chance far more often with few groups (issue 41: a
    reading on 6 sequences cleared 3 errors by chance). The upper tail ``p = erfc(z / sqrt 2) / 2`` is
    matched on the t law, whose distribution function is ``1/2 + g(nu) * integral_0^atan(x / sqrt nu)
    cos^(nu - 1)(u) du`` with ``g(nu) = Gamma((nu + 1) / 2) / (sqrt(pi) Gamma(nu / 2))`` (the substitution
    ``t = sqrt(nu) tan u``); the integral by Simpson's rule on ``intervals`` steps, the quantile by
    bisection below the Cauchy quantile ``tan(pi (1/2 - p))`` (the heaviest tail).

    Parameters
    ----------
    z : float
        The level as standard-normal errors (e.g. ``defaults().temperature_z``).
    dof : int
        Degrees of freedom (the jackknife's groups less one); below 1 gives NaN.
    intervals : int, default 2000
        Simpson steps (even).

    Returns
    -------
    float
        ``x`` with ``P(T > x) = P(Z > z)``; ``z`` itself for an infinite ``z``.
    """
    import math

    if not dof >= 1:
        return float("nan")
    if not np.isfinite(z):
        return float(z)
    nu = float(dof)
    target = 0.5 - 0.5 * math.erfc(z / math.sqrt(2.0))  # F(x) - 1/2 at the quantile (negative for z < 0)
    g = math.exp(math.lgamma((nu + 1.0) / 2.0) - math.lgamma(nu / 2.0)) / math.sqrt(math.pi)

    def half_cdf(u_max: float) -> float:  # F(sqrt(nu) tan u_max) - 1/2, for u_max in [0, pi/2)
        u = np.linspace(0.0, u_max, intervals + 1)
        f = np.cos(u) ** (nu - 1.0)
        return g * (u_max / intervals / 3.0) * float(f[0] + f[-1] + 4.0 * f[1:-1:2].sum() + 2.0 * f[2:-1:2].sum())

    a = abs(target)
    # the quantile lies below the Cauchy one (1 degree of freedom, the heaviest tail), tan(pi a): bisect below it so
    # the steps resolve the integrand, which narrows to a width of about 1 / sqrt(nu)
    lo, hi = 0.0, min(math.pi / 2.0, math.atan(math.tan(math.pi * a) / math.sqrt(nu)) * 1.001)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if half_cdf(mid) < a else (lo, mid)
    return float(math.copysign(math.sqrt(nu) * math.tan(0.5 * (lo + hi)), target))


def rounding_scale(abs_residual: np.ndarray, max_logit: np.ndarray, temperature: np.ndarray, rank: np.ndarray,
                   mask: np.ndarray, *, groups: int = 20) -> dict[str, Any]:
    """How large the differences are against bfloat16 rounding of the logits, on non-argmax tokens.

    When one side rounds its logits to bfloat16 and the other does not, a token's logprob moves by
    ``(delta_token - sum_j p_j delta_j) / T``, the deltas uniform within half a bf16 spacing of each
    logit; for a token below the argmax that is about ``(delta_token - delta_argmax) / T``, of standard
    deviation up to ``spacing(max logit) / sqrt(6) / T``. The statistic is the median over the tokens
    the trainer does not rank first of ``|r| / (spacing(max logit) / sqrt(6) / T)``: about 0.72 for
    uniform rounding of both logits at the largest logit's spacing (the median of a triangular
    difference), less where the token's own logit is smaller; parity leaves a fraction of it.
    Measured: one side bf16 0.51-0.78 (H200 ``small``, H200 head matrix), 1.07-1.22 (tiny CPU model);
    parity 0.11-0.26. The error is a delete-a-group jackknife over sequences.

    Parameters
    ----------
    abs_residual : numpy.ndarray
        ``|r|`` per token, ``(sequence, position)`` (nats).
    max_logit : numpy.ndarray
        The trainer's largest logit at each position.
    temperature : numpy.ndarray
        The request's temperature per token (broadcast to the tokens).
    rank : numpy.ndarray
        The trainer's rank of the sampled token (0 = argmax).
    mask : numpy.ndarray
        Boolean, True on the tokens to use.
    groups : int, default 20
        Most jackknife groups.

    Returns
    -------
    dict
        ``share`` (the median ratio), ``share_se``, ``n_tokens``, ``n_sequences`` and the jackknife's
        ``n_groups`` (absent with fewer than 3 tokens).
    """
    t = np.where(np.asarray(temperature, float) > 0, np.asarray(temperature, float), 1.0)
    pred = bf16_spacing(max_logit) / np.sqrt(6.0) / t
    q = np.asarray(abs_residual, float) / pred
    sel = np.asarray(mask, bool) & (np.asarray(rank) > 0) & np.isfinite(q)
    n_seq = int(sel.reshape(sel.shape[0], -1).any(axis=1).sum()) if sel.ndim > 1 else int(sel.sum())
    if sel.sum() < 3:
        return {"share": float("nan"), "share_se": float("nan"), "n_tokens": int(sel.sum()), "n_sequences": n_seq}
    share = float(np.median(q[sel]))
    jk = core.jackknife_slope_se(lambda m: float(np.median(q[m])) if m.any() else float("nan"), sel, groups=groups)
    se = jk["se"]
    return {"share": share, "share_se": float(se), "n_tokens": int(sel.sum()), "n_sequences": n_seq,
            "n_groups": int(jk["n_groups"])}


def head_cells(data) -> dict[tuple[str, str], tuple[str, xr.Dataset]]:
    """``{(rollout_head, trainer_head): (arm, trace)}`` of a head matrix (``data``: arms, a DataTree
    or a store path): the dtypes the trace records (:func:`cell_dtypes`), else the arm's factors;
    two arms of the same cell are an error.

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path of a head matrix.

    Returns
    -------
    dict[tuple[str, str], tuple[str, xr.Dataset]]
    """
    cells: dict[tuple[str, str], tuple[str, xr.Dataset]] = {}
    for name, ds in as_arms(data).items():
        dt = cell_dtypes(ds)
        if dt["rollout_head"] is None or dt["trainer_head"] is None:
            f = arm_factors(ds)
            if not set(CELL_DIMS) <= set(f):
                raise ValueError(f"arm {name!r}: the trace records no rollout/trainer head dtype "
                                 "(engine_effective.head_dtype, trainer.head_dtype, factors)")
            dt = {k: dt[k] or f[k] for k in CELL_DIMS}
        key = (dt["rollout_head"], dt["trainer_head"])
        if key in cells:
            raise ValueError(f"arms {cells[key][0]!r} and {name!r} are the same cell {key}")
        cells[key] = (name, ds)
    if not cells:
        raise ValueError("no arms given")
    return cells


def dtype_order(values) -> list[str]:
    """Dtypes from least to most precise (bfloat16, float16, float32), others after.

    Parameters
    ----------
    values : iterable of str
        Dtype names.

    Returns
    -------
    list[str]
    """
    rank = {d: i for i, d in enumerate(("bfloat16", "float16", "float32"))}
    return sorted(set(values), key=lambda v: (rank.get(v, 99), v))


def _grid(cells, per_cell) -> xr.Dataset:
    """Combine one Dataset per cell into a Dataset with dims (rollout_head, trainer_head, ...):
    missing cells are NaN."""
    out = stack_cells({key: per_cell(ds) for key, (_, ds) in cells.items()}, CELL_DIMS)
    return out.reindex(rollout_head=dtype_order(k[0] for k in cells), trainer_head=dtype_order(k[1] for k in cells))


def head_table(data, *, trainer: TrainerSide | None = None, eps: float | None = None,
               dim: str | Sequence[str] | None = None) -> xr.Dataset:
    """Per-cell parity table of an LM-head precision matrix.

    RMS / max / mean ``|d|``, mean ratio, Pearson of token probabilities, clip fraction at
    ``eps``, k3 and token counts, each reduced over ``dim`` within every cell
    (:func:`rlparity.metrics.summary` with ``dim=``). Cells missing from ``data`` are NaN; ``arm``
    holds each cell's arm name.

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path (arms from
        :func:`rlparity.experiments.head_precision.head_matrix`).
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    eps : float, optional
        The clip range of ``clip_fraction`` (default ``defaults().eps``).
    dim : str or sequence of str, optional
        Token dims reduced: ``None`` (default, every token: one number per cell), ``"position"``
        (one per sequence) or ``"sequence"`` (one per position).

    Returns
    -------
    xarray.Dataset
        Dims ``(rollout_head, trainer_head)`` plus the dims not reduced.
    """
    cells = head_cells(data)
    table = _grid(cells, lambda ds: summary(ds, trainer, eps, dim=dim)[list(TABLE_VARIABLES)].astype(float))
    names = {key: name for key, (name, _) in cells.items()}
    table["arm"] = (CELL_DIMS, np.array([[names.get((r, t), "") for t in table["trainer_head"].values]
                                         for r in table["rollout_head"].values], dtype=str))
    table["matched"] = table["rollout_head"] == table["trainer_head"]
    for k in TABLE_VARIABLES:
        long_name, units = SUMMARY_VARIABLES[k]
        table[k].attrs = {"long_name": long_name, **({"units": units} if units == "nats" else {})}
    table.attrs = pair_attrs(trainer, eps=defaults().eps if eps is None else float(eps),
                             long_name="LM-head precision matrix: rollout head dtype x trainer head dtype")
    return table


def logit_edges(data, n_bins: int = 8) -> np.ndarray:
    """Quantile bin edges of the trainer's largest logit over all arms' real tokens.

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path.
    n_bins : int
        Number of bins.

    Returns
    -------
    numpy.ndarray
    """
    xs = []
    for ds in as_arms(data).values():
        m = ds["response_mask"].values.astype(bool)
        x = ds["trainer_max_logit"].values[m]
        xs.append(x[np.isfinite(x)])
    x = np.concatenate(xs) if xs else np.zeros(0)
    if x.size == 0:
        raise ValueError("no real tokens with a trainer_max_logit: score the traces first")
    edges = np.unique(np.quantile(x, np.linspace(0, 1, n_bins + 1)))
    if edges.size < 2:
        edges = np.array([x.min() - 0.5, x.max() + 0.5])
    return edges


def _binned(ds: xr.Dataset, trainer: TrainerSide | None, edges: np.ndarray) -> xr.Dataset:
    """RMS and mean of d and token counts per bin of ``trainer_max_logit`` (one cell). Bin ``b``
    holds ``edges[b] <= x < edges[b + 1]``; the last bin includes its right edge."""
    d = log_ratio(ds, trainer)
    x = ds["trainer_max_logit"]
    ok = np.isfinite(d) & np.isfinite(x)
    frame = xr.Dataset({"d": d.where(ok), "x": x.where(ok)}).stack(token=("sequence", "position"))
    frame = frame.where(np.isfinite(frame["x"]), drop=True)
    bins = edges.copy()
    bins[-1] = np.nextafter(bins[-1], np.inf)  # [low, high) bins, the largest value in the last one
    nb = edges.size - 1
    groups = frame["d"].groupby_bins(frame["x"], bins, right=False, labels=np.arange(nb))
    out = xr.Dataset({"abs_log_ratio_rms": np.sqrt((frame["d"] ** 2).groupby_bins(
                          frame["x"], bins, right=False, labels=np.arange(nb)).mean()),
                      "log_ratio_mean": groups.mean(), "n_tokens": groups.count()})
    out = out.rename({"x_bins": "logit_bin"}).reindex(logit_bin=np.arange(nb))
    out["n_tokens"] = out["n_tokens"].fillna(0).astype(np.int64)
    return out.drop_vars([c for c in out.coords if c != "logit_bin"])


def gap_by_logit(data, *, trainer: TrainerSide | None = None, n_bins: int = 8,
                 edges: Sequence[float] | None = None) -> xr.Dataset:
    """RMS and mean of d per bin of the trainer's largest logit (``trainer_max_logit``), dims
    ``(rollout_head, trainer_head, logit_bin)``; bins are shared quantile bins over all arms unless
    ``edges`` are given.

    A low-precision head rounds logits to a relative step, so its error grows with the logit
    magnitude.

    Parameters
    ----------
    data : mapping, DataTree or path
        ``{arm: trace}``, a DataTree or a store path.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    n_bins : int
        Number of bins.
    edges : numpy.ndarray, optional
        Bin edges of the logit (default :func:`logit_edges`).

    Returns
    -------
    xarray.Dataset
    """
    arms = as_arms(data)
    cells = head_cells(arms)
    e = np.asarray(edges, dtype=float) if edges is not None else logit_edges(arms, n_bins)
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise ValueError("edges must be an increasing 1-d sequence of at least 2 values")
    out = _grid(cells, lambda ds: _binned(ds, trainer, e))
    out["n_tokens"] = out["n_tokens"].fillna(0).astype(np.int64)
    out["abs_log_ratio_rms"].attrs = {"units": "nats", "long_name": "RMS of d in the bin"}
    out["log_ratio_mean"].attrs = {"units": "nats", "long_name": "mean of d in the bin"}
    out["n_tokens"].attrs = {"long_name": "tokens in the bin"}
    out = out.assign_coords(
        logit_low=("logit_bin", e[:-1], {"long_name": "bin lower edge of max logit"}),
        logit_high=("logit_bin", e[1:], {"long_name": "bin upper edge of max logit"}),
        logit_center=("logit_bin", (e[:-1] + e[1:]) / 2, {"long_name": "bin centre of max logit"}))
    out.attrs = pair_attrs(trainer, binned_by="trainer_max_logit")
    return out


def gap_by_position(data, *, trainer: TrainerSide | None = None) -> xr.Dataset:
    """RMS and mean of d and token counts per response position, dims ``(rollout_head, trainer_head,
    position)``.

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
    def per_cell(ds):
        d, mask = log_ratio(ds, trainer), ds["response_mask"]
        finite = xr.apply_ufunc(core.finite_mask, d, mask)
        return xr.Dataset({"abs_log_ratio_rms": reduce(core.masked_rms, d, mask, dim="sequence"),
                           "log_ratio_mean": reduce(core.masked_mean, d, mask, dim="sequence"),
                           "n_tokens": reduce(core.count, finite, dim="sequence")})

    out = _grid(head_cells(data), per_cell)
    out["n_tokens"] = out["n_tokens"].fillna(0).astype(np.int64)
    out["abs_log_ratio_rms"].attrs = {"units": "nats", "long_name": "RMS of d at the position"}
    out["log_ratio_mean"].attrs = {"units": "nats", "long_name": "mean of d at the position"}
    out["n_tokens"].attrs = {"long_name": "tokens at the position"}
    out.attrs = pair_attrs(trainer)
    return out


def matched_advantage(table: xr.Dataset, *, variable: str = "abs_log_ratio_rms",
                      reference: str = "float32") -> dict[str, Any]:
    """How much lower ``variable`` is in the matched ``reference``/``reference`` cell than in each
    mismatched cell (rollout head != trainer head): ratios, differences, and whether it is lower
    than every one of them.

    ``excess_in_quadrature`` = sqrt(x^2 - matched^2) is, for an RMS, the part of a mismatched cell's
    error that the matched cell does not have, if the head error and the rest (the body) add as
    independent noise: the head's own share when a shared body error dominates both cells.

    Parameters
    ----------
    table : xarray.Dataset
        A :func:`head_table`.
    variable : str
        The table's variable compared.
    reference : str, optional
        The reference arm.

    Returns
    -------
    dict[str, Any]
    """
    if reference not in table["rollout_head"].values or reference not in table["trainer_head"].values:
        raise ValueError(f"the table has no {reference}/{reference} cell")
    v = table[variable]
    best = float(v.sel(rollout_head=reference, trainer_head=reference))
    if not np.isfinite(best):
        raise ValueError(f"the table has no {reference}/{reference} cell (its {variable} is NaN)")
    others = {}
    for r in table["rollout_head"].values:
        for t in table["trainer_head"].values:
            if r != t and np.isfinite(float(v.sel(rollout_head=r, trainer_head=t))):
                x = float(v.sel(rollout_head=r, trainer_head=t))
                others[arm_name(r, t)] = {
                    "value": x, "ratio": x / best if best > 0 else float("inf"), "difference": x - best,
                    # the extra error on top of the matched cell's, if the two add independently
                    "excess_in_quadrature": float(np.sqrt(max(x ** 2 - best ** 2, 0.0)))}
    if not others:
        raise ValueError("the table has no mismatched cell to compare with")
    return {"variable": variable, "matched_cell": arm_name(reference, reference),
            "matched_value": best, "mismatched": others,
            "matched_is_lowest": all(best < o["value"] for o in others.values()),
            "min_ratio": min(o["ratio"] for o in others.values()),
            "min_difference": min(o["difference"] for o in others.values())}


def probability_pairs(trace: xr.Dataset, *, trainer: TrainerSide | None = None, max_points: int | None = None,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """Per real token: rollout probability mu, trainer probability pi_old, ``|d|`` and max logit
    (optionally a seeded subsample of ``max_points`` tokens), for scatter plots.

    Parameters
    ----------
    trace : xarray.Dataset
        One arm.
    trainer : {"processed", "raw"}, optional
        The trainer side (default ``defaults().trainer``).
    max_points : int, optional
        Keep at most this many tokens (a seeded sample; None: all).
    seed : int
        Seed of the sample.

    Returns
    -------
    dict[str, np.ndarray]
    """
    m = trace["response_mask"].values.astype(bool)
    log_mu = trace["rollout_logprob"].values[m]
    log_pi = trace[trainer_variable(trainer)].values[m]
    d = (log_pi - log_mu)
    maxl = trace["trainer_max_logit"].values[m] if "trainer_max_logit" in trace else np.full(d.shape, np.nan)
    idx = np.arange(d.size)
    if max_points is not None and d.size > max_points:
        idx = np.sort(np.random.default_rng(seed).choice(d.size, max_points, replace=False))
    return {"mu": np.exp(log_mu[idx]), "pi": np.exp(log_pi[idx]), "abs_log_ratio": np.abs(d[idx]),
            "max_logit": maxl[idx]}


__all__ = ["CELL_DIMS", "DEFAULT_HEADS", "TABLE_VARIABLES", "arm_name", "bf16_representable", "cell_dtypes", "dtype_order", "gap_by_logit",
           "gap_by_position", "head_cells", "head_table", "logit_edges", "matched_advantage",
           "probability_pairs", "quantised_share", "student_t_level"]
