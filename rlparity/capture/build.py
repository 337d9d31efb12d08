"""From engine outputs to a rollout trace: completions, the trace builder and its provenance attrs."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.provenance import jsonable
from rlparity.capture.requests import Request, sampling_attrs
from rlparity.trace import annotate, arm_record, from_rollouts, pad_rows


@dataclass
class Completion:
    """One sampled completion as any backend returns it.

    Parameters
    ----------
    request : Request
        The request it answers.
    sample_index : int
        Which of the request's ``n`` samples it is (0-based).
    prompt_token_ids : list of int
        The prompt's token ids as the engine saw them.
    token_ids : list of int
        The sampled token ids.
    logprobs : list of float
        The engine's logprob of each sampled token, in nats.
    finish_reason : str
        Why sampling stopped (``stop``, ``length``, ``abort``...).
    text : str, default ""
        The decoded response.
    policy_versions : list of int, optional
        The policy version of the weights that produced each token; ``None``: not recorded.
    cached_prompt_tokens : int, optional
        Prompt tokens the engine served from its prefix cache; ``None``: not reported.
    token_times : list of float, optional
        When each token arrived, seconds on the engine's clock (inflight bookkeeping).
    submit_time : float, optional
        When the request was submitted, seconds on the engine's clock.
    attempt : int, optional
        0 for the first submission, 1, 2... for a request resubmitted after an abort.
    prefix_cache_generation : int, optional
        How many prefix-cache resets had happened when the request was prefilled.
    prefix_cache_stale : bool, optional
        Whether its cached prompt tokens may come from other weights (an update since the last reset).
    routes : numpy.ndarray, optional
        Mixture of experts: the experts the engine routed each input token to, shape
        ``(input positions, MoE layers, top_k)``, -1 where not computed (:mod:`rlparity.capture.routing`).
    request_id : str, optional
        The id the request was submitted with (``AsyncEngine``).
    """

    request: Request
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str = ""
    policy_versions: list[int] | None = None
    cached_prompt_tokens: int | None = None
    # inflight bookkeeping (AsyncEngine; the offline Engine once its weights were updated)
    token_times: list[float] | None = None
    submit_time: float | None = None
    attempt: int | None = None
    prefix_cache_generation: int | None = None
    prefix_cache_stale: bool | None = None
    # mixture of experts: the experts the engine routed each input token to, (input positions, MoE layers,
    # top_k), -1 where not computed (rlparity.capture.routing)
    routes: np.ndarray | None = None
    request_id: str | None = None  # the id the request was submitted with (AsyncEngine)


def build_trace(completions: Sequence[Completion], *, attrs: Mapping[str, Any]) -> xr.Dataset:
    """Turn completions into a rollout trace (sorted by request, then sample, then attempt).

    The inflight variables (``token_time``, ``submit_time``, ``attempt``, ``prefix_cache_generation``,
    ``prefix_cache_stale``) are added when the backend recorded them; the sampling penalties when
    any request used one; ``routed_experts`` and ``prompt_routed_experts`` when the capture recorded
    routes (``attrs["routing_capture"]``).

    Parameters
    ----------
    completions : sequence of Completion
        Every completion of the capture, in any order.
    attrs : Mapping
        The trace's attrs (:func:`capture_attrs`), made JSON-able.

    Returns
    -------
    xarray.Dataset
        The trace (:func:`rlparity.trace.from_rollouts`), one sequence per completion.
    """
    completions = sorted(completions, key=lambda c: (c.request.index, c.sample_index, c.attempt or 0))
    pv = None
    if any(c.policy_versions is not None for c in completions):
        pv = [c.policy_versions if c.policy_versions is not None else [0] * len(c.token_ids)
              for c in completions]
    ds = from_rollouts(
        prompt_token_ids=[c.prompt_token_ids for c in completions],
        token_ids=[c.token_ids for c in completions],
        rollout_logprobs=[c.logprobs for c in completions],
        finish_reasons=[c.finish_reason or "unknown" for c in completions],
        policy_versions=pv,
        prompt_index=[c.request.index for c in completions],
        sample_index=[c.sample_index for c in completions],
        temperature=[c.request.sampling.temperature for c in completions],
        top_k=[c.request.sampling.top_k for c in completions],
        top_p=[c.request.sampling.top_p for c in completions],
        request_seed=[-1 if c.request.seed is None else c.request.seed for c in completions],
        prompt_texts=[c.request.text for c in completions],
        prompt_messages=[json.dumps(c.request.messages) if c.request.messages is not None else ""
                         for c in completions],
        response_texts=[c.text for c in completions],
        cached_prompt_tokens=[-1 if c.cached_prompt_tokens is None else c.cached_prompt_tokens
                              for c in completions],
        attrs=jsonable(dict(attrs)),
    )
    ds = _with_penalties(_with_inflight(ds, completions), completions)
    return _with_routing(ds, completions, arm_record(ds).routing_capture)


def _with_routing(ds: xr.Dataset, completions: Sequence[Completion], info: Mapping[str, Any] | None
                  ) -> xr.Dataset:
    """``routed_experts`` (the experts of the input token that predicts each response token:
    position ``j`` is input position ``prompt_length - 1 + j``) and ``prompt_routed_experts`` (the
    prompt tokens; -1 where the engine served them from its prefix cache or did not record them),
    when the capture recorded routes."""
    if not info or not info.get("layers") or not any(c.routes is not None for c in completions):
        return ds
    n_layers, k = len(info["layers"]), int(info.get("top_k") or 0)
    if not k:
        k = max(c.routes.shape[2] for c in completions if c.routes is not None)
    n, width, pwidth = ds.sizes["sequence"], ds.sizes["position"], ds.sizes["prompt_position"]
    resp = np.full((n, width, n_layers, k), -1, dtype=np.int16)
    prompt = np.full((n, pwidth, n_layers, k), -1, dtype=np.int16)
    for i, c in enumerate(completions):
        r = c.routes
        if r is None or r.ndim != 3:
            continue
        r = r[:, :n_layers, :k]
        P, R = len(c.prompt_token_ids), len(c.token_ids)
        cached = min(max(c.cached_prompt_tokens or 0, 0), max(P - 1, 0))  # never recomputed by the engine
        m = min(P, r.shape[0])
        prompt[i, cached:m] = r[cached:m]
        m = min(R, max(r.shape[0] - (P - 1), 0))
        resp[i, :m] = r[P - 1: P - 1 + m]
    coords = {"moe_layer": np.asarray(info["layers"], dtype=np.int64), "expert_slot": np.arange(k)}
    ds = ds.assign_coords(coords)
    ds["routed_experts"] = (("sequence", "position", "moe_layer", "expert_slot"), resp)
    ds["prompt_routed_experts"] = (("sequence", "prompt_position", "moe_layer", "expert_slot"), prompt)
    return annotate(ds)


PENALTIES = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def _with_penalties(ds: xr.Dataset, completions: Sequence[Completion]) -> xr.Dataset:
    """Per-sequence sampling penalties, recorded when any request used one (the trainer must
    apply them too, or its processed reading is another distribution)."""
    if any(c.request.sampling.penalized for c in completions):
        for name in PENALTIES:
            ds[name] = (("sequence",), np.array([getattr(c.request.sampling, name) for c in completions],
                                                dtype=np.float64))
    return annotate(ds)


def _with_inflight(ds: xr.Dataset, completions: Sequence[Completion]) -> xr.Dataset:
    if any(c.token_times is not None for c in completions):
        ds["token_time"] = (("sequence", "position"), pad_rows(
            [c.token_times if c.token_times is not None else [np.nan] * len(c.token_ids) for c in completions],
            np.nan, np.float64, width=ds.sizes["position"]))
        ds["submit_time"] = (("sequence",), np.array(
            [np.nan if c.submit_time is None else c.submit_time for c in completions], dtype=np.float64))
        ds["attempt"] = (("sequence",), np.array([c.attempt or 0 for c in completions], dtype=np.int64))
    if any(c.prefix_cache_generation is not None for c in completions):
        ds["prefix_cache_generation"] = (("sequence",), np.array(
            [-1 if c.prefix_cache_generation is None else c.prefix_cache_generation for c in completions],
            dtype=np.int64))
        ds["prefix_cache_stale"] = (("sequence",), np.array([bool(c.prefix_cache_stale) for c in completions]))
    return annotate(ds)


def model_info(model: str | os.PathLike) -> dict[str, Any]:
    """Name and (for a local checkpoint) a fingerprint of the model's weights.

    Parameters
    ----------
    model : str or os.PathLike
        A Hugging Face model name or a local checkpoint directory.

    Returns
    -------
    dict
        ``model``, ``model_is_local`` and, for a local directory, ``model_fingerprint``: 16 hex
        digits of a SHA-256 over the names, sizes and first MiB of its first 8 ``.safetensors`` files.
    """
    import hashlib

    p = Path(model)
    info: dict[str, Any] = {"model": str(model), "model_is_local": p.exists()}
    if p.exists():
        h = hashlib.sha256()
        for f in sorted(p.glob("*.safetensors"))[:8]:
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}".encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
        info["model_fingerprint"] = h.hexdigest()[:16]
    return info


@dataclass
class CaptureInfo:
    """What a backend knows about the engine it ran (for the trace attrs).

    Parameters
    ----------
    backend : str
        The capture backend (``vllm-offline``, ``vllm-async``, ``vllm-server``...).
    requested : dict
        The settings asked for (``EngineSettings.model_dump()``).
    effective : dict
        The settings the engine really ran with (read back from vLLM).
    extra : dict, optional
        Further attrs of the backend (timings, weight updates, routing capture); empty by default.
    """

    backend: str
    requested: dict[str, Any]
    effective: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


def capture_attrs(info: CaptureInfo, model: str | os.PathLike, requests: Sequence[Request],
                  arm: str) -> dict[str, Any]:
    """The attrs of a captured trace: the arm, the engine's settings, sampling, seeds and the model.

    Parameters
    ----------
    info : CaptureInfo
        What the backend knows about the engine it ran; its ``extra`` is merged in last.
    model : str or os.PathLike
        The model (:func:`model_info` is merged in).
    requests : sequence of Request
        The capture's requests (their sampling and the first 4096 request seeds are recorded).
    arm : str
        The arm's name.

    Returns
    -------
    dict
        ``arm``, ``capture_backend``, ``engine_requested``, ``engine_effective``, ``sampling``,
        ``seeds``, the model info and ``info.extra``.
    """
    return {
        "arm": arm,
        "capture_backend": info.backend,
        "engine_requested": info.requested,
        "engine_effective": info.effective,
        "sampling": sampling_attrs(requests),
        "seeds": {"engine": info.effective.get("seed"),
                  "requests": [r.seed for r in requests][:4096]},
        **model_info(model),
        **info.extra,
    }


__all__ = ["CaptureInfo", "Completion", "build_trace", "capture_attrs", "model_info"]
