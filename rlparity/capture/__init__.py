"""Capture rollouts with real vLLM under named engine settings.

Backends, all sharing the request (:mod:`~rlparity.capture.requests`) and trace-building
(:mod:`~rlparity.capture.build`) code: :class:`Engine` (offline ``vllm.LLM``),
:class:`AsyncEngine` (``AsyncLLM``, with inflight weight updates: ``update_weights`` pauses, loads
new weights through rlparity's worker extension (:mod:`~rlparity.capture.weights`) and resumes, and
every token carries the version of the weights that sampled it) and :class:`~rlparity.capture.server_client.ServerClient` /
:class:`~rlparity.capture.server.Server` (a running ``vllm serve``). Settings
(:class:`EngineSettings`, :class:`SamplingSettings`) and profiles live in :mod:`rlparity.config`.
``EngineSettings(capture_routing=True)`` also records a mixture-of-experts model's routes
(:mod:`~rlparity.capture.routing`).
"""

from rlparity.capture.async_engine import AsyncEngine
from rlparity.capture.build import Completion, build_trace
from rlparity.capture.engine_config import effective_config
from rlparity.capture.offline import Engine, capture
from rlparity.capture.requests import Request, make_requests
from rlparity.config.settings import EngineSettings, SamplingSettings

__all__ = ["AsyncEngine", "Completion", "Engine", "EngineSettings", "Request", "SamplingSettings", "build_trace",
           "capture", "effective_config", "make_requests"]
