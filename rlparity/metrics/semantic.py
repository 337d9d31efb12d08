"""Tables of the semantic layer: the offset by temperature, and every probability-0 token."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs
from rlparity.config.defaults import TrainerSide, defaults
from rlparity.metrics import core
from rlparity.metrics.summary import pair_attrs, summary, trainer_variable
from rlparity.trace import arm_record, as_arms

TEMPERATURE_VARIABLES = ("log_ratio_mean", "abs_log_ratio_rms", "mean_ratio", "n_tokens", "n_zero_prob")


def by_temperature(trace: xr.Dataset, trainer: TrainerSide | None = None) -> xr.Dataset:
    """Token stats of d grouped by each request's temperature (dim ``temperature``).

    Plus the mean log kept mass of top-k/top-p when the trace has it.

    The raw-mode signature: with ``raw_logprobs`` the mean of d moves with temperature (the
    engine reports ``log softmax(z)`` while the sampler drew from ``log softmax(z / T)``);
    with ``processed_logprobs`` it stays at zero for every temperature.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with a trainer side.
    trainer : {"processed", "raw"}, optional
        The trainer reading to compare with; ``None`` is ``defaults().trainer``.

    Returns
    -------
    xarray.Dataset
        Over ``temperature``: :data:`TEMPERATURE_VARIABLES` (nats where a logprob quantity) and
        ``log_kept_mass_mean`` (nats; NaN without ``trainer_log_kept_mass``), with pair attrs.
    """

    def row(group: xr.Dataset) -> xr.Dataset:
        s = summary(group, trainer)[list(TEMPERATURE_VARIABLES)]
        if "trainer_log_kept_mass" in group:
            kept = core.masked_mean(group["trainer_log_kept_mass"].values, group["response_mask"].values)
        else:
            kept = np.nan
        s["log_kept_mass_mean"] = xr.DataArray(float(kept), attrs={"units": "nats",
                                                                   "long_name": "mean log kept mass of top-k/top-p"})
        return s.drop_attrs()

    ds = trace.groupby("temperature").map(row)
    ds.attrs = pair_attrs(trainer, arm=arm_record(trace).name)
    return ds


def temperature_table(data, trainer: TrainerSide | None = None) -> xr.Dataset:
    """:func:`by_temperature` of every arm stacked along ``arm``.

    Parameters
    ----------
    data : Mapping[str, xarray.Dataset], xarray.DataTree or path
        The arms, a DataTree or a store path.
    trainer : {"processed", "raw"}, optional
        The trainer reading to compare with; ``None`` is ``defaults().trainer``.

    Returns
    -------
    xarray.Dataset
        Over ``(arm, temperature)``; an arm without a temperature is NaN there.
    """
    arms = as_arms(data)
    out = xr.concat([by_temperature(ds, trainer) for ds in arms.values()],
                    dim=xr.DataArray(list(arms), dims="arm", name="arm"), join="outer")
    out.attrs = pair_attrs(trainer, arms=list(arms))
    return out


def sharpness_fit(logprob: np.ndarray, reference: np.ndarray, mask: np.ndarray, *, band: tuple[float, float] = (0.01, 0.37),
                  groups: int = 20) -> dict[str, Any]:
    """How sharp one reading is against another: the inverse temperature between them, from the numbers.

    For a token the reference gives most of the mass (``-log p`` in ``band``; above ``-log 0.5`` it
    is surely the argmax), ``-log p_beta = log(1 + sum_j exp(-beta Delta_j))``, ``Delta_j`` the gaps
    of the other logits to it; while the tail is small this is ``~ sum_j exp(-beta Delta_j)``, so
    ``log(-log p)`` scales with the inverse temperature ``beta``. The slope of ``log(-logprob)`` on
    ``log(-reference)`` through the origin (a Huber fit,
    :func:`rlparity.metrics.core.fits.robust_reading_fit`) is then the ratio of the two readings'
    inverse temperatures: 1 when both are at one temperature, ``1 / T`` for a
    reading at temperature ``T`` against a temperature-1 reference (the trainer's raw reading). Many
    near-tied competitors bias it slightly upwards (the soft minimum of the gaps moves with beta):
    about +5% on the H200 ``small`` model at T = 0.7. Tokens are chosen on the reference only, so
    the choice does not lean on the reading fitted. The standard error is the larger of the
    sandwich one and a delete-a-group jackknife over sequences
    (:func:`rlparity.metrics.core.fits.jackknife_slope_se`).

    Parameters
    ----------
    logprob : numpy.ndarray
        The reading whose sharpness is measured, ``(sequence, position)`` (nats).
    reference : numpy.ndarray
        The reference reading of the same tokens (nats).
    mask : numpy.ndarray
        Boolean, True on real tokens.
    band : tuple of float, default (0.01, 0.37)
        The range of ``-reference`` (nats) the fit uses: below, float rounding and bf16 noise dominate
        ``log(-log p)``; above, the small-tail approximation fails.
    groups : int, default 20
        Most jackknife groups.

    Returns
    -------
    dict
        ``beta`` (the slope), ``beta_se``, ``beta_se_token``, ``beta_se_jackknife``, ``n_tokens``
        and ``n_sequences`` (NaN slope and errors with fewer than 3 tokens).
    """
    lp = np.asarray(logprob, dtype=float)
    ref = np.asarray(reference, dtype=float)
    lo, hi = band
    with np.errstate(divide="ignore", invalid="ignore"):
        sel = np.asarray(mask, bool) & np.isfinite(lp) & np.isfinite(ref) & (-ref >= lo) & (-ref <= hi) & (lp < 0)
        y = np.where(sel, np.log(-lp), 0.0)
        x = np.where(sel, np.log(-ref), 0.0)
    n_seq = int(sel.reshape(sel.shape[0], -1).any(axis=1).sum()) if sel.ndim > 1 else int(sel.sum())
    if sel.sum() < 3:
        nan = float("nan")
        return {"beta": nan, "beta_se": nan, "beta_se_token": nan, "beta_se_jackknife": nan,
                "n_tokens": int(sel.sum()), "n_sequences": n_seq}
    fit = core.robust_reading_fit(y, x, sel)
    jk = core.jackknife_slope_se(lambda m: core.robust_reading_fit(y, x, m, start=fit["alpha"])["alpha"], sel,
                                groups=groups)
    se = max(fit["alpha_se"], jk["se"]) if np.isfinite(jk["se"]) else float("nan")
    return {"beta": float(fit["alpha"]), "beta_se": float(se), "beta_se_token": float(fit["alpha_se"]),
            "beta_se_jackknife": float(jk["se"]), "n_tokens": int(sel.sum()), "n_sequences": n_seq}


SHARPNESS_READINGS = {"rollout": "rollout_logprob", "trainer": "trainer_processed_logprob"}


def effective_temperature(trace: xr.Dataset) -> xr.Dataset:
    """The temperature each side's logprobs are at, read from the numbers (dim ``temperature``).

    Per request temperature: the inverse temperature ``beta`` of the rollout's logprobs and of the
    trainer's processed reading against the trainer's raw reading (temperature 1 by definition),
    :func:`sharpness_fit` on the tokens the raw reading is confident about
    (``-log p`` in ``defaults().sharpness_band``). ``beta ~ 1 / T`` for a side that applied the
    request's temperature, ``~ 1`` for one that did not (vLLM's ``raw_logprobs``; a trainer that
    does not divide the logits). Needs no recorded setting: a user's own run, a peer's dump.

    Parameters
    ----------
    trace : xarray.Dataset
        A scored arm with ``trainer_logprob`` (the raw reading) and ``temperature`` per sequence.

    Returns
    -------
    xarray.Dataset
        Over ``temperature``: ``beta_<side>``, ``beta_<side>_se``, ``temperature_<side>``
        (``1 / beta``) for ``side`` in ``rollout`` / ``trainer`` (NaN where the reading is absent),
        and ``n_tokens`` / ``n_sequences`` fitted; empty (no ``temperature``) without the raw reading.
    """
    if "trainer_logprob" not in trace or "temperature" not in trace:
        return xr.Dataset(coords={"temperature": np.zeros(0)})
    o = defaults()
    mask = trace["response_mask"].values.astype(bool)
    temps = trace["temperature"].values
    ref = trace["trainer_logprob"].values
    rows = {}
    for t in np.unique(temps[np.isfinite(temps)]):
        m = mask & (temps == t)[:, None]
        row = {}
        for side, var in SHARPNESS_READINGS.items():
            if var not in trace:
                row.update({f"beta_{side}": np.nan, f"beta_{side}_se": np.nan})
                continue
            f = sharpness_fit(trace[var].values, ref, m, band=o.sharpness_band, groups=o.jackknife_groups)
            row.update({f"beta_{side}": f["beta"], f"beta_{side}_se": f["beta_se"],
                        "n_tokens": f["n_tokens"], "n_sequences": f["n_sequences"]})
        rows[float(t)] = row
    keys = ["beta_rollout", "beta_rollout_se", "beta_trainer", "beta_trainer_se", "n_tokens", "n_sequences"]
    ds = xr.Dataset({k: ("temperature", np.array([rows[t].get(k, np.nan) for t in rows], dtype=float)) for k in keys},
                    coords={"temperature": np.array(list(rows), dtype=float)})
    for side in SHARPNESS_READINGS:
        with np.errstate(divide="ignore", invalid="ignore"):
            ds[f"temperature_{side}"] = 1.0 / ds[f"beta_{side}"]
        ds[f"beta_{side}"].attrs = {"long_name": f"inverse temperature of the {side}'s logprobs against the trainer's "
                                                 "raw reading (slope of log(-log p) on confident tokens)"}
        ds[f"temperature_{side}"].attrs = {"long_name": f"the {side}'s effective temperature, from the numbers"}
    ds["temperature"].attrs = {"long_name": "the request's sampling temperature"}
    ds.attrs = make_attrs(arm=arm_record(trace).name, band_nats=list(o.sharpness_band))
    return ds


BF16_ULP = 2.0 ** -7  # the spacing of bfloat16 numbers relative to their size (8 significant bits)


def zero_prob_tokens(trace: xr.Dataset, trainer: TrainerSide | None = None, *,
                     noise_rms: float | None = None) -> xr.Dataset:
    """Every token the trainer gives probability 0, one row each (dim ``token``).

    Where it is, what was sampled, the rollout's logprob, the trainer's rank of it, and its cause.
    Never averaged away.

    ``cause``: ``"boundary"`` when the token's logit is within a precision-sized margin of the kept
    set's edge (``trainer_cut_margin`` <= ``precision_margin`` = the larger of
    ``boundary_flip_ulps`` bfloat16 ulps of the position's largest logit and 3 x ``noise_rms``
    (nats, the engine's measured noise) x temperature): the two sides' rounding put it on different
    sides of the cut. ``"outside"`` when it is clearly beyond the edge. Traces scored before
    ``trainer_cut_margin`` existed fall back on the rank (``rank == top_k``: adjacent to the edge);
    ``"unclassified"`` where neither is recorded.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with a trainer side.
    trainer : {"processed", "raw"}, optional
        The trainer reading to compare with; ``None`` is ``defaults().trainer``.
    noise_rms : float, optional
        The engine's measured noise RMS (nats); ``None`` uses the ulp margin alone.

    Returns
    -------
    xarray.Dataset
        Over ``token``: ``sequence_index``, ``position_index``, ``token_id``, ``rollout_logprob`` and
        ``trainer_logprob`` (raw, nats), ``trainer_token_rank``, ``top_k``, ``top_p``, ``cut_margin``,
        ``precision_margin`` (logit units) and ``cause``.
    """
    var = trainer_variable(trainer)
    log_pi = trace[var].values
    mask = trace["response_mask"].values.astype(bool)
    seq, pos = np.nonzero(mask & np.isneginf(log_pi))
    rank = trace["trainer_token_rank"].values[seq, pos] if "trainer_token_rank" in trace else np.full(seq.size, -1)
    raw = trace["trainer_logprob"].values[seq, pos] if "trainer_logprob" in trace else np.full(seq.size, np.nan)
    top_k = trace["top_k"].values[seq]
    temp = trace["temperature"].values[seq]
    margin = (trace["trainer_cut_margin"].values[seq, pos] if "trainer_cut_margin" in trace
              else np.full(seq.size, np.nan))
    scale = (np.abs(trace["trainer_max_logit"].values[seq, pos]) if "trainer_max_logit" in trace
             else np.full(seq.size, np.nan))
    precision = defaults().boundary_flip_ulps * BF16_ULP * scale
    if noise_rms is not None and np.isfinite(noise_rms):
        precision = np.fmax(precision, 3.0 * noise_rms * np.where(temp > 0, temp, 1.0))
    cause = np.full(seq.size, "unclassified", dtype=object)
    known = np.isfinite(margin) & np.isfinite(precision)
    cause[known & (margin <= precision)] = "boundary"
    cause[known & (margin > precision)] = "outside"
    by_rank = ~known & (top_k > 0) & (rank >= 0)
    cause[by_rank & (rank == top_k)] = "boundary"
    cause[by_rank & (rank > top_k)] = "outside"
    ds = xr.Dataset({
        "sequence_index": ("token", seq.astype(np.int64)),
        "position_index": ("token", pos.astype(np.int64)),
        "token_id": ("token", trace["token_id"].values[seq, pos]),
        "rollout_logprob": ("token", trace["rollout_logprob"].values[seq, pos], {"units": "nats"}),
        "trainer_logprob": ("token", raw, {"units": "nats"}),
        "trainer_token_rank": ("token", rank),
        "top_k": ("token", top_k),
        "top_p": ("token", trace["top_p"].values[seq]),
        "cut_margin": ("token", margin, {"long_name": "kept-set edge minus the token's logit (logit units)"}),
        "precision_margin": ("token", precision, {"long_name": "margin within which a token counts as a flip"}),
        "cause": ("token", cause.astype(str)),
    }, coords={"token": np.arange(seq.size)})
    ds.attrs = make_attrs(trainer_side=trainer or defaults().trainer, arm=arm_record(trace).name,
                          long_name="tokens the trainer gives probability 0", noise_rms=noise_rms)
    return ds


def identity_sampling(trace: xr.Dataset) -> bool:
    """Whether sampling is the identity: raw and processed readings then coincide.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with ``temperature``, ``top_k`` and ``top_p``.

    Returns
    -------
    bool
        True when every request has temperature 1 or is greedy, and no top-k or top-p cut.
    """
    t = trace["temperature"].values
    return bool(np.all((t == 1.0) | (t < 1e-5)) and np.all(trace["top_k"].values <= 0)
                and np.all(trace["top_p"].values >= 1.0))


__all__ = ["BF16_ULP", "by_temperature", "identity_sampling", "temperature_table", "zero_prob_tokens"]
