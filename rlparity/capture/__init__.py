"""Capture rollouts with real vLLM under named engine settings.

Backends: :class:`Engine` (offline ``vllm.LLM``); later ``AsyncLLM`` and a running
``vllm serve`` share the request/trace code in :mod:`rlparity.capture._common`.
"""

from rlparity.capture._common import Completion, Request, build_trace, effective_config, make_requests
from rlparity.capture.offline import Engine, capture
from rlparity.capture.settings import EngineSettings, SamplingSettings

__all__ = ["Completion", "Engine", "EngineSettings", "Request", "SamplingSettings", "build_trace",
           "capture", "effective_config", "make_requests"]
