"""What an engine really runs with: the configuration read back from vLLM, and CPU defaults."""

from __future__ import annotations

import os
from typing import Any

from rlparity.config.provenance import jsonable
from rlparity.config.settings import EngineSettings, dtype_name


def effective_config(vllm_config: Any) -> dict[str, Any]:
    """The settings an engine actually runs with, read from its ``VllmConfig``.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        The engine's configuration (of a running engine, or ``EngineArgs.create_engine_config()``).

    Returns
    -------
    dict
        JSON-able settings: logprobs mode, prefix caching, async scheduling, dtypes, the attention
        backend resolved and requested, compilation and CUDA-graph modes, batch invariance,
        scheduler limits, generation-config sampling defaults, seed, context length, block size,
        parallel sizes and device. A field this vLLM does not have is ``None``.
    """
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
        "dtype": dtype_name(get(mc, "dtype")),
        "head_dtype": dtype_name(head),
        "attention_backend": resolved_attention_backend(vllm_config) or getattr(backend, "name", backend) or "auto",
        "attention_backend_requested": getattr(backend, "name", backend) or "auto",
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
        "tensor_parallel_size": get(get(vllm_config, "parallel_config"), "tensor_parallel_size"),
        "data_parallel_size": get(get(vllm_config, "parallel_config"), "data_parallel_size"),
        "device": str(get(get(vllm_config, "device_config"), "device_type", None)
                      or get(get(vllm_config, "device_config"), "device", None)),
    })


def resolved_attention_backend(vllm_config: Any) -> str | None:
    """The attention backend vLLM's selector picks for this configuration.

    What the workers run: e.g. ``FLASH_ATTN`` on an H200 when none is asked, ``CPU_ATTN`` on
    vLLM's CPU build even when another is asked; resolved in this process with vLLM's own selector.

    Parameters
    ----------
    vllm_config : vllm.config.VllmConfig
        The engine's configuration.

    Returns
    -------
    str or None
        The backend's name; ``None`` when this vLLM cannot say (then the requested value is recorded).
    """
    try:
        from vllm.config import set_current_vllm_config

        try:
            from vllm.v1.attention.selector import get_attn_backend
        except ImportError:  # older layouts
            from vllm.attention.selector import get_attn_backend  # type: ignore[no-redef]
        import inspect

        mc, cc = vllm_config.model_config, vllm_config.cache_config
        kwargs: dict[str, Any] = {"use_mla": bool(getattr(mc, "use_mla", False))}
        params = inspect.signature(get_attn_backend).parameters
        if "num_heads" in params:
            kwargs["num_heads"] = mc.get_num_attention_heads(vllm_config.parallel_config)
        if "block_size" in params:
            kwargs["block_size"] = cc.block_size
        with set_current_vllm_config(vllm_config):
            backend = get_attn_backend(mc.get_head_size(), mc.dtype, cc.cache_dtype, **kwargs)
        return str(backend.get_name())
    except Exception:  # noqa: BLE001 - a read-back must never break a capture
        return None


def model_max_positions(model: str | os.PathLike) -> int | None:
    """``max_position_embeddings`` of a local checkpoint's ``config.json`` (or its ``text_config``);
    None for a hub id or a config without it."""
    import json
    from pathlib import Path

    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") if isinstance(cfg, dict) else None):
        n = c.get("max_position_embeddings") if isinstance(c, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def fit_to_model(model: str | os.PathLike, settings: EngineSettings) -> EngineSettings:
    """``settings`` with the default ``max_model_len`` (1024) lowered to the model's
    ``max_position_embeddings`` when the model is shorter: vLLM refuses a context longer than the
    model's. Any other value is the user's and passes as given."""
    default = EngineSettings.model_fields["max_model_len"].default
    n = model_max_positions(model)
    if n is not None and settings.max_model_len == default and n < default:
        return settings.replace(max_model_len=n)
    return settings


def cpu_engine_kwargs(settings: EngineSettings) -> dict[str, Any]:
    """Engine kwargs that make vLLM's CPU build usable on a small machine (a query: nothing is changed).

    The KV-cache size comes from the environment: see :func:`cpu_engine_env`.

    Parameters
    ----------
    settings : EngineSettings
        The engine's settings; a ``gpu_memory_utilization`` they set is kept.

    Returns
    -------
    dict
        ``{"gpu_memory_utilization": 0.3}`` on vLLM's CPU build when the settings leave it unset,
        else empty (also on every other platform).
    """
    if not _is_cpu():
        return {}
    return {} if settings.gpu_memory_utilization is not None else {"gpu_memory_utilization": 0.3}


def cpu_engine_env() -> dict[str, str]:
    """Environment variables vLLM's CPU build needs on a small machine, unless the user set them.

    Applied for the engine's lifetime by :func:`rlparity.capture.lifecycle.engine_session`.

    Returns
    -------
    dict of str to str
        ``{"VLLM_CPU_KVCACHE_SPACE": "1"}`` (1 GiB of KV cache) on vLLM's CPU build when the
        variable is not set, else empty.
    """
    if not _is_cpu() or "VLLM_CPU_KVCACHE_SPACE" in os.environ:
        return {}
    return {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _is_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:
        return False


__all__ = ["cpu_engine_env", "cpu_engine_kwargs", "effective_config", "resolved_attention_backend"]
