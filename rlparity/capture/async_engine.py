"""Capture with vLLM's ``AsyncLLM``, the engine online RL loops drive (PipelineRL, verl, slime).

:class:`AsyncEngine` runs a real ``AsyncLLM`` on its own event loop in a background thread, so
the same object serves plain scripts and notebooks (where a loop already runs) through the sync
methods, and ``async`` code through the ``a``-prefixed ones.

Tokens are streamed, and each token is stamped with the engine's ``policy_version`` at the moment
it arrives: an inflight weight update done as ``pause(mode="keep", clear_cache=False)``, update,
``set_policy_version(v)``, ``resume()`` leaves sequences whose first tokens carry the old version
and whose later tokens carry the new one (the trace's per-token ``policy_version``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import xarray as xr

from rlparity.capture.build import CaptureInfo, build_trace, capture_attrs
from rlparity.capture.engine_config import cpu_engine_kwargs, effective_config
from rlparity.capture.lifecycle import EngineLifecycle
from rlparity.capture.offline import completion_from_vllm
from rlparity.capture.requests import Prompt, Request, make_requests, render_chat
from rlparity.config.settings import EngineSettings, SamplingSettings

PAUSE_MODES = ("keep", "wait", "abort")


class AsyncEngine(EngineLifecycle):
    """A real ``vllm.v1.engine.async_llm.AsyncLLM`` built from :class:`EngineSettings`.

    >>> with AsyncEngine(model_path, EngineSettings(logprobs_mode="processed_logprobs")) as eng:
    ...     trace = eng.capture(prompts, SamplingSettings(temperature=0.7, top_k=20))

    Holds the machine-wide engine lock while it lives, like :class:`~rlparity.capture.Engine`.
    """

    backend = "vllm-async"

    def __init__(self, model: str | os.PathLike, settings: EngineSettings | None = None):
        self.model = str(model)
        self.settings = settings or EngineSettings()
        self.policy_version = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._first_token = threading.Event()

    def _start_llm(self):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlparity-asyncllm", daemon=True)
        self._thread.start()
        return self._run(self._build())

    async def _build(self):
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = {**cpu_engine_kwargs(self.settings), **self.settings.to_engine_kwargs()}
        return AsyncLLM.from_engine_args(AsyncEngineArgs(model=self.model, **kwargs))

    @staticmethod
    async def _cancel(task) -> None:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task

    def _run(self, coro):
        if self._loop is None:
            raise RuntimeError("the AsyncEngine is not running: call start() or use it as a context manager")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_llm(self) -> None:
        if self._llm is not None:
            handler = getattr(self._llm, "output_handler", None)
            if handler is not None and self._loop is not None:
                # stop reading outputs first, so the engine core's exit is not reported as a crash
                with contextlib.suppress(Exception):
                    self._run(self._cancel(handler))
            with contextlib.suppress(Exception):
                self._llm.shutdown()
            self._llm = None
            gc.collect()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30)
            self._loop.close()
            self._loop, self._thread = None, None

    # introspection ---------------------------------------------------------------------
    def effective_config(self) -> dict[str, Any]:
        """Settings the running engine really uses (read back, not what was asked)."""
        return effective_config(self.llm.vllm_config)

    def tokenizer(self):
        return self.llm.get_tokenizer()

    # inflight weight updates -----------------------------------------------------------
    def set_policy_version(self, version: int) -> None:
        """Stamp tokens that arrive from now on with ``version`` (call after updating weights)."""
        self.policy_version = int(version)

    async def apause(self, mode: str = "keep", clear_cache: bool = False) -> None:
        """``AsyncLLM.pause_generation``: ``mode="keep"`` freezes in-flight requests; with
        ``clear_cache=False`` the prefix cache keeps state computed by the old weights."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode {mode!r}: use one of {', '.join(PAUSE_MODES)}")
        await self.llm.pause_generation(mode=mode, clear_cache=clear_cache)

    async def aresume(self) -> None:
        await self.llm.resume_generation()

    def pause(self, mode: str = "keep", clear_cache: bool = False) -> None:
        self._run(self.apause(mode, clear_cache))

    def resume(self) -> None:
        self._run(self.aresume())

    def wait_first_token(self, timeout: float = 120.0) -> bool:
        """Block until a capture in flight has streamed its first token (for pausing mid-run)."""
        return self._first_token.wait(timeout)

    # capture ---------------------------------------------------------------------------
    async def acapture(self, prompts: Sequence[Prompt] | Prompt,
                       sampling: SamplingSettings | Sequence[SamplingSettings] | None = None,
                       *, arm: str = "default") -> xr.Dataset:
        """Sample every prompt concurrently (one ``generate`` stream each); return a trace."""
        llm = self.llm
        requests = render_chat(make_requests(prompts, sampling or SamplingSettings()), self.tokenizer())
        t0 = time.perf_counter()
        batch = uuid.uuid4().hex[:8]
        per_request = await asyncio.gather(*(self._one(llm, r, f"rlparity-{batch}-{r.index}") for r in requests))
        elapsed = time.perf_counter() - t0
        completions = [c for group in per_request for c in group]
        info = CaptureInfo(self.backend, self.settings.model_dump(), self.effective_config(),
                           {"generate_s": round(elapsed, 3), "startup_s": self.startup_s})
        return build_trace(completions, attrs=capture_attrs(info, self.model, requests, arm))

    async def _one(self, llm, req: Request, request_id: str):
        prompt = {"prompt_token_ids": req.token_ids} if req.token_ids is not None else req.text
        params = req.sampling.to_vllm(req.seed)
        versions: dict[int, list[int]] = {}
        final = None
        async for out in llm.generate(prompt, params, request_id):
            for c in out.outputs:
                seen = versions.setdefault(c.index, [])
                seen.extend([self.policy_version] * (len(c.token_ids) - len(seen)))
                if seen:
                    self._first_token.set()
            final = out
        if final is None:
            raise RuntimeError(f"request {request_id} returned no output")
        comps = []
        for c in sorted(final.outputs, key=lambda c: c.index):
            comp = completion_from_vllm(req, c.index, final.prompt_token_ids, c)
            comp.policy_versions = versions.get(c.index, [])[:len(comp.token_ids)]
            comp.cached_prompt_tokens = getattr(final, "num_cached_tokens", None)
            comps.append(comp)
        return comps

    def capture(self, prompts: Sequence[Prompt] | Prompt,
                sampling: SamplingSettings | Sequence[SamplingSettings] | None = None,
                *, arm: str = "default", progress: bool = False) -> xr.Dataset:
        """The sync form of :meth:`acapture` (``progress`` is accepted for parity with
        :class:`~rlparity.capture.Engine`; streams report no bar)."""
        self._first_token.clear()
        return self._run(self.acapture(prompts, sampling, arm=arm))

    def capture_async(self, prompts, sampling=None, *, arm: str = "default"):
        """Start :meth:`acapture` and return a ``concurrent.futures.Future`` of the trace, so the
        caller can pause, update and resume while it runs."""
        self.llm
        assert self._loop is not None
        self._first_token.clear()  # before scheduling: wait_first_token must see this capture's
        return asyncio.run_coroutine_threadsafe(self.acapture(prompts, sampling, arm=arm), self._loop)


__all__ = ["PAUSE_MODES", "AsyncEngine"]
