"""Capture rollouts with real vLLM under named engine settings.

Backends, all sharing the request/trace code in :mod:`rlparity.capture._common`:
:class:`Engine` (offline ``vllm.LLM``), :class:`AsyncEngine` (``AsyncLLM``, with pause/resume
and per-token policy versions for inflight weight updates) and
:class:`~rlparity.capture.server.ServerClient` / :class:`~rlparity.capture.server.Server`
(a running ``vllm serve``).
"""

from rlparity.capture.async_engine import AsyncEngine
from rlparity.capture._common import Completion, Request, build_trace, effective_config, make_requests
from rlparity.capture.offline import Engine, capture
from rlparity.capture.settings import EngineSettings, SamplingSettings

__all__ = ["AsyncEngine", "Completion", "Engine", "EngineSettings", "Request", "SamplingSettings", "build_trace",
           "capture", "effective_config", "make_requests"]
