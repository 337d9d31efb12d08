"""Tables of the semantic layer: the offset by temperature, and every probability-0 token."""

from __future__ import annotations

import numpy as np
import xarray as xr

from rlparity.config.provenance import make_attrs
from rlparity.config.defaults import TrainerSide
from rlparity.metrics import core
from rlparity.metrics.summary import pair_attrs, summary, trainer_variable
from rlparity.trace import as_arms

TEMPERATURE_VARIABLES = ("log_ratio_mean", "abs_log_ratio_rms", "mean_ratio", "n_tokens", "n_zero_prob")


def by_temperature(trace: xr.Dataset, trainer: TrainerSide | None = None) -> xr.Dataset:
    """Token stats of d grouped by each request's temperature (dim ``temperature``), plus the
    mean log kept mass of top-k/top-p when the trace has it.

    The raw-mode signature: with ``raw_logprobs`` the mean of d moves with temperature (the
    engine reports ``log softmax(z)`` while the sampler drew from ``log softmax(z / T)``);
    with ``processed_logprobs`` it stays at zero for every temperature.
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
    """:func:`by_temperature` of every arm stacked along ``arm`` (``data``: arms, a DataTree or a
    store path)."""
    arms = as_arms(data)
    out = xr.concat([by_temperature(ds, trainer) for ds in arms.values()],
                    dim=xr.DataArray(list(arms), dims="arm", name="arm"), join="outer")
    out.attrs = pair_attrs(trainer, arms=list(arms))
    return out


def zero_prob_tokens(trace: xr.Dataset, trainer: TrainerSide | None = None) -> xr.Dataset:
    """Every token the trainer gives probability 0, one row each (dim ``token``): where it is,
    what was sampled, the rollout's logprob and the trainer's rank of it. Never averaged away."""
    var = trainer_variable(trainer)
    log_pi = trace[var].values
    mask = trace["response_mask"].values.astype(bool)
    seq, pos = np.nonzero(mask & np.isneginf(log_pi))
    rank = trace["trainer_token_rank"].values[seq, pos] if "trainer_token_rank" in trace else np.full(seq.size, -1)
    raw = trace["trainer_logprob"].values[seq, pos] if "trainer_logprob" in trace else np.full(seq.size, np.nan)
    ds = xr.Dataset({
        "sequence_index": ("token", seq.astype(np.int64)),
        "position_index": ("token", pos.astype(np.int64)),
        "token_id": ("token", trace["token_id"].values[seq, pos]),
        "rollout_logprob": ("token", trace["rollout_logprob"].values[seq, pos], {"units": "nats"}),
        "trainer_logprob": ("token", raw, {"units": "nats"}),
        "trainer_token_rank": ("token", rank),
        "top_k": ("token", trace["top_k"].values[seq]),
        "top_p": ("token", trace["top_p"].values[seq]),
    }, coords={"token": np.arange(seq.size)})
    ds.attrs = make_attrs(trainer_side=trainer, arm=trace.attrs.get("arm", "default"),
                          long_name="tokens the trainer gives probability 0")
    return ds


__all__ = ["by_temperature", "temperature_table", "zero_prob_tokens"]
