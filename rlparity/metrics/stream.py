"""The parity summary of traces larger than memory, chunk by chunk.

A trace opened lazily (``rlparity.trace.open_arms(store, chunks=...)``: dask arrays over the zarr
chunks) is summarised by :func:`summary_stream`: the real tokens of one block of sequences at a time
are loaded, and every statistic of :func:`rlparity.metrics.summary` is accumulated from sums that
combine across blocks (:class:`SummaryAccumulator`): counts, sums of d, ``|d|``, d^2, exp(d), expm1(d) - d,
the clip count, the ESS sums, the probability differences and the Pearson sums, the largest ``|d|``.
Memory is one block, whatever the trace's size.

Everything is exact (to rounding) except the five quantiles of d: they come from a histogram of d
on fixed bins (sign-symmetric, 64 per decade from 1e-9 to 1e3 nats) once the trace passes 5M tokens,
so a quantile lies within one bin (3.7% of its value, or 1e-9 nats) of the two order statistics it
falls between. Below that the quantiles are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import xarray as xr

from rlparity.metrics import core
from rlparity.trace import blocks

# histogram edges for the quantiles of d: 0, then +-10^k for k in [-9, 3] at 64 per decade
_POS = np.logspace(-9, 3, 12 * 64 + 1)
EDGES = np.concatenate([-_POS[::-1], [0.0], _POS])


class SummaryAccumulator:
    """Sums from which every scalar summary statistic follows.

    :meth:`add` one block of real tokens (1-d arrays of the trainer's and the rollout's logprobs),
    :meth:`result` at the end.

    Parameters
    ----------
    eps : float
        The PPO clip range of ``clip_fraction``.
    exact_quantiles_below : int
        Keep the values (exact quantiles) while fewer tokens were used.
    """

    def __init__(self, eps: float, *, exact_quantiles_below: int = 5_000_000):
        self.eps = float(eps)
        self.exact_below = int(exact_quantiles_below)
        self.s = {k: 0.0 for k in ("sx", "sax", "sxx", "sr", "srr", "sk3", "sdp", "sdp2", "spi", "smu", "spimu",
                                   "spi2", "smu2")}
        self.n = {k: 0 for k in ("tokens", "used", "zero", "clip", "rfin", "prob", "k3fin")}
        self.big = -np.inf
        self.dpmax = -np.inf
        self.hist = np.zeros(EDGES.size + 1, dtype=np.int64)
        self.values: list[np.ndarray] | None = []

    def add(self, lp: np.ndarray, lm: np.ndarray) -> None:
        """One block: the trainer's (``lp``) and the rollout's (``lm``) logprobs of its real tokens.

        Parameters
        ----------
        lp : numpy.ndarray
            The trainer's logprobs of the block's real tokens (1-d).
        lm : numpy.ndarray
            The rollout's, same tokens.

        Returns
        -------
        None
        """
        lp, lm = np.asarray(lp, np.float64), np.asarray(lm, np.float64)
        s, n = self.s, self.n
        n["tokens"] += lp.size
        d = lp - lm
        fin = np.isfinite(d)
        x = d[fin]
        n["used"] += x.size
        n["zero"] += int(np.count_nonzero(np.isneginf(lp)))
        s["sx"] += float(x.sum())
        ax = np.abs(x)
        s["sax"] += float(ax.sum())
        s["sxx"] += float(np.dot(x, x))
        if x.size:
            self.big = max(self.big, float(ax.max()))
        with np.errstate(over="ignore", invalid="ignore"):
            r = np.exp(x)
            k3 = np.expm1(x) - x
        rf = np.isfinite(r)
        n["rfin"] += int(rf.sum())
        s["sr"] += float(r[rf].sum())
        s["srr"] += float(np.dot(r[rf], r[rf]))
        kf = np.isfinite(k3)
        n["k3fin"] += int(kf.sum())
        s["sk3"] += float(k3[kf].sum())
        n["clip"] += int(np.count_nonzero((r < 1 - self.eps) | (r > 1 + self.eps)))
        self.hist += np.bincount(np.searchsorted(EDGES, x, side="right"), minlength=self.hist.size)
        if self.values is not None:
            if n["used"] <= self.exact_below:
                self.values.append(x.astype(np.float64))
            else:
                self.values = None
        pm = np.isfinite(lm) & ~np.isnan(lp)
        pi, mu = np.exp(lp[pm]), np.exp(lm[pm])
        dp = np.abs(pi - mu)
        n["prob"] += int(pm.sum())
        s["sdp"] += float(dp.sum())
        s["sdp2"] += float(np.dot(dp, dp))
        if dp.size:
            self.dpmax = max(self.dpmax, float(dp.max()))
        s["spi"] += float(pi.sum())
        s["smu"] += float(mu.sum())
        s["spimu"] += float(np.dot(pi, mu))
        s["spi2"] += float(np.dot(pi, pi))
        s["smu2"] += float(np.dot(mu, mu))

    def quantiles(self, qs=core.QUANTILES) -> np.ndarray:
        """The quantiles of d: exact while the values fit (``exact_quantiles_below``), else from the
        histogram (linear within a bin).

        Parameters
        ----------
        qs : sequence of float
            The quantile levels (default :data:`rlparity.metrics.core.QUANTILES`).

        Returns
        -------
        numpy.ndarray
            One value per level (nats).
        """
        if self.values is not None:
            x = np.concatenate(self.values) if self.values else np.zeros(0)
            return np.quantile(x, qs) if x.size else np.full(len(qs), np.nan)
        total = int(self.hist.sum())
        cum = np.cumsum(self.hist)
        out = []
        lo_edges = np.concatenate([[EDGES[0] * 10], EDGES])
        hi_edges = np.concatenate([EDGES, [EDGES[-1] * 10]])
        for q in qs:
            target = q * (total - 1)
            b = int(np.searchsorted(cum, target, side="right"))
            before = cum[b - 1] if b else 0
            frac = (target - before) / max(self.hist[b], 1)
            out.append(lo_edges[b] + frac * (hi_edges[b] - lo_edges[b]))
        return np.array(out)

    def result(self) -> dict[str, Any]:
        """The scalar summary's values (the variables of :data:`rlparity.metrics.summary.SUMMARY_VARIABLES`).

        Returns
        -------
        dict
            The scalar summary's values.
        """
        s, n = self.s, self.n
        u = n["used"]
        nan = float("nan")
        out: dict[str, Any] = {"n_tokens": np.int64(n["tokens"]), "n_used": np.int64(u),
                               "n_zero_prob": np.int64(n["zero"])}
        out["log_ratio_mean"] = s["sx"] / u if u else nan
        out["abs_log_ratio_mean"] = s["sax"] / u if u else nan
        out["abs_log_ratio_rms"] = float(np.sqrt(s["sxx"] / u)) if u else nan
        out["abs_log_ratio_max"] = self.big if u else nan
        for q, v in zip(core.QUANTILES, self.quantiles()):
            out[f"log_ratio_q{int(q * 100):02d}"] = float(v)
        out["mean_ratio"] = s["sr"] / n["rfin"] if n["rfin"] else nan
        out["kl_k1"] = -s["sx"] / u if u else nan
        out["kl_k2"] = s["sxx"] / 2 / u if u else nan
        out["kl_k3"] = s["sk3"] / n["k3fin"] if n["k3fin"] else nan
        out["clip_fraction"] = n["clip"] / u if u else nan
        out["ess_token"] = s["sr"] ** 2 / (n["rfin"] * s["srr"]) if n["rfin"] and s["srr"] > 0 else nan
        m = n["prob"]
        out["prob_diff_mean"] = s["sdp"] / m if m else nan
        out["prob_diff_max"] = self.dpmax if m else nan
        out["prob_diff_std"] = float(np.sqrt(max(s["sdp2"] / m - (s["sdp"] / m) ** 2, 0.0))) if m else nan
        if m > 1:
            cxy = s["spimu"] - s["spi"] * s["smu"] / m
            cxx = s["spi2"] - s["spi"] ** 2 / m
            cyy = s["smu2"] - s["smu"] ** 2 / m
            out["prob_pearson"] = cxy / np.sqrt(cxx * cyy) if cxx > 0 and cyy > 0 else nan
        else:
            out["prob_pearson"] = nan
        return out


def summary_stream(trace: xr.Dataset, var: str, eps: float, *, size: int | None = None,
                   progress: Callable | None = None) -> dict[str, Any]:
    """The scalar summary of ``trace`` (the ``var`` trainer reading against the rollout) one block
    of sequences at a time (:func:`rlparity.trace.blocks`: each block validated, the store's
    checksums verified at the end); ``progress`` wraps the block iterator (e.g. ``tqdm``). Returns
    the values, as :meth:`SummaryAccumulator.result`.

    Parameters
    ----------
    trace : xarray.Dataset
        One lazy arm.
    var : str
        The trainer reading's variable.
    eps : float
        The PPO clip range.
    size : int, optional
        Sequences per block (default the trace's chunk).
    progress : callable, optional
        Wraps the block iterator (e.g. ``tqdm.tqdm``).

    Returns
    -------
    dict
        The values, as :meth:`SummaryAccumulator.result`.
    """
    acc = SummaryAccumulator(eps)
    for part in blocks(trace, size=size, progress=progress, variables=(var, "rollout_logprob", "response_mask")):
        m = part["response_mask"].values.astype(bool)
        acc.add(part[var].values[m], part["rollout_logprob"].values[m])
    return acc.result()


__all__ = ["EDGES", "SummaryAccumulator", "summary_stream"]
