"""Pieces every capture backend shares: prompt normalisation, request seeds, the trace builder,
the effective-configuration read-back and the one-engine-at-a-time lock."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xarray as xr

from rlparity._provenance import jsonable
from rlparity.capture.lock import engine_lock
from rlparity.capture.settings import EngineSettings, SamplingSettings
from rlparity.trace import from_rollouts

Prompt = str | Sequence[int] | Mapping[str, Any]


@dataclass
class Request:
    """One prompt with its sampling settings, normalised."""

    index: int
    text: str
    token_ids: list[int] | None
    sampling: SamplingSettings
    seed: int | None
    messages: list[dict[str, Any]] | None = None


Normalized = tuple[str, "list[int] | None", "list[dict[str, Any]] | None"]


def normalize_prompts(prompts: Sequence[Prompt] | Prompt) -> list[Normalized]:
    """Accept text, token ids, ``{"prompt": ...}`` / ``{"prompt_token_ids": [...]}`` dicts, or
    chat ``{"messages": [{"role": ..., "content": ...}, ...]}`` (rendered with the model's chat
    template by :func:`render_chat`). Returns ``(text, token_ids, messages)`` per prompt."""
    if isinstance(prompts, (str, Mapping)):
        prompts = [prompts]
    out: list[Normalized] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append((p, None, None))
        elif isinstance(p, Mapping):
            if "messages" in p:
                msgs = p["messages"]
                if not isinstance(msgs, Sequence) or not all(isinstance(m, Mapping) and "content" in m for m in msgs):
                    raise ValueError(f"prompt {i}: 'messages' must be a list of {{'role', 'content'}} dicts")
                ids = [int(t) for t in p["prompt_token_ids"]] if "prompt_token_ids" in p else None
                out.append((str(p.get("prompt", "")), ids, [dict(m) for m in msgs]))
            elif "prompt_token_ids" in p:
                out.append((str(p.get("prompt", "")), [int(t) for t in p["prompt_token_ids"]], None))
            elif "prompt" in p:
                out.append((str(p["prompt"]), None, None))
            else:
                raise ValueError(f"prompt {i} is a dict without 'prompt', 'prompt_token_ids' or "
                                 f"'messages': {dict(p)!r}")
        else:
            try:
                ids = [int(t) for t in p]
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"prompt {i} is {type(p).__name__}; pass text, a list of token ids or a dict "
                    "with 'prompt_token_ids'"
                ) from err
            if not ids:
                raise ValueError(f"prompt {i} is an empty token list")
            out.append(("", ids, None))
    if not out:
        raise ValueError("no prompts given")
    return out


def make_requests(prompts: Sequence[Prompt] | Prompt,
                  sampling: SamplingSettings | Sequence[SamplingSettings]) -> list[Request]:
    """Pair prompts with sampling settings; request ``i`` gets seed ``sampling.seed + i``.

    ``sampling`` is one setting for all prompts, or one per prompt (temperature is per request,
    so a temperature sweep runs in one engine).
    """
    items = normalize_prompts(prompts)
    if isinstance(sampling, SamplingSettings):
        per = [sampling] * len(items)
    else:
        per = list(sampling)
        if len(per) != len(items):
            raise ValueError(f"{len(items)} prompts but {len(per)} sampling settings: pass one, or one per prompt")
    return [
        Request(i, text, ids, s, None if s.seed is None else s.seed + i, msgs)
        for i, ((text, ids, msgs), s) in enumerate(zip(items, per))
    ]


def chat_token_ids(tokenizer, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Token ids of ``messages`` under the tokenizer's chat template, generation prompt added
    (what ``LLM.chat`` and a trainer's ``apply_chat_template(tokenize=True)`` produce)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat prompts need a tokenizer with a chat template; this model has none: "
                         "pass text or token ids, or set tokenizer.chat_template")
    out = tokenizer.apply_chat_template(list(messages), tokenize=True, add_generation_prompt=True)
    ids = out["input_ids"] if isinstance(out, Mapping) else out
    return [int(t) for t in ids]


def render_chat(requests: Sequence[Request], tokenizer) -> list[Request]:
    """Give chat requests their token ids (chat template, no second BOS) and rendered text."""
    for r in requests:
        if r.messages is not None and r.token_ids is None:
            r.token_ids = chat_token_ids(tokenizer, r.messages)
            if not r.text:
                r.text = tokenizer.apply_chat_template(list(r.messages), tokenize=False,
                                                       add_generation_prompt=True)
    return requests


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


def build_trace(completions: Sequence[Completion], *, attrs: Mapping[str, Any]) -> xr.Dataset:
    """Turn completions into a rollout trace (sorted by request, then sample)."""
    completions = sorted(completions, key=lambda c: (c.request.index, c.sample_index))
    pv = None
    if any(c.policy_versions is not None for c in completions):
        pv = [c.policy_versions if c.policy_versions is not None else [0] * len(c.token_ids)
              for c in completions]
    return from_rollouts(
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


def sampling_attrs(requests: Sequence[Request]) -> list[dict[str, Any]]:
    """Distinct sampling settings of a capture, for the trace attrs."""
    seen: list[dict[str, Any]] = []
    for r in requests:
        d = r.sampling.model_dump()
        if d not in seen:
            seen.append(d)
    return seen


def effective_config(vllm_config: Any) -> dict[str, Any]:
    """The settings an engine actually runs with, read from its ``VllmConfig``."""
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    sc = vllm_config.scheduler_config
    comp = vllm_config.compilation_config
    att = getattr(vllm_config, "attention_config", None)

    def get(obj, name, default=None):
        return getattr(obj, name, default) if obj is not None else default

    try:
        import vllm.envs as envs

        batch_invariant = bool(envs.VLLM_BATCH_INVARIANT)
    except Exception:  # older vLLM without the switch
        batch_invariant = False
    try:
        diff_sampling = mc.get_diff_sampling_param()
    except Exception:
        diff_sampling = None
    head = get(mc, "head_dtype")
    backend = get(att, "backend")
    return jsonable({
        "model": get(mc, "model"),
        "logprobs_mode": get(mc, "logprobs_mode"),
        "enable_prefix_caching": get(cc, "enable_prefix_caching"),
        "async_scheduling": get(sc, "async_scheduling"),
        "dtype": str(get(mc, "dtype")).replace("torch.", ""),
        "head_dtype": str(head).replace("torch.", "") if head is not None else None,
        "attention_backend": getattr(backend, "name", backend) or "auto",
        "enforce_eager": get(mc, "enforce_eager"),
        "compilation_mode": str(getattr(get(comp, "mode"), "name", get(comp, "mode"))),
        "cudagraph_mode": str(getattr(get(comp, "cudagraph_mode"), "name", get(comp, "cudagraph_mode"))),
        "batch_invariant": batch_invariant,
        "max_num_seqs": get(sc, "max_num_seqs"),
        "max_num_batched_tokens": get(sc, "max_num_batched_tokens"),
        "enable_chunked_prefill": get(sc, "enable_chunked_prefill"),
        "disable_cascade_attn": get(mc, "disable_cascade_attn"),
        "generation_config": get(mc, "generation_config"),
        "generation_config_sampling_defaults": diff_sampling,
        "seed": get(mc, "seed"),
        "max_model_len": get(mc, "max_model_len"),
        "block_size": get(cc, "block_size"),
        "device": str(get(get(vllm_config, "device_config"), "device_type", None)
                      or get(get(vllm_config, "device_config"), "device", None)),
    })


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


@contextlib.contextmanager
def engine_session(settings: EngineSettings) -> Iterator[None]:
    """The engine lock plus the settings' environment variables (e.g. ``VLLM_BATCH_INVARIANT``)
    for as long as an in-process engine lives; the environment is restored on exit."""
    with engine_lock(), settings_env(settings):
        yield


@contextlib.contextmanager
def settings_env(settings: EngineSettings) -> Iterator[None]:
    """Set the environment variables ``settings`` need (vLLM reads some only from there);
    restore the previous values on exit."""
    env = settings.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class EngineLifecycle:
    """What every in-process backend shares: ``start()`` once (lazily through :attr:`llm`),
    ``close()`` idempotent, usable as a context manager. Subclasses implement ``_start_llm``
    (returns the vLLM object) and ``_stop_llm``."""

    model: str
    settings: EngineSettings
    _llm: Any = None
    _session: contextlib.ExitStack | None = None
    startup_s: float | None = None

    def _start_llm(self) -> Any:
        raise NotImplementedError

    def _stop_llm(self) -> None:
        raise NotImplementedError

    def start(self):
        if self._llm is not None:
            return self
        self._session = contextlib.ExitStack()
        self._session.enter_context(engine_session(self.settings))
        try:
            t0 = time.perf_counter()
            self._llm = self._start_llm()
            self.startup_s = time.perf_counter() - t0
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Shut the engine down and free its memory; release the lock and the environment."""
        self._stop_llm()
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def llm(self):
        """The running vLLM object (the engine starts on first use)."""
        if self._llm is None:
            self.start()
        return self._llm


def cpu_defaults(settings: EngineSettings) -> dict[str, Any]:
    """Defaults that make vLLM's CPU build usable on a small machine (KV cache, memory share)."""
    try:
        from vllm.platforms import current_platform

        is_cpu = current_platform.is_cpu()
    except Exception:
        is_cpu = False
    if not is_cpu:
        return {}
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return {} if settings.gpu_memory_utilization is not None else {"gpu_memory_utilization": 0.3}


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
