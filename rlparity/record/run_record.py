"""The run record: a run store's metadata (its root attributes) as one typed pydantic model.

A run store's attributes say how the run was recorded: the provenance, the model, the trainer's
side and sampling, the engine's settings as the training loop gave them (``engine``, kept as
given) and what those name of the floor (``engine_given``), the trainer (``trainer``), a peer's
provenance (``peer``: what its dump lacks), the RL runner's labels. :class:`RunRecord` names
every key, with its type, and is the one place they are read (:func:`run_record`) and written
(:class:`rlparity.record.store.RunWriter` writes :meth:`RunRecord.to_attrs`), as
:class:`rlparity.trace.ArmRecord` is for an arm.

Old stores convert on read (:meth:`RunRecord.from_attrs`): a store without ``engine_given`` gets it
from its ``engine`` (the settings the loop gave; nothing else is assumed), and a store that kept
the named settings as ``engine_requested`` (a development build) has them moved to
``engine_given``: in a run store they were never a capture's full settings, which is what
``engine_requested`` means on an arm (``rlparity replay`` starts an engine from it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError

from rlparity.trace.record import (Dict, EngineRecord, Int, List, MetadataRecord, Str, TrainerRecord,
                                   documented_record, record_refusal)

# the engine settings that set the floor of the backend pair (the baseline key: rlparity.metrics.baselines)
GIVEN_SETTINGS = ("dtype", "head_dtype", "attention_backend", "logprobs_mode")


def given_settings(engine: Mapping[str, Any] | None) -> dict[str, str]:
    """What the engine settings a training loop gives name of the floor (a run store's ``engine_given``).

    Parameters
    ----------
    engine : Mapping, optional
        The engine's settings (:class:`rlparity.config.EngineSettings` dumped, or vLLM keyword
        arguments: the head's precision as ``head_dtype`` or ``hf_overrides={"head_dtype": ...}``).

    Returns
    -------
    dict[str, str]
        The :data:`GIVEN_SETTINGS` the settings name; a setting left out, ``None`` or ``"auto"``
        (the engine's own choice, unknown here) is left out: nothing is assumed.
    """
    eng = dict(engine or {})
    hf = eng.get("hf_overrides")
    if eng.get("head_dtype") is None and isinstance(hf, Mapping):
        eng["head_dtype"] = hf.get("head_dtype")
    return {k: str(eng[k]).removeprefix("torch.") for k in GIVEN_SETTINGS if eng.get(k) not in (None, "auto")}


@documented_record
class PeerRecord(MetadataRecord):
    """A peer's provenance (``peer``): the framework whose run was recorded or imported, and what it lacks."""

    framework: Str = Field(None, description="the peer (verl, prime-rl)")
    source: Str = Field(None, description="the peer's code the values were read from")
    path: Str = Field(None, description="the dump folder an import read")
    missing: Dict = Field(None, description="what the peer does not record, and how to supply it ({name: why})")
    trainer: Dict = Field(None, description="the trainer's record of the peer's first step")
    versions: Str = Field(None, description="how the peer's policy versions are known")


@documented_record
class RunRecord(MetadataRecord):
    """A run store's metadata, every key typed; see the module docstring. Read it with :func:`run_record`."""

    # provenance (rlparity.config.provenance.make_attrs)
    created_at: Str = Field(None, description="when the store was created (UTC, ISO 8601)")
    library: Str = Field(None, description="the library that wrote it (rlparity)")
    library_version: Str = Field(None, description="rlparity's version")
    versions: dict[str, str | None] | None = Field(None, description="the versions of the libraries of the run")
    host: Dict = Field(None, description="the machine and system")
    # the run
    model: Str = Field(None, description="the model path or hub id")
    trainer_side: Str = Field(None, description="the trainer's reading the store holds (processed, raw)")
    sampling: Dict = Field(None, description="the run's sampling parameters (each step's default)")
    engine: Dict = Field(None, description="the engine's settings as the loop gave them (kept as given)")
    engine_given: EngineRecord | None = Field(None, description="what engine names of the floor (given_settings): "
                                              "partial, never a capture's full settings")
    dashboards: List = Field(None, description="the peers whose dashboard names the metrics carry")
    finish_reasons: List = Field(None, description="the finish reasons the finish_reason codes index")
    trainer: TrainerRecord | None = Field(None, description="the trainer's side (dtype, head_dtype, device)")
    engine_floor: Dict = Field(None, description="the engine's batch-shape floor, where the loop measured it")
    peer: PeerRecord | None = Field(None, description="a peer's provenance (record_verl, import_run)")
    rl_run: Str = Field(None, description="the RL runner's run name")
    profile: Str = Field(None, description="the RL runner's engine profile")
    old_policy: Str = Field(None, description="the RL runner's ratio denominator (pi_old or mu)")
    steps: Int = Field(None, description="the committed steps (rlparity.record.open_run sets it)")

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any], *, where: str = "the run store") -> RunRecord:
        """The record of a run store's attributes, from any store rlparity wrote (old ones converted).

        Parameters
        ----------
        attrs : Mapping[str, Any]
            The store's root attributes (or ``open_run(...).attrs``).
        where : str, default "the run store"
            The store, for the error message.

        Returns
        -------
        RunRecord

        Raises
        ------
        ArmRecordError
            A known key holds a value of the wrong type: one line naming the store, the key and the fix.
        """
        data = dict(attrs)
        if "engine_given" not in data:
            if isinstance(data.get("engine_requested"), Mapping):  # a development build's name for it
                data["engine_given"] = dict(data.pop("engine_requested"))
            elif isinstance(data.get("engine"), Mapping):  # a store before it was recorded
                data["engine_given"] = given_settings(data["engine"])
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise record_refusal(err, data, None, subject=where,
                           fix="record the run again, or pass the right value to the Recorder (attrs=...)") from None

    @property
    def given(self) -> EngineRecord:
        """The floor's engine settings the loop named (``engine_given``); empty where it named none."""
        return self.engine_given or EngineRecord()

    @property
    def scorer(self) -> TrainerRecord:
        """The trainer's side (``trainer``); empty where the loop gave none."""
        return self.trainer or TrainerRecord()


def run_record(run: Any, *, where: str = "the run store") -> RunRecord:
    """The typed metadata of a run store.

    Parameters
    ----------
    run : xarray.Dataset or Mapping
        A run (:func:`rlparity.record.open_run`: its ``attrs`` are read) or the attributes themselves.
    where : str, default "the run store"
        The store, for the error message.

    Returns
    -------
    RunRecord
    """
    return RunRecord.from_attrs(run.attrs if hasattr(run, "attrs") else run, where=where)


__all__ = ["GIVEN_SETTINGS", "PeerRecord", "RunRecord", "given_settings", "run_record"]
