"""The arm record: an arm's metadata (``Dataset.attrs``) as one typed pydantic model.

An arm's attrs say how its trace was made: the engine's settings as requested and as the engine
reported them (``engine_requested`` / ``engine_effective``), the trainer's (``trainer``), the
sampling, the model, the library versions and the records of the experiment that wrote it.
:class:`ArmRecord` names every key a store holds, with its type, and is the one place they are
read: ``arm_record(trace).effective.logprobs_mode`` rather than
``(trace.attrs.get("engine_effective") or {}).get("logprobs_mode")``.

The record is a view of the attrs, not a second copy of them: :meth:`ArmRecord.from_attrs` reads
any store, old or new (a missing key is ``None``; a record kept as a JSON string, as a format
without nested attrs holds it, is decoded; a key rlparity does not know is kept in
:attr:`ArmRecord.extra`), and :meth:`ArmRecord.to_attrs` gives back exactly what the store holds,
keys in their order, so that a store re-written through the record is byte for byte the same.
A value of the wrong type (``engine_effective`` a string, ``latest_policy_version`` a float) is
refused in one line naming the key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from rlparity.config.docfields import document_fields


# strict (the records' config): an int stays an int and a float a float, so the record round-trips,
# and "3" is no int nor 1 a bool
Number = int | float
Str = str | None
Int = int | None
Bool = bool | None
Dict = dict[str, Any] | None
List = list[Any] | tuple[Any, ...] | None


class ArmRecordError(ValueError):
    """An arm's metadata holds a value of the wrong type; the message names the key and the fix
    (:func:`rlparity.trace.validate` reports it as a :class:`~rlparity.trace.TraceValidationError`)."""


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python scalar it holds (an in-memory trace may carry one; a store never does)."""
    return value.item() if isinstance(value, np.generic) else value


def _wants_container(annotation: Any) -> bool:
    """Whether a field holds a mapping, a list or a record (not a string): a JSON string there is decoded."""
    kinds = get_args(annotation) if get_origin(annotation) in (Union, type(int | None)) else (annotation,)
    return any(get_origin(k) in (dict, list, tuple) or k in (dict, list, tuple)
               or (isinstance(k, type) and issubclass(k, MetadataRecord)) for k in kinds)


_EXPECTED = {"dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
             "string_type": "a string", "int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
             "list_type": "a list"}


def _where(attrs: Any, loc: tuple) -> tuple[str, Any]:
    """The stored path (``['trainer']['dropout']``) and value a validation error points at; the
    error's location also names union members and validators, which the attrs do not hold."""
    path, value = "", attrs
    for part in loc:
        if isinstance(value, str) and value.lstrip().startswith(("{", "[")):
            try:
                value = json.loads(value)
            except ValueError:
                break
        if isinstance(value, Mapping) and part in value:
            path, value = path + f"[{part!r}]", _plain(value[part])
    return path, value


_M = TypeVar("_M")


def documented_record(model: type[_M]) -> type[_M]:
    """:func:`~rlparity.config.docfields.document_fields`, and the unknown keys a record keeps
    (the decorator of every metadata record: the arm's here, the run store's in
    :mod:`rlparity.record.run_record`).

    Parameters
    ----------
    model : type
        A :class:`MetadataRecord` subclass.

    Returns
    -------
    type
        ``model``, its docstring listing its fields.
    """
    document_fields(model)
    model.__doc__ = str(model.__doc__).rstrip("\n") + (
        "\n**extra_data : Any\n    Keys rlparity does not know, kept as they are stored (:meth:`get` reads them).\n")
    return model


def _decoded(model: type[BaseModel], data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` as a record reads it: numpy scalars as Python's, a record kept as a JSON string decoded."""
    data = {str(k): _plain(v) for k, v in data.items()}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if isinstance(data.get(key), str) and _wants_container(field.annotation):
            try:
                data[key] = json.loads(data[key])
            except ValueError:
                pass  # not JSON: refused as a string where a mapping belongs
    return data


def record_refusal(err: ValidationError, attrs: Any, arm: str | None, *, subject: str | None = None,
                   fix: str = "set it right (or delete it) in the arm's attrs and save the arm again "
                              "(rlparity.trace.save)") -> ArmRecordError:
    """The one-line error of a validation failure: the arm (or ``subject``), the stored key, its value,
    what it should be, the fix.

    Parameters
    ----------
    err : pydantic.ValidationError
        The failure.
    attrs : Any
        The metadata validated.
    arm : str or None
        The arm's name (default ``attrs["arm"]``).
    subject : str, optional
        What the metadata belongs to, instead of the arm (e.g. a run store's path).
    fix : str
        How to set it right.

    Returns
    -------
    ArmRecordError
    """
    e = err.errors()[0]
    path, value = _where(attrs, e["loc"])
    kinds = {x["type"] for x in err.errors() if x["loc"][:len(e["loc"]) - 1] == e["loc"][:-1]}
    expected = ("a number" if {"int_type", "float_type"} <= kinds else "a mapping or a list"
                if {"dict_type", "list_type"} <= kinds else "a mapping or a string"
                if {"dict_type", "string_type"} <= kinds else _EXPECTED.get(e["type"], e["msg"]))
    if subject is None:
        name = arm if arm is not None else (attrs.get("arm") if isinstance(attrs, Mapping) else None)
        subject = f"arm {name or 'default'!r}"
    return ArmRecordError(f"{subject}: attrs{path} = {value!r:.80} is not {expected}: {fix}")


class MetadataRecord(BaseModel):
    """A mapping of metadata with typed known keys: the keys' order is kept, unknown keys too."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True, strict=True)
    _keys: tuple[str, ...] = PrivateAttr(default=())

    def model_post_init(self, context: Any, /) -> None:
        """Nothing after validation: the validator keeps the keys' order (pydantic's hook).

        Parameters
        ----------
        context : Any
            Pydantic's validation context.
        """

    @model_validator(mode="wrap")
    @classmethod
    def _read(cls, data: Any, handler: Any) -> Any:
        if not isinstance(data, Mapping):
            return handler(data)
        data = _decoded(cls, data)
        out = handler(data)
        out._keys = tuple(data)
        return out

    def to_attrs(self) -> dict[str, Any]:
        """The metadata as the store holds it: the keys read, in their order, and nothing else.

        Returns
        -------
        dict[str, Any]
            Plain JSON-able values (records as dicts).
        """
        by_key = {(f.alias or n): n for n, f in type(self).model_fields.items() if n in self.model_fields_set}
        extra = self.model_extra or {}
        keys = list(self._keys) + [k for k in (*by_key, *extra) if k not in self._keys]
        out = {}
        for k in keys:
            v = getattr(self, by_key[k]) if k in by_key else extra[k]
            out[k] = v.to_attrs() if isinstance(v, MetadataRecord) else v
        return out

    def __bool__(self) -> bool:  # truthy when it holds anything, as the mapping it stands for
        return bool(self.model_fields_set or self.model_extra)

    def get(self, key: str, default: Any = None) -> Any:
        """A setting by its stored name, known or not, as ``dict.get`` reads the stored mapping.

        Parameters
        ----------
        key : str
            The stored name.
        default : Any, optional
            What a key the record does not hold reads as (a stored ``None`` stays ``None``).
        """
        names = {(f.alias or n): n for n, f in type(self).model_fields.items()}
        if key in names:
            return getattr(self, names[key]) if names[key] in self.model_fields_set else default
        return (self.model_extra or {}).get(key, default)


@documented_record
class EngineRecord(MetadataRecord):
    """The engine's settings, as requested (``engine_requested``) or as the engine reported them
    (``engine_effective``); ``None`` where not given (requested) or not reported (effective).
    Settings not named here are kept (:meth:`get` reads them)."""

    model: Str = Field(None, description="the model path or hub id the engine loaded")
    dtype: Str = Field(None, description="the body's dtype (float32, bfloat16, float16)")
    head_dtype: Str = Field(None, description="the LM head's dtype (model = the body's)")
    logprobs_mode: Str = Field(None, description="what vLLM returns as logprobs (raw_logprobs, processed_logprobs...)")
    attention_backend: Str = Field(None, description="the attention backend the engine ran")
    attention_backend_requested: Str = Field(None, description="the attention backend asked for (auto = vLLM's choice)")
    async_scheduling: Bool = Field(None, description="vLLM's asynchronous scheduling")
    batch_invariant: Bool = Field(None, description="vLLM's batch-invariant kernels")
    enable_prefix_caching: Bool = Field(None, description="the prefix cache")
    enable_chunked_prefill: Bool = Field(None, description="chunked prefill")
    enforce_eager: Bool = Field(None, description="eager mode (no CUDA graphs, no compilation)")
    disable_cascade_attn: Bool = Field(None, description="cascade attention turned off")
    compilation_mode: Str = Field(None, description="the compilation mode")
    cudagraph_mode: Str = Field(None, description="the CUDA graph mode")
    device: Str = Field(None, description="the device the engine ran on")
    generation_config: Str = Field(None, description="where the sampling defaults come from (vllm, auto = the model's generation_config.json)")
    generation_config_sampling_defaults: Dict = Field(None, description="the sampling defaults the model's generation config sets")
    block_size: Int = Field(None, description="the KV-cache block size")
    max_model_len: Int = Field(None, description="the longest sequence the engine takes")
    max_num_batched_tokens: Int = Field(None, description="tokens per scheduler step")
    max_num_seqs: Int = Field(None, description="sequences per scheduler step")
    seed: Int = Field(None, description="the engine's seed")
    tensor_parallel_size: Int = Field(None, description="tensor-parallel ranks")
    data_parallel_size: Int = Field(None, description="data-parallel ranks")
    gpu_memory_utilization: Number | None = Field(None, description="the share of GPU memory the engine may take")
    capture_routing: Bool = Field(None, description="whether the engine returned its routed experts")
    extra: Dict = Field(None, description="engine keyword arguments passed through as given (EngineSettings.extra)")


@documented_record
class TrainerRecord(MetadataRecord):
    """How the trainer scored the arm (``trainer``: :mod:`rlparity.score`, or an importer's)."""

    library: Str = Field(None, description="the library that scored (transformers)")
    model: Str = Field(None, description="the trainer's model path or hub id")
    device: Str = Field(None, description="the device the trainer scored on")
    dtype: Str = Field(None, description="the trainer's body dtype")
    head_dtype: Str = Field(None, description="the trainer's LM-head dtype")
    fp32_gemm: Str = Field(None, description="the float32 matmul precision setting")
    topk_ties: Str = Field(None, description="how top-k ties were kept")
    scored_by: Str = Field(None, description="policy_version: each token scored with the weights that sampled it")
    settings: Dict = Field(None, description="the scorer's settings (prompt_ids, train_mode...)")
    prompt_tokenization: Dict = Field(None, description="how the trainer tokenized the prompts")
    training_mode: Bool = Field(None, description="whether the trainer scored in train mode")
    dropout: Number | None = Field(None, description="the largest dropout probability of the trainer's model")
    score_s: Number | None = Field(None, description="seconds the scoring took")
    shape: dict[str, Any] | str | None = Field(None, description="the batch shape the trainer scored in (a label or its layout)")
    self_check: Dict = Field(None, description="the trainer's floors: sequences rescored alone, then together twice and under a second attention kernel")
    self_check_per_version: Dict = Field(None, description="the self-check per policy version")
    weight_checksums: Dict = Field(None, description="the checksums of the weights the trainer scored with")
    weight_checksums_per_version: Dict = Field(None, description="those checksums per policy version")
    per_version: Dict = Field(None, description="the model of each policy version")
    latest_version: Int = Field(None, description="the latest policy version scored")


@documented_record
class FaultRecord(MetadataRecord):
    """A fault an online RL run switched on mid-run (``rl.fault``: the ground truth of the step)."""

    cause: Str = Field(None, description="the fault (rlparity.experiments.rl_runner.MIDRUN_FAULTS)")
    from_step: Int = Field(None, description="the first step it is on")
    on: Bool = Field(None, description="whether it is on at this step")


@documented_record
class RLRecord(MetadataRecord):
    """One step of an online RL run (``rl``: :func:`rlparity.experiments.rl.rl_run`): what the runner
    did and how long it took."""

    run: Str = Field(None, description="the run's name (<profile>+<old_policy>)")
    profile: Str = Field(None, description="the engine profile of the run")
    profile_index: Int = Field(None, description="the profile's place in the order the runner was given")
    step: Int = Field(None, description="the optimizer step")
    loss: Str = Field(None, description="the loss (ppo, gspo...)")
    lr: Number | None = Field(None, description="the learning rate")
    old_policy: Str = Field(None, description="the loss's ratio denominator (pi_old or mu)")
    async_rollouts: Bool = Field(None, description="whether the rollouts were sampled one step ahead")
    trainer_version: Int = Field(None, description="the trainer's weights version of the step")
    versions_sampled: List = Field(None, description="the policy versions that sampled the step's tokens")
    pause_mode: Str = Field(None, description="how the engine paused for the weight update")
    clear_cache: Bool = Field(None, description="whether the update cleared the prefix cache")
    seed: Int = Field(None, description="the run's seed")
    sizes: Dict = Field(None, description="n_prompts, n_samples, max_tokens")
    train_step: Dict = Field(None, description="the optimizer step's metrics")
    update: Dict = Field(None, description="the weight update after the step")
    seconds: Dict = Field(None, description="rollout, train, update and wall seconds")
    engine_startup_s: Number | None = Field(None, description="seconds the engine took to start")
    alarms: List = Field(None, description="the run recorder's alarms at the step (None: no recorder)")
    fault: FaultRecord | None = Field(None, description="the fault switched on mid-run (None: none)")


@documented_record
class ArmRecord(MetadataRecord):
    """An arm's metadata, every key a store holds typed; see the module docstring.

    Read it with :func:`arm_record`; :attr:`effective`, :attr:`requested` and :attr:`scorer` are
    the engine's and the trainer's records, empty (every setting ``None``) where the arm has none.
    """

    # the arm and the data model
    arm: Str = Field(None, description="the arm's name")
    schema_version: Int = Field(None, description="the trace schema's version")
    factors: Dict = Field(None, description="the experiment's factors of the arm (rlparity.trace.with_factors)")
    # provenance (rlparity.config.provenance.make_attrs)
    created_at: Str = Field(None, description="when the trace was made (UTC, ISO 8601)")
    library: Str = Field(None, description="the library that wrote it (rlparity)")
    library_version: Str = Field(None, description="rlparity's version")
    versions: dict[str, str | None] | None = Field(None, description="the versions of the libraries whose numerics the trace depends on")
    host: Dict = Field(None, description="the machine and system")
    # the capture: model, engine, sampling
    model: Str = Field(None, description="the model path or hub id")
    model_fingerprint: Str = Field(None, description="a fingerprint of the model's weights")
    model_is_local: Bool = Field(None, description="whether the model is a local path")
    capture_backend: Str = Field(None, description="what captured the rollouts (vllm-offline, vllm-async, import:FORMAT...)")
    engine_requested: EngineRecord | None = Field(None, description="the engine's settings as requested")
    engine_effective: EngineRecord | None = Field(None, description="the engine's settings as it reported them after start-up")
    engine_given: EngineRecord | None = Field(None, description="the floor's engine settings a training loop named (a run "
                                              "store's step: rlparity.record.run_record.given_settings); partial, never "
                                              "a capture's full settings")
    sampling: dict[str, Any] | list[Any] | tuple[Any, ...] | None = Field(None, description="the sampling parameters, per request or one mapping for all")
    sampling_unknown: List = Field(None, description="the sampling fields an imported dump does not record")
    seeds: Dict = Field(None, description="the engine's and the requests' seeds")
    generate_s: Number | None = Field(None, description="seconds the generation took")
    startup_s: Number | None = Field(None, description="seconds the engine took to start")
    import_: Dict = Field(None, alias="import", description="what an import read, supplied, excluded and missed (stored as import)")
    # weight versions (inflight updates, RL steps)
    latest_policy_version: Int = Field(None, description="the engine's weights version when the capture ended")
    weight_updates: List = Field(None, description="the weight updates during the capture (mode, cache reset, times)")
    engine_clock: Str = Field(None, description="what the token and submit times count")
    engine_weight_checksums: Dict = Field(None, description="per version, the checksums of the weights the engine loaded")
    # the trainer's side
    trainer: TrainerRecord | None = Field(None, description="how the trainer scored the arm")
    trainer_router: Dict = Field(None, description="the trainer's MoE routers (layers, top-k, dtype, replay)")
    routing_capture: Dict = Field(None, description="how the engine's routes were taken")
    scored_token_checksum: Str = Field(None, description="the checksum of the tokens the trainer scored")
    lazy_sample: Str = Field(None, description="which sequences a lazy read kept")
    # the records of the experiment that wrote the arm
    head_experiment: Dict = Field(None, description="the LM-head precision cell (legacy factors)")
    inflight: Dict = Field(None, description="the inflight weight-update cell (legacy factors)")
    rl: RLRecord | None = Field(None, description="the online RL run and step")
    replay: Dict = Field(None, description="how a replay arm was replayed (mode, source arm, its settings)")
    record_step: Int = Field(None, description="the run store's step the trace is (rlparity.record.step_trace)")
    record_metrics: Dict = Field(None, description="the run recorder's metrics at that step")
    record_alarms: Dict = Field(None, description="the run recorder's alarms that fired at that step ({code: level})")
    train_step: Dict = Field(None, description="the optimizer step's settings (loss, clip, corrections)")
    objective_correction: Dict = Field(None, description="the objective correction the run applies (tis, cap, masks)")
    faults: Dict = Field(None, description="the faults injected (the ground truth of a fault arm)")
    fault_protocol: Dict = Field(None, description="how a fault arm was run")
    engine_floor: Dict = Field(None, description="the engine's batch-shape floor")
    floor_shape: Str = Field(None, description="the batch shape of a floor arm")
    layer_capture: Dict = Field(None, description="how per-layer states were captured")
    layer_scenario: Str = Field(None, description="the scenario of a layer arm")
    moe_experiment: Dict = Field(None, description="the MoE experiment's settings")
    ablation: Dict = Field(None, description="the engine-setting ablation's plan and knob")

    EMPTY_ENGINE: ClassVar[EngineRecord]
    EMPTY_TRAINER: ClassVar[TrainerRecord]
    EMPTY_RL: ClassVar[RLRecord]

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], *, arm: str | None = None) -> ArmRecord:
        """The record of an arm's attrs, from any store rlparity wrote.

        Parameters
        ----------
        attrs : Mapping[str, Any]
            The arm's ``Dataset.attrs``.
        arm : str, optional
            The arm's name for the error message (default ``attrs["arm"]``).

        Returns
        -------
        ArmRecord

        Raises
        ------
        ArmRecordError
            A known key holds a value of the wrong type: one line naming the arm, the key and the fix.
        """
        try:
            return cls.model_validate(attrs)
        except ValidationError as err:
            raise record_refusal(err, attrs, arm) from None

    @property
    def name(self) -> str:
        """The arm's name: ``arm``, ``"default"`` where the attrs do not name it (as a store names a lone trace)."""
        return self.arm if self.arm is not None else "default"

    @property
    def effective(self) -> EngineRecord:
        """The engine's settings as it reported them (``engine_effective``); empty where not recorded."""
        return self.engine_effective or ArmRecord.EMPTY_ENGINE

    @property
    def requested(self) -> EngineRecord:
        """The engine's settings as requested (``engine_requested``); empty where not recorded."""
        return self.engine_requested or ArmRecord.EMPTY_ENGINE

    @property
    def scorer(self) -> TrainerRecord:
        """How the trainer scored the arm (``trainer``); empty where not recorded."""
        return self.trainer or ArmRecord.EMPTY_TRAINER

    @property
    def given(self) -> EngineRecord:
        """The floor's engine settings a training loop named (``engine_given``); empty where not recorded."""
        return self.engine_given or ArmRecord.EMPTY_ENGINE

    @property
    def rl_step(self) -> RLRecord:
        """The online RL run's step (``rl``); empty where the arm is no RL step."""
        return self.rl or ArmRecord.EMPTY_RL

    @property
    def extra(self) -> dict[str, Any]:
        """The keys rlparity does not know, kept as they are (written back by :meth:`to_attrs`)."""
        return dict(self.model_extra or {})


ArmRecord.EMPTY_ENGINE = EngineRecord()
ArmRecord.EMPTY_TRAINER = TrainerRecord()
ArmRecord.EMPTY_RL = RLRecord()


def arm_name(trace: Any, default: Any = "default") -> Any:
    """An arm's name as stored (``attrs["arm"]``), its record left unchecked: the one read of the name
    where the rest of the attrs need not be valid (the storage's messages, a trace not yet validated).

    Parameters
    ----------
    trace : xarray.Dataset or Mapping
        An arm or its attrs.
    default : Any, default "default"
        What an arm whose attrs do not name it reads as (the name a store gives a lone trace).

    Returns
    -------
    Any
        The stored value (a string for any trace rlparity wrote), else ``default``.
    """
    return _plain((trace.attrs if hasattr(trace, "attrs") else trace).get("arm", default))


def arm_record(trace: Any) -> ArmRecord:
    """The typed metadata of one arm.

    Parameters
    ----------
    trace : xarray.Dataset or Mapping
        An arm (its ``attrs`` are read) or the attrs themselves.

    Returns
    -------
    ArmRecord

    Raises
    ------
    ArmRecordError
        A known key holds a value of the wrong type (the message names it).
    """
    return ArmRecord.from_attrs(trace.attrs if hasattr(trace, "attrs") else trace)


__all__ = ["ArmRecord", "ArmRecordError", "EngineRecord", "FaultRecord", "RLRecord", "TrainerRecord", "arm_name",
           "arm_record"]
