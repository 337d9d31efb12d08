"""Capture with vLLM's ``AsyncLLM``, the engine online RL loops drive (PipelineRL, verl, slime).

:class:`AsyncEngine` runs a real ``AsyncLLM`` on its own event loop in a background thread, so
the same object serves plain scripts and notebooks (where a loop already runs) through the sync
methods, and ``async`` code through the ``a``-prefixed ones.

Inflight weight updates (:class:`~rlparity.capture.inflight.InflightUpdates`, mixed into
:class:`AsyncEngine`): :meth:`AsyncEngine.update_weights` pauses generation (``keep``, ``wait``
or ``abort``), loads new weights into the running workers through rlparity's worker extension
(:mod:`rlparity.capture.weights`), optionally resets the prefix cache, sets the policy version and
resumes. Every token carries the version of the weights that produced it: at the update the
workers report how many tokens each request had (the boundary; a token produced before the pause
but streamed after it keeps the old version), so a sequence that straddles an update carries both
versions. Under ``abort`` the aborted requests are kept with ``finish_reason="abort"`` and their
old-version tokens; with ``resubmit_aborted=True`` they are also resubmitted after the update, as
an RL loop would (``attempt`` = 1, 2, ...), and the new attempt samples with the new weights.

Per sequence the trace also records when it was submitted and when each token arrived
(``submit_time``, ``token_time``: seconds on the engine's clock), the prefix-cache generation at
its prefill and whether its cached prompt tokens may come from other weights
(``prefix_cache_stale``: an update happened since the last cache reset).
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

from rlparity.capture.build import CaptureInfo, Completion, build_trace, capture_attrs
from rlparity.capture.engine_config import cpu_engine_kwargs, effective_config
from rlparity.capture.gc_pause import gc_paused
from rlparity.capture.in_process import async_core_env
from rlparity.capture.inflight import InflightUpdates, _Stream
from rlparity.capture.lifecycle import EngineLifecycle
from rlparity.capture.offline import completion_from_vllm
from rlparity.capture.requests import Prompt, Request, make_requests, render_chat
from rlparity.capture.routing import (
    START_METHOD, TAKE_METHOD, RouteStore, engine_routes, routing_engine_kwargs, routing_mode, start_info,
)
from rlparity.capture.weights import EXTENSION, WeightState, versions_for
from rlparity.config.defaults import defaults
from rlparity.config.settings import EngineSettings, SamplingSettings


def with_extension(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Add rlparity's worker extension to engine kwargs, unless the user set their own.

    Parameters
    ----------
    kwargs : dict
        Keyword arguments for ``vllm.AsyncEngineArgs`` / ``vllm.LLM``.

    Returns
    -------
    dict
        ``kwargs`` itself when it already names a ``worker_extension_cls``, else a copy with
        ``worker_extension_cls`` set to rlparity's extension (:data:`rlparity.capture.weights.EXTENSION`).
    """
    return kwargs if kwargs.get("worker_extension_cls") else {**kwargs, "worker_extension_cls": EXTENSION}


class AsyncEngine(InflightUpdates, EngineLifecycle):
    """A real ``vllm.v1.engine.async_llm.AsyncLLM`` built from :class:`~rlparity.config.settings.EngineSettings`.

    >>> with AsyncEngine(model_path, EngineSettings(logprobs_mode="processed_logprobs")) as eng:
    ...     fut = eng.capture_async(prompts, SamplingSettings(temperature=0.7, max_tokens=64))
    ...     eng.wait_tokens(32)
    ...     eng.update_weights("ckpt-v1", version=1, mode="keep", clear_cache=True)
    ...     trace = fut.result()

    Holds the machine-wide engine lock while it lives, like :class:`~rlparity.capture.Engine`.
    The engine starts on first use (or on ``start()`` / entering the ``with`` block).

    The inflight controls (:meth:`update_weights`, :meth:`pause`, :meth:`reset_prefix_cache`...)
    are :class:`~rlparity.capture.inflight.InflightUpdates`'s.

    Parameters
    ----------
    model : str or os.PathLike
        A Hugging Face model name or a local checkpoint directory.
    settings : EngineSettings, optional
        The engine's settings; ``None`` means ``EngineSettings()`` (the project defaults).
    """

    backend = "vllm-async"

    def __init__(self, model: str | os.PathLike, settings: EngineSettings | None = None):
        self.model = str(model)
        self.settings = settings or EngineSettings()
        self.weights = WeightState()
        self.routes = RouteStore()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._first_token = threading.Event()
        self._tokens_seen = 0
        self._streams: dict[str, _Stream] = {}
        self._t0 = time.monotonic()

    @property
    def policy_version(self) -> int:
        """The version of the weights the engine runs now."""
        return self.weights.version

    def clock(self) -> float:
        """Seconds on the engine's clock.

        Returns
        -------
        float
            Seconds since the engine object was made (``time.monotonic``); the times of a trace
            (``submit_time``, ``token_time``) and of the update records use this clock.
        """
        return time.monotonic() - self._t0

    def _start_llm(self):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rlparity-asyncllm", daemon=True)
        self._thread.start()
        return self._run(self._build())

    async def _build(self):
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        mode = routing_mode(self.settings.capture_routing, self.model)
        kwargs = with_extension({**cpu_engine_kwargs(self.settings), **self.settings.to_engine_kwargs(),
                                 **routing_engine_kwargs(mode, self.settings.enforce_eager)})
        with async_core_env():  # RLPARITY_ENGINE_IN_PROCESS: the worker in the core's process (opt-in)
            llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=self.model, **kwargs))
        if mode is not None:
            worker = (await llm.collective_rpc(START_METHOD))[0] if mode == "hooks" else None
            self.routes = RouteStore(start_info(self.model, mode, worker))
        elif self.settings.capture_routing:
            self.routes = RouteStore({"mode": None, "why": "the model has no mixture-of-experts layer"})
        return llm

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
        """Settings the running engine really uses (read back, not what was asked).

        Returns
        -------
        dict
            :func:`rlparity.capture.engine_config.effective_config` of the running engine's ``vllm_config``.
        """
        return effective_config(self.llm.vllm_config)

    def tokenizer(self):
        """The running engine's tokenizer (starts the engine if needed).

        Returns
        -------
        transformers.PreTrainedTokenizerBase
            What ``AsyncLLM.get_tokenizer()`` returns.
        """
        return self.llm.get_tokenizer()

    # capture ---------------------------------------------------------------------------
    async def acapture(self, prompts: Sequence[Prompt] | Prompt,
                       sampling: SamplingSettings | Sequence[SamplingSettings] | None = None,
                       *, arm: str = "default", resubmit_aborted: bool = False,
                       max_attempts: int = 3) -> xr.Dataset:
        """Sample every prompt concurrently (one ``generate`` stream each); return a trace.

        A request aborted by a weight update (``mode="abort"``) stays in the trace with
        ``finish_reason="abort"``; with ``resubmit_aborted`` it is submitted again (up to
        ``max_attempts`` in all) and each new attempt is a further sequence (``attempt`` 1, 2...).

        Parameters
        ----------
        prompts : Prompt or sequence of Prompt
            Text, chat messages or token ids (:func:`rlparity.capture.requests.normalize_prompts`).
        sampling : SamplingSettings or sequence of SamplingSettings, optional
            One setting for all prompts or one per prompt; ``None`` means ``SamplingSettings()``.
        arm : str, default "default"
            The arm's name, stored in the trace's attrs.
        resubmit_aborted : bool, default False
            Submit a request aborted by an update again, as an RL loop would.
        max_attempts : int, default 3
            Attempts per request at most, the first included (with ``resubmit_aborted``).

        Returns
        -------
        xarray.Dataset
            The trace (:func:`rlparity.capture.build.build_trace`), with per-token policy versions
            and times, the weight updates during the capture and the routing when captured.
        """
        llm = self.llm
        requests = render_chat(make_requests(prompts, sampling or SamplingSettings()), self.tokenizer())
        self.weights.fingerprint(self.policy_version, self.model)
        t_start = self.clock()
        t0 = time.perf_counter()
        batch = uuid.uuid4().hex[:8]
        per_request = await asyncio.gather(*(
            self._attempts(llm, r, f"rlparity-{batch}-{r.index}", resubmit_aborted, max_attempts)
            for r in requests))
        elapsed = time.perf_counter() - t0
        completions = [c for group in per_request for c in group]
        extra: dict[str, Any] = {}
        if self.routes.info:
            if self.routes.info.get("mode") == "hooks":
                self.routes.absorb((await llm.collective_rpc(TAKE_METHOD))[0])
                for c in completions:
                    if c.routes is None:
                        c.routes = self.routes.pop(c.request_id, c.sample_index, c.request.sampling.n)
            extra["routing_capture"] = self.routes.info
        info = CaptureInfo(self.backend, self.settings.model_dump(), self.effective_config(),
                           {"generate_s": round(elapsed, 3), "startup_s": self.startup_s,
                            "latest_policy_version": self.policy_version,
                            "weight_updates": self.weights.log(t_start, self.clock()),
                            "engine_weight_checksums": self.weights.checksum_attrs(),
                            "engine_clock": "seconds since the engine object was made (time.monotonic)", **extra})
        return build_trace(completions, attrs=capture_attrs(info, self.model, requests, arm))

    async def _attempts(self, llm, req: Request, request_id: str, resubmit: bool, max_attempts: int):
        out: list[Completion] = []
        for attempt in range(max(1, max_attempts)):
            comps = await self._one(llm, req, request_id if attempt == 0 else f"{request_id}-r{attempt}", attempt)
            out += comps
            if not (resubmit and any(c.finish_reason == "abort" for c in comps)):
                break
        return out

    async def _one(self, llm, req: Request, request_id: str, attempt: int = 0) -> list[Completion]:
        prompt = {"prompt_token_ids": req.token_ids} if req.token_ids is not None else req.text
        params = req.sampling.to_vllm(req.seed)
        st = _Stream(request_id, self.clock(), self.weights.snapshot(), attempt)
        self._streams[request_id] = st
        final = None
        try:
            async for out in llm.generate(prompt, params, request_id):
                now = self.clock()
                for c in out.outputs:
                    have = st.counts.get(c.index, 0)
                    new = len(c.token_ids) - have
                    if new > 0:
                        st.counts[c.index] = have + new
                        st.times.setdefault(c.index, []).extend([now] * new)
                        self._tokens_seen += new
                        self._first_token.set()
                final = out
        finally:
            self._streams.pop(request_id, None)
        if final is None:
            raise RuntimeError(f"request {request_id} returned no output")
        version, generation, maybe_stale = st.prefill_state
        comps = []
        for c in sorted(final.outputs, key=lambda c: c.index):
            comp = completion_from_vllm(req, c.index, final.prompt_token_ids, c)
            n = len(comp.token_ids)
            comp.policy_versions = versions_for(n, version, st.boundaries.get(c.index, []))
            comp.cached_prompt_tokens = getattr(final, "num_cached_tokens", None)
            comp.token_times = (st.times.get(c.index, []) + [float("nan")] * n)[:n]
            comp.submit_time = st.t_submit
            comp.attempt = attempt
            comp.prefix_cache_generation = generation
            comp.prefix_cache_stale = bool(maybe_stale and (comp.cached_prompt_tokens or 0) > 0)
            comp.request_id = request_id
            if self.routes.info.get("mode") == "engine":
                comp.routes = engine_routes(final, c, self.routes.info["layers"])
            comps.append(comp)
        return comps

    def capture(self, prompts: Sequence[Prompt] | Prompt,
                sampling: SamplingSettings | Sequence[SamplingSettings] | None = None,
                *, arm: str = "default", progress: bool = False, resubmit_aborted: bool = False) -> xr.Dataset:
        """The sync form of :meth:`acapture`.

        While it waits, Python's cyclic garbage collector is paused (``defaults().capture_gc_pause``, default on;
        :func:`rlparity.capture.gc_pause.gc_paused`), as in :meth:`rlparity.capture.Engine.capture`;
        :meth:`acapture` and :meth:`capture_async`, which run beside the caller's own work, leave it as it is.

        Parameters
        ----------
        prompts : Prompt or sequence of Prompt
            Text, chat messages or token ids.
        sampling : SamplingSettings or sequence of SamplingSettings, optional
            One setting for all prompts or one per prompt; ``None`` means ``SamplingSettings()``.
        arm : str, default "default"
            The arm's name, stored in the trace's attrs.
        progress : bool, default False
            Accepted for parity with :class:`~rlparity.capture.Engine`; streams report no bar.
        resubmit_aborted : bool, default False
            Submit a request aborted by an update again (see :meth:`acapture`).

        Returns
        -------
        xarray.Dataset
            The trace, as :meth:`acapture` returns it.
        """
        self._first_token.clear()
        self._tokens_seen = 0
        # the caller waits here as for the offline engine's generate: the collector paused meanwhile (issue 39)
        with gc_paused(defaults().capture_gc_pause):
            return self._run(self.acapture(prompts, sampling, arm=arm, resubmit_aborted=resubmit_aborted))

    def capture_async(self, prompts, sampling=None, *, arm: str = "default", resubmit_aborted: bool = False):
        """Start :meth:`acapture` and return a future of the trace.

        The caller can update the weights (or pause and resume) while it runs.

        Parameters
        ----------
        prompts : Prompt or sequence of Prompt
            Text, chat messages or token ids.
        sampling : SamplingSettings or sequence of SamplingSettings, optional
            One setting for all prompts or one per prompt; ``None`` means ``SamplingSettings()``.
        arm : str, default "default"
            The arm's name, stored in the trace's attrs.
        resubmit_aborted : bool, default False
            Submit a request aborted by an update again (see :meth:`acapture`).

        Returns
        -------
        concurrent.futures.Future
            Resolves to the trace (an ``xarray.Dataset``).
        """
        self.llm
        assert self._loop is not None
        self._first_token.clear()  # before scheduling: wait_first_token must see this capture's
        self._tokens_seen = 0
        return asyncio.run_coroutine_threadsafe(
            self.acapture(prompts, sampling, arm=arm, resubmit_aborted=resubmit_aborted), self._loop)


__all__ = ["AsyncEngine", "with_extension"]
