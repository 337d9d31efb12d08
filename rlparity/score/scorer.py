"""The trainer: a transformers model loaded once (:class:`Scorer`) that rescores a trace's tokens as
a trainer computes pi_old, and :func:`score`, one rescoring with a model loaded for it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import xarray as xr

from rlparity.config.settings import TrainerSettings
from rlparity.score import assembly, batching, routes, selfcheck
from rlparity.score.fingerprint import checkpoint_checksums
from rlparity.score.loading import attention_switched, load_trainer_model, second_attention
from rlparity.score.lm_head_stats import FP32_GEMMS, STATS, head_stats
from rlparity.score.prompts import trainer_prompt_ids
from rlparity.score.routing import RouterControl
from rlparity.score.vocabulary import check_vocabulary
from rlparity.trace import arm_record, sequences, validate

__all__ = ["Scorer", "score"]


@dataclass
class Scorer:
    """A transformers model loaded once, to rescore many traces (the trainer side).

    The model is loaded with ``from_pretrained`` exactly as a user's trainer would, or an already
    loaded model is used as it is (e.g. the trainer's after an optimizer step; ``dtype`` then reads
    the model's own). ``settings`` says how the trainer computes its reading: by default the
    correct way (the engine's sampling parameters, the ids the engine saw, eval mode); other values
    imitate a user's trainer (another temperature, no top-k cut, re-tokenized prompts, dropout on).
    Every scoring records what was applied (``trainer_temperature`` / ``trainer_top_k`` /
    ``trainer_top_p`` per sequence, the settings and the batch shape in ``attrs["trainer"]``),
    per-tensor checksums of the weights, and the trainer's own floor: ``settings.self_check``
    sequences rescored alone, then together twice and once more with the attention in float32
    (``attrs["trainer"]["self_check"]``: how much the batch shape, a second run and the attention
    kernel's rounding move the logprobs).

    Parameters
    ----------
    model : str, os.PathLike or transformers model
        A local path or hub id, or an already loaded transformers causal LM.
    dtype : str, default "float32"
        The body's precision: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
    head_dtype : str, default "float32"
        The LM head's precision (same choices).
    device : str, default "cpu"
        Torch device the model runs on.
    batch_size : int, default 16
        Sequences per forward (1 in batch-invariant mode).
    chunk_tokens : int or None, default None
        LM-head rows per chunk; None: 2048 on CUDA, 512 on CPU.
    trust_remote_code : bool, default False
        Passed to ``from_pretrained`` for the model and the tokenizer.
    progress : bool, default True
        Show a progress bar while scoring.
    tokenize_prompts : bool, default True
        Also record the trainer's own tokenization of each prompt (:func:`tokenize_prompts`).
    add_special_tokens : bool, default True
        Whether the trainer's tokenization of prompt text adds special tokens (an imported dump's
        own rule takes precedence, :meth:`special_tokens`).
    compile_head : bool or None, default None
        ``torch.compile`` the LM-head reductions; None: as :func:`~rlparity.score.lm_head_stats.head_stats` decides.
    fp32_gemm : str, default "auto"
        How a float32 head multiplies 16-bit inputs (one of :data:`FP32_GEMMS`; see
        :func:`rlparity.score.lm_head_stats.project`).
    settings : TrainerSettings or None, default None
        How the trainer computes its reading (:class:`~rlparity.config.settings.TrainerSettings`);
        None: the correct way.

    Raises
    ------
    ValueError
        If ``dtype`` / ``head_dtype`` is not a supported precision or ``fp32_gemm`` is unknown.
    """

    model: Any  # a path or hub id, or an already loaded transformers causal LM
    dtype: str = "float32"
    head_dtype: str = "float32"
    device: str = "cpu"
    batch_size: int = 16
    chunk_tokens: int | None = None  # LM-head rows per chunk (None: 2048 on CUDA, 512 on CPU)
    trust_remote_code: bool = False
    progress: bool = True
    tokenize_prompts: bool = True
    add_special_tokens: bool = True
    compile_head: bool | None = None  # torch.compile the LM-head reductions (None: see head_stats)
    fp32_gemm: str = "auto"  # how a float32 head multiplies 16-bit inputs (see rlparity.score.lm_head_stats.project)
    settings: TrainerSettings | None = None  # how the trainer computes its reading (None: the correct way)

    def __post_init__(self) -> None:
        for name in ("dtype", "head_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"{name}={getattr(self, name)!r}; use float32, bfloat16 or float16")
        if self.fp32_gemm not in FP32_GEMMS:
            raise ValueError(f"fp32_gemm={self.fp32_gemm!r}; use one of {FP32_GEMMS}")
        self.settings = self.settings or TrainerSettings()
        # a loaded model (e.g. the trainer's, after a step) keeps its dtype: what it is, not what was asked
        self.module, self._loaded_here, self.dtype = load_trainer_model(
            self.model, self.dtype, self.device, self.settings, trust_remote_code=self.trust_remote_code)
        self.decoder = self.module.get_decoder()
        head = self.module.get_output_embeddings()
        self.head_weight = head.weight
        self.head_bias = getattr(head, "bias", None)
        # the MoE routers (None for a dense model): recorded at every forward, changed when the settings ask
        self.router = RouterControl.attach(self.module, self.settings.router_dtype)
        self._tokenizer = None
        self._checksums: dict[str, str] | None = None
        self._fingerprint_job: Any = None  # the checksums being computed beside a scoring (a Future)
        self._fingerprint_pool: Any = None

    @property
    def tokenizer(self):
        """The trainer's tokenizer (loaded on first use, from the same model)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_name,
                                                            trust_remote_code=self.trust_remote_code)
        return self._tokenizer

    @property
    def model_name(self) -> str:
        """The model's path or hub id (a loaded model's ``name_or_path``)."""
        return str(getattr(self.model, "name_or_path", self.model))

    @property
    def micro_batch_size(self) -> int:
        """The sequences a micro-batch holds: ``batch_size``, or 1 in batch-invariant mode."""
        return 1 if self.settings.batch_invariant else self.batch_size

    @property
    def _fingerprint_stale(self) -> bool:
        """Whether the next call needs new checksums: none yet, or a model passed in (it may have trained)."""
        return self._checksums is None or not self._loaded_here

    def weights_changed(self) -> None:
        """Say that the module's weights changed in place (an optimizer step on ``self.module``): the
        next :meth:`weight_checksums` fingerprints them again. A model loaded here is otherwise
        fingerprinted once."""
        self._checksums = None
        self._fingerprint_job = None

    def _start_fingerprint(self) -> None:
        """Start the weight checksums beside the scoring (:meth:`compute` calls it first): a thread of its
        own and, on a GPU, a CUDA stream of its own ordered after everything already queued on the current
        one (e.g. the optimizer step that changed the weights), so the copies to the host and the CRC
        overlap the forwards instead of following them. :meth:`weight_checksums` waits for it."""
        if not self.settings.fingerprint or not self._fingerprint_stale:
            return
        from concurrent.futures import ThreadPoolExecutor

        stream = None
        if self.device.startswith("cuda"):
            import torch

            stream = torch.cuda.Stream(device=self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
        if self._fingerprint_pool is None:
            self._fingerprint_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlparity-fingerprint")
        self._fingerprint_job = self._fingerprint_pool.submit(checkpoint_checksums, self.module, stream=stream)

    def weight_checksums(self) -> dict[str, str]:
        """Per-tensor checksums of the weights it scores with (:mod:`rlparity.trace.weights`).

        Keyed by checkpoint names (transformers' load-time conversions, e.g. a MoE model's per-expert
        tensors fused into one, reverted as ``save_pretrained`` does); a model loaded here is
        fingerprinted once, a model passed in (it may train) at every call.

        Returns
        -------
        dict of str to str
            ``{tensor name: checksum}``.
        """
        job, self._fingerprint_job = self._fingerprint_job, None
        if job is not None:  # started beside this call's scoring, after any change to the weights
            self._checksums = job.result()
        elif self._fingerprint_stale:
            self._checksums = checkpoint_checksums(self.module)
        return self._checksums

    def batches(self, seqs: list[tuple[list[int], list[int]]]) -> Iterator[list[int]]:
        """Split ``seqs`` into micro-batches of indices.

        Micro-batches hold ``batch_size`` sequences (one each in batch-invariant mode), in the order
        :attr:`settings` asks: similar lengths together (``"length"``), the trace's order, or shuffled
        (seeded).

        Parameters
        ----------
        seqs : list of (list of int, list of int)
            ``(prompt ids, response ids)`` per sequence.

        Yields
        ------
        list of int
            The indices into ``seqs`` of one micro-batch.
        """
        yield from batching.micro_batches(seqs, self.settings.order, self.micro_batch_size)

    def response_hidden(self, seqs: list[tuple[list[int], list[int]]], batch: list[int]) -> list:
        """One forward of the body over ``batch``: the last hidden states that predict each response.

        The rows are laid out as :attr:`settings` says (right-padded rows, one packed row, left-padded
        rows, or alone at a fixed bucket length in batch-invariant mode). Gradients flow unless the
        caller turns them off.

        Parameters
        ----------
        seqs : list of (list of int, list of int)
            ``(prompt ids, response ids)`` per sequence.
        batch : list of int
            Indices into ``seqs`` of the sequences to run together.

        Returns
        -------
        list of torch.Tensor
            Per sequence of ``batch``, the hidden states ``(rlen, H)`` at the positions that predict its
            response tokens.
        """
        return batching.response_hidden(self.decoder, seqs, batch, self.device, self.settings.layout,
                                        self.settings.batch_invariant)

    def applied_sampling(self, trace: xr.Dataset) -> dict[str, np.ndarray]:
        """The temperature, top-k and top-p of the trainer's processed reading, per sequence.

        The engine's request, unless :attr:`settings` overrides them.

        Parameters
        ----------
        trace : xarray.Dataset
            A trace with ``temperature``, ``top_k`` and ``top_p`` per sequence.

        Returns
        -------
        dict of str to numpy.ndarray
            ``trainer_temperature``, ``trainer_top_k`` and ``trainer_top_p``, one value per sequence.
        """
        s = self.settings
        n = trace.sizes["sequence"]
        pick = lambda over, var, dt: (np.full(n, over, dtype=dt) if over is not None  # noqa: E731
                                      else trace[var].values.astype(dt))
        return {"trainer_temperature": pick(s.temperature, "temperature", np.float64),
                "trainer_top_k": pick(s.top_k, "top_k", np.int64),
                "trainer_top_p": pick(s.top_p, "top_p", np.float64)}

    def scored_sequences(self, trace: xr.Dataset) -> list[tuple[list[int], list[int]]]:
        """The ``(prompt ids, response ids)`` the trainer scores.

        The engine's prompt ids, or (with ``settings.prompt_ids="retokenize"``) the trainer's own
        tokenization of the prompt text or chat messages where there is one.

        Parameters
        ----------
        trace : xarray.Dataset
            The trace to score.

        Returns
        -------
        list of (list of int, list of int)
            One pair per sequence.
        """
        seqs = sequences(trace)
        if self.settings.prompt_ids == "engine":
            return seqs
        texts = trace["prompt_text"].values if "prompt_text" in trace else [""] * len(seqs)
        msgs = trace["prompt_messages"].values if "prompt_messages" in trace else [""] * len(seqs)
        out = []
        for (p, r), t, m in zip(seqs, texts, msgs):
            own = trainer_prompt_ids(self.tokenizer, str(t), str(m), add_special_tokens=self.special_tokens(trace))
            out.append((own if own else p, r))
        return out

    def _stats(self, seqs, batches, sampling: dict[str, np.ndarray], progress: bool = False,
               replay: tuple[np.ndarray | None, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The head statistics of every sequence in ``batches`` (one forward per batch), as
        ``(n, width)`` arrays (NaN / -1 elsewhere); for a MoE model also the routers' own top-k and
        margins (``(n, width, layer[, k])``). ``replay``: the engine's ``(prompt routes, routes)``
        forced in the routers (routing replay)."""
        from tqdm.auto import tqdm

        n = len(seqs)
        width = max((len(r) for _, r in seqs), default=0)
        result = {k: (np.full((n, width), -1, dtype=np.int64) if k == "trainer_token_rank"
                      else np.full((n, width), np.nan)) for k in STATS}
        router = self.router
        if router is not None:
            result.update(routes.route_arrays(router, n, width))
        for batch in tqdm(batches, desc="trainer rescoring", disable=not progress):
            if router is not None:  # where each sequence sits among the forward's tokens, as the routers see them
                where = batching.token_starts([len(seqs[i][0]) + len(seqs[i][1]) for i in batch],
                                              self.settings.layout, self.settings.batch_invariant)
                routes.begin_batch(router, seqs, batch, where, replay)
            hidden = self.response_hidden(seqs, batch)
            if router is not None:
                routes.record_routes(router.end(), seqs, batch, where, result)
            rows = batching.head_rows(hidden, seqs, batch, sampling, self.device)
            if rows is None:
                continue
            stats = head_stats(rows.hidden, self.head_weight, self.head_bias, rows.tokens, rows.temperature,
                               rows.top_k, rows.top_p, self.head_dtype, self.chunk_tokens, compile=self.compile_head,
                               fp32_gemm=self.fp32_gemm)
            batching.scatter(stats, rows.where, result)
        return result

    def score(self, trace: xr.Dataset) -> xr.Dataset:
        """Rescore ``trace`` with this model.

        Parameters
        ----------
        trace : xarray.Dataset
            A rollout trace (validated; its token ids must fit the model's vocabulary).

        Returns
        -------
        xarray.Dataset
            A copy of ``trace`` with the trainer variables added (``trainer_logprob``,
            ``trainer_processed_logprob`` in nats, entropies, ranks, ...), what was applied and the
            provenance attrs.

        Raises
        ------
        VocabularyError
            If the trace holds token ids beyond the model's vocabulary.
        """
        return self.assemble(trace, self.compute(trace))

    def compute(self, trace: xr.Dataset, shard: tuple[int, int] | None = None, *, self_check: bool = True
                ) -> dict[str, Any]:
        """The trainer's statistics of ``trace``: the arrays :meth:`assemble` turns into variables.

        Every micro-batch is scored, or with ``shard=(rank, world)`` every ``world``-th micro-batch from
        ``rank`` (the others stay NaN / -1): the same micro-batches and shapes as a single process
        scores, so the shards of a distributed run (:mod:`rlparity.score.distributed`) merge into
        exactly its result.

        Parameters
        ----------
        trace : xarray.Dataset
            A rollout trace (validated).
        shard : tuple of (int, int), optional
            ``(rank, world)``: score only this rank's micro-batches; None scores all.
        self_check : bool, default True
            Run the trainer's floor check (``settings.self_check`` sequences alone, then together twice) when the
            settings ask for it.

        Returns
        -------
        dict
            ``result`` (the statistics' ``(sequence, position)`` arrays), ``sampling`` (what was
            applied), ``skipped`` (sequences left out of routing replay), ``elapsed`` (seconds) and
            ``check`` (the self-check, or None).

        Raises
        ------
        VocabularyError
            If the trace holds token ids beyond the model's vocabulary.
        ValueError
            If routing replay is asked for without a MoE model or the engine's routes.
        """
        validate(trace)
        rows = self.module.get_input_embeddings().num_embeddings
        check_vocabulary(trace, min(rows, int(self.head_weight.shape[0])), self.model_name)
        seqs = self.scored_sequences(trace)
        sampling = self.applied_sampling(trace)
        if shard is None or shard[0] == 0:  # the process that assembles (rank 0 of a distributed run)
            self._start_fingerprint()
        try:
            return self._scored_parts(trace, seqs, sampling, shard, self_check)
        except BaseException:
            self._fingerprint_job = None  # a failed call leaves no checksums for a later one to take
            raise

    def _scored_parts(self, trace: xr.Dataset, seqs, sampling: dict[str, np.ndarray],
                      shard: tuple[int, int] | None, self_check: bool) -> dict[str, Any]:
        """:meth:`compute` after its checks: the batched scoring, then the self-check."""
        import torch

        t0 = time.perf_counter()
        batches = list(self.batches(seqs))
        if shard is not None:
            batches = batches[shard[0]:: shard[1]]
        mode = self.settings.routing_replay
        replay, skipped = routes.replay_routes(self.router, trace, seqs) if mode != "off" else (None, [])
        training = self.module.training
        # eval unless the trainer imitated scores in train mode (dropout active)
        self.module.train(self.settings.train_mode)
        with torch.inference_mode():
            result = self._stats(seqs, batches, sampling, progress=self.progress,
                                 replay=replay if mode == "on" else None)
            if mode == "also":
                again = self._stats(seqs, batches, sampling, replay=replay)
                result["trainer_replay_logprob"] = again["trainer_logprob"]
                result["trainer_replay_processed_logprob"] = again["trainer_processed_logprob"]
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0  # the scoring itself, not the self-check
            check = (selfcheck.self_check(self._stats, seqs, sampling, result, k=self.settings.self_check,
                                          batch_size=self.micro_batch_size,
                                          replay=replay if mode == "on" else None,
                                          kernel=self._kernel_switch())
                     if self.settings.self_check and self_check else None)
        self.module.train(training)
        return {"result": result, "sampling": sampling, "skipped": skipped, "elapsed": elapsed, "check": check}

    def _kernel_switch(self):
        """``(what, switch)`` for the self-check's kernel pass (:func:`rlparity.score.loading.second_attention`),
        or None when it is off, would repeat the model's own implementation, or a batch-invariant trainer
        (whose kernels are pinned) scores."""
        current = getattr(self.module.config, "_attn_implementation", None)
        second = None if self.settings.batch_invariant else second_attention(current, self.settings.kernel_check)
        if second is None:
            return None
        return f"{current} vs {second}", lambda: attention_switched(self.module, second)

    def assemble(self, trace: xr.Dataset, parts: dict[str, Any]) -> xr.Dataset:
        """The scored trace from :meth:`compute`'s parts.

        Parameters
        ----------
        trace : xarray.Dataset
            The trace that was computed.
        parts : dict
            What :meth:`compute` returned (the shards' results merged, for a distributed run).

        Returns
        -------
        xarray.Dataset
            A copy of ``trace`` with the trainer variables, what the trainer applied, its
            tokenization of the prompts and the provenance attrs.
        """
        return assembly.scored_trace(self, trace, parts)

    def special_tokens(self, trace: xr.Dataset) -> bool:
        """``add_special_tokens`` for this trace's prompt text.

        An imported dump's framework rule (``attrs["import"]["prompt_tokenization"]``: slime and
        NeMo-RL tokenize their chat-templated text without them), else the scorer's own.

        Parameters
        ----------
        trace : xarray.Dataset
            The trace whose prompts are tokenized.

        Returns
        -------
        bool
            Whether to add special tokens.
        """
        rule = (arm_record(trace).import_ or {}).get("prompt_tokenization") or {}
        return bool(rule.get("add_special_tokens", self.add_special_tokens))

    def shape(self) -> dict[str, Any]:
        """The trainer shape this scorer runs (recorded on every rescoring).

        Returns
        -------
        dict
            Micro-batch size, layout, order, batch-invariant mode, attention implementation, gradient
            checkpointing, mode (train or eval), dtypes, chunk size and device.
        """
        s = self.settings
        return {"batch_size": self.micro_batch_size, "layout": s.layout, "order": s.order,
                "batch_invariant": s.batch_invariant,
                "attn_implementation": getattr(self.module.config, "_attn_implementation", None),
                "gradient_checkpointing": bool(getattr(self.module, "is_gradient_checkpointing", False)),
                "mode": "train" if s.train_mode else "eval", "dtype": self.dtype, "head_dtype": self.head_dtype,
                "chunk_tokens": self.chunk_tokens, "device": self.device}

    def attrs(self, trace: xr.Dataset, elapsed: float, self_check: dict[str, Any] | None = None) -> dict[str, Any]:
        """The provenance attributes of a scored trace.

        Parameters
        ----------
        trace : xarray.Dataset
            The trace that was scored.
        elapsed : float
            Seconds the scoring took.
        self_check : dict, optional
            The trainer's self-check (its floor), or None.

        Returns
        -------
        dict
            ``trainer`` (model, dtypes, device, settings, mode, dropout, shape, self-check, weight
            checksums, seconds) and ``scored_token_checksum``, JSON-ready.
        """
        return assembly.trainer_attrs(self, trace, elapsed, self_check)


def score(trace: xr.Dataset, model: str | os.PathLike | None = None, *, dtype: str = "float32",
          head_dtype: str = "float32", device: str = "cpu", **kwargs: Any) -> xr.Dataset:
    """Rescore ``trace`` with the trainer.

    Parameters
    ----------
    trace : xarray.Dataset
        A rollout trace.
    model : str or os.PathLike, optional
        The trainer's model; None: the trace's own (``attrs["model"]``).
    dtype : str, default "float32"
        The body's precision.
    head_dtype : str, default "float32"
        The LM head's precision.
    device : str, default "cpu"
        Torch device.
    **kwargs
        Other fields of :class:`Scorer` (``batch_size``, ``settings``, ...).

    Returns
    -------
    xarray.Dataset
        ``trace`` with the trainer variables (:meth:`Scorer.score`).

    Raises
    ------
    ValueError
        If no model is given and the trace names none.
    """
    model = model or arm_record(trace).model
    if not model:
        raise ValueError("the trace names no model: pass model=PATH_OR_HUB_ID")
    return Scorer(model, dtype=dtype, head_dtype=head_dtype, device=device, **kwargs).score(trace)
