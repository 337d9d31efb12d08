"""Typed settings for a capture: how to sample, and how the engine is configured.

``None`` in :class:`EngineSettings` means "leave vLLM's default": nothing is passed, and the
effective value is read back from the engine after start-up. That is what lets rlparity audit
what a user's engine really did, not what was asked.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from rlparity.config.docfields import document_fields

LogprobsMode = Literal["raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}


def device_name(value: Any) -> str:
    """A device rlparity's trainers and engines run on: ``cpu``, ``cuda`` or ``cuda:N``.

    Parameters
    ----------
    value : object
        The device as given (a string or a ``torch.device``).

    Returns
    -------
    str
        The device's name.

    Raises
    ------
    ValueError
        For any other device (``tpu``, ``cuda:x``, an empty string...), naming the choices.
    """
    text = str(value).strip()
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", text):
        raise ValueError(f"device {value!r} is not one rlparity runs on: pass cpu, cuda or cuda:N")
    return text


# a device field of a settings model: checked when the settings are made, before any model or engine
Device = Annotated[str, AfterValidator(device_name)]


def normalize_dtype(name: Any, *, what: str = "dtype") -> str:
    """The canonical name of a floating-point dtype.

    ``"float32"``, ``"bfloat16"`` or ``"float16"`` from a name, an alias (``bf16``, ``fp32``...)
    or a torch dtype; anything else is an error naming the choices.

    Parameters
    ----------
    name : Any
        A dtype name, an alias or a torch dtype (``torch.bfloat16``); case and a ``torch.`` prefix
        are ignored.
    what : str, default "dtype"
        What the value is, for the error message.

    Returns
    -------
    str
        ``"float32"``, ``"bfloat16"`` or ``"float16"``.

    Raises
    ------
    ValueError
        ``name`` is no floating-point dtype or alias (the message lists the choices).
    """
    key = str(name).strip().lower().removeprefix("torch.")
    key = _DTYPE_ALIASES.get(key, key)
    if key not in FLOAT_DTYPES:
        raise ValueError(f"unknown {what} {name!r}; use one of {', '.join(FLOAT_DTYPES)} "
                         f"(aliases: {', '.join(sorted(_DTYPE_ALIASES))})")
    return key


_S = TypeVar("_S")


def with_overrides(settings: _S, overrides: Mapping[str, Any], where: str) -> _S:
    """A function's settings dataclass with some fields replaced.

    The values are not checked here (the function checks the values it uses); a name that is no
    field is a :class:`TypeError` that lists the fields, as Python's own for an unknown keyword.

    Parameters
    ----------
    settings : dataclass instance
        The function's settings (a dataclass).
    overrides : Mapping[str, Any]
        Field names and their new values; empty returns ``settings`` itself.
    where : str
        The function's name, for the error message.

    Returns
    -------
    dataclass instance
        A copy of ``settings`` with the fields in ``overrides`` replaced.

    Raises
    ------
    TypeError
        A key of ``overrides`` is no field of ``settings``.
    """
    names = [f.name for f in dataclasses.fields(settings)]
    bad = sorted(set(overrides) - set(names))
    if bad:
        raise TypeError(f"{where}() got an unexpected keyword argument {bad[0]!r}; use one of the fields of "
                        f"{type(settings).__name__}: {', '.join(names)}")
    return dataclasses.replace(settings, **overrides) if overrides else settings


def dtype_name(value: Any) -> str | None:
    """A dtype as its plain name (``torch.bfloat16`` -> ``bfloat16``).

    Parameters
    ----------
    value : Any
        A torch dtype, a dtype name or ``None``.

    Returns
    -------
    str or None
        The name without a ``torch.`` prefix; ``None`` stays ``None``.
    """
    return None if value is None else str(value).removeprefix("torch.")


@functools.cache
def _vllm_sampling_params() -> tuple[type, bool]:
    """vLLM's ``SamplingParams`` and whether it has ``flat_logprobs``, looked up once a process (not through
    ``vllm``'s lazy attributes at every request)."""
    from vllm import SamplingParams

    return SamplingParams, "flat_logprobs" in getattr(SamplingParams, "__struct_fields__", ())


@document_fields
class SamplingSettings(BaseModel):
    """Per-request sampling parameters (vLLM ``SamplingParams``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    temperature: float = Field(1.0, ge=0.0, description="sampling temperature")
    top_k: int = Field(0, ge=-1, description="top-k cut; 0 or -1 = off (-1 is stored as 0)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="top-p (nucleus) cut; 1 = off")
    max_tokens: int = Field(32, ge=1, description="tokens generated per sequence")
    seed: int | None = Field(0, description="base seed; request i uses seed + i (None = unseeded)")
    n: int = Field(1, ge=1, description="samples per prompt")
    ignore_eos: bool = Field(True, description="keep generating past the end-of-sequence token (every "
                            "sequence has max_tokens tokens)")
    repetition_penalty: float = Field(1.0, gt=0.0, description="vLLM's repetition penalty (1 = off): logits of "
                                      "tokens already in the prompt or output are divided (if > 0) or multiplied by it")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="subtracted from the logits of tokens "
                                    "already in the output (0 = off)")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="subtracted from the logits of output "
                                     "tokens times their count so far (0 = off)")

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        return 0 if v == -1 else v

    def to_vllm(self, request_seed: int | None):
        """These settings as a vLLM ``SamplingParams`` for one request (sampled token logprobs on).

        Parameters
        ----------
        request_seed : int or None
            The request's seed (``seed + i`` for request ``i``); ``None`` leaves it unseeded.

        Returns
        -------
        vllm.SamplingParams
            The request's sampling parameters, with ``logprobs=0`` (the sampled token's logprob), returned
            flat (``flat_logprobs=True``: one list for the request instead of an object per token) where the
            installed vLLM has that field.
        """
        SamplingParams, flat = _vllm_sampling_params()
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k if self.top_k > 0 else 0,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            seed=request_seed,
            n=self.n,
            ignore_eos=self.ignore_eos,
            logprobs=0,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            **({"flat_logprobs": True} if flat else {}),
        )

    @property
    def penalized(self) -> bool:
        """Whether any sampling penalty is on (the sampler's distribution then depends on the history)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def to_openai(self, request_seed: int | None) -> dict[str, Any]:
        """These settings as the sampling fields of an OpenAI-compatible completion request.

        Parameters
        ----------
        request_seed : int or None
            The request's seed; ``None`` sends no ``seed``.

        Returns
        -------
        dict[str, Any]
            The request body's sampling fields, ``logprobs: 0`` included; ``top_k`` and the penalties
            only where they are on.
        """
        body: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "n": self.n,
            "logprobs": 0,
            "ignore_eos": self.ignore_eos,
        }
        if self.top_k > 0:
            body["top_k"] = self.top_k
        for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
            if getattr(self, name) != neutral:
                body[name] = getattr(self, name)
        if request_seed is not None:
            body["seed"] = request_seed
        return body


@document_fields
class EngineSettings(BaseModel):
    """Engine settings that change what the rollout logprobs mean or which path computes them.

    Every field left ``None`` keeps the engine's own default (recorded as effective later).

    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    logprobs_mode: LogprobsMode | None = Field(None, description="what vLLM returns for the sampled token: "
                                                "its logprob or logit, before (raw) or after (processed) "
                                                "temperature and top-k/top-p")
    enable_prefix_caching: bool | None = Field(None, description="vLLM's prefix cache")
    async_scheduling: bool | None = Field(None, description="vLLM's asynchronous scheduling")
    head_dtype: Literal["float32", "bfloat16", "float16", "model"] | None = Field(
        None, description="LM head precision (vLLM hf_overrides={'head_dtype': ...})")
    dtype: DType | None = Field(None, description="model (body) dtype")
    attention_backend: str | None = Field(None, description="vLLM attention backend name")
    enforce_eager: bool | None = Field(None, description="True = eager, False = compiled")
    batch_invariant: bool | None = Field(None, description="VLLM_BATCH_INVARIANT=1")
    max_num_seqs: int | None = Field(None, ge=1, description="most sequences the engine runs at once")
    enable_chunked_prefill: bool | None = Field(None, description="vLLM's chunked prefill")
    disable_cascade_attn: bool | None = Field(None, description="turn vLLM's cascade attention off")
    generation_config: str | None = Field(
        None, description="'auto' (take sampling defaults from the model) or 'vllm' (ignore them)")
    seed: int | None = Field(0, description="the engine's seed")
    max_model_len: int | None = Field(1024, description="longest sequence (prompt and response), tokens")
    gpu_memory_utilization: float | None = Field(None, description="share of GPU memory vLLM may take")
    tensor_parallel_size: int | None = Field(None, ge=1, description="GPUs one engine's model is sharded over "
                                             "(vLLM tensor parallelism)")
    data_parallel_size: int | None = Field(None, ge=1, description="engine replicas sharing the requests "
                                           "(vLLM data parallelism)")
    capture_routing: bool | Literal["engine", "hooks"] | None = Field(
        None, description="record the experts every MoE router selects per token (routed_experts): True = vLLM's "
        "enable_return_routed_experts where it works (GPU), else router hooks through the worker extension (eager)")
    extra: dict[str, Any] = Field(default_factory=dict, description="other vLLM EngineArgs, passed as is")

    def to_engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` / ``AsyncEngineArgs`` (only what was set).

        Returns
        -------
        dict[str, Any]
            The fields that are not ``None`` (``head_dtype`` as ``hf_overrides``, ``extra`` merged
            in); ``batch_invariant`` and ``capture_routing`` are not engine arguments and are left out.
        """
        kw: dict[str, Any] = {}
        for name in ("logprobs_mode", "enable_prefix_caching", "async_scheduling", "dtype",
                     "attention_backend", "enforce_eager", "max_num_seqs", "enable_chunked_prefill",
                     "disable_cascade_attn", "generation_config", "seed", "max_model_len",
                     "gpu_memory_utilization", "tensor_parallel_size", "data_parallel_size"):
            value = getattr(self, name)
            if value is not None:
                kw[name] = value
        if self.head_dtype is not None:
            kw["hf_overrides"] = {"head_dtype": self.head_dtype}
        kw.update(self.extra)
        return kw

    def to_cli_args(self) -> list[str]:
        """The same settings as ``vllm serve`` / ``api_server`` command-line flags.

        Returns
        -------
        list[str]
            One ``--flag`` per keyword of :meth:`to_engine_kwargs` (``--no-flag`` for False, a
            mapping as JSON).
        """
        args: list[str] = []
        import json

        for key, value in self.to_engine_kwargs().items():
            flag = "--" + key.replace("_", "-")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + key.replace("_", "-"))
            elif isinstance(value, dict):
                args += [flag, json.dumps(value)]
            else:
                args += [flag, str(value)]
        return args

    def env(self) -> dict[str, str]:
        """Environment variables the settings need in the engine process.

        Returns
        -------
        dict[str, str]
            ``VLLM_BATCH_INVARIANT`` (``"1"`` or ``"0"``) when ``batch_invariant`` is set; else empty.
        """
        out: dict[str, str] = {}
        if self.batch_invariant is not None:
            out["VLLM_BATCH_INVARIANT"] = "1" if self.batch_invariant else "0"
        return out

    def replace(self, **changes: Any) -> EngineSettings:
        """A copy with some fields changed (validated).

        Parameters
        ----------
        **changes : Any
            Field names and their new values.

        Returns
        -------
        EngineSettings
            The new settings.
        """
        return type(self)(**{**self.model_dump(), **changes})


@document_fields
class TrainerSettings(BaseModel):
    """How the trainer computes its reading of the sampled tokens (pi_old): what the
    :class:`~rlparity.score.Scorer` does, or imitates of a user's trainer.

    The defaults are the correct trainer: the engine's own sampling parameters per sequence, the
    ids the engine saw, eval mode. Every other value describes a real trainer's habit that breaks
    parity (a trainer that divides by another temperature, skips the top-k/top-p cut, re-tokenizes
    the prompt text, or leaves dropout on); the trace records what was applied, so a diagnosis can
    say which side differs.

    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    temperature: float | None = Field(None, gt=0.0, description="temperature of the processed reading "
                                      "(None: each sequence's engine temperature)")
    top_k: int | None = Field(None, ge=-1, description="top-k of the processed reading (None: the engine's; "
                              "0 or -1: no cut)")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="top-p of the processed reading "
                                "(None: the engine's; 1: no cut)")
    prompt_ids: Literal["engine", "retokenize"] = Field(
        "engine", description="score each response after the prompt ids the engine saw ('engine'), or after "
        "the trainer's own tokenization of the prompt text or chat messages ('retokenize', as trainers that "
        "rebuild inputs from text do)")
    train_mode: bool = Field(False, description="score in train mode (dropout active), as a trainer that "
                             "computes pi_old inside its training forward")
    dropout: float | None = Field(None, ge=0.0, lt=1.0, description="dropout probability set on the model's "
                                  "dropout layers and attention (None: the model config's)")
    layout: Literal["padded", "packed", "left_padded"] = Field(
        "padded", description="how a batch's sequences are laid out: 'padded' (right-padded rows with an "
        "attention mask), 'packed' (one row of the sequences back to back, position ids reset at each, a "
        "block-diagonal causal mask: verl's remove-padding and prime-rl's packing), 'left_padded' (left-padded "
        "rows with an attention mask but no position ids, so positions shift with the batch's longest "
        "sequence: a batch-variant trainer some loops have)")
    order: Literal["length", "given", "shuffled"] = Field(
        "length", description="which sequences share a micro-batch: sorted by length, in the trace's order, or "
        "shuffled (seeded)")
    batch_invariant: bool = Field(False, description="score every sequence alone, padded to a fixed bucket "
                                  "(multiples of 64 tokens): its logprobs never depend on the batch it came in "
                                  "(slower; the floor this mode leaves is what the kernels add at a fixed shape)")
    attn_implementation: str | None = Field(None, description="transformers' attention implementation ('sdpa', "
                                            "'eager', 'flash_attention_2', 'flex_attention': with these two a "
                                            "packed layout skips the blocks between sequences; None: the library's "
                                            "default; a model passed in is switched in place)")
    gradient_checkpointing: bool = Field(False, description="score with gradient checkpointing enabled, as a "
                                         "trainer that computes pi_old in its training forward")
    self_check: int = Field(8, ge=0, description="sequences rescored after each scoring alone (batch 1), then "
                            "together in the trainer's micro-batches twice and once more under `kernel_check`: "
                            "the trainer's own floor (batch-shape, run-to-run and kernel differences; what each "
                            "pass cost is recorded as self_check.pass_s); 0 = off")
    kernel_check: str = Field("auto", description="the self-check's sequences scored together once more with a "
                              "second attention implementation: how far two correct kernels in the trainer's dtype "
                              "disagree (the kernel floor, part of what separates any engine from any trainer). "
                              "'auto': the trainer's attention in float32 (SDPA on float32 q, k, v), what a correct "
                              "kernel computes before rounding; an implementation's name (e.g. 'flex_attention'); "
                              "'off'")
    fingerprint: bool = Field(True, description="record per-tensor checksums of the weights scored with")
    router_dtype: Literal["float32", "bfloat16"] | None = Field(
        None, description="precision of the MoE routers' projection (None: the model's; 'bfloat16' imitates a trainer "
        "whose router GEMM runs in bf16; 'float32' casts hidden states and router weights to float32)")
    routing_replay: Literal["off", "also", "on"] = Field(
        "off", description="routing replay (R3) with the engine's routes (needs routed_experts in the trace): 'also' "
        "adds trainer_replay_logprob / trainer_replay_processed_logprob beside the usual readings, 'on' computes the "
        "usual readings with the engine's routes forced (an R3 trainer's pi_old)")

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int | None) -> int | None:
        return 0 if v == -1 else v

    def replace(self, **changes: Any) -> TrainerSettings:
        """A copy with some fields changed (validated).

        Parameters
        ----------
        **changes : Any
            Field names and their new values.

        Returns
        -------
        TrainerSettings
            The new settings.
        """
        return type(self)(**{**self.model_dump(), **changes})
