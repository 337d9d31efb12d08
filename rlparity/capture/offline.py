"""Capture with vLLM's offline engine (``vllm.LLM``)."""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Sequence
from typing import Any

import xarray as xr

from rlparity.capture.build import CaptureInfo, Completion, build_trace, capture_attrs
from rlparity.capture.engine_config import cpu_engine_kwargs, effective_config
from rlparity.capture.gc_pause import gc_paused
from rlparity.capture.in_process import in_process_core
from rlparity.capture.lifecycle import EngineLifecycle
from rlparity.capture.requests import Prompt, Request, make_requests, render_chat
from rlparity.capture.checkpoints import checkpoint_checksums, resolve_source
from rlparity.capture.routing import (
    START_METHOD, TAKE_METHOD, RouteStore, engine_routes, routing_engine_kwargs, routing_mode, start_info,
)
from rlparity.capture.weights import EXTENSION, LOAD_METHOD, UpdateRecord, WeightState
from rlparity.config.defaults import defaults
from rlparity.config.settings import EngineSettings, SamplingSettings


class Engine(EngineLifecycle):
    """A real ``vllm.LLM`` built from :class:`~rlparity.config.settings.EngineSettings`; a context manager.

    >>> with Engine(model_path, EngineSettings(logprobs_mode="processed_logprobs")) as eng:
    ...     trace = eng.capture(prompts, SamplingSettings(temperature=0.7, top_k=20))

    Start one engine per setting and reuse it for many captures. The engine holds a
    machine-wide lock (see :func:`rlparity.capture.lock.engine_lock`) while it lives; it starts
    on first use (or on ``start()`` / entering the ``with`` block).

    Parameters
    ----------
    model : str or os.PathLike
        A Hugging Face model name or a local checkpoint directory.
    settings : EngineSettings, optional
        The engine's settings; ``None`` means ``EngineSettings()`` (the project defaults).
    llm : vllm.LLM, optional
        An engine already running to capture with; the ``Engine`` then never shuts it down.
        ``None`` (default): the ``Engine`` builds and owns its own.
    """

    backend = "vllm-offline"

    def __init__(self, model: str | os.PathLike, settings: EngineSettings | None = None,
                 *, llm: Any = None):
        self.model = str(model)
        self.settings = settings or EngineSettings()
        self._llm = llm
        self._owns = llm is None
        self.weights = WeightState()
        self.routes = RouteStore()
        self._t0 = time.monotonic()
        self._restore_caller = None

    def _start_llm(self):
        from vllm import LLM

        mode = routing_mode(self.settings.capture_routing, self.model)
        kwargs = {**cpu_engine_kwargs(self.settings), **self.settings.to_engine_kwargs(),
                  **routing_engine_kwargs(mode, self.settings.enforce_eager)}
        if not kwargs.get("worker_extension_cls"):
            kwargs["worker_extension_cls"] = EXTENSION
        with in_process_core(self.settings) as restore:  # RLPARITY_ENGINE_IN_PROCESS: the core in this process (opt-in)
            llm = LLM(model=self.model, **kwargs)
        self._restore_caller = restore
        if mode is not None:
            worker = llm.collective_rpc(START_METHOD)[0] if mode == "hooks" else None
            self.routes = RouteStore(start_info(self.model, mode, worker))
        elif self.settings.capture_routing:
            self.routes = RouteStore({"mode": None, "why": "the model has no mixture-of-experts layer"})
        return llm

    @property
    def policy_version(self) -> int:
        """The version of the weights the engine runs now (tokens of later captures carry it)."""
        return self.weights.version

    def clock(self) -> float:
        """Seconds on the engine's clock.

        Returns
        -------
        float
            Seconds since the engine object was made (``time.monotonic``).
        """
        return time.monotonic() - self._t0

    # weight updates (between batches) --------------------------------------------------
    def update_weights(self, source: Any, version: int, *, clear_cache: bool = False) -> dict[str, Any]:
        """Load new weights into the engine's workers between captures and set the policy version.

        The weights go through ``collective_rpc`` to rlparity's worker extension. With
        ``clear_cache`` the prefix cache is reset too; otherwise cached prefixes keep serving KV
        computed by the old weights (later captures record those hits as ``prefix_cache_stale``).

        Parameters
        ----------
        source : str, os.PathLike or dict of torch.Tensor
            A checkpoint directory, a ``.safetensors`` file or a state dict of tensors (written to a
            temporary safetensors file the workers read; nothing is pickled).
        version : int
            The policy version of the new weights: tokens of later captures carry it.
        clear_cache : bool, default False
            Reset the prefix cache after loading.

        Returns
        -------
        dict
            The update's record (:meth:`rlparity.capture.weights.UpdateRecord.to_dict`; times in
            seconds on the engine's clock).

        Raises
        ------
        RuntimeError
            If the workers cannot load ``source``, or vLLM refuses to reset the prefix cache.
        """
        llm = self.llm
        path, cleanup, desc = resolve_source(source)
        self.weights.fingerprint(self.policy_version, self.model)
        checksums = checkpoint_checksums(path)
        rec = UpdateRecord(self.policy_version, int(version), "between_batches", bool(clear_cache),
                           bool(clear_cache), desc, t_pause=self.clock())
        try:
            try:
                results = llm.collective_rpc(LOAD_METHOD, args=(str(path),))
            except Exception as err:
                raise RuntimeError(
                    f"the workers could not load {desc}: {err} (is {EXTENSION} the engine's worker_extension_cls, "
                    "and do the tensor names match the model's checkpoint names?)") from err
            rec.t_paused = rec.t_loaded = self.clock()
            rec.tensors = int((results or [{}])[0].get("tensors", 0))
            rec.load_method = str((results or [{}])[0].get("method", ""))
            if clear_cache and not llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset the prefix cache after the update")
            rec.t_resume = self.clock()
            self.weights.checksums[int(version)] = checksums
            self.weights.on_update(rec)
        finally:
            cleanup()
        return rec.to_dict()

    def reset_prefix_cache(self) -> None:
        """Reset the prefix cache now.

        Raises
        ------
        RuntimeError
            If vLLM refuses the reset.
        """
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset the prefix cache")
        self.weights.on_reset(self.clock())

    def _stop_llm(self) -> None:
        if self._llm is not None and self._owns:
            with contextlib.suppress(Exception):
                self._llm.llm_engine.engine_core.shutdown()
            self._llm = None
            gc.collect()
            restore, self._restore_caller = self._restore_caller, None
            if restore is not None:  # an in-process core: what it changed in this process comes back
                restore()

    # introspection ---------------------------------------------------------------------
    def effective_config(self) -> dict[str, Any]:
        """Settings the running engine really uses (read back, not what was asked).

        Returns
        -------
        dict
            :func:`rlparity.capture.engine_config.effective_config` of the running engine's ``vllm_config``.
        """
        return effective_config(self.llm.llm_engine.vllm_config)

    def tokenizer(self):
        """The running engine's tokenizer (starts the engine if needed).

        Returns
        -------
        transformers.PreTrainedTokenizerBase
            What ``LLM.get_tokenizer()`` returns.
        """
        return self.llm.get_tokenizer()

    # capture ---------------------------------------------------------------------------
    def capture(self, prompts: Sequence[Prompt] | Prompt,
                sampling: SamplingSettings | Sequence[SamplingSettings] | None = None,
                *, arm: str = "default", progress: bool = True,
                policy_version: int | None = None) -> xr.Dataset:
        """Sample every prompt and return a rollout trace (no trainer side yet).

        vLLM's ``generate`` runs with Python's cyclic garbage collector paused
        (:func:`rlparity.capture.gc_pause.gc_paused`; ``defaults().capture_gc_pause``, default on), and the
        collector's state is put back after it.

        Parameters
        ----------
        prompts : Prompt or sequence of Prompt
            Text, chat messages or token ids (:func:`rlparity.capture.requests.normalize_prompts`).
        sampling : SamplingSettings or sequence of SamplingSettings, optional
            One setting for all prompts or one per prompt; ``None`` means ``SamplingSettings()``.
        arm : str, default "default"
            The arm's name, stored in the trace's attrs.
        progress : bool, default True
            Show vLLM's progress bar.
        policy_version : int, optional
            The policy version the tokens carry; ``None`` means the engine's (see :meth:`update_weights`).

        Returns
        -------
        xarray.Dataset
            The trace (:func:`rlparity.capture.build.build_trace`), with the routing when captured and
            the weight updates and prefix-cache state once weights were updated.
        """
        llm = self.llm
        policy_version = self.policy_version if policy_version is None else int(policy_version)
        self.weights.fingerprint(self.policy_version, self.model)
        _, generation, maybe_stale = self.weights.snapshot()
        requests = render_chat(make_requests(prompts, sampling or SamplingSettings()),
                               self.tokenizer())
        inputs = [
            {"prompt_token_ids": r.token_ids} if r.token_ids is not None else r.text
            for r in requests
        ]
        params = [r.sampling.to_vllm(r.seed) for r in requests]
        t0 = time.perf_counter()
        with gc_paused(defaults().capture_gc_pause):  # no full collections inside vLLM's client loop (issue 39)
            outputs = llm.generate(inputs, params, use_tqdm=progress)
        elapsed = time.perf_counter() - t0
        return self._trace(requests, outputs, elapsed, arm, policy_version, generation, maybe_stale)

    def _trace(self, requests: Sequence[Request], outputs: Sequence[Any], elapsed: float, arm: str,
               policy_version: int, generation: int, maybe_stale: bool) -> xr.Dataset:
        """The trace of ``LLM.generate``'s ``outputs`` for ``requests``: what :meth:`capture` adds after vLLM
        returns (``benchmarks/capture.py`` times it on generate's own outputs)."""
        routing = self.routes.info.get("mode")
        if routing == "hooks":
            self.routes.absorb(self.llm.collective_rpc(TAKE_METHOD)[0])
        completions = []
        for req, out in zip(requests, outputs):
            for j, c in enumerate(out.outputs):
                comp = completion_from_vllm(req, j, out.prompt_token_ids, c, policy_version)
                comp.cached_prompt_tokens = getattr(out, "num_cached_tokens", None)
                if routing == "hooks":
                    comp.routes = self.routes.pop(str(out.request_id), c.index, len(out.outputs))
                elif routing == "engine":
                    comp.routes = engine_routes(out, c, self.routes.info["layers"])
                if self.weights.tracked:
                    comp.prefix_cache_generation = generation
                    comp.prefix_cache_stale = bool(maybe_stale and (comp.cached_prompt_tokens or 0) > 0)
                completions.append(comp)
        extra: dict[str, Any] = {"generate_s": round(elapsed, 3), "startup_s": self.startup_s,
                                 "engine_weight_checksums": self.weights.checksum_attrs()}
        if self.routes.info:
            extra["routing_capture"] = self.routes.info
        if self.weights.tracked:
            extra.update(latest_policy_version=self.policy_version, weight_updates=self.weights.log())
        info = CaptureInfo(self.backend, self.settings.model_dump(), self.effective_config(), extra)
        return build_trace(completions, attrs=capture_attrs(info, self.model, requests, arm))


def completion_from_vllm(req, sample_index: int, prompt_token_ids, c, policy_version: int = 0
                         ) -> Completion:
    """A :class:`~rlparity.capture.build.Completion` from a vLLM ``CompletionOutput`` (offline and AsyncLLM alike).

    Parameters
    ----------
    req : Request
        The request the output answers.
    sample_index : int
        Which of the request's samples it is.
    prompt_token_ids : sequence of int
        The prompt's token ids as the engine saw them.
    c : vllm.CompletionOutput
        The output; it must carry logprobs (requests set ``logprobs=0``).
    policy_version : int, default 0
        The policy version every token carries.

    Returns
    -------
    Completion
        Token ids, the sampled tokens' logprobs (nats), finish reason, text and policy versions.

    Raises
    ------
    RuntimeError
        If the output has no logprobs.
    """
    token_ids = list(c.token_ids)
    if c.logprobs is None:
        raise RuntimeError("the engine returned no logprobs: requests must set logprobs=0")
    logprobs = sampled_logprobs(c.logprobs, token_ids)
    return Completion(req, sample_index, list(prompt_token_ids), token_ids, logprobs,
                      str(c.finish_reason), c.text or "",
                      [policy_version] * len(token_ids))


def sampled_logprobs(logprobs, token_ids: list[int]) -> list[float]:
    """The sampled tokens' logprobs out of a vLLM output's ``logprobs``, one per token.

    vLLM returns them per position either as a list of ``{token id: Logprob}`` dicts or, with
    ``SamplingParams(flat_logprobs=True)`` (what :meth:`SamplingSettings.to_vllm` asks where vLLM has it), as
    one ``FlatLogprobs`` whose flat lists hold every position's entries from ``start_indices[i]``, the sampled
    token first. The flat form is read without building a dict per token.

    Parameters
    ----------
    logprobs : list of dict or vllm.logprobs.FlatLogprobs
        ``CompletionOutput.logprobs``.
    token_ids : list of int
        ``CompletionOutput.token_ids``.

    Returns
    -------
    list of float
        The logprob of ``token_ids[i]`` at position ``i`` (nats).

    Raises
    ------
    RuntimeError
        If a flat entry at a position's start is not that position's sampled token.
    """
    starts = getattr(logprobs, "start_indices", None)
    if starts is None:
        return [float(step[t].logprob) for step, t in zip(logprobs, token_ids)]
    flat_ids, flat_lp = logprobs.token_ids, logprobs.logprobs
    n = min(len(starts), len(token_ids))
    if len(flat_lp) == n == len(token_ids):  # logprobs=0: one entry a position, the sampled token
        ids, out = flat_ids, flat_lp
    else:
        ids, out = [flat_ids[i] for i in starts[:n]], [flat_lp[i] for i in starts[:n]]
    if isinstance(ids, list) and isinstance(token_ids, list) and len(ids) == len(token_ids) == n:
        same = ids == token_ids  # one comparison, no copies (the common case)
    else:  # vLLM may hand either as a list, a tuple or its own sequence
        same = list(ids[:n]) == list(token_ids[:n])
    if not same:
        raise RuntimeError("vLLM's flat logprobs do not start each position with the sampled token: read them "
                           "per position (SamplingParams(flat_logprobs=False))")
    return out[:n]  # a copy: vLLM's floats (from numpy's tolist)


def capture(model: str | os.PathLike, prompts: Sequence[Prompt] | Prompt,
            sampling: SamplingSettings | Sequence[SamplingSettings] | None = None,
            engine: EngineSettings | None = None, *, arm: str = "default",
            progress: bool = True) -> xr.Dataset:
    """Start an engine, capture, shut it down: the one-call form of :class:`Engine`.

    Parameters
    ----------
    model : str or os.PathLike
        A Hugging Face model name or a local checkpoint directory.
    prompts : Prompt or sequence of Prompt
        Text, chat messages or token ids (:func:`rlparity.capture.requests.normalize_prompts`).
    sampling : SamplingSettings or sequence of SamplingSettings, optional
        One setting for all prompts or one per prompt; ``None`` means ``SamplingSettings()``.
    engine : EngineSettings, optional
        The engine's settings; ``None`` means ``EngineSettings()``.
    arm : str, default "default"
        The arm's name, stored in the trace's attrs.
    progress : bool, default True
        Show vLLM's progress bar.

    Returns
    -------
    xarray.Dataset
        The trace, as :meth:`Engine.capture` returns it.
    """
    with Engine(model, engine) as eng:
        return eng.capture(prompts, sampling, arm=arm, progress=progress)
