"""Capture with vLLM's ``AsyncLLM``, the engine online RL loops drive (PipelineRL, verl, slime).

:class:`AsyncEngine` runs a real ``AsyncLLM`` on its own event loop in a background thread, so
the same object serves plain scripts and notebooks (where a loop already runs) through the sync
methods, and ``async`` code through the ``a``-prefixed ones.

Inflight weight updates: :meth:`AsyncEngine.update_weights` pauses generation (``keep``, ``wait``
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
import re
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import xarray as xr

from rlparity.capture.build import CaptureInfo, Completion, build_trace, capture_attrs
from rlparity.capture.checkpoints import checkpoint_checksums, resolve_source
from rlparity.capture.engine_config import cpu_engine_kwargs, effective_config
from rlparity.capture.lifecycle import EngineLifecycle
from rlparity.capture.offline import completion_from_vllm
from rlparity.capture.requests import Prompt, Request, make_requests, render_chat
from rlparity.capture.routing import (
    START_METHOD, TAKE_METHOD, RouteStore, engine_routes, routing_engine_kwargs, routing_mode, start_info,
)
from rlparity.capture.weights import (
    EXTENSION, LOAD_METHOD, LOGPROBS_MODE_METHOD, LOGPROBS_MODES, PROGRESS_METHOD, UpdateRecord, WeightState,
    pause_call, versions_for,
)
from rlparity.config.settings import EngineSettings, SamplingSettings

PAUSE_MODES = ("keep", "wait", "abort")
_CHILD = re.compile(r"^(\d+)_(.*)$")


@dataclass
class _Stream:
    """One request in flight, as the client sees it."""

    key: str
    t_submit: float
    prefill_state: tuple[int, int, bool]  # (version, cache generation, cache may hold other versions)
    attempt: int = 0
    counts: dict[int, int] = field(default_factory=dict)
    times: dict[int, list[float]] = field(default_factory=dict)
    boundaries: dict[int, list[tuple[int, int]]] = field(default_factory=dict)


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


class AsyncEngine(EngineLifecycle):
    """A real ``vllm.v1.engine.async_llm.AsyncLLM`` built from :class:`EngineSettings`.

    >>> with AsyncEngine(model_path, EngineSettings(logprobs_mode="processed_logprobs")) as eng:
    ...     fut = eng.capture_async(prompts, SamplingSettings(temperature=0.7, max_tokens=64))
    ...     eng.wait_tokens(32)
    ...     eng.update_weights("ckpt-v1", version=1, mode="keep", clear_cache=True)
    ...     trace = fut.result()

    Holds the machine-wide engine lock while it lives, like :class:`~rlparity.capture.Engine`.
    The engine starts on first use (or on ``start()`` / entering the ``with`` block).

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

    # inflight weight updates -----------------------------------------------------------
    def _stream_of(self, engine_id: str) -> tuple[_Stream, int] | None:
        """The stream and sample index of an engine-side request id (``<ext>-<8 random>``, or
        ``<i>_<ext>-<8 random>`` for sample ``i`` of an ``n > 1`` request)."""
        idx = 0
        m = _CHILD.match(engine_id)
        if m and not engine_id.startswith("rlparity-"):
            idx, engine_id = int(m.group(1)), m.group(2)
        hits = [st for key, st in self._streams.items() if engine_id == key or engine_id.startswith(key + "-")]
        return (max(hits, key=lambda st: len(st.key)), idx) if hits else None

    async def _drained_counts(self, quiet: float = 0.02, limit: float = 2.0) -> dict[tuple[str, int], int]:
        """Tokens each stream received, once nothing has arrived for ``quiet`` seconds (the engine
        is paused: what is still in transit is in this process's queues)."""
        t_end = time.monotonic() + limit
        last = None
        while True:
            now = {(k, i): c for k, st in self._streams.items() for i, c in st.counts.items()}
            if now == last or time.monotonic() > t_end:
                return now
            last = now
            await asyncio.sleep(quiet)

    async def _apply_boundaries(self, rec: UpdateRecord, worker: dict[str, list[int]]) -> None:
        """Give every stream in flight its boundary for ``rec`` (worker counts first, then the
        drained stream counts) and record it on the update; called once the engine state holds
        the update, so a stream that had produced nothing gets the state it will prefill under."""
        streamed = await self._drained_counts()
        from_worker: dict[tuple[str, int], int] = {}
        for rid, (_, n_out) in worker.items():
            hit = self._stream_of(rid)
            if hit is not None:
                from_worker[(hit[0].key, hit[1])] = int(n_out)
        sources = {"worker": 0, "stream": 0}
        state_after = self.weights.snapshot()
        for key, st in self._streams.items():
            idxs = set(st.counts) | {i for (k, i) in from_worker if k == key} or {0}
            for i in sorted(idxs):
                if (key, i) in from_worker:
                    n, src = from_worker[(key, i)], "worker"
                    rec.stream_behind += max(0, n - streamed.get((key, i), 0))
                else:
                    n, src = streamed.get((key, i), 0), "stream"
                sources[src] += 1
                st.boundaries.setdefault(i, []).append((n, rec.version))
                rec.boundaries[f"{key}:{i}"] = n
                if n == 0 and i == min(idxs):
                    st.prefill_state = state_after  # prefilled after the update, under its cache state
        rec.in_flight = len(self._streams)
        rec.boundary_source = sources

    async def aupdate_weights(self, source: Any, version: int, *, mode: str = "keep",
                              clear_cache: bool = False) -> dict[str, Any]:
        """Pause, load new weights into the running workers, set the policy version and resume.

        Pause (``mode``, ``clear_cache``), load ``source`` into the running workers, set the
        policy version to ``version`` and resume; every stream in flight gets its boundary (the
        tokens it had before the update keep the old version).

        Parameters
        ----------
        source : str, os.PathLike or dict of torch.Tensor
            A checkpoint directory, a ``.safetensors`` file or a state dict of tensors (written
            to a temporary safetensors file the workers read; nothing is pickled).
        version : int
            The policy version of the new weights: tokens produced after the update carry it.
        mode : {"keep", "wait", "abort"}, default "keep"
            How generation pauses: ``keep`` freezes in-flight requests, ``wait`` lets them finish,
            ``abort`` aborts them (they stay in the trace with ``finish_reason="abort"``).
        clear_cache : bool, default False
            Reset the prefix cache during the pause (vLLM also recomputes the KV of requests kept
            under ``keep``); with ``False`` cached prefixes keep serving KV computed by the old weights.

        Returns
        -------
        dict
            The update's record (:meth:`rlparity.capture.weights.UpdateRecord.to_dict`): times in
            seconds on the engine's clock, ``pause_s`` = pause to resume, the boundaries per stream.

        Raises
        ------
        ValueError
            If ``mode`` is not one of :data:`PAUSE_MODES`.
        RuntimeError
            If the workers cannot load ``source``, or vLLM refuses to reset the prefix cache.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode {mode!r}: use one of {', '.join(PAUSE_MODES)}")
        llm = self.llm
        path, cleanup, desc = resolve_source(source)
        self.weights.fingerprint(self.policy_version, self.model)
        checksums = checkpoint_checksums(path)
        kw, reset_after = pause_call(llm.pause_generation, mode, clear_cache)
        rec = UpdateRecord(self.policy_version, int(version), mode, bool(clear_cache), bool(clear_cache), desc,
                           t_pause=self.clock(), pause_kwargs=kw)
        try:
            await llm.pause_generation(**kw)
            rec.t_paused = self.clock()
            try:
                results = await llm.collective_rpc(LOAD_METHOD, args=(str(path),))
            except Exception as err:
                raise RuntimeError(
                    f"the workers could not load {desc}: {err} (is {EXTENSION} the engine's worker_extension_cls, "
                    "and do the tensor names match the model's checkpoint names?)") from err
            rec.t_loaded = self.clock()
            if reset_after and not await llm.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError("vLLM refused to reset the prefix cache after the update")
            worker: dict[str, list[int]] = {}
            for r in results or []:
                worker.update((r or {}).get("requests", {}))
            rec.tensors = int((results or [{}])[0].get("tensors", 0))
            rec.load_method = str((results or [{}])[0].get("method", ""))
            self.weights.checksums[int(version)] = checksums
            self.weights.on_update(rec)  # first: requests submitted from now on see the new state
            await self._apply_boundaries(rec, worker)
        finally:
            await llm.resume_generation()
            rec.t_resume = self.clock()
            cleanup()
        return rec.to_dict()

    def update_weights(self, source: Any, version: int, *, mode: str = "keep",
                       clear_cache: bool = False) -> dict[str, Any]:
        """The sync form of :meth:`aupdate_weights` (callable while :meth:`capture_async` runs).

        Parameters
        ----------
        source : str, os.PathLike or dict of torch.Tensor
            A checkpoint directory, a ``.safetensors`` file or a state dict of tensors.
        version : int
            The policy version of the new weights.
        mode : {"keep", "wait", "abort"}, default "keep"
            How generation pauses (see :meth:`aupdate_weights`).
        clear_cache : bool, default False
            Reset the prefix cache during the pause.

        Returns
        -------
        dict
            The update's record, as :meth:`aupdate_weights` returns it.
        """
        return self._run(self.aupdate_weights(source, version, mode=mode, clear_cache=clear_cache))

    async def areset_prefix_cache(self) -> None:
        """Reset the prefix cache now (between captures; vLLM refuses while requests run).

        Raises
        ------
        RuntimeError
            If vLLM refuses the reset (requests are running).
        """
        if not await self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset the prefix cache (requests are running): call it between "
                               "captures, or update with clear_cache=True")
        self.weights.on_reset(self.clock())

    def reset_prefix_cache(self) -> None:
        """The sync form of :meth:`areset_prefix_cache`.

        Raises
        ------
        RuntimeError
            If vLLM refuses the reset (requests are running).
        """
        self._run(self.areset_prefix_cache())

    async def arequest_progress(self) -> dict[str, list[int]]:
        """How far each running request is, as the workers hold it.

        Returns
        -------
        dict of str to list of int
            ``{engine request id: [prompt tokens, output tokens]}``, merged over the workers.
        """
        out: dict[str, list[int]] = {}
        for r in await self.llm.collective_rpc(PROGRESS_METHOD):
            out.update(r or {})
        return out

    async def _relabel(self, version: int) -> None:
        old = self.policy_version
        rec = UpdateRecord(old, int(version), "label", False, False, "label only: no weights loaded",
                           t_pause=self.clock())
        progress = await self.arequest_progress()
        self.weights.on_update(rec)
        self.weights.cache_versions = {version if v == old else v for v in self.weights.cache_versions} - (
            {old} if old != version else set())
        await self._apply_boundaries(rec, progress)
        rec.t_paused = rec.t_loaded = rec.t_resume = self.clock()

    def set_logprobs_mode(self, mode: str) -> str:
        """Switch which logprobs the running engine reports (the workers' sampler), between captures.

        For runs that plant a fault mid-run: ``raw_logprobs`` from step N on an engine started with
        ``processed_logprobs``. The engine's recorded settings still say how it was started.

        Parameters
        ----------
        mode : {"processed_logprobs", "raw_logprobs"}
            The logprobs reported from now on.

        Returns
        -------
        str
            The mode before (of the first worker).

        Raises
        ------
        ValueError
            If ``mode`` is not one of them.
        """
        if mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs mode {mode!r}: use one of {', '.join(LOGPROBS_MODES)}")

        async def call():
            return await self.llm.collective_rpc(LOGPROBS_MODE_METHOD, args=(mode,))

        return str(self._run(call())[0])

    def set_policy_version(self, version: int) -> None:
        """Relabel the weights as ``version`` without loading any.

        For loops that update the workers themselves: tokens produced from now on carry
        ``version``. Prefer :meth:`update_weights`, which loads the weights and records the update.

        Parameters
        ----------
        version : int
            The policy version tokens produced from now on carry.
        """
        self._run(self._relabel(version))

    async def apause(self, mode: str = "keep", clear_cache: bool = False) -> None:
        """Pause generation (``AsyncLLM.pause_generation``).

        Parameters
        ----------
        mode : {"keep", "wait", "abort"}, default "keep"
            ``keep`` freezes in-flight requests, ``wait`` lets them finish, ``abort`` aborts them.
        clear_cache : bool, default False
            Reset the prefix cache while paused; with ``False`` the prefix cache keeps state
            computed by the old weights.

        Raises
        ------
        ValueError
            If ``mode`` is not one of :data:`PAUSE_MODES`.
        """
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode {mode!r}: use one of {', '.join(PAUSE_MODES)}")
        kw, reset_after = pause_call(self.llm.pause_generation, mode, clear_cache)
        await self.llm.pause_generation(**kw)
        if reset_after:
            await self.llm.reset_prefix_cache(reset_running_requests=True)
        if clear_cache:
            self.weights.on_reset(self.clock())

    async def aresume(self) -> None:
        """Resume generation after :meth:`apause` (``AsyncLLM.resume_generation``)."""
        await self.llm.resume_generation()

    def pause(self, mode: str = "keep", clear_cache: bool = False) -> None:
        """The sync form of :meth:`apause`.

        Parameters
        ----------
        mode : {"keep", "wait", "abort"}, default "keep"
            How generation pauses (see :meth:`apause`).
        clear_cache : bool, default False
            Reset the prefix cache while paused.
        """
        self._run(self.apause(mode, clear_cache))

    def resume(self) -> None:
        """The sync form of :meth:`aresume`."""
        self._run(self.aresume())

    def wait_first_token(self, timeout: float = 120.0) -> bool:
        """Block until a capture in flight has streamed its first token (for pausing mid-run).

        Parameters
        ----------
        timeout : float, default 120.0
            Seconds to wait at most.

        Returns
        -------
        bool
            ``True`` once a token arrived, ``False`` on timeout.
        """
        return self._first_token.wait(timeout)

    def wait_tokens(self, n: int, timeout: float = 120.0) -> bool:
        """Block until the captures in flight have streamed ``n`` tokens in all (for updating mid-sequence).

        Parameters
        ----------
        n : int
            Tokens to wait for, summed over every stream since the capture started.
        timeout : float, default 120.0
            Seconds to wait at most.

        Returns
        -------
        bool
            ``True`` once ``n`` tokens arrived, ``False`` on timeout.
        """
        t_end = time.monotonic() + timeout
        while self._tokens_seen < n:
            if time.monotonic() > t_end:
                return False
            time.sleep(0.002)
        return True

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


__all__ = ["PAUSE_MODES", "AsyncEngine", "with_extension"]
