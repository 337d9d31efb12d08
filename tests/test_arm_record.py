"""The arm record (rlparity.trace.record): every shipped store's arm metadata reads into it and
writes back as stored (keys, values and their order: the JSON of ``.zattrs`` is the reference);
old stores convert; unknown keys survive; a wrong type is refused in one line naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlparity.datasets import example_path, list_examples
from rlparity.metrics.head_precision import cell_dtypes
from rlparity.testing import synthetic_trace
from rlparity.trace import (ArmRecord, ArmRecordError, EngineRecord, TraceValidationError, arm_factors, arm_record,
                            load, save, validate)
from rlparity.trace.weights import engine_effective, trainer_checksums


def _stored_arms() -> list[tuple[str, Path]]:
    return [(f"{name}/{p.parent.name}", p) for name in list_examples()
            for p in sorted(example_path(name).glob("*/.zattrs"))]


STORED = _stored_arms()


def test_every_shipped_example_has_arms():
    assert len(list_examples()) == 13 and len(STORED) >= 92  # 102 arms when written (cpu-doctor: 12 steps)


@pytest.mark.parametrize("label,path", STORED, ids=[a for a, _ in STORED])
def test_round_trip_on_every_shipped_arm(label, path):
    raw = json.loads(path.read_text())
    rec = ArmRecord.from_attrs(raw)
    back = rec.to_attrs()
    assert back == raw
    assert json.dumps(back) == json.dumps(raw)  # the keys in the stored order, nested ones too
    assert rec.extra == {}  # every key a shipped store holds has a typed field
    # the typed fields read what the JSON holds (the JSON read by hand is the reference)
    assert rec.arm == raw["arm"] and rec.name == raw["arm"]
    # a run store's step (cpu-doctor) records no engine: its records read empty
    assert rec.effective.logprobs_mode == (raw.get("engine_effective") or {}).get("logprobs_mode")
    assert rec.requested.head_dtype == (raw.get("engine_requested") or {}).get("head_dtype")
    assert rec.scorer.head_dtype == raw["trainer"].get("head_dtype")
    assert rec.scorer.scored_by == raw["trainer"].get("scored_by")
    assert rec.latest_policy_version == raw.get("latest_policy_version")


def test_round_trip_after_load_on_every_example():
    """Through the store reader (xarray attrs), not the JSON: the same attrs come back."""
    n = 0
    from rlparity.trace import open_arms
    for name in list_examples():
        for arm, ds in open_arms(example_path(name)).items():
            assert arm_record(ds).to_attrs() == dict(ds.attrs)
            n += 1
    assert n == len(STORED)


@pytest.mark.parametrize("scored", [False, True])
def test_round_trip_on_synthetic_arms(scored):
    ds = synthetic_trace(n_sequences=3, max_len=4, scored=scored, arm="synth")
    rec = arm_record(ds)
    assert rec.to_attrs() == dict(ds.attrs)
    assert list(rec.to_attrs()) == list(ds.attrs)
    assert rec.extra == {"synthetic": ds.attrs["synthetic"]}  # a key rlparity does not know is kept
    assert rec.effective.head_dtype == "float32" and rec.requested.dtype is None
    assert (rec.scorer.model == "synthetic") is scored and (rec.trainer is None) is (not scored)


def test_records_built_in_code_write_their_keys_only():
    rec = ArmRecord(arm="a", engine_effective=EngineRecord(dtype="bfloat16"), latest_policy_version=2)
    assert rec.to_attrs() == {"arm": "a", "engine_effective": {"dtype": "bfloat16"}, "latest_policy_version": 2}
    assert ArmRecord().to_attrs() == {} and ArmRecord().name == "default"


def test_numbers_keep_their_type():
    """An int stays an int and a float a float (a lax float field would write 1 back as 1.0)."""
    rec = ArmRecord.from_attrs({"startup_s": 1, "generate_s": 1.0, "trainer": {"dropout": 0, "score_s": 2.5}})
    back = rec.to_attrs()
    assert json.dumps(back) == '{"startup_s": 1, "generate_s": 1.0, "trainer": {"dropout": 0, "score_s": 2.5}}'


def test_numpy_scalars_of_an_in_memory_trace_read_as_python():
    rec = ArmRecord.from_attrs({"latest_policy_version": np.int64(3), "startup_s": np.float32(0.5),
                                "trainer": {"training_mode": np.bool_(True)}})
    assert rec.latest_policy_version == 3 and type(rec.latest_policy_version) is int
    assert rec.startup_s == 0.5 and rec.scorer.training_mode is True


def test_missing_none_and_empty_records():
    rec = ArmRecord.from_attrs({"engine_effective": None, "engine_requested": {}})
    assert rec.engine_effective is None and not rec.engine_requested and rec.engine_requested is not None
    assert rec.effective.dtype is None and rec.requested.dtype is None and rec.scorer.head_dtype is None
    assert rec.to_attrs() == {"engine_effective": None, "engine_requested": {}}
    assert bool(EngineRecord.model_validate({"seed": 0})) and not EngineRecord()


def test_get_reads_as_dict_get():
    eng = EngineRecord.model_validate({"dtype": None, "kv_cache_dtype": "fp8", "seed": 0})
    assert eng.get("dtype", "x") is None  # stored None stays None
    assert eng.get("head_dtype", "x") == "x"  # a known key not stored: the default
    assert eng.get("kv_cache_dtype") == "fp8" and eng.get("nothing", 7) == 7  # unknown keys
    assert eng.get("seed", 5) == 0
    assert ArmRecord.from_attrs({"import": {"format": "slime"}}).import_ == {"format": "slime"}


def test_json_strings_are_decoded():
    """A record kept as a JSON string (a format without nested attrs) reads as the mapping."""
    rec = ArmRecord.from_attrs({"engine_effective": '{"dtype": "bfloat16", "head_dtype": "float32"}',
                                "sampling": '[{"temperature": 0.7}]', "model": "{not a record}"})
    assert rec.effective.head_dtype == "float32" and rec.sampling == [{"temperature": 0.7}]
    assert rec.model == "{not a record}"  # a string field keeps its string
    assert rec.to_attrs()["engine_effective"] == {"dtype": "bfloat16", "head_dtype": "float32"}


def _legacy_arm():
    """An arm as rlparity 0.x stored it: no factors (the head matrix's record and arm name say
    them), the engine's settings as a JSON string, no provenance, a key of its own."""
    ds = synthetic_trace(n_sequences=2, max_len=3, scored=True, arm="rollout-float32_trainer-bfloat16")
    ds.attrs = {"arm": "rollout-float32_trainer-bfloat16", "schema_version": 1, "capture_backend": "vllm-offline",
                "engine_effective": json.dumps({"dtype": "bfloat16", "head_dtype": "model"}),
                "trainer": {"model": "m", "dtype": "bfloat16", "head_dtype": "bf16"},
                "head_experiment": {"rollout_head": "float32", "trainer_head": "bfloat16"},
                "my_lab_note": {"run": 7}}
    return ds


def test_old_store_converts(tmp_path):
    save(_legacy_arm(), tmp_path / "old.zarr")
    ds = load(tmp_path / "old.zarr")
    rec = arm_record(ds)
    assert rec.factors is None and rec.created_at is None and rec.engine_requested is None
    assert rec.effective.dtype == "bfloat16" and rec.effective.head_dtype == "model"
    assert rec.extra == {"my_lab_note": {"run": 7}}  # unknown keys survive the store
    assert arm_factors(ds) == {"rollout_head": "float32", "trainer_head": "bfloat16"}
    # the readers see it: vLLM's "model" head is the body's dtype; the trainer's alias is normalised
    assert cell_dtypes(ds) == {"rollout_head": "bfloat16", "trainer_head": "bfloat16",
                               "rollout_body": "bfloat16", "trainer_body": "bfloat16"}


def test_unknown_keys_survive_save_and_load(tmp_path):
    ds = synthetic_trace(n_sequences=2, max_len=3, arm="a")
    ds.attrs["lab"] = {"notes": ["x", 1]}
    save(ds, tmp_path / "s.zarr")
    back = load(tmp_path / "s.zarr")
    assert arm_record(back).extra["lab"] == {"notes": ["x", 1]}
    assert arm_record(back).to_attrs()["lab"] == {"notes": ["x", 1]}


@pytest.mark.parametrize("key,value,path,expected", [
    ("engine_effective", "fast", "['engine_effective']", "a mapping"),
    ("engine_effective", {"logprobs_mode": 1}, "['engine_effective']['logprobs_mode']", "a string"),
    ("trainer", {"dropout": "0.1"}, "['trainer']['dropout']", "a number"),
    ("startup_s", {"s": 1.0}, "['startup_s']", "a number"),  # a mapping where a number belongs
    ("trainer", {"shape": 3}, "['trainer']['shape']", "a mapping or a string"),
    ("trainer", {"training_mode": 1}, "['trainer']['training_mode']", "true or false"),
    ("latest_policy_version", 1.5, "['latest_policy_version']", "an integer"),
    ("latest_policy_version", True, "['latest_policy_version']", "an integer"),
    ("sampling", "fast", "['sampling']", "a mapping or a list"),
    ("model", 3, "['model']", "a string"),
])
def test_a_wrong_type_is_refused_in_one_line(key, value, path, expected):
    with pytest.raises(ArmRecordError) as err:
        ArmRecord.from_attrs({"arm": "a1", key: value})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"arm 'a1': attrs{path} = ")
    assert f"is not {expected}:" in msg and "save the arm again" in msg


def test_validate_and_the_readers_refuse_bad_metadata():
    ds = synthetic_trace(n_sequences=2, max_len=3, scored=True, arm="bad")
    ds.attrs["engine_effective"] = ["bfloat16"]
    with pytest.raises(TraceValidationError, match=r"^arm 'bad' is not a valid rlparity trace: arm 'bad': "
                                                   r"attrs\['engine_effective'\] = \['bfloat16'\] is not a mapping"):
        validate(ds, where="arm 'bad'")
    with pytest.raises(ArmRecordError, match="engine_effective"):
        cell_dtypes(ds)


def test_weight_records_read_through_the_record():
    attrs = {"engine_weight_checksums": {"0": {"w": "a", "v": "b"}, "1": {"w": "c"}, "2": {}},
             "trainer": {"weight_checksums_per_version": {"0": {"w": "a"}, "1": None}}}
    assert engine_effective(attrs) == {0: {"w": "a", "v": "b"}, 1: {"w": "c", "v": "b"}}
    assert trainer_checksums(attrs, [0, 1]) == {0: {"w": "a"}}
    one = {"trainer": {"weight_checksums": {"w": "z"}}}
    assert trainer_checksums(one, [4]) == {4: {"w": "z"}} and trainer_checksums(one, [4, 5]) == {}


def test_the_error_names_a_key_inside_a_json_string_and_a_mapping():
    with pytest.raises(ArmRecordError, match=r"^arm 'default': attrs\['engine_effective'\]\['dtype'\] = 3 is not a "
                                             r"string: "):
        ArmRecord.from_attrs({"engine_effective": '{"dtype": 3}'})
    with pytest.raises(ArmRecordError, match=r"^arm 'x': attrs\['versions'\]\['torch'\] = 2 is not a string: "):
        ArmRecord.from_attrs({"versions": {"torch": 2}}, arm="x")
    with pytest.raises(ArmRecordError, match=r"attrs\['engine_effective'\] = '\{oops' is not a mapping: "):
        ArmRecord.from_attrs({"engine_effective": "{oops"})  # not JSON: refused, not guessed


def test_accessors_of_a_record():
    rec = ArmRecord.from_attrs({"arm": "", "engine_effective": {"dtype": "float16"}, "trainer": {"dtype": "float32"}})
    assert rec.name == "" and rec.effective.dtype == "float16" and rec.requested is ArmRecord.EMPTY_ENGINE
    assert rec.scorer.dtype == "float32" and ArmRecord().scorer is ArmRecord.EMPTY_TRAINER
    assert arm_record({"arm": "m"}).arm == "m"  # the attrs themselves, or an arm


def test_attrs_that_are_no_mapping_are_refused():
    with pytest.raises(ArmRecordError, match=r"^arm 'default': attrs = \['arm'\] is not a mapping: "):
        ArmRecord.from_attrs(["arm"])


def test_the_records_document_every_field():
    """The API page of the record is its schema: every stored key with its type and meaning."""
    doc = ArmRecord.__doc__
    assert doc.startswith("An arm's metadata, every key a store holds typed")
    for name in ("engine_effective : EngineRecord, optional", "latest_policy_version : int, optional",
                 "import_ : dict[str, Any], optional", "**extra_data : Any"):
        assert name in doc
    assert "logprobs_mode : str, optional" in EngineRecord.__doc__


def test_an_rl_step_reads_typed():
    """issue 35: the RL runner's record (rl) and its mid-run fault are typed, read as attributes."""
    rec = arm_record({"rl": {"run": "p+mu", "step": 3, "lr": 1e-3, "alarms": ["gap_above_gate"],
                             "fault": {"cause": "raw_logprobs", "from_step": 2, "on": True}}})
    step = rec.rl_step
    assert (step.run, step.step, step.lr, step.alarms) == ("p+mu", 3, 1e-3, ["gap_above_gate"])
    assert (step.fault.cause, step.fault.from_step, step.fault.on) == ("raw_logprobs", 2, True)
    assert rec.to_attrs()["rl"]["fault"] == {"cause": "raw_logprobs", "from_step": 2, "on": True}
    assert ArmRecord().rl_step is ArmRecord.EMPTY_RL and ArmRecord().rl_step.fault is None
    assert arm_record({"rl": {"step": 1}}).rl_step.fault is None  # a run without a fault
    with pytest.raises(ArmRecordError, match=r"attrs\['rl'\]\['fault'\]\['on'\] = 'yes' is not true or false"):
        arm_record({"rl": {"fault": {"on": "yes"}}})
    with pytest.raises(ArmRecordError, match=r"attrs\['rl'\]\['step'\] = 2.0 is not an integer"):
        arm_record({"rl": {"step": 2.0}})


def test_the_name_is_read_without_the_record():
    """arm_name reads the stored name as dict.get would, even where the rest of the attrs is invalid."""
    from rlparity.trace import arm_name

    assert arm_name({"arm": "a", "rl": "not json"}) == "a"  # the record would refuse rl
    assert arm_name({}) == "default" and arm_name({}, None) is None and arm_name({"arm": None}, "x") is None
    assert arm_name({"arm": np.str_("b")}) == "b" and type(arm_name({"arm": np.str_("b")})) is str
