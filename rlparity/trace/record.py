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
from typing import Any, ClassVar, Union, get_args, get_origin

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StrictBool, StrictFloat, StrictInt, StrictStr, \
    ValidationError, model_validator


Number = Union[StrictInt, StrictFloat]  # an int stays an int, a float a float: the record round-trips
Str = StrictStr | None
Int = StrictInt | None
Bool = StrictBool | None
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
               or (isinstance(k, type) and issubclass(k, _Record)) for k in kinds)


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
        elif isinstance(value, list) and isinstance(part, int) and part < len(value):
            path, value = path + f"[{part}]", value[part]
    return path, value


class _Record(BaseModel):
    """A mapping of metadata with typed known keys: the keys' order is kept, unknown keys too."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True, strict=True)
    _keys: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _read(cls, data: Any, handler: Any) -> Any:
        if not isinstance(data, Mapping):
            return handler(data)
        data = {str(k): _plain(v) for k, v in data.items()}
        for name, field in cls.model_fields.items():
            key = field.alias or name
            if isinstance(data.get(key), str) and _wants_container(field.annotation):
                try:
                    data[key] = json.loads(data[key])
                except ValueError:
                    pass  # not JSON: refused below as a string where a mapping belongs
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
            out[k] = v.to_attrs() if isinstance(v, _Record) else v
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


class EngineRecord(_Record):
    """The engine's settings, as requested (``engine_requested``) or as the engine reported them
    (``engine_effective``); ``None`` where not given (requested) or not reported (effective).
    Settings not named here are kept (:meth:`get` reads them)."""

    model: Str = None
    dtype: Str = None
    head_dtype: Str = None
    logprobs_mode: Str = None
    attention_backend: Str = None
    attention_backend_requested: Str = None
    async_scheduling: Bool = None
    batch_invariant: Bool = None
    enable_prefix_caching: Bool = None
    enable_chunked_prefill: Bool = None
    enforce_eager: Bool = None
    disable_cascade_attn: Bool = None
    compilation_mode: Str = None
    cudagraph_mode: Str = None
    device: Str = None
    generation_config: Str = None
    generation_config_sampling_defaults: Dict = None
    block_size: Int = None
    max_model_len: Int = None
    max_num_batched_tokens: Int = None
    max_num_seqs: Int = None
    seed: Int = None
    tensor_parallel_size: Int = None
    data_parallel_size: Int = None
    gpu_memory_utilization: Number | None = None
    capture_routing: Bool = None
    extra: Dict = None  # the engine keyword arguments passed through as given (EngineSettings.extra)


class TrainerRecord(_Record):
    """How the trainer scored the arm (``trainer``: :mod:`rlparity.score`, or an importer's)."""

    library: Str = None
    model: Str = None
    device: Str = None
    dtype: Str = None
    head_dtype: Str = None
    fp32_gemm: Str = None
    topk_ties: Str = None
    scored_by: Str = None  # "policy_version": each token scored with the weights that sampled it
    settings: Dict = None  # the scorer's settings (prompt_ids, ...)
    prompt_tokenization: Dict = None
    training_mode: Bool = None
    dropout: Number | None = None
    score_s: Number | None = None
    shape: Dict = None
    self_check: Dict = None
    self_check_per_version: Dict = None
    weight_checksums: Dict = None
    weight_checksums_per_version: Dict = None
    per_version: Dict = None
    latest_version: Int = None


class ArmRecord(_Record):
    """An arm's metadata, every key a store holds typed; see the module docstring.

    Read it with :func:`arm_record`; :attr:`effective`, :attr:`requested` and :attr:`scorer` are
    the engine's and the trainer's records, empty (every setting ``None``) where the arm has none.
    """

    # the arm and the data model
    arm: Str = None
    schema_version: Int = None
    factors: Dict = None
    # provenance (rlparity.config.provenance.make_attrs)
    created_at: Str = None
    library: Str = None
    library_version: Str = None
    versions: dict[str, StrictStr | None] | None = None
    host: Dict = None
    # the capture: model, engine, sampling
    model: Str = None
    model_fingerprint: Str = None
    model_is_local: Bool = None
    capture_backend: Str = None
    engine_requested: EngineRecord | None = None
    engine_effective: EngineRecord | None = None
    sampling: dict[str, Any] | list[Any] | tuple[Any, ...] | None = None  # per request (a capture), or one for all
    sampling_unknown: List = None
    seeds: Dict = None
    generate_s: Number | None = None
    startup_s: Number | None = None
    import_: Dict = Field(default=None, alias="import")
    # weight versions (inflight updates, RL steps)
    latest_policy_version: Int = None
    weight_updates: List = None
    engine_clock: Str = None
    engine_weight_checksums: Dict = None
    # the trainer's side
    trainer: TrainerRecord | None = None
    trainer_router: Dict = None
    routing_capture: Dict = None
    scored_token_checksum: Str = None
    lazy_sample: Str = None
    # the records of the experiment that wrote the arm
    head_experiment: Dict = None
    inflight: Dict = None
    rl: Dict = None
    train_step: Dict = None
    objective_correction: Dict = None
    faults: Dict = None
    fault_protocol: Dict = None
    engine_floor: Dict = None
    floor_shape: Str = None
    layer_capture: Dict = None
    layer_scenario: Str = None
    moe_experiment: Dict = None
    ablation: Dict = None

    EMPTY_ENGINE: ClassVar[EngineRecord]
    EMPTY_TRAINER: ClassVar[TrainerRecord]

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
            e = err.errors()[0]
            path, value = _where(attrs, e["loc"])
            kinds = {x["type"] for x in err.errors() if x["loc"][:len(e["loc"]) - 1] == e["loc"][:-1]}
            expected = ("a number" if {"int_type", "float_type"} <= kinds else "a mapping or a list"
                        if {"dict_type", "list_type"} <= kinds else _EXPECTED.get(e["type"], e["msg"]))
            name = arm if arm is not None else (attrs.get("arm") if isinstance(attrs, Mapping) else None)
            raise ArmRecordError(
                f"arm {name or 'default'!r}: attrs{path} = {value!r:.80} is not {expected}: "
                f"set it right (or delete it) in the arm's attrs and save the arm again (rlparity.trace.save)"
            ) from None

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
    def extra(self) -> dict[str, Any]:
        """The keys rlparity does not know, kept as they are (written back by :meth:`to_attrs`)."""
        return dict(self.model_extra or {})


ArmRecord.EMPTY_ENGINE = EngineRecord()
ArmRecord.EMPTY_TRAINER = TrainerRecord()


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


__all__ = ["ArmRecord", "ArmRecordError", "EngineRecord", "TrainerRecord", "arm_record"]
