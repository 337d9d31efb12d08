"""The LM-head precision experiment: rollout head dtype x trainer head dtype.

The same prompts (same seeds) are sampled once per rollout head dtype (vLLM
``hf_overrides={"head_dtype": ...}``) and every rollout is rescored once per trainer head dtype.
The body runs in one pinned ``dtype`` on both sides (default bfloat16: vLLM's CPU build runs
``dtype="auto"`` as bfloat16 anyway), so the cells differ only in the precision of the final
projection to logits. Logprobs are ``processed_logprobs`` in every cell, so no semantic mismatch
mixes in.

* :func:`head_matrix` runs the experiment and returns ``{arm: trace}`` with arms named
  ``rollout-<dtype>_trainer-<dtype>`` (:func:`arm_name`).
* :func:`head_table` is the per-cell table (dims ``rollout_head``, ``trainer_head``).
* :func:`gap_by_logit` and :func:`gap_by_position` break the gap down by the trainer's largest
  logit and by response position.
* :func:`matched_advantage` says by how much the matched fp32/fp32 cell beats the others.

Each cell's head dtypes are read from the trace attrs (the rollout's ``engine_effective``, read
back from the running engine, and the trainer's ``head_dtype``), never from the arm name alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from rlparity._provenance import make_attrs
from rlparity.capture.settings import EngineSettings, SamplingSettings
from rlparity.metrics import core, log_ratio, summary, trainer_variable

HEAD_DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_HEADS = ("bfloat16", "float32")
_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
            "half": "float16", "torch.float32": "float32", "torch.bfloat16": "bfloat16",
            "torch.float16": "float16"}
_ARM = re.compile(r"^rollout-(?P<rollout>[a-z0-9]+)_trainer-(?P<trainer>[a-z0-9]+)$")
# per-cell variables of head_table: (summary variable, long name)
TABLE_VARIABLES = {
    "abs_log_ratio_rms": ("abs_log_ratio_rms", "RMS of d"),
    "abs_log_ratio_max": ("abs_log_ratio_max", "max of |d|"),
    "abs_log_ratio_mean": ("abs_log_ratio_mean", "mean of |d|"),
    "log_ratio_mean": ("log_ratio_mean", "mean of d"),
    "mean_ratio": ("mean_ratio", "mean of pi_old/mu"),
    "prob_pearson": ("prob_pearson", "Pearson corr(pi_old, mu) of sampled-token probabilities"),
    "prob_diff_mean": ("prob_diff_mean", "mean |pi_old - mu|"),
    "clip_fraction": ("clip_fraction", "share of tokens with pi_old/mu outside [1-eps, 1+eps]"),
    "kl_k3": ("kl_k3", "Schulman k3, estimates KL(mu || pi_old)"),
    "n_tokens": ("n_tokens", "real response tokens"),
    "n_zero_prob": ("n_zero_prob", "tokens the trainer gives probability 0"),
}
_NATS = {"abs_log_ratio_rms", "abs_log_ratio_max", "abs_log_ratio_mean", "log_ratio_mean", "kl_k3"}


def normalize_dtype(name: Any, *, what: str = "head dtype") -> str:
    """``"float32"``, ``"bfloat16"`` or ``"float16"`` from a name, an alias or a torch dtype."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in HEAD_DTYPES:
        raise ValueError(f"unknown {what} {name!r}; use one of {', '.join(HEAD_DTYPES)} "
                         f"(aliases: {', '.join(sorted(k for k in _ALIASES if '.' not in k))})")
    return key


def arm_name(rollout_head: str, trainer_head: str) -> str:
    """``rollout-float32_trainer-bfloat16``: the arm of one cell."""
    return f"rollout-{normalize_dtype(rollout_head)}_trainer-{normalize_dtype(trainer_head)}"


def parse_arm(name: str) -> tuple[str, str]:
    """``(rollout_head, trainer_head)`` from an arm name made by :func:`arm_name`."""
    m = _ARM.match(name)
    if not m:
        raise ValueError(f"arm {name!r} is not named rollout-<dtype>_trainer-<dtype>")
    return normalize_dtype(m["rollout"]), normalize_dtype(m["trainer"])


def cell_dtypes(trace: xr.Dataset) -> dict[str, str | None]:
    """Head and body dtypes of both sides, from the trace attrs (None where not recorded).

    The rollout side is what the engine reported it ran (``engine_effective``), falling back to
    what was requested; the trainer side is what the scorer recorded.
    """
    eff = trace.attrs.get("engine_effective") or {}
    req = trace.attrs.get("engine_requested") or {}
    trainer = trace.attrs.get("trainer") or {}

    def norm(v):
        if v in (None, "", "model"):
            return None
        try:
            return normalize_dtype(v)
        except ValueError:
            return str(v)

    rollout_head = eff.get("head_dtype") or req.get("head_dtype")
    if rollout_head == "model":  # vLLM's "same as the body"
        rollout_head = eff.get("dtype") or req.get("dtype")
    return {"rollout_head": norm(rollout_head), "trainer_head": norm(trainer.get("head_dtype")),
            "rollout_body": norm(eff.get("dtype") or req.get("dtype")),
            "trainer_body": norm(trainer.get("dtype"))}


def _check_dtypes(values: Sequence[str] | str, what: str) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    out = tuple(normalize_dtype(v, what=what) for v in values)
    if not out:
        raise ValueError(f"{what}: give at least one dtype")
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: repeated dtype in {values!r}")
    return out


def head_matrix(model: str | os.PathLike, prompts: Sequence, sampling: SamplingSettings | None = None, *,
                rollout_head: Sequence[str] = DEFAULT_HEADS, trainer_head: Sequence[str] = DEFAULT_HEADS,
                dtype: str = "bfloat16", device: str = "cpu", engine: EngineSettings | None = None,
                pool=None, scorers: Mapping[str, Any] | None = None, batch_size: int = 16,
                progress: bool = False) -> dict[str, xr.Dataset]:
    """Capture ``prompts`` once per rollout head dtype and rescore each rollout once per trainer
    head dtype; return ``{arm_name(r, t): trace}``.

    ``dtype`` pins the body precision on both sides (engine ``dtype`` and the trainer's
    ``Scorer(dtype=...)``), so only the head differs between cells. ``sampling`` is the same in
    every cell (default: temperature 0.7, top-k 20, 24 tokens, seed 0: request i uses seed i).
    ``engine`` holds other engine settings; ``logprobs_mode`` is always ``processed_logprobs``.
    ``device`` is the trainer's device ("cpu", "cuda"); vLLM picks its platform itself.
    ``scorers`` may pass ready :class:`rlparity.score.Scorer` objects by head dtype (their body
    dtype must equal ``dtype``). Engines come from ``pool`` (default: the shared pool), one per
    rollout head dtype; the last one stays live in the pool (close it when done).
    """
    from rlparity.capture.pool import shared_pool
    from rlparity.score import Scorer

    rollout_head = _check_dtypes(rollout_head, "rollout head dtype")
    trainer_head = _check_dtypes(trainer_head, "trainer head dtype")
    dtype = normalize_dtype(dtype, what="body dtype")
    if not len(prompts):
        raise ValueError("head_matrix needs at least one prompt")
    sampling = sampling or SamplingSettings(temperature=0.7, top_k=20, max_tokens=24, seed=0)
    base = engine or EngineSettings()
    pool = pool or shared_pool()
    scorers = dict(scorers or {})
    for th in trainer_head:
        sc = scorers.get(th)
        if sc is None:
            scorers[th] = Scorer(model, dtype=dtype, head_dtype=th, device=device,
                                 batch_size=batch_size, progress=progress)
        elif (sc.dtype, sc.head_dtype) != (dtype, th):
            raise ValueError(f"scorer for trainer head {th} has dtype={sc.dtype}, "
                             f"head_dtype={sc.head_dtype}; expected {dtype}/{th}")
    arms: dict[str, xr.Dataset] = {}
    for rh in rollout_head:
        settings = base.replace(logprobs_mode="processed_logprobs", head_dtype=rh, dtype=dtype)
        eng = pool.get(model, settings)
        rollout = eng.capture(list(prompts), sampling, arm=f"rollout-{rh}", progress=progress)
        eff = rollout.attrs.get("engine_effective", {})
        if eff.get("head_dtype") not in (None, rh) or eff.get("dtype") not in (None, dtype):
            raise RuntimeError(f"asked the engine for head {rh} / body {dtype}, it reports head "
                               f"{eff.get('head_dtype')} / body {eff.get('dtype')}")
        for th in trainer_head:
            sc = scorers[th]
            scored = sc.score(rollout)
            name = arm_name(rh, th)
            scored.attrs["arm"] = name
            scored.attrs["head_experiment"] = {
                "rollout_head": rh, "trainer_head": th, "body_dtype": dtype, "device": device,
                "trainer_body_dtype_effective": str(next(sc.module.parameters()).dtype).replace("torch.", ""),
                "trainer_head_weight_dtype": str(sc.head_weight.dtype).replace("torch.", ""),
            }
            arms[name] = scored
    return arms


def _cells(arms: Mapping[str, xr.Dataset]) -> dict[tuple[str, str], tuple[str, xr.Dataset]]:
    cells: dict[tuple[str, str], tuple[str, xr.Dataset]] = {}
    for name, ds in arms.items():
        dt = cell_dtypes(ds)
        if dt["rollout_head"] is None or dt["trainer_head"] is None:
            try:
                r, t = parse_arm(name)
            except ValueError:
                raise ValueError(f"arm {name!r}: the trace records no rollout/trainer head dtype "
                                 "(engine_effective.head_dtype, trainer.head_dtype)") from None
            dt = {"rollout_head": dt["rollout_head"] or r, "trainer_head": dt["trainer_head"] or t}
        key = (dt["rollout_head"], dt["trainer_head"])
        if key in cells:
            raise ValueError(f"arms {cells[key][0]!r} and {name!r} are the same cell {key}")
        cells[key] = (name, ds)
    if not cells:
        raise ValueError("no arms given")
    return cells


def _order(values) -> list[str]:
    rank = {d: i for i, d in enumerate(("bfloat16", "float16", "float32"))}
    return sorted(set(values), key=lambda v: (rank.get(v, 99), v))


def _as_mapping(data) -> dict[str, xr.Dataset]:
    from rlparity.trace import as_arms

    return as_arms(data)


def head_table(data, *, trainer: str = "processed", eps: float = 0.2) -> xr.Dataset:
    """Per-cell parity table, dims ``(rollout_head, trainer_head)``: RMS / max / mean |d|, mean
    ratio, Pearson of token probabilities, clip fraction at ``eps``, k3 and token counts.

    ``data``: ``{arm: trace}``, a DataTree or a store path (arms from :func:`head_matrix`). Cells
    missing from ``data`` are NaN; ``arm`` holds each cell's arm name.
    """
    cells = _cells(_as_mapping(data))
    rows = _order(k[0] for k in cells)
    cols = _order(k[1] for k in cells)
    shape = (len(rows), len(cols))
    values = {k: np.full(shape, np.nan) for k in TABLE_VARIABLES}
    arm = np.full(shape, "", dtype=object)
    for (r, t), (name, ds) in cells.items():
        i, j = rows.index(r), cols.index(t)
        s = summary(ds, trainer, eps=eps)
        for k, (var, _) in TABLE_VARIABLES.items():
            values[k][i, j] = float(s[var])
        arm[i, j] = name
    dims = ("rollout_head", "trainer_head")
    ds = xr.Dataset(
        {k: (dims, v, {"long_name": TABLE_VARIABLES[k][1], **({"units": "nats"} if k in _NATS else {})})
         for k, v in values.items()},
        coords={"rollout_head": rows, "trainer_head": cols})
    ds["arm"] = (dims, arm.astype(str))
    ds["matched"] = (dims, np.array([[r == t for t in cols] for r in rows]))
    ds.attrs = make_attrs(pair="backend (pi_old, mu)", direction=f"{trainer_variable(trainer)} - rollout_logprob",
                          trainer_side=trainer, eps=eps, units="nats",
                          long_name="LM-head precision matrix: rollout head dtype x trainer head dtype")
    return ds


def binned_rms(x: np.ndarray, d: np.ndarray, mask: np.ndarray, edges: np.ndarray) -> dict[str, np.ndarray]:
    """RMS and mean of ``d`` and token counts in bins of ``x`` (numpy; NaN for empty bins).

    Bin ``b`` holds ``edges[b] <= x < edges[b + 1]`` (the last bin includes its right edge).
    Only real tokens with finite ``d`` and ``x`` count.
    """
    m = core.finite_mask(d, mask) & np.isfinite(x)
    xv, dv = x[m], d[m]
    nb = len(edges) - 1
    idx = np.clip(np.searchsorted(edges, xv, side="right") - 1, 0, nb - 1)
    inside = (xv >= edges[0]) & (xv <= edges[-1])
    idx, dv = idx[inside], dv[inside]
    n = np.bincount(idx, minlength=nb).astype(float)
    s1 = np.bincount(idx, weights=dv, minlength=nb)
    s2 = np.bincount(idx, weights=dv ** 2, minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"rms": np.where(n > 0, np.sqrt(s2 / np.maximum(n, 1)), np.nan),
                "mean": np.where(n > 0, s1 / np.maximum(n, 1), np.nan), "n_tokens": n.astype(np.int64)}


def logit_edges(data, n_bins: int = 8) -> np.ndarray:
    """Quantile bin edges of the trainer's largest logit over all arms' real tokens."""
    xs = []
    for ds in _as_mapping(data).values():
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


def gap_by_logit(data, *, trainer: str = "processed", n_bins: int = 8,
                 edges: Sequence[float] | None = None) -> xr.Dataset:
    """RMS and mean of d per bin of the trainer's largest logit (``trainer_max_logit``), dims
    ``(rollout_head, trainer_head, logit_bin)``; bins are shared quantile bins over all arms
    unless ``edges`` are given. A low-precision head rounds logits to a relative step, so its
    error grows with the logit magnitude."""
    arms = _as_mapping(data)
    cells = _cells(arms)
    e = np.asarray(edges, dtype=float) if edges is not None else logit_edges(arms, n_bins)
    if e.ndim != 1 or e.size < 2 or np.any(np.diff(e) <= 0):
        raise ValueError("edges must be an increasing 1-d sequence of at least 2 values")
    rows, cols = _order(k[0] for k in cells), _order(k[1] for k in cells)
    nb = e.size - 1
    out = {k: np.full((len(rows), len(cols), nb), np.nan) for k in ("rms", "mean")}
    count = np.zeros((len(rows), len(cols), nb), dtype=np.int64)
    for (r, t), (_, ds) in cells.items():
        i, j = rows.index(r), cols.index(t)
        d = log_ratio(ds, trainer).values
        b = binned_rms(ds["trainer_max_logit"].values, d, ds["response_mask"].values.astype(bool), e)
        out["rms"][i, j], out["mean"][i, j], count[i, j] = b["rms"], b["mean"], b["n_tokens"]
    dims = ("rollout_head", "trainer_head", "logit_bin")
    ds = xr.Dataset({
        "abs_log_ratio_rms": (dims, out["rms"], {"units": "nats", "long_name": "RMS of d in the bin"}),
        "log_ratio_mean": (dims, out["mean"], {"units": "nats", "long_name": "mean of d in the bin"}),
        "n_tokens": (dims, count, {"long_name": "tokens in the bin"}),
    }, coords={"rollout_head": rows, "trainer_head": cols, "logit_bin": np.arange(nb),
               "logit_low": ("logit_bin", e[:-1], {"long_name": "bin lower edge of max logit"}),
               "logit_high": ("logit_bin", e[1:], {"long_name": "bin upper edge of max logit"}),
               "logit_center": ("logit_bin", (e[:-1] + e[1:]) / 2, {"long_name": "bin centre of max logit"})})
    ds.attrs = make_attrs(pair="backend (pi_old, mu)", direction=f"{trainer_variable(trainer)} - rollout_logprob",
                          binned_by="trainer_max_logit", units="nats")
    return ds


def gap_by_position(data, *, trainer: str = "processed") -> xr.Dataset:
    """RMS and mean of d and token counts per response position, dims
    ``(rollout_head, trainer_head, position)``."""
    arms = _as_mapping(data)
    cells = _cells(arms)
    rows, cols = _order(k[0] for k in cells), _order(k[1] for k in cells)
    width = max(ds.sizes["position"] for ds in arms.values())
    rms = np.full((len(rows), len(cols), width), np.nan)
    mean = np.full_like(rms, np.nan)
    count = np.zeros(rms.shape, dtype=np.int64)
    for (r, t), (_, ds) in cells.items():
        i, j = rows.index(r), cols.index(t)
        d = log_ratio(ds, trainer).values
        m = core.finite_mask(d, ds["response_mask"].values.astype(bool))
        w = d.shape[1]
        n = m.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            rms[i, j, :w] = np.where(n > 0, np.sqrt((np.where(m, d, 0.0) ** 2).sum(axis=0) / np.maximum(n, 1)),
                                     np.nan)
        mean[i, j, :w] = core.masked_mean(d, m, axis=0)
        count[i, j, :w] = n
    dims = ("rollout_head", "trainer_head", "position")
    ds = xr.Dataset({
        "abs_log_ratio_rms": (dims, rms, {"units": "nats", "long_name": "RMS of d at the position"}),
        "log_ratio_mean": (dims, mean, {"units": "nats", "long_name": "mean of d at the position"}),
        "n_tokens": (dims, count, {"long_name": "tokens at the position"}),
    }, coords={"rollout_head": rows, "trainer_head": cols, "position": np.arange(width)})
    ds.attrs = make_attrs(pair="backend (pi_old, mu)", direction=f"{trainer_variable(trainer)} - rollout_logprob",
                          units="nats")
    return ds


def matched_advantage(table: xr.Dataset, *, variable: str = "abs_log_ratio_rms",
                      reference: str = "float32") -> dict[str, Any]:
    """How much lower ``variable`` is in the matched ``reference``/``reference`` cell than in each
    mismatched cell (rollout head != trainer head): ratios, differences, and whether it is lower
    than every one of them.

    ``excess_in_quadrature`` = sqrt(x^2 - matched^2) is, for an RMS, the part of a mismatched cell's
    error that the matched cell does not have, if the head error and the rest (the body) add as
    independent noise: the head's own share when a shared body error dominates both cells.
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
                others[f"rollout-{r}_trainer-{t}"] = {
                    "value": x, "ratio": x / best if best > 0 else float("inf"), "difference": x - best,
                    # the extra error on top of the matched cell's, if the two add independently
                    "excess_in_quadrature": float(np.sqrt(max(x ** 2 - best ** 2, 0.0)))}
    if not others:
        raise ValueError("the table has no mismatched cell to compare with")
    return {"variable": variable, "matched_cell": f"rollout-{reference}_trainer-{reference}",
            "matched_value": best, "mismatched": others,
            "matched_is_lowest": all(best < o["value"] for o in others.values()),
            "min_ratio": min(o["ratio"] for o in others.values()),
            "min_difference": min(o["difference"] for o in others.values())}


def probability_pairs(trace: xr.Dataset, *, trainer: str = "processed", max_points: int | None = None,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """Per real token: rollout probability mu, trainer probability pi_old, |d| and max logit
    (optionally a seeded subsample of ``max_points`` tokens), for scatter plots."""
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


__all__ = ["DEFAULT_HEADS", "HEAD_DTYPES", "arm_name", "binned_rms", "cell_dtypes", "gap_by_logit",
           "gap_by_position", "head_matrix", "head_table", "logit_edges", "matched_advantage",
           "normalize_dtype", "parse_arm", "probability_pairs"]
