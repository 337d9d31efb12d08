"""Importers of other frameworks' rollout dumps (rlparity.io), on the fixtures in tests/data/io.

The fixtures are written by scripts/make_io_fixtures.py the way each framework's public source
writes its files, with values from the tiny model: tokens sampled at temperature 0.7 (top-k 8 for
NeMo-RL and PipelineRL), engine logprobs processed (parity dumps, 0.002 nats of engine noise) or
raw (raw-mode dumps), trainer logprobs as each framework's trainer computes them. No engine runs.
"""

import json
import math
import os
import shutil
import types
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from rlparity import io as rio
from rlparity.diagnose import Severity, diagnose
from rlparity.io.common import ImportFormatError, MissingSamplingError, PickleRefusedError
from rlparity.metrics import summary
from rlparity.trace import open_arms, validate

DATA = Path(__file__).parent / "data" / "io"
PRIME = DATA / "prime-rl" / "token_exports"
NEMO = DATA / "nemo-rl"
SLIME = DATA / "slime"
PIPE = DATA / "pipelinerl"
VERL = DATA / "generic" / "verl" / "step_5.npz"
CUSTOM = DATA / "generic" / "custom"
NEMO_SAMPLING = {"temperature": 0.7, "top_k": 8, "top_p": 1.0}

# format, path, options, {arm: trainer reading}
CASES = [
    ("prime-rl", PRIME, {"temperature": 0.7}, {"step_3_rank_0": "processed", "step_3_rank_1": "processed"}),
    ("nemo-rl", NEMO / "parity", NEMO_SAMPLING, {"step_1": "processed"}),
    ("nemo-rl", NEMO / "raw_mode", NEMO_SAMPLING, {"step_1": "processed"}),
    ("slime", SLIME / "rollout_data", {"temperature": 0.7}, {"rollout_2": None}),
    ("slime", SLIME / "train_data", {"temperature": 0.7}, {"rollout_2_train": "processed"}),
    ("pipelinerl", PIPE / "parity", NEMO_SAMPLING, {"actor_0_0_0": None}),
    ("generic", VERL, {}, {"step_5": "processed"}),
    ("generic", CUSTOM / "rows.jsonl", {"temperature": 1.0, "top_k": 0, "top_p": 1.0}, {"rows": "processed+raw"}),
    ("generic", CUSTOM / "rows.parquet", {}, {"rows": "processed"}),
]


def _data(ds):
    return ds.drop_attrs()


@pytest.mark.parametrize("fmt,path,opts,readings", CASES, ids=[f"{c[0]}:{c[1].relative_to(DATA)}" for c in CASES])
def test_import_validates_and_round_trips_through_a_store(tmp_path, fmt, path, opts, readings):
    result = rio.import_to_store(fmt, path, tmp_path / "s.zarr", progress=False, **opts)
    assert set(result.arms) == set(readings)
    stored = open_arms(tmp_path / "s.zarr")  # validates every arm
    in_memory = rio.read(fmt, path, **opts)
    assert set(stored) == set(in_memory) == set(readings)
    for arm, reading in readings.items():
        ds = validate(stored[arm])
        xr.testing.assert_identical(_data(ds), _data(in_memory[arm]))
        imp = ds.attrs["import"]
        assert ds.attrs["capture_backend"] == f"import:{fmt}"
        assert imp["format"] == fmt and imp["n_sequences"] == ds.sizes["sequence"] > 0
        assert imp["user_supplied"] == {k: v for k, v in opts.items()}
        if reading is None:
            assert "trainer" not in ds.attrs and "trainer_logprob" not in ds and "trainer_processed_logprob" not in ds
            assert "trainer_logprobs" in imp["fields_missing"]
        else:
            assert ds.attrs["trainer"]["reading"] == reading and ds.attrs["trainer"]["source"] == f"import:{fmt}"
            assert ("trainer_processed_logprob" in ds) and (("trainer_logprob" in ds) == ("raw" in reading))
            # no invented trainer variables
            assert "trainer_token_rank" not in ds and "trainer_max_logit" not in ds


def test_formats_are_listed():
    assert set(rio.formats()) == {"prime-rl", "nemo-rl", "slime", "pipelinerl", "generic"}
    with pytest.raises(ValueError, match="unknown format 'trl'.*prime-rl"):
        rio.read("trl", PRIME)


def test_prime_rl_packed_records_are_unpacked_and_turns_split():
    ds = rio.read("prime-rl", PRIME / "step_3" / "rank_0.jsonl", temperature=0.7)["step_3_rank_0"]
    lines = [json.loads(x) for x in (PRIME / "step_3" / "rank_0.jsonl").read_text().splitlines()]
    # 9 lines; the last packs two samples (position_ids restart at 0); the first has two assistant turns
    assert len(lines) == 9 and lines[-1]["position_ids"].count(0) == 2
    assert ds.attrs["import"]["n_records"] == 10 and ds.sizes["sequence"] == 11
    assert ds.attrs["import"]["n_multi_turn_records"] == 1
    # turn 2's prompt is everything before it (turn 1 and the tool tokens), its tokens/logprobs the file's
    first = lines[0]
    mask = np.array(first["loss_mask"])
    runs = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    (s1, e1), (s2, e2) = runs.reshape(-1, 2)
    p2 = ds["prompt_token_id"].values[1]
    assert p2[p2 >= 0].tolist() == first["token_ids"][:s2]
    assert ds["token_id"].values[1, : e2 - s2].tolist() == first["token_ids"][s2:e2]
    np.testing.assert_array_equal(ds["rollout_logprob"].values[1, : e2 - s2], first["inference_logprobs"][s2:e2])
    np.testing.assert_array_equal(ds["trainer_processed_logprob"].values[1, : e2 - s2], first["trainer_logprobs"][s2:e2])
    # prime-rl's entropy is the same tempered distribution's: kept, under the same reading
    np.testing.assert_array_equal(ds["trainer_processed_entropy"].values[0, : e1 - s1], first["entropy"][s1:e1])
    # the unpacked second sample of the last line starts a fresh prompt
    last = lines[-1]
    cut = last["position_ids"].index(0, 1)
    p_last = ds["prompt_token_id"].values[-1]
    assert p_last[p_last >= 0].tolist() == [t for t, m in zip(last["token_ids"][cut:], last["loss_mask"][cut:]) if not m]
    assert ds.attrs["trainer"]["decided_from"].startswith("PrimeIntellect-ai/prime-rl src/prime_rl/trainer/rl/train.py")
    assert ds.attrs["import"]["framework_defaults"]["top_p"]["value"] == 1.0
    assert ds.attrs["sampling_unknown"] == ["top_k"]  # prime-rl sends no top_k unless extra_body does


def test_nemo_rl_raw_mode_vs_parity_on_the_frameworks_own_reading():
    """With NeMo-RL's one (processed) trainer reading, the raw-mode dump shows the signature a
    single reading can give: mean d = E_x~sampler[log p_proc - log p_raw] = KL(p_proc || p_raw) > 0
    and E[pi/mu] > 1, where a faithful rollout has E_mu[pi/mu] = 1 and mean d = -KL(mu||pi) <= 0."""
    parity = rio.read("nemo-rl", NEMO / "parity", **NEMO_SAMPLING)["step_1"]
    raw = rio.read("nemo-rl", NEMO / "raw_mode", **NEMO_SAMPLING)["step_1"]
    sp, sr = summary(parity, "processed"), summary(raw, "processed")
    assert abs(float(sp["log_ratio_mean"])) < 0.002 and float(sp["abs_log_ratio_rms"]) < 0.005
    assert abs(float(sp["mean_ratio"]) - 1) < 0.005
    assert float(sr["log_ratio_mean"]) > 0.03 and float(sr["mean_ratio"]) > 1.05
    assert float(sr["abs_log_ratio_rms"]) > 0.1
    # the batch dimension of 1 NeMo-RL's logger keeps was removed, padding cut at input_lengths
    row = json.loads((NEMO / "parity" / "train_data_step1.jsonl").read_text().splitlines()[0])
    n = row["input_lengths"][0]
    ids = row["token_ids"][0][:n]
    got = np.concatenate([parity["prompt_token_id"].values[0][: parity["prompt_length"].values[0]],
                          parity["token_id"].values[0][: parity["response_length"].values[0]]])
    assert got.tolist() == ids and parity["reward"].values[0] == row["rewards"][0]


def test_diagnose_a_single_reading_import():
    """An import carries the framework's one trainer reading: the semantic verdict comes from the
    mean offset (a faithful rollout has mean(d) + var(d)/2 = 0); the raw-mode dump is caught."""
    bad = diagnose(rio.read("nemo-rl", NEMO / "raw_mode", **NEMO_SAMPLING))
    good = diagnose(rio.read("nemo-rl", NEMO / "parity", **NEMO_SAMPLING))
    f = next(f for f in bad if f.name == "logprobs_not_processed")
    assert f.severity == Severity.ERROR and f.evidence["offset_z"] > 4 and "processed_logprobs" in f.fix
    assert not good.problems(), str(good)
    assert "logprobs_processed" in good.names(Severity.INFO)


def test_pipelinerl_rollout_side_scored_then_diagnosed(tiny_model):
    """PipelineRL streams carry the rollout side only; `rlparity score` adds the trainer: the
    raw-mode stream gets the raw-logprobs verdict, the parity stream a clean one."""
    from rlparity.score import score

    verdicts = {}
    for name in ("parity", "raw_mode"):
        ds = rio.read("pipelinerl", PIPE / name, **NEMO_SAMPLING)["actor_0_0_0"]
        assert "trainer_logprob" not in ds and "rlparity score" in " ".join(ds.attrs["import"]["notes"])
        assert sorted(set(ds["policy_version"].values[ds["response_mask"].values].tolist())) == [0, 1, 2, 3]
        assert set(ds["finish_reason"].values.tolist()) <= {"stop", "length"}
        verdicts[name] = diagnose(score(ds, tiny_model, progress=False))
    raw = verdicts["raw_mode"].findings
    f = next(f for f in raw if f.name == "raw_logprobs_used_as_processed")
    assert f.severity == Severity.ERROR and f.evidence["rms_d_vs_trainer_raw"] < 0.005
    assert f.evidence["rms_d_vs_trainer_processed"] > 0.1
    assert "logprobs_processed" in verdicts["parity"].names(Severity.INFO)
    # the stream records model versions 0-3 but one model scored every token: said, and nothing else
    assert verdicts["parity"].names() == {"scored_at_one_version"}, str(verdicts["parity"])


def test_generic_identity_sampling_fills_both_readings_and_diagnoses():
    arms = rio.read("generic", CUSTOM / "rows.jsonl", temperature=1.0, top_k=0, top_p=1.0)
    ds = arms["rows"]
    np.testing.assert_array_equal(ds["trainer_logprob"].values, ds["trainer_processed_logprob"].values)
    assert ds.attrs["import"]["n_multi_turn_records"] == 1 and ds.attrs["import"]["fields_missing"] == []
    assert (ds["policy_version"].values[ds["response_mask"].values] == 7).all()
    report = diagnose(arms)
    assert "logprob_semantics_untestable" in report.names(Severity.INFO) and not report.problems()


def test_generic_npz_in_verls_layout():
    ds = rio.read("generic", VERL)["step_5"]
    with np.load(VERL) as z:
        ids, att, rm, lp = z["input_ids"], z["attention_mask"], z["response_mask"], z["rollout_log_probs"]
    P = ids.shape[1] - rm.shape[1]
    for i in range(ids.shape[0]):
        prompt = ids[i, :P][att[i, :P] == 1]
        assert ds["prompt_token_id"].values[i][: len(prompt)].tolist() == prompt.tolist()
        n = int(rm[i].sum())
        assert ds["token_id"].values[i, :n].tolist() == ids[i, P: P + n].tolist()
        np.testing.assert_allclose(ds["rollout_logprob"].values[i, :n], lp[i, :n].astype(np.float64))
    # file-level scalars: temperature 0.7, verl's top_k=-1 (off) stored as 0; not user-supplied
    assert set(ds["temperature"].values) == {0.7} and set(ds["top_k"].values) == {0}
    assert ds.attrs["import"]["user_supplied"] == {} and ds.attrs["sampling_unknown"] == []
    assert ds.attrs["import"]["file_sampling"] == {"temperature": 0.7, "top_k": -1, "top_p": 1.0}


def test_verl_snippet_of_the_docs_writes_an_importable_file(tmp_path, monkeypatch):
    """The five-line snippet of GENERIC_FORMAT.md, run on verl-shaped tensors (batch.batch)."""
    import torch

    doc = (Path(rio.__file__).parent / "GENERIC_FORMAT.md").read_text()
    snippet = doc.split("**From verl**")[1].split("```python")[1].split("```")[0]
    assert len(snippet.strip().splitlines()) == 5
    with np.load(VERL) as z:
        tensors = {k: torch.tensor(z[k]) for k in ("input_ids", "attention_mask", "response_mask",
                                                   "rollout_log_probs", "old_log_probs")}
    rollout_cfg = types.SimpleNamespace(temperature=0.7, top_k=-1, top_p=1.0)
    trainer = types.SimpleNamespace(global_steps=5, config=types.SimpleNamespace(
        actor_rollout_ref=types.SimpleNamespace(rollout=rollout_cfg)))
    monkeypatch.chdir(tmp_path)
    exec(snippet, {"batch": types.SimpleNamespace(batch=tensors), "self": trainer})
    got = rio.read("generic", tmp_path / "rlparity_dump")["step_5"]
    xr.testing.assert_identical(_data(got), _data(rio.read("generic", VERL)["step_5"]))


def test_slime_rollout_and_train_dumps():
    arms = rio.read("slime", SLIME / "rollout_data", temperature=0.7)
    ro = arms["rollout_2"]
    assert ro.attrs["import"]["dump"] == "rollout" and "trainer_logprob" not in ro
    assert (ro["policy_version"].values[ro["response_mask"].values] == 5).all()  # weight_versions ["5"]
    assert ro.attrs["import"]["n_multi_turn_records"] == 1
    tr = rio.read("slime", SLIME / "train_data", temperature=0.7)["rollout_2_train"]
    # the train dump's rollout side equals the rollout dump's; it adds the trainer's log_probs
    np.testing.assert_allclose(tr["rollout_logprob"].values, ro["rollout_logprob"].values, atol=1e-6)
    s = summary(tr, "processed")
    assert abs(float(s["log_ratio_mean"])) < 0.002 and float(s["abs_log_ratio_rms"]) < 0.005
    assert "policy_version" in tr.attrs["import"]["fields_missing"]


def test_pt_that_needs_pickle_is_refused_without_running_it(tmp_path):
    import torch

    with pytest.raises(PickleRefusedError, match=r"types\.SimpleNamespace.*weights_only=True.*never falls back"):
        rio.read("slime", SLIME / "needs_pickle.pt")
    # a file whose unpickling would run code: refused, and the code never ran
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({"rollout_id": 1, "samples": [Evil()]}, tmp_path / "evil.pt")
    with pytest.raises(PickleRefusedError, match="refused"):
        rio.read("slime", tmp_path / "evil.pt")
    assert not marker.exists()


def test_missing_sampling_parameters_are_recorded_and_asked_for():
    ds = rio.read("pipelinerl", PIPE / "parity")["actor_0_0_0"]
    assert ds.attrs["sampling_unknown"] == ["temperature", "top_k", "top_p"]
    assert np.isnan(ds["temperature"].values).all() and (ds["top_k"].values == -1).all()
    assert rio.sampling_unknown(ds) == ["temperature", "top_k", "top_p"]
    with pytest.raises(MissingSamplingError) as err:
        rio.require_sampling(ds, ["temperature"], needed_for="rescoring the processed reading")
    msg = str(err.value)
    assert "rescoring the processed reading needs temperature" in msg and "--temperature 0.7" in msg
    assert "rlparity import pipelinerl" in msg and "top_k" not in msg
    given = rio.read("pipelinerl", PIPE / "parity", temperature=0.7, top_k=-1)["actor_0_0_0"]
    assert given.attrs["import"]["user_supplied"] == {"temperature": 0.7, "top_k": 0}
    assert given.attrs["sampling_unknown"] == ["top_p"]
    rio.require_sampling(given, ["temperature", "top_k"])
    # an option that contradicts the dump is an error, not an override
    with pytest.raises(ImportFormatError, match=r"records temperature=0.7 but --temperature 1.0"):
        rio.read("generic", VERL, temperature=1.0)
    with pytest.raises(ValueError, match="top_p=1.5"):
        rio.read("pipelinerl", PIPE / "parity", top_p=1.5)


def test_trainer_reading_can_be_overridden():
    raw = rio.read("prime-rl", PRIME, temperature=0.7, trainer_reading="raw")["step_3_rank_1"]
    assert "trainer_logprob" in raw and "trainer_processed_logprob" not in raw
    assert raw.attrs["trainer"]["reading"] == "raw"
    none = rio.read("prime-rl", PRIME, temperature=0.7, trainer_reading="none")["step_3_rank_1"]
    assert not any(v.startswith("trainer_") for v in none.data_vars) and "trainer" not in none.attrs
    with pytest.raises(ValueError, match="trainer_reading='tempered'"):
        rio.read("prime-rl", PRIME, trainer_reading="tempered")


def test_cut_the_trainer_does_not_apply_and_copied_trainer_side_are_flagged(tmp_path):
    # verl computes old_log_probs without top-k: with top_k=50 they are not the sampler's distribution
    rows = [json.loads(x) for x in (CUSTOM / "rows.jsonl").read_text().splitlines()]
    for r in rows:
        r["top_k"] = 50
    rows[1]["old_log_probs"] = rows[1]["rollout_log_probs"]  # bypass mode: a copy
    (tmp_path / "cut.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = rio.import_to_store("generic", tmp_path / "cut.jsonl", tmp_path / "s.zarr", progress=False)
    tr = open_arms(tmp_path / "s.zarr")["cut"].attrs["trainer"]
    assert tr["not_renormalized_sequences"] == 9 and tr["copied_from_rollout_sequences"] == 1
    text = str(result)
    assert "top-k/top-p cut the framework's trainer does not apply" in text and "a copy" in text


def _corrupt(src: Path, dst: Path, lineno: int, text: str) -> Path:
    lines = src.read_text().splitlines(keepends=True)
    lines[lineno - 1] = text
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("".join(lines))
    return dst


def test_bad_lines_name_file_and_line(tmp_path):
    src = PRIME / "step_3" / "rank_0.jsonl"
    bad = _corrupt(src, tmp_path / "a" / "rank_0.jsonl", 3, '{"token_ids": [1, 2,\n')
    with pytest.raises(ImportFormatError, match=rf"{bad}:3: not valid JSON"):
        rio.read("prime-rl", bad)
    rec = json.loads(src.read_text().splitlines()[1])
    del rec["loss_mask"]
    bad = _corrupt(src, tmp_path / "b" / "rank_0.jsonl", 2, json.dumps(rec) + "\n")
    with pytest.raises(ImportFormatError, match=rf"{bad}:2: no field 'loss_mask'"):
        rio.read("prime-rl", bad)
    rec = json.loads(src.read_text().splitlines()[3])
    rec["inference_logprobs"] = rec["inference_logprobs"][:-1]
    bad = _corrupt(src, tmp_path / "c" / "rank_0.jsonl", 4, json.dumps(rec) + "\n")
    with pytest.raises(ImportFormatError, match=rf"{bad}:4: 'inference_logprobs' has \d+ entries"):
        rio.read("prime-rl", bad)
    text = (PIPE / "parity" / "streams" / "actor" / "0" / "0" / "0.jsonl").read_text().splitlines()
    group = json.loads(text[4])
    group[1]["logprobs"] = group[1]["logprobs"][:-2]
    bad = _corrupt(PIPE / "parity" / "streams" / "actor" / "0" / "0" / "0.jsonl", tmp_path / "p.jsonl", 5,
                   json.dumps(group) + "\n")
    with pytest.raises(ImportFormatError, match=rf"{bad}:5 \(text 1\): \d+ predicted tokens .* but \d+ logprobs"):
        rio.read("pipelinerl", bad)


def test_small_chunks_give_the_same_store_as_one_chunk(tmp_path, monkeypatch):
    from rlparity.io import generic

    monkeypatch.setattr(generic, "NPZ_ROWS", 3)  # .npz members read 3 rows at a time from the zip
    for fmt, path, opts in (("prime-rl", PRIME, {"temperature": 0.7}), ("generic", VERL, {})):
        one = rio.import_to_store(fmt, path, tmp_path / f"{fmt}1.zarr", chunk_size=10_000, progress=False, **opts)
        many = rio.import_to_store(fmt, path, tmp_path / f"{fmt}3.zarr", chunk_size=3, progress=False, **opts)
        a, b = open_arms(one.store), open_arms(many.store)
        assert list(a) == list(b)
        for arm in a:
            xr.testing.assert_identical(_data(a[arm]), _data(b[arm]))
            strip = ("created_at",)
            assert {k: v for k, v in a[arm].attrs.items() if k not in strip} == \
                   {k: v for k, v in b[arm].attrs.items() if k not in strip}
    # the chunks really are bounded: 16 sequences in chunks of 3 -> 6 chunks
    from rlparity.io.common import SamplingResolver
    from rlparity.io.formats import get_format, stream_chunks

    chunks = list(stream_chunks(get_format("pipelinerl"), PIPE / "parity", sampling=SamplingResolver({}),
                                trainer_reading=None, chunk_size=3, progress=False, builders={}))
    assert [c.sizes["sequence"] for _, c in chunks] == [3, 3, 3, 3, 3, 1]


def test_progress_bar_and_summary(tmp_path, capsys):
    result = rio.import_to_store("nemo-rl", NEMO / "parity", tmp_path / "s.zarr", temperature=0.7, top_k=8)
    err = capsys.readouterr().err
    assert "import nemo-rl" in err
    text = str(result)
    assert "step_1: 12 sequences" in text and "--top-p 0.95" in text and "unknown: top_p" in text


def test_nothing_half_written_on_failure(tmp_path):
    src = tmp_path / "dump"
    src.mkdir()
    shutil.copy(CUSTOM / "rows.jsonl", src / "a_good.jsonl")
    _corrupt(CUSTOM / "rows.jsonl", src / "b_bad.jsonl", 6, "not json\n")
    out = tmp_path / "out" / "s.zarr"
    with pytest.raises(ImportFormatError, match=r"b_bad.jsonl:6"):
        rio.import_to_store("generic", src, out, progress=False, chunk_size=2)
    assert not out.exists() and os.listdir(out.parent) == []
    # an existing store: kept as it was when the import fails, refused without overwrite
    good = rio.import_to_store("generic", CUSTOM / "rows.jsonl", out, progress=False).store
    before = {p.relative_to(good): p.read_bytes() for p in good.rglob("*") if p.is_file()}
    with pytest.raises(FileExistsError, match="overwrite"):
        rio.import_to_store("generic", CUSTOM / "rows.jsonl", out, progress=False)
    with pytest.raises(ImportFormatError):
        rio.import_to_store("generic", src, out, progress=False, overwrite=True)
    after = {p.relative_to(good): p.read_bytes() for p in good.rglob("*") if p.is_file()}
    assert before == after and sorted(os.listdir(out.parent)) == ["s.zarr"]
    assert math.isclose(float(open_arms(out)["rows"]["reward"].values[0]),
                        json.loads((CUSTOM / "rows.jsonl").read_text().splitlines()[0])["reward"])
