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
from rlparity.trace import annotate, from_rollouts, pad_rows


@dataclass
class Completion:
    """One sampled completion as any backend returns it."""

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
    ``prefix_cache_stale``) are added when the backend recorded them."""
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
    return _with_routing(ds, completions, ds.attrs.get("routing_capture"))


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
    """Name and (for a local checkpoint) a fingerprint of the model's weights."""
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
    """What a backend knows about the engine it ran (for the trace attrs)."""

    backend: str
    requested: dict[str, Any]
    effective: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


def capture_attrs(info: CaptureInfo, model: str | os.PathLike, requests: Sequence[Request],
                  arm: str) -> dict[str, Any]:
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
