"""Mixture-of-experts routing: do the rollout engine and the trainer send each token to the same experts?

A **routing flip** is a (token, MoE layer) where the engine's set of top-k experts
(``routed_experts``, recorded while it sampled) differs from the trainer's (``trainer_routed_experts``,
its own router on the same input token). A flip changes the token's hidden state through other
experts' weights, so the token's logprob disagrees by far more than kernel noise; the R3 paper and
Megatron-LM PR #4256 trace most of a MoE model's train/inference mismatch to them.

Numpy core (``axis=``, last axis ``expert_slot`` where there is one):

* :func:`route_valid` / :func:`route_agree`: whether both sides recorded a route, and whether the
  two top-k sets are equal (order does not matter);
* :func:`expert_overlap`: the share of the k experts the two sides have in common;
* :func:`token_flips`: per token, whether any layer flipped.

xarray layer: :func:`routing_table` (per MoE layer, reduced over ``dim``: top-k agreement, overlap,
flip rate, median router margin at flips and elsewhere) and :func:`flip_summary` (tokens with at least
one flip, and the mismatch ``|d|`` of tokens with flips vs without, with and without routing replay),
both reducing ``dim`` (``None``: every token; ``"sequence"``: one value per position; ``"position"``:
one per sequence). ``d = log pi_old - log mu`` (nats); the replay pair is ``d_replay = log
pi_old(replayed routes) - log mu``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from rlparity.config.defaults import TrainerSide
from rlparity.config.provenance import make_attrs
from rlparity.metrics import core
from rlparity.metrics.summary import BACKEND_PAIR, log_ratio, reduce_dims, trainer_side, trainer_variable
from rlparity.trace import TraceValidationError

REPLAY_VARIABLE = {"processed": "trainer_replay_processed_logprob", "raw": "trainer_replay_logprob"}


# ------------------------------------------------------------------------------ numpy core
def route_valid(engine: np.ndarray, trainer: np.ndarray) -> np.ndarray:
    """Where both sides recorded a full top-k (no ``-1`` slot).

    Parameters
    ----------
    engine : numpy.ndarray
        The engine's expert ids per token and layer, last axis ``expert_slot`` (``-1``: not recorded).
    trainer : numpy.ndarray
        The trainer's expert ids, the shape of ``engine``.

    Returns
    -------
    numpy.ndarray
        Boolean, the ``expert_slot`` axis reduced.
    """
    return np.all(np.asarray(engine) >= 0, axis=-1) & np.all(np.asarray(trainer) >= 0, axis=-1)


def route_agree(engine: np.ndarray, trainer: np.ndarray) -> np.ndarray:
    """Whether the two top-k sets are equal (order ignored).

    Parameters
    ----------
    engine : numpy.ndarray
        The engine's expert ids per token and layer, last axis ``expert_slot`` (``-1``: not recorded).
    trainer : numpy.ndarray
        The trainer's expert ids, the shape of ``engine``.

    Returns
    -------
    numpy.ndarray
        Boolean, the ``expert_slot`` axis reduced.
    """
    return np.all(np.sort(engine, axis=-1) == np.sort(trainer, axis=-1), axis=-1)


def expert_overlap(engine: np.ndarray, trainer: np.ndarray) -> np.ndarray:
    """The share of the k experts both sides selected (1 = the same set).

    Parameters
    ----------
    engine : numpy.ndarray
        The engine's expert ids per token and layer, last axis ``expert_slot`` (``-1``: not recorded).
    trainer : numpy.ndarray
        The trainer's expert ids, the shape of ``engine``.

    Returns
    -------
    numpy.ndarray
        Shares in [0, 1], the ``expert_slot`` axis reduced.
    """
    e, t = np.asarray(engine), np.asarray(trainer)
    shared = (e[..., :, None] == t[..., None, :]).any(axis=-1).sum(axis=-1)
    return shared / e.shape[-1]


def layer_flips(engine: np.ndarray, trainer: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per (token, layer): a flip (both sides recorded a route and the sets differ), on real tokens.

    Parameters
    ----------
    engine : numpy.ndarray
        The engine's expert ids per token and layer, last axis ``expert_slot`` (``-1``: not recorded).
    trainer : numpy.ndarray
        The trainer's expert ids, the shape of ``engine``.
    mask : numpy.ndarray
        Boolean over the token axes, True on real tokens (broadcast over layers).

    Returns
    -------
    numpy.ndarray
        Boolean per token and layer.
    """
    return route_valid(engine, trainer) & ~route_agree(engine, trainer) & np.asarray(mask, dtype=bool)[..., None]


def token_flips(flips: np.ndarray) -> np.ndarray:
    """Per token: at least one layer flipped.

    Parameters
    ----------
    flips : numpy.ndarray
        Boolean flips per token and layer (:func:`layer_flips`), last axis ``moe_layer``.

    Returns
    -------
    numpy.ndarray
        Boolean per token (the last axis reduced).
    """
    return np.any(flips, axis=-1)


def share(hit: np.ndarray, of: np.ndarray, axis=None) -> np.ndarray:
    """``hit`` among ``of`` along ``axis`` (NaN where ``of`` is empty).

    Parameters
    ----------
    hit : numpy.ndarray
        Boolean, the entries counted.
    of : numpy.ndarray
        Boolean, the entries counted among.
    axis : int, tuple of int or None, default None
        Axes to reduce; ``None`` reduces all.

    Returns
    -------
    numpy.ndarray or float
        The share in [0, 1].
    """
    return core.masked_mean(np.asarray(hit, dtype=np.float64), of, axis=axis)


# ------------------------------------------------------------------------------ xarray layer
def has_routes(trace: xr.Dataset) -> bool:
    """Whether the trace holds both sides' routes (a MoE capture rescored by a MoE trainer).

    Parameters
    ----------
    trace : xarray.Dataset
        A trace.

    Returns
    -------
    bool
        True when ``routed_experts`` and ``trainer_routed_experts`` are both there.
    """
    return "routed_experts" in trace and "trainer_routed_experts" in trace


def _require(trace: xr.Dataset) -> None:
    if "routed_experts" not in trace:
        raise TraceValidationError("the trace holds no engine routes (routed_experts): capture a mixture-of-experts "
                                   "model with EngineSettings(capture_routing=True)")
    if "trainer_routed_experts" not in trace:
        raise TraceValidationError("the trace holds no trainer routes (trainer_routed_experts): rescore it with "
                                   "`rlparity score` (the scorer records a MoE model's routers)")


def flips(trace: xr.Dataset) -> xr.DataArray:
    """Per (sequence, position, moe_layer): a routing flip on a real token.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with both sides' routes (``routed_experts``, ``trainer_routed_experts``).

    Returns
    -------
    xarray.DataArray
        Boolean ``routing_flip``.

    Raises
    ------
    TraceValidationError
        The trace holds no engine routes or no trainer routes.
    """
    _require(trace)
    valid = xr.apply_ufunc(route_valid, trace["routed_experts"], trace["trainer_routed_experts"],
                           input_core_dims=[["expert_slot"], ["expert_slot"]])
    agree = xr.apply_ufunc(route_agree, trace["routed_experts"], trace["trainer_routed_experts"],
                           input_core_dims=[["expert_slot"], ["expert_slot"]])
    out = valid & ~agree & trace["response_mask"]
    out.name = "routing_flip"
    out.attrs = {"long_name": "the engine's and the trainer's top-k experts differ (one MoE layer)"}
    return out


def routing_table(trace: xr.Dataset, *, dim: str | Sequence[str] | None = None) -> xr.Dataset:
    """Per MoE layer, reduced over ``dim``: agreement, overlap, flip rate and router margins.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with both sides' routes (``routed_experts``, ``trainer_routed_experts``).
    dim : str, sequence of str or None, default None
        Token dims to reduce (``"sequence"``, ``"position"``); ``None`` reduces both.

    Returns
    -------
    xarray.Dataset
        ``topk_agreement`` (share of tokens whose top-k sets are equal), ``expert_overlap`` (mean share
        of shared experts), ``flip_rate`` (1 - agreement), ``n_tokens``, ``n_flips`` and, when the trace
        records the trainer's router margin, ``margin_median`` and ``margin_at_flips_median`` (router
        logit units).

    Raises
    ------
    TraceValidationError
        The trace holds no engine routes or no trainer routes.
    """
    _require(trace)
    dims = list(reduce_dims(dim))
    e, t = trace["routed_experts"], trace["trainer_routed_experts"]
    valid = xr.apply_ufunc(route_valid, e, t, input_core_dims=[["expert_slot"], ["expert_slot"]])
    valid = valid & trace["response_mask"]
    agree = xr.apply_ufunc(route_agree, e, t, input_core_dims=[["expert_slot"], ["expert_slot"]])
    overlap = xr.apply_ufunc(expert_overlap, e, t, input_core_dims=[["expert_slot"], ["expert_slot"]])
    flip = valid & ~agree
    axis = tuple(range(-len(dims), 0))

    def red(f, *arrays, **kw):
        return xr.apply_ufunc(f, *arrays, input_core_dims=[dims] * len(arrays), kwargs={"axis": axis, **kw})

    out = xr.Dataset({
        "topk_agreement": red(share, agree, valid),
        "expert_overlap": red(core.masked_mean, overlap.astype(float), valid),
        "flip_rate": red(share, flip, valid),
        "n_tokens": red(core.count, valid),
        "n_flips": red(core.count, flip),
    })
    if "trainer_router_margin" in trace:
        m = trace["trainer_router_margin"].astype(np.float64)
        out["margin_median"] = red(_masked_median, m, valid)
        out["margin_at_flips_median"] = red(_masked_median, m, flip)
    out.attrs = make_attrs(pair="routes (engine routed_experts, trainer trainer_routed_experts)",
                           margin_units="router logit")
    return out


def _masked_median(x: np.ndarray, mask: np.ndarray, axis=None) -> np.ndarray:
    return core.masked_quantile(x, mask, 0.5, axis=axis)


def flip_summary(trace: xr.Dataset, trainer: TrainerSide | None = None, *,
                 dim: str | Sequence[str] | None = None) -> xr.Dataset:
    """Tokens with at least one routing flip and the mismatch they carry, reduced over ``dim``.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with both sides' routes (``routed_experts``, ``trainer_routed_experts``).
    trainer : {"processed", "raw"}, optional
        The trainer reading of ``d``; ``None`` is ``defaults().trainer`` (or the reading the trace holds).
    dim : str, sequence of str or None, default None
        Token dims to reduce (``"sequence"``, ``"position"``); ``None`` reduces both.

    Returns
    -------
    xarray.Dataset
        :data:`FLIP_VARIABLES`: ``token_flip_rate``, ``n_tokens``, ``n_flipped``, ``abs_d_flipped`` /
        ``abs_d_unflipped`` (mean ``|d|``, nats) and their ratio, and, when the trace was scored with
        routing replay, ``abs_d_flipped_replay`` / ``abs_d_unflipped_replay`` (nats) and
        ``replay_ratio`` = ``abs_d_flipped / abs_d_flipped_replay`` (how many times smaller the
        flipped tokens' mismatch is once the engine's routes are forced).

    Raises
    ------
    TraceValidationError
        The trace holds no engine routes or no trainer routes.
    """
    _require(trace)
    side = trainer_side(trace, trainer)
    layer_flip = flips(trace)
    tok = layer_flip.any("moe_layer")
    mask = trace["response_mask"]
    d = log_ratio(trace, side)
    dims = list(reduce_dims(dim))
    axis = tuple(range(-len(dims), 0))

    def red(f, *arrays):
        return xr.apply_ufunc(f, *arrays, input_core_dims=[dims] * len(arrays), kwargs={"axis": axis})

    ad = np.abs(d)
    out = xr.Dataset({
        "token_flip_rate": red(share, tok, mask),
        "n_tokens": red(core.count, mask),
        "n_flipped": red(core.count, tok & mask),
        "abs_d_flipped": red(core.masked_mean, ad, tok & mask),
        "abs_d_unflipped": red(core.masked_mean, ad, ~tok & mask),
    })
    out["flipped_over_unflipped"] = out["abs_d_flipped"] / out["abs_d_unflipped"]
    rvar = REPLAY_VARIABLE[side]
    if rvar in trace:
        dr = np.abs((trace[rvar] - trace["rollout_logprob"]).where(mask))
        out["abs_d_flipped_replay"] = red(core.masked_mean, dr, tok & mask)
        out["abs_d_unflipped_replay"] = red(core.masked_mean, dr, ~tok & mask)
        out["replay_ratio"] = out["abs_d_flipped"] / out["abs_d_flipped_replay"]
    for name, (long, units) in FLIP_VARIABLES.items():
        if name in out:
            out[name].attrs.update({"long_name": long, **({"units": units} if units else {})})
    out.attrs = make_attrs(pair=BACKEND_PAIR, direction=f"{trainer_variable(side)} - rollout_logprob",
                           trainer_side=side, units="nats",
                           replay_pair=f"{rvar} - rollout_logprob" if rvar in trace else None)
    return out


FLIP_VARIABLES: dict[str, tuple[str, str | None]] = {
    "token_flip_rate": ("share of tokens with a routing flip in at least one MoE layer", None),
    "n_tokens": ("real response tokens", "tokens"),
    "n_flipped": ("tokens with at least one routing flip", "tokens"),
    "abs_d_flipped": ("mean |d| of the tokens with a routing flip", "nats"),
    "abs_d_unflipped": ("mean |d| of the tokens without a routing flip", "nats"),
    "flipped_over_unflipped": ("abs_d_flipped / abs_d_unflipped", None),
    "abs_d_flipped_replay": ("mean |d_replay| of the tokens with a flip, the engine's routes forced", "nats"),
    "abs_d_unflipped_replay": ("mean |d_replay| of the tokens without a flip, the engine's routes forced", "nats"),
    "replay_ratio": ("abs_d_flipped / abs_d_flipped_replay: how much routing replay shrinks the flipped tokens' "
                     "mismatch", None),
}


def routing_record(trace: xr.Dataset, trainer: TrainerSide | None = None) -> dict:
    """The routing numbers of one arm as plain JSON-able values (for results files and notebooks).

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with both sides' routes (``routed_experts``, ``trainer_routed_experts``).
    trainer : {"processed", "raw"}, optional
        The trainer reading of ``d``; ``None`` is ``defaults().trainer`` (or the reading the trace holds).

    Returns
    -------
    dict
        ``per_layer`` (keyed by decoder layer: the :func:`routing_table` variables) and the
        :func:`flip_summary` scalars; NaN as ``None``.

    Raises
    ------
    TraceValidationError
        The trace holds no engine routes or no trainer routes.
    """
    table = routing_table(trace)
    summ = flip_summary(trace, trainer)
    layers = [int(x) for x in table["moe_layer"].values]
    per_layer = {str(L): {k: _num(table[k].sel(moe_layer=L)) for k in table.data_vars} for L in layers}
    return {"per_layer": per_layer, **{k: _num(summ[k]) for k in summ.data_vars}}


def token_points(trace: xr.Dataset, trainer: TrainerSide | None = None) -> xr.Dataset:
    """Per real token (dim ``token``): the points of a margin-vs-mismatch scatter.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with both sides' routes (``routed_experts``, ``trainer_routed_experts``).
    trainer : {"processed", "raw"}, optional
        The trainer reading of ``d``; ``None`` is ``defaults().trainer`` (or the reading the trace holds).

    Returns
    -------
    xarray.Dataset
        ``min_router_margin`` (the trainer's smallest router margin over the MoE layers, logit units;
        inf where the trace records no margins), ``abs_d`` (nats), ``flipped`` and, when scored with replay,
        ``abs_d_replay`` (nats).

    Raises
    ------
    TraceValidationError
        The trace holds no engine routes or no trainer routes.
    """
    _require(trace)
    side = trainer_side(trace, trainer)
    mask = trace["response_mask"].values.astype(bool)
    margin = trace["trainer_router_margin"].values.astype(np.float64) if "trainer_router_margin" in trace \
        else np.full(mask.shape + (trace.sizes["moe_layer"],), np.nan)
    with np.errstate(invalid="ignore"):
        low = np.nanmin(np.where(np.isfinite(margin), margin, np.inf), axis=-1)
    data = {"min_router_margin": low[mask], "abs_d": np.abs(log_ratio(trace, side).values[mask]),
            "flipped": flips(trace).any("moe_layer").values[mask]}
    rvar = REPLAY_VARIABLE[side]
    if rvar in trace:
        data["abs_d_replay"] = np.abs(trace[rvar].values - trace["rollout_logprob"].values)[mask]
    return xr.Dataset({k: ("token", v) for k, v in data.items()},
                      attrs=make_attrs(pair=BACKEND_PAIR, trainer_side=side, margin_units="router logit"))


def format_routing(trace: xr.Dataset, trainer: TrainerSide | None = None) -> str:
    """The routing numbers of one arm as text: per MoE layer, then the flipped tokens' mismatch.

    Parameters
    ----------
    trace : xarray.Dataset
        A trace with both sides' routes (``routed_experts``, ``trainer_routed_experts``).
    trainer : {"processed", "raw"}, optional
        The trainer reading of ``d``; ``None`` is ``defaults().trainer`` (or the reading the trace holds).

    Returns
    -------
    str
        A table of agreement, flip rate and margins per layer, then the flipped and unflipped tokens'
        mean ``|d|`` (nats), with and without replay.

    Raises
    ------
    TraceValidationError
        The trace holds no engine routes or no trainer routes.
    """
    rec = routing_record(trace, trainer)
    fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
    lines = ["MoE routing (engine routed_experts vs trainer top-k)",
             f"  {'layer':>6} {'agreement':>10} {'flip rate':>10} {'margin med':>11} {'at flips':>10}"]
    for layer, r in rec["per_layer"].items():
        lines.append(f"  {layer:>6} {fmt(r['topk_agreement'], '.4f'):>10} {fmt(r['flip_rate'], '.4f'):>10} "
                     f"{fmt(r.get('margin_median'), '.3g'):>11} {fmt(r.get('margin_at_flips_median'), '.3g'):>10}")
    lines.append(f"  tokens with a flip: {rec['n_flipped']} of {rec['n_tokens']} ({fmt(rec['token_flip_rate'], '.2%')}); "
                 f"mean |d| flipped {fmt(rec['abs_d_flipped'], '.3g')} vs unflipped {fmt(rec['abs_d_unflipped'], '.3g')} nats")
    if "replay_ratio" in rec:
        lines.append(f"  with the engine's routes replayed: flipped {fmt(rec['abs_d_flipped_replay'], '.3g')} nats "
                     f"({fmt(rec['replay_ratio'], '.3g')}x less)")
    return "\n".join(lines)


def _num(x) -> float | int | None:
    v = x.item() if hasattr(x, "item") else x
    if isinstance(v, (int, np.integer)):
        return int(v)
    v = float(v)
    return None if not np.isfinite(v) else v


__all__ = ["FLIP_VARIABLES", "REPLAY_VARIABLE", "expert_overlap", "flip_summary", "flips", "format_routing", "has_routes", "token_points",
           "layer_flips", "route_agree", "route_valid", "routing_record", "routing_table", "share", "token_flips"]
