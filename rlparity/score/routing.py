"""The trainer's mixture-of-experts routers: what they select, how close each decision is, and
routing replay (R3).

transformers' MoE blocks (Qwen3-MoE, Mixtral and the models built like them) call a router module,
``mlp.gate``, that returns ``(router_logits, routing_weights, selected_experts)``. :class:`RouterControl`
puts one forward hook on every such router of a loaded model and, per forward:

* **records** the router's own top-k (as the block selects it: ``topk`` of the softmax) and its
  margin, the k-th largest router logit minus the (k+1)-th (router logit units: a small margin is a
  decision a little noise can flip);
* optionally **computes the router in another precision** (``router_dtype``: ``bfloat16`` imitates
  a trainer whose router GEMM runs in bf16, ``float32`` is the fix: hidden states and router weight
  cast to float32 before the projection);
* optionally **forces routes** (routing replay, R3 as verl, slime and prime-rl ship it): the experts
  the rollout engine selected replace the trainer's own wherever the engine recorded them; the
  weights of the forced experts are the trainer's own softmax probabilities at those experts,
  renormalised as the block does (so the router still gets gradients), rows without an engine route
  keep the trainer's selection.

Nothing is changed when neither option is set: the hook only reads the router's output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

ROUTER_DTYPES = ("float32", "bfloat16")


def find_routers(module: Any) -> list[tuple[int, Any]]:
    """The router of every MoE layer of a transformers causal LM.

    A router is a layer's ``mlp.gate`` that has ``top_k`` and a 2-d ``weight`` of
    ``(num_experts, hidden)`` (Qwen3-MoE, Mixtral and models built like them).

    Parameters
    ----------
    module : transformers model
        A causal LM with ``get_decoder().layers``.

    Returns
    -------
    list of (int, torch.nn.Module)
        ``(decoder layer index, router)`` per MoE layer; empty for a dense model (or one without
        ``get_decoder``).
    """
    try:
        layers = module.get_decoder().layers
    except AttributeError:
        return []
    out = []
    for i, layer in enumerate(layers):
        gate = getattr(getattr(layer, "mlp", None), "gate", None)
        w = getattr(gate, "weight", None)
        if gate is not None and hasattr(gate, "top_k") and w is not None and getattr(w, "ndim", 0) == 2:
            out.append((i, gate))
    return out


@dataclass
class RouterControl:
    """Hooks on every router of one model (see the module docstring).

    Between :meth:`begin` and :meth:`end` each router's forward is recorded (and changed, when
    asked). Made with :meth:`attach`.

    Parameters
    ----------
    routers : list of (int, torch.nn.Module)
        ``(decoder layer index, router)`` per MoE layer (:func:`find_routers`).
    router_dtype : str or None, default None
        Compute the router in this precision (one of :data:`ROUTER_DTYPES`); None: the model's.
    handles : list, optional
        The forward-hook handles (filled by :meth:`attach`).
    forced : torch.Tensor or None, default None
        ``(rows, n_layers, k)`` long tensor of engine routes for the current forward, -1 = none;
        None = no replay.
    records : dict, optional
        Per router index, ``(top-k ids, margins)`` of the current forward.
    """

    routers: list[tuple[int, Any]]
    router_dtype: str | None = None
    handles: list[Any] = field(default_factory=list)
    forced: Any = None  # (rows, n_layers, k) long tensor of engine routes, -1 = none; None = no replay
    records: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # layer -> (top-k ids, margins)

    @classmethod
    def attach(cls, module: Any, router_dtype: str | None = None) -> RouterControl | None:
        """Hooks on the routers of ``module``.

        Parameters
        ----------
        module : transformers model
            The causal LM.
        router_dtype : str or None, default None
            Compute each router in this precision (``"float32"`` or ``"bfloat16"``); None: the model's.

        Returns
        -------
        RouterControl or None
            The control, or ``None`` for a dense model.

        Raises
        ------
        ValueError
            If ``router_dtype`` is unknown, or given for a dense model (no router to compute in another
            precision).
        """
        routers = find_routers(module)
        if router_dtype is not None and router_dtype not in ROUTER_DTYPES:
            raise ValueError(f"router_dtype={router_dtype!r}; use one of {ROUTER_DTYPES} or None (the model's)")
        if not routers:
            if router_dtype is not None:
                raise ValueError(f"router_dtype={router_dtype!r} but the model has no mixture-of-experts router")
            return None
        ctl = cls(routers, router_dtype)
        for n, (_, gate) in enumerate(routers):
            ctl.handles.append(gate.register_forward_hook(lambda mod, args, out, _n=n: ctl._hook(_n, mod, args, out)))
        return ctl

    @property
    def layers(self) -> list[int]:
        """The decoder layer indices of the routers.

        Returns
        -------
        list of int
            One per MoE layer, in order.
        """
        return [i for i, _ in self.routers]

    @property
    def num_experts(self) -> int:
        """The experts each router chooses from (rows of the first router's weight).

        Returns
        -------
        int
            ``gate.weight.shape[0]``.
        """
        return int(self.routers[0][1].weight.shape[0])

    @property
    def top_k(self) -> int:
        """The number of experts each router selects per token.

        Returns
        -------
        int
            The first router's ``top_k``.
        """
        return int(self.routers[0][1].top_k)

    def begin(self, forced: Any = None) -> None:
        """Start a forward.

        Parameters
        ----------
        forced : torch.Tensor or None, default None
            ``(rows, n_layers, k)`` engine routes for the rows the routers will see (``batch x length``,
            row-major, :func:`forced_rows`), ``-1`` where none; ``None`` = no replay.
        """
        self.forced, self.records = forced, {}

    def end(self) -> dict[int, tuple[Any, Any]]:
        """End a forward and hand over its records.

        Returns
        -------
        dict of int to (torch.Tensor, torch.Tensor)
            Per router (index into :attr:`routers`), the trainer's own top-k ``(rows, k)`` and margins
            ``(rows,)`` (float32 router-logit units).
        """
        out, self.forced, self.records = self.records, None, {}
        return out

    def remove(self) -> None:
        """Remove every hook from the model."""
        for h in self.handles:
            h.remove()
        self.handles = []

    def _hook(self, n: int, gate: Any, args: tuple, out: Any):
        import torch

        if not isinstance(out, tuple) or len(out) < 3:
            return None
        logits, scores, indices = out[0], out[1], out[2]
        k = int(gate.top_k)
        changed = self.router_dtype is not None or self.forced is not None
        if self.router_dtype is not None:
            h = args[0].reshape(-1, gate.weight.shape[1])
            dt = getattr(torch, self.router_dtype)
            bias = getattr(gate, "bias", None)
            logits = torch.nn.functional.linear(h.to(dt), gate.weight.to(dt),
                                                None if bias is None else bias.to(dt)).to(out[0].dtype)
        with torch.no_grad():
            lf = logits.detach().float()
            top = torch.topk(lf, min(k + 1, lf.shape[-1]), dim=-1).values
            margin = (top[:, k - 1] - top[:, k]) if top.shape[-1] > k else torch.full_like(top[:, 0], float("inf"))
        probs = torch.softmax(logits.float(), dim=-1)
        own = torch.topk(probs, k, dim=-1).indices
        self.records[n] = (own.detach().to("cpu"), margin.to("cpu"))
        if not changed:
            return None
        chosen = own
        if self.forced is not None:
            f = self.forced[:, n, :k].to(own.device)
            if f.shape[0] == own.shape[0]:
                have = (f >= 0).all(dim=-1, keepdim=True)
                chosen = torch.where(have, f, own)
        weights = probs.gather(-1, chosen)
        if getattr(gate, "norm_topk_prob", True):
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return (logits, weights.to(scores.dtype), chosen.to(indices.dtype), *out[3:])


def forced_rows(seqs: list[tuple[list[int], list[int]]], batch: list[int], where: tuple[int, list[int]],
                prompt_routes: np.ndarray | None, routes: np.ndarray, n_layers: int, k: int) -> np.ndarray:
    """The engine's routes laid out as the routers of one forward see its input tokens.

    Prompt token ``i`` of a sequence whose first token is input token ``s`` is at row ``s + i``, the
    input token that predicts response token ``j`` at row ``s + prompt_length - 1 + j``.

    Parameters
    ----------
    seqs : list of (list of int, list of int)
        ``(prompt ids, response ids)`` per sequence.
    batch : list of int
        Indices into ``seqs`` of the batch's sequences.
    where : tuple of (int, list of int)
        The forward's input tokens (rows x width) and each sequence's first token among them
        (:func:`rlparity.score.batching.token_starts`: right- or left-padded rows, one packed row).
    prompt_routes : numpy.ndarray or None
        ``(sequence, prompt_position, layer, k)`` engine routes of the prompts, or ``None``.
    routes : numpy.ndarray
        ``(sequence, position, layer, k)`` engine routes of the responses.
    n_layers : int
        Number of MoE layers.
    k : int
        Experts per token.

    Returns
    -------
    numpy.ndarray
        ``(tokens, n_layers, k)`` int64 routes, ``-1`` where the engine recorded none (padding
        included: then the trainer keeps its own selection).
    """
    total, starts = where
    out = np.full((total, n_layers, k), -1, dtype=np.int64)
    for s, i in zip(starts, batch):
        P, R = len(seqs[i][0]), len(seqs[i][1])
        if prompt_routes is not None:
            m = min(P, prompt_routes.shape[1])
            out[s: s + m] = prompt_routes[i, :m, :n_layers, :k]
        m = min(R, routes.shape[1])
        if P >= 1:
            out[s + P - 1: s + P - 1 + m] = routes[i, :m, :n_layers, :k]
    return out


__all__ = ["ROUTER_DTYPES", "RouterControl", "find_routers", "forced_rows"]
