"""The routes of a MoE trainer's scoring, as arrays and trace variables: the engine's routes a
routing replay forces (:func:`replay_routes`, :func:`begin_batch`), the routers' own top-k and
margins recorded per response token (:func:`route_arrays`, :func:`record_routes`) and the router
variables of the scored trace (:func:`with_router_vars`). The routers' hooks themselves are
:mod:`rlparity.score.routing`'s."""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from rlparity.score.routing import RouterControl, forced_rows
from rlparity.trace import sequences
from rlparity.trace.validation import route_id_problem

__all__ = ["begin_batch", "record_routes", "replay_routes", "route_arrays", "with_router_vars"]


def route_arrays(router: RouterControl, n: int, width: int) -> dict[str, np.ndarray]:
    """The empty arrays of the routers' own top-k and margins.

    Parameters
    ----------
    router : RouterControl
        The model's routers.
    n : int
        Sequences.
    width : int
        Response positions.

    Returns
    -------
    dict of str to numpy.ndarray
        ``trainer_routed_experts`` ``(n, width, layer, k)`` of -1 and ``trainer_router_margin``
        ``(n, width, layer)`` of NaN.
    """
    n_layers, top_k = len(router.layers), router.top_k
    return {"trainer_routed_experts": np.full((n, width, n_layers, top_k), -1, dtype=np.int16),
            "trainer_router_margin": np.full((n, width, n_layers), np.nan, dtype=np.float32)}


def begin_batch(router: RouterControl, seqs: list[tuple[list[int], list[int]]], batch: list[int],
                where: tuple[int, list[int]], replay: tuple[np.ndarray | None, np.ndarray] | None) -> None:
    """Arm the routers for one forward over ``batch``, forcing the engine's routes when ``replay`` gives them.

    Parameters
    ----------
    router : RouterControl
        The model's routers.
    seqs : list of (list of int, list of int)
        ``(prompt ids, response ids)`` per sequence.
    batch : list of int
        Indices into ``seqs`` of the forward's sequences.
    where : tuple of (int, list of int)
        The forward's input tokens and each sequence's first token among them
        (:func:`rlparity.score.batching.token_starts`).
    replay : tuple of (numpy.ndarray or None, numpy.ndarray) or None
        The engine's ``(prompt routes, routes)`` to force, or ``None`` (the routers choose).
    """
    import torch

    forced = None
    if replay is not None:
        forced = torch.from_numpy(forced_rows(seqs, batch, where, replay[0], replay[1],
                                              len(router.layers), router.top_k))
    router.begin(forced)


def record_routes(records: dict[int, Any], seqs: list[tuple[list[int], list[int]]], batch: list[int],
                  where: tuple[int, list[int]], result: dict[str, np.ndarray]) -> None:
    """Store the routers' own top-k and margins at the input tokens that predict each response token.

    Parameters
    ----------
    records : dict of int to (torch.Tensor, torch.Tensor)
        Per MoE layer, the routers' top-k ids and margins over the forward's input tokens
        (:meth:`RouterControl.end`).
    seqs : list of (list of int, list of int)
        ``(prompt ids, response ids)`` per sequence.
    batch : list of int
        Indices into ``seqs`` of the forward's sequences.
    where : tuple of (int, list of int)
        The forward's input tokens and each sequence's first token among them, as for :func:`begin_batch`.
    result : dict of str to numpy.ndarray
        :func:`route_arrays`'s arrays, filled in place.
    """
    total, starts = where
    for n_layer, (own, margin) in records.items():
        own = own.numpy().reshape(total, -1)
        margin = margin.numpy().reshape(total)
        for r, i in enumerate(batch):
            P, R = len(seqs[i][0]), len(seqs[i][1])
            if R and P:
                at = starts[r] + P - 1
                result["trainer_routed_experts"][i, :R, n_layer] = own[at: at + R]
                result["trainer_router_margin"][i, :R, n_layer] = margin[at: at + R]


def replay_routes(router: RouterControl | None, trace: xr.Dataset, seqs: list[tuple[list[int], list[int]]]
                  ) -> tuple[tuple[np.ndarray | None, np.ndarray], list[int]]:
    """The engine's routes to force, with the sequences whose scored prompt differs from the engine's left out.

    Parameters
    ----------
    router : RouterControl or None
        The model's routers (``None``: a dense model, refused).
    trace : xarray.Dataset
        The trace with the engine's ``routed_experts`` (and ``prompt_routed_experts``).
    seqs : list of (list of int, list of int)
        The ``(prompt ids, response ids)`` the trainer scores.

    Returns
    -------
    tuple of ((numpy.ndarray or None, numpy.ndarray), list of int)
        ``(prompt routes, routes)`` with -1 on the sequences left out, and those sequences (their
        rows would be shifted: they keep the trainer's own routes).

    Raises
    ------
    ValueError
        If the model has no router, the trace no routes, their MoE layers differ or an expert id is
        out of range.
    """
    if router is None:
        raise ValueError("routing replay needs a mixture-of-experts model: this model has no router")
    if "routed_experts" not in trace:
        raise ValueError("routing replay needs the engine's routes (routed_experts): capture with "
                         "EngineSettings(capture_routing=True)")
    have = [int(x) for x in trace["moe_layer"].values]
    if have != router.layers:
        raise ValueError(f"the trace's routes cover MoE layers {have}, the trainer's model has routers in "
                         f"layers {router.layers}: score with the model that sampled the trace")
    routes = trace["routed_experts"].values.copy()
    prompt = trace["prompt_routed_experts"].values.copy() if "prompt_routed_experts" in trace else None
    for name, ids in (("routed_experts", routes), ("prompt_routed_experts", prompt)):
        why = None if ids is None else route_id_problem(name, ids, router.num_experts)
        if why:  # before any forward: an id beyond the model's would index past its experts
            raise ValueError(f"routing replay: {why}")
    engine = sequences(trace)
    skipped = [i for i, ((p, _), (q, _)) in enumerate(zip(engine, seqs)) if p != q]
    routes[skipped] = -1
    if prompt is not None:
        prompt[skipped] = -1
    return (prompt, routes), skipped


def with_router_vars(out: xr.Dataset, router: RouterControl, arrays: dict[str, np.ndarray], width: int,
                     skipped: list[int], *, router_dtype: str | None, routing_replay: str, dtype: str) -> xr.Dataset:
    """The routers' variables and coordinates on the scored trace, and what was done in attrs.

    Parameters
    ----------
    out : xarray.Dataset
        The scored trace.
    router : RouterControl
        The model's routers.
    arrays : dict of str to numpy.ndarray
        :func:`route_arrays`'s arrays, filled.
    width : int
        The trace's positions.
    skipped : list of int
        Sequences left out of routing replay.
    router_dtype : str or None
        The routers' dtype as set (``None``: the model's).
    routing_replay : str
        The routing replay mode.
    dtype : str
        The model's dtype.

    Returns
    -------
    xarray.Dataset
        ``out`` with ``trainer_routed_experts``, ``trainer_router_margin``, the ``moe_layer`` and
        ``expert_slot`` coordinates and ``attrs["trainer_router"]``.

    Raises
    ------
    ValueError
        If the trace's MoE layers are not the model's.
    """
    layers = np.asarray(router.layers, dtype=np.int64)
    if "moe_layer" in out.coords and [int(x) for x in out["moe_layer"].values] != layers.tolist():
        raise ValueError(f"the trace's routes cover MoE layers {out['moe_layer'].values.tolist()}, the trainer's "
                         f"model has routers in layers {layers.tolist()}: score with the model that sampled it")
    out = out.assign_coords(moe_layer=layers, expert_slot=np.arange(router.top_k))
    ids, margin = arrays["trainer_routed_experts"], arrays["trainer_router_margin"]
    full_ids = np.full((ids.shape[0], width, *ids.shape[2:]), -1, dtype=ids.dtype)
    full_ids[:, : ids.shape[1]] = ids[:, :width]
    full_m = np.full((margin.shape[0], width, margin.shape[2]), np.nan, dtype=margin.dtype)
    full_m[:, : margin.shape[1]] = margin[:, :width]
    out["trainer_routed_experts"] = (("sequence", "position", "moe_layer", "expert_slot"), full_ids)
    out["trainer_router_margin"] = (("sequence", "position", "moe_layer"), full_m)
    out.attrs["trainer_router"] = {
        "layers": layers.tolist(), "top_k": router.top_k,
        "router_dtype": router_dtype or dtype,
        "router_dtype_source": "settings" if router_dtype else "the model's dtype",
        "routing_replay": routing_replay,
        "replay_sequences_left_out": skipped,
        "selection": "topk of softmax(router logits) per token, as the MoE block selects",
        "margin": "k-th minus (k+1)-th largest router logit (float32)"}
    return out
