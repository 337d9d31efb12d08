"""Tables of the semantic layer: the offset by temperature, and every probability-0 token."""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs
from rlparity.config.defaults import TrainerSide, defaults
from rlparity.metrics import core
from rlparity.metrics.summary import pair_attrs, summary, trainer_variable
from rlparity.trace import as_arms

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
    ds.attrs = pair_attrs(trainer, arm=trace.attrs.get("arm", "default"))
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
    ds.attrs = make_attrs(trainer_side=trainer or defaults().trainer, arm=trace.attrs.get("arm", "default"),
                          long_name="tokens the trainer gives probability 0", noise_rms=noise_rms)
    return ds


__all__ = ["BF16_ULP", "by_temperature", "temperature_table", "zero_prob_tokens"]
