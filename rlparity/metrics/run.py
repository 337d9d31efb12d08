"""The numbers of a recorded run, step by step: the mismatch per step and per policy lag, and why
it grows (a shift-share decomposition of the change of mean ``|d|`` between step windows).

A run is ``{step: trace}`` (one scored trace per optimizer step: a run store's steps through
:func:`rlparity.record.step_trace`, or the arms ``<run>@step_NNN`` of an RL store). The pair is
the backend pair (pi_old, mu), ``d = log pi_old - log mu`` (nats), over real tokens with a finite
``d`` (tokens the trainer gives probability 0 are counted apart, never averaged).

The decomposition (:func:`growth_decomposition`) is Oaxaca-Blinder's twofold split with the base
window's coefficients: per-token ``y = |d|`` is regressed (least squares) on one-hot covariates
fitted on the base window: the token's position bucket (response length), its ``-log mu`` band
below ``ln 10`` (confidence, an entropy proxy), its band above ``ln 10`` (low-probability tokens,
``mu < 0.1``) and its policy lag. With ``b`` the base fit and ``x`` the window means of the
covariates, the change of the token mean of ``y`` from the base window 0 to a window 1 is

``y1 - y0 = (x1 - x0) . b  +  (y1 - x1 . b)``

exactly (least squares with an intercept: ``y0 = x0 . b``). The first term splits by covariate
group (the **composition** parts: the tokens moved to cells of another ``|d|``), the second is the
**residual** (the ``|d|`` of a cell changed: the kernels, the backend, the weights). The parts of
one group depend on its reference category (the first bucket, the most confident band, lag 0),
as every detailed Oaxaca-Blinder split does. Intervals: a bootstrap over sequences, the base and
the later window resampled independently, the fit refitted each time (percentiles).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide
from rlparity.metrics import core
from rlparity.metrics.floor_records import recorded_floors
from rlparity.metrics.objective import policy_logprob
from rlparity.metrics.summary import trainer_side
from rlparity.trace import arm_record

LOW_PROB = 0.1  # mu below this is a low-probability token
POSITION_EDGES = (0, 16, 64, 256, 1024)  # response position buckets [e_i, e_i+1); the last is open
CONFIDENCE_EDGES = (0.0, 0.05, 0.3, 1.0)  # -log mu bands below ln(1 / LOW_PROB); the first is the reference
LOW_PROB_EDGES = (math.log(1 / LOW_PROB), math.log(100.0))  # -log mu bands of low-probability tokens
LAG_MAX = 3  # lags 0, 1, 2 and 3 or more
PARTS = ("length", "confidence", "low_prob", "lag")
PART_NAMES = {"length": "response length (position bucket)", "confidence": "confidence (-log mu band, mu >= 0.1)",
              "low_prob": "low-probability tokens (mu < 0.1)", "lag": "policy lag",
              "residual": "residual: the |d| of a cell changed (kernels, backend, weights)"}
TARGETS = ("abs_d", "k3")


@dataclass(frozen=True)
class StepTokens:
    """The real tokens of one or more steps, flat (one entry per token, finite ``d`` only).

    Parameters
    ----------
    d : numpy.ndarray
        ``log pi_old - log mu`` (nats, float64).
    neg_log_mu : numpy.ndarray
        ``-log mu`` (nats).
    position : numpy.ndarray
        The token's position in its response (from 0).
    lag : numpy.ndarray
        ``trainer_version - policy_version`` (versions).
    sequence : numpy.ndarray
        A sequence id, unique over the steps held.
    step : numpy.ndarray
        The step of the token.
    n_zero_prob : int
        Real tokens left out because ``d`` is not finite (a side gives probability 0).
    """

    d: np.ndarray
    neg_log_mu: np.ndarray
    position: np.ndarray
    lag: np.ndarray
    sequence: np.ndarray
    step: np.ndarray
    n_zero_prob: int = 0

    @property
    def n_sequences(self) -> int:
        """The sequences held.

        Returns
        -------
        int
            Distinct sequence ids.
        """
        return int(np.unique(self.sequence).size)


def step_tokens(trace: xr.Dataset, step: int = 0, *, trainer: TrainerSide | None = None,
                sequence_offset: int = 0) -> StepTokens:
    """The real tokens of one step's trace, flat.

    Parameters
    ----------
    trace : xarray.Dataset
        One scored step (pi_old and mu).
    step : int, default 0
        The step number given to its tokens.
    trainer : {"processed", "raw"}, optional
        The trainer reading that is pi_old (default :func:`rlparity.metrics.trainer_side`).
    sequence_offset : int, default 0
        Added to the sequence index (ids unique over several steps).

    Returns
    -------
    StepTokens
        The tokens with a finite ``d``; the lag is against ``attrs["latest_policy_version"]``
        (else the newest version among the tokens).
    """
    side = trainer_side(trace, trainer)
    mask = trace["response_mask"].values.astype(bool)
    log_mu = policy_logprob(trace, "mu", side)
    log_pi = policy_logprob(trace, "old", side)
    with np.errstate(invalid="ignore"):
        d = log_pi - log_mu
    ok = core.finite_mask(d, mask)
    latest = arm_record(trace).latest_policy_version
    pv = trace["policy_version"].values if "policy_version" in trace else np.zeros(mask.shape, np.int64)
    lag = core.token_lag(pv, mask, latest=None if latest is None else int(latest))
    seq, pos = np.nonzero(ok)
    return StepTokens(d=d[ok], neg_log_mu=-log_mu[ok], position=pos.astype(np.int64), lag=lag[ok],
                      sequence=seq.astype(np.int64) + int(sequence_offset),
                      step=np.full(seq.size, int(step), np.int64), n_zero_prob=int((mask & ~ok).sum()))


def concat_tokens(parts: Sequence[StepTokens]) -> StepTokens:
    """Several steps' tokens as one (sequence ids must already be distinct).

    Parameters
    ----------
    parts : sequence of StepTokens
        The steps.

    Returns
    -------
    StepTokens
        Their tokens, in order.
    """
    if not parts:
        empty = np.zeros(0)
        return StepTokens(empty, empty, empty.astype(np.int64), empty, empty.astype(np.int64), empty.astype(np.int64))
    return StepTokens(*(np.concatenate([getattr(p, f) for p in parts])
                        for f in ("d", "neg_log_mu", "position", "lag", "sequence", "step")),
                      n_zero_prob=sum(p.n_zero_prob for p in parts))


def run_tokens(steps: Mapping[int, xr.Dataset], *, trainer: TrainerSide | None = None) -> dict[int, StepTokens]:
    """Every step's tokens, sequence ids unique over the run.

    Parameters
    ----------
    steps : Mapping[int, xarray.Dataset]
        ``{step: trace}``.
    trainer : {"processed", "raw"}, optional
        The trainer reading that is pi_old.

    Returns
    -------
    dict[int, StepTokens]
        In step order.
    """
    out, offset = {}, 0
    for k in sorted(steps):
        tr = steps[k]
        out[k] = step_tokens(tr, k, trainer=trainer, sequence_offset=offset)
        offset += int(tr.sizes["sequence"])
    return out


def token_row(t: StepTokens) -> dict[str, float]:
    """One row of the step table from tokens (a step's or a window's).

    Parameters
    ----------
    t : StepTokens
        The tokens.

    Returns
    -------
    dict[str, float]
        ``n_tokens``, ``n_zero_prob``, ``abs_log_ratio_mean`` (nats), ``kl_k3`` (nats, mean of
        ``exp(d) - 1 - d``), ``response_length_mean`` (tokens per sequence), ``neg_log_mu_mean``
        (nats), ``low_prob_share`` (``mu < 0.1``), ``lag_mean`` and ``lag_max`` (versions); NaN
        where there is no token.
    """
    n = int(t.d.size)
    nan = float("nan")
    if n == 0:
        return {"n_tokens": 0, "n_zero_prob": t.n_zero_prob, "abs_log_ratio_mean": nan, "kl_k3": nan,
                "response_length_mean": nan, "neg_log_mu_mean": nan, "low_prob_share": nan, "lag_mean": nan,
                "lag_max": nan}
    known = ~np.isnan(t.lag)
    return {"n_tokens": n, "n_zero_prob": t.n_zero_prob, "abs_log_ratio_mean": float(np.abs(t.d).mean()),
            "kl_k3": float((np.expm1(t.d) - t.d).mean()), "response_length_mean": n / max(t.n_sequences, 1),
            "neg_log_mu_mean": float(t.neg_log_mu.mean()),
            "low_prob_share": float((t.neg_log_mu > LOW_PROB_EDGES[0]).mean()),
            **({"lag_mean": float(np.nanmean(t.lag)), "lag_max": float(np.nanmax(t.lag))} if known.any() else
               {"lag_mean": nan, "lag_max": nan})}  # no version known: no lag


STEP_VARIABLES = {
    "n_tokens": ("real tokens with a finite d", "1"),
    "n_zero_prob": ("real tokens a side gives probability 0 (left out of every mean)", "1"),
    "abs_log_ratio_mean": ("mean |d|, d = log pi_old - log mu (backend pair)", "nats"),
    "kl_k3": ("k3 = mean of exp(d) - 1 - d, estimates KL(mu || pi_old)", "nats"),
    "response_length_mean": ("real tokens per sequence", "tokens"),
    "neg_log_mu_mean": ("mean -log mu of the sampled tokens (confidence; an entropy proxy)", "nats"),
    "low_prob_share": (f"share of tokens with mu < {LOW_PROB:g}", "1"),
    "lag_mean": ("mean policy lag: trainer version - version that sampled the token", "versions"),
    "lag_max": ("largest policy lag", "versions"),
    "trainer_floor": ("the trainer's recorded batch-shape floor, mean |x|", "nats"),
    "engine_floor": ("the engine's recorded batch floor, mean |x|", "nats"),
}


def step_table(steps: Mapping[int, xr.Dataset], *, trainer: TrainerSide | None = None,
               tokens: Mapping[int, StepTokens] | None = None) -> xr.Dataset:
    """The mismatch of every step, with the floors each step recorded.

    Parameters
    ----------
    steps : Mapping[int, xarray.Dataset]
        ``{step: trace}``.
    trainer : {"processed", "raw"}, optional
        The trainer reading that is pi_old.
    tokens : Mapping[int, StepTokens], optional
        :func:`run_tokens` already computed.

    Returns
    -------
    xarray.Dataset
        Dim ``step``; the variables of :data:`STEP_VARIABLES` (attrs ``long_name``, ``units``,
        ``pair``).
    """
    tokens = tokens if tokens is not None else run_tokens(steps, trainer=trainer)
    ks = sorted(steps)
    rows = [token_row(tokens[k]) for k in ks]
    data: dict[str, Any] = {name: np.array([r[name] for r in rows], float) for name in rows[0]} if rows else {}
    floors = [recorded_floors(steps[k], trainer_side(steps[k], trainer)) for k in ks]
    data["trainer_floor"] = np.array([f["batch_shape_mean_abs"] for f in floors], float)
    data["engine_floor"] = np.array([f["engine_batch_mean_abs"] for f in floors], float)
    ds = xr.Dataset({name: ("step", np.asarray(v, float)) for name, v in data.items()},
                    coords={"step": np.asarray(ks, np.int64)})
    for name, (long, units) in STEP_VARIABLES.items():
        if name in ds:
            ds[name].attrs = {"long_name": long, "units": units, "pair": "backend (pi_old, mu)"}
    return ds


def lag_table(tokens: Mapping[int, StepTokens], *, lag_max: int = LAG_MAX) -> xr.Dataset:
    """Mean ``|d|`` and token counts per step and policy lag.

    Parameters
    ----------
    tokens : Mapping[int, StepTokens]
        :func:`run_tokens`.
    lag_max : int, default LAG_MAX
        Lags at or above it share the last column.

    Returns
    -------
    xarray.Dataset
        Dims ``(step, lag)``: ``abs_log_ratio_mean`` (nats, NaN without a token) and ``n_tokens``;
        the last lag label means "``lag_max`` or more".
    """
    ks = sorted(tokens)
    mean = np.full((len(ks), lag_max + 1), np.nan)
    count = np.zeros((len(ks), lag_max + 1), np.int64)
    for i, k in enumerate(ks):
        t = tokens[k]
        # an unknown version (NaN lag: a dump that records none) falls in no lag
        cat = np.where(np.isnan(t.lag), -1, np.clip(np.nan_to_num(t.lag, nan=0.0), 0, lag_max)).astype(int)
        for j in range(lag_max + 1):
            sel = cat == j
            count[i, j] = int(sel.sum())
            if sel.any():
                mean[i, j] = float(np.abs(t.d[sel]).mean())
    return xr.Dataset({"abs_log_ratio_mean": (("step", "lag"), mean, {"long_name": "mean |d| of the lag's tokens",
                                                                       "units": "nats"}),
                       "n_tokens": (("step", "lag"), count, {"long_name": "tokens of that lag", "units": "1"})},
                      coords={"step": np.asarray(ks, np.int64), "lag": np.arange(lag_max + 1)},
                      attrs={"lag_max": lag_max, "pair": "backend (pi_old, mu)"})


# ------------------------------------------------------------------------------------ the decomposition

def _bucket(x: np.ndarray, edges: Sequence[float]) -> np.ndarray:
    """Index of the bucket ``[edges[i], edges[i+1])`` each value falls in (the last is open)."""
    return np.clip(np.searchsorted(np.asarray(edges, float), x, side="right") - 1, 0, len(edges) - 1)


def _factors(t: StepTokens) -> dict[str, np.ndarray]:
    """The categories of each covariate group, per token (0 is every group's reference)."""
    nl = np.maximum(t.neg_log_mu, 0.0)
    band = _bucket(nl, (*CONFIDENCE_EDGES, *LOW_PROB_EDGES))
    nconf = len(CONFIDENCE_EDGES)
    return {"length": _bucket(t.position, POSITION_EDGES),
            "confidence": np.where(band < nconf, band, 0),
            "low_prob": np.where(band >= nconf, band - nconf + 1, 0),
            "lag": np.clip(np.nan_to_num(t.lag, nan=0.0), 0, LAG_MAX).astype(int)}


def _design(base: StepTokens, later: StepTokens) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int]], dict]:
    """One-hot design matrices of both windows (intercept first): only the categories the base
    window holds get a column; a later token of a category the base never saw counts in the
    nearest category the base holds (recorded in ``merged``)."""
    fb, fl = _factors(base), _factors(later)
    cols_b, cols_l, names = [np.ones(base.d.size)], [np.ones(later.d.size)], [("intercept", 0)]
    merged: dict[str, dict[int, int]] = {}
    for group in PARTS:
        seen = np.unique(fb[group])
        if seen.size == 0:
            continue
        later_cat = fl[group]
        missing = np.setdiff1d(np.unique(later_cat), seen)
        if missing.size:
            near = {int(c): int(seen[np.argmin(np.abs(seen - c))]) for c in missing}
            merged[group] = near
            later_cat = np.array([near.get(int(c), int(c)) for c in later_cat]) if later_cat.size else later_cat
        base_cat = fb[group]
        ref = 0 if 0 in seen else int(seen[0])
        for c in seen:
            if int(c) == ref:
                continue
            cols_b.append((base_cat == c).astype(float))
            cols_l.append((later_cat == c).astype(float))
            names.append((group, int(c)))
    return np.column_stack(cols_b), np.column_stack(cols_l), names, merged


def _target(t: StepTokens, target: str) -> np.ndarray:
    if target == "abs_d":
        return np.abs(t.d)
    if target == "k3":
        return np.expm1(t.d) - t.d
    raise ValueError(f"target={target!r}; use one of {TARGETS}")


def _per_sequence(x: np.ndarray, y: np.ndarray, seq: np.ndarray, quad: bool) -> dict[str, np.ndarray]:
    """Per-sequence sums: token count, sum of x, sum of y (and x'x, x'y with ``quad``)."""
    _, inv = np.unique(seq, return_inverse=True)
    s, p = int(inv.max(initial=-1)) + 1, x.shape[1]
    out = {"n": np.bincount(inv, minlength=s).astype(float),
           "sx": np.zeros((s, p)), "sy": np.bincount(inv, weights=y, minlength=s)}
    np.add.at(out["sx"], inv, x)
    if quad:
        out["sxx"] = np.zeros((s, p, p))
        np.add.at(out["sxx"], inv, x[:, :, None] * x[:, None, :])
        out["sxy"] = np.zeros((s, p))
        np.add.at(out["sxy"], inv, x * y[:, None])
    return out


def _parts(wb: np.ndarray, wl: np.ndarray, b: dict, lt: dict, groups: np.ndarray) -> np.ndarray:
    """The parts ``[length, confidence, low_prob, lag, residual, total]`` for sequence weights ``wb``
    (base) and ``wl`` (later)."""
    xtx = np.einsum("s,sij->ij", wb, b["sxx"])
    xty = wb @ b["sxy"]
    beta = np.linalg.lstsq(xtx, xty, rcond=None)[0]
    nb, nl = wb @ b["n"], wl @ lt["n"]
    x0, x1 = (wb @ b["sx"]) / nb, (wl @ lt["sx"]) / nl
    y0, y1 = (wb @ b["sy"]) / nb, (wl @ lt["sy"]) / nl
    contrib = (x1 - x0) * beta
    parts = [float(contrib[groups == g].sum()) for g in range(len(PARTS))]
    total = y1 - y0
    return np.array([*parts, total - sum(parts), total])


def growth_decomposition(base: StepTokens, later: StepTokens, *, target: str = "abs_d", n_boot: int = 200,
                         seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Why the mismatch changed between two windows: the change of the token mean of ``|d|`` (or
    of the k3 term) split into composition parts and a residual (module docstring).

    Parameters
    ----------
    base : StepTokens
        The base window's tokens (the fit is made on them).
    later : StepTokens
        A later window's tokens.
    target : {"abs_d", "k3"}, default "abs_d"
        Per token ``|d|`` or ``exp(d) - 1 - d`` (nats).
    n_boot : int, default 200
        Bootstrap replicates over sequences (0: no interval).
    seed : int, default 0
        Seeds the bootstrap.
    level : float, default 0.95
        The interval's coverage.

    Returns
    -------
    dict
        ``base_mean`` and ``later_mean`` (nats), ``change`` (their difference), ``parts``: per
        part (:data:`PARTS` and ``residual``) ``{"value", "low", "high", "share"}`` (nats; the share
        of the change, NaN when the change is 0), ``check`` (the parts' sum minus the change:
        0 up to rounding), ``merged`` (later categories the base never held, counted in the
        nearest one it held), ``n_tokens``, ``n_sequences``, ``target``, ``n_boot``, ``level``.

    Raises
    ------
    ValueError
        If a window has no token, or ``target`` is unknown.
    """
    if base.d.size == 0 or later.d.size == 0:
        raise ValueError("a window has no token with a finite d: nothing to decompose")
    xb, xl, names, merged = _design(base, later)
    groups = np.array([PARTS.index(g) if g in PARTS else -1 for g, _ in names])
    b = _per_sequence(xb, _target(base, target), base.sequence, quad=True)
    lt = _per_sequence(xl, _target(later, target), later.sequence, quad=False)
    point = _parts(np.ones(b["n"].size), np.ones(lt["n"].size), b, lt, groups)
    labels = (*PARTS, "residual")
    out_parts = {}
    low = high = np.full(point.size, np.nan)
    if n_boot > 0:
        rng = np.random.default_rng(seed)
        sb, sl = b["n"].size, lt["n"].size
        reps = np.array([_parts(np.bincount(rng.integers(0, sb, sb), minlength=sb).astype(float),
                                np.bincount(rng.integers(0, sl, sl), minlength=sl).astype(float), b, lt, groups)
                         for _ in range(int(n_boot))])
        a = (1.0 - level) / 2
        low, high = np.quantile(reps, a, axis=0), np.quantile(reps, 1 - a, axis=0)
    total = float(point[-1])
    for i, name in enumerate(labels):
        out_parts[name] = {"value": float(point[i]), "low": float(low[i]), "high": float(high[i]),
                           "share": float(point[i] / total) if total != 0 else float("nan"),
                           "long_name": PART_NAMES[name]}
    y0 = float(_target(base, target).mean())
    y1 = float(_target(later, target).mean())
    return {"target": target, "base_mean": y0, "later_mean": y1, "change": y1 - y0,
            "change_interval": [float(low[-1]), float(high[-1])], "parts": out_parts,
            "check": float(sum(p["value"] for p in out_parts.values()) - (y1 - y0)),
            "merged": {g: {str(k): v for k, v in m.items()} for g, m in merged.items()},
            "n_tokens": [int(base.d.size), int(later.d.size)],
            "n_sequences": [base.n_sequences, later.n_sequences], "n_boot": int(n_boot), "level": level,
            "units": "nats", "pair": "backend (pi_old, mu), d = log pi_old - log mu"}


__all__ = ["CONFIDENCE_EDGES", "LAG_MAX", "LOW_PROB", "LOW_PROB_EDGES", "PARTS", "PART_NAMES", "POSITION_EDGES",
           "STEP_VARIABLES", "StepTokens", "TARGETS", "concat_tokens", "growth_decomposition", "lag_table",
           "run_tokens", "step_table", "step_tokens", "token_row"]
