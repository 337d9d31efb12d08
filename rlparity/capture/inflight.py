"""The inflight controls of :class:`rlparity.capture.AsyncEngine`: weight updates while requests run.

:class:`InflightUpdates` is mixed into :class:`~rlparity.capture.async_engine.AsyncEngine`: it pauses
generation (:data:`PAUSE_MODES`: ``keep``, ``wait`` or ``abort``), loads new weights into the running
workers through rlparity's worker extension (:mod:`rlparity.capture.weights`), resets the prefix
cache, relabels the policy version, switches the reported logprobs, and gives every stream in flight
its boundary at an update (the tokens it had before the update keep the old version).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

from rlparity.capture.checkpoints import checkpoint_checksums, resolve_source
from rlparity.capture.weights import (
    EXTENSION, LOAD_METHOD, LOGPROBS_MODE_METHOD, LOGPROBS_MODES, PROGRESS_METHOD, UpdateRecord, pause_call,
)

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


class InflightUpdates:
    """Pause, update, reset and relabel a running :class:`~rlparity.capture.async_engine.AsyncEngine`.

    A mixin: the methods use what the engine holds (``llm``, ``model``, ``weights``, ``policy_version``,
    ``clock()``, the streams in flight and the token counters its captures fill, and ``_run`` for the
    sync forms).
    """

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
        """The sync form of :meth:`aupdate_weights` (callable while :meth:`~rlparity.capture.async_engine.AsyncEngine.capture_async` runs).

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


__all__ = ["PAUSE_MODES", "InflightUpdates"]
