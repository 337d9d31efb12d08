"""Importers of other frameworks' rollout dumps (rlparity.importers), on the fixtures in tests/data/io.

The fixtures are written by each framework's own serialization code at a pinned commit
(scripts/peers/, run by scripts/make_io_fixtures.py with their heavy imports stubbed), with values
from the tiny model: tokens sampled at temperature 0.7 (top-k 8 for NeMo-RL and PipelineRL),
engine logprobs processed (parity dumps, 0.002 nats of engine noise) or raw (raw-mode dumps),
trainer logprobs as each framework's trainer computes them. No engine runs. Counts are checked
against the files read directly with json / torch / numpy (the reference), verdicts against what
each fixture was built to show.
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

from rlparity import importers as rio
from rlparity.diagnose import Severity, diagnose
from rlparity.importers.errors import ImportFormatError, PickleRefusedError
from rlparity.importers.sampling import MissingSamplingError
from rlparity.metrics import summary
from rlparity.trace import open_arms, validate

DATA = Path(__file__).parent / "data" / "io"
PRIME = DATA / "prime-rl" / "single" / "token_exports"
PRIME_MULTI = DATA / "prime-rl" / "multirun"
NEMO = DATA / "nemo-rl" / "logs"
SLIME = DATA / "slime" / "debug"
PIPE = DATA / "pipelinerl"
VERL = DATA / "generic" / "verl" / "rlparity_dump" / "step_5.npz"
TRL = DATA / "trl" / "rlparity_dump"
CUSTOM = DATA / "generic" / "custom"
K8 = {"temperature": 0.7, "top_k": 8, "top_p": 1.0}
T07 = {"temperature": 0.7, "top_k": 0, "top_p": 1.0}

# format, path, options, {arm: trainer reading}
CASES = [
    ("prime-rl", PRIME, {"temperature": 0.7}, {"step_3": "processed", "step_4": "processed"}),
    ("prime-rl", PRIME_MULTI, {"temperature": 0.7}, {"run_a_step_7": "processed", "run_b_step_7": "processed"}),
    ("nemo-rl", NEMO, K8, {"exp_001_step_1": "processed", "exp_002_step_1": "processed"}),
    ("slime", SLIME, {"temperature": 0.7}, {"rollout_2": None, "rollout_eval_2": None, "rollout_2_train": "processed"}),
    ("pipelinerl", PIPE / "exp", K8, {"actor": None, "actor_test": None}),
    ("generic", VERL, {}, {"step_5": "processed"}),
    ("generic", TRL, {}, {"step_5": "processed"}),
    ("generic", CUSTOM / "rows.jsonl", {"temperature": 1.0, "top_k": 0, "top_p": 1.0}, {"rows": "processed+raw"}),
    ("generic", CUSTOM / "rows.parquet", {}, {"rows": "processed"}),
]


def _data(ds):
    return ds.drop_attrs()


def _lines(path: Path) -> list:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


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
        assert ds.attrs["capture_backend"] == f"import:{fmt}" and imp["coords"] == result.arms[arm]["coords"]
        assert imp["format"] == fmt and imp["n_sequences"] == ds.sizes["sequence"] > 0
        assert imp["n_tokens"] == int(ds["response_mask"].sum())
        assert imp["user_supplied"] == opts
        if reading is None:
            assert "trainer" not in ds.attrs and "trainer_logprob" not in ds and "trainer_processed_logprob" not in ds
            assert "trainer_logprobs" in imp["fields_missing"]
        else:
            assert ds.attrs["trainer"]["reading"] == reading and ds.attrs["trainer"]["source"] == f"import:{fmt}"
            assert ("trainer_processed_logprob" in ds) and (("trainer_logprob" in ds) == ("raw" in reading))
            assert "trainer_token_rank" not in ds and "trainer_max_logit" not in ds  # nothing invented


def test_formats_are_listed():
    assert set(rio.formats()) == {"prime-rl", "nemo-rl", "slime", "pipelinerl", "generic"}
    with pytest.raises(ValueError, match="unknown format 'trl'.*prime-rl.*From TRL"):
        rio.read("trl", PRIME)


# ----------------------------------------------------------------------------- one arm per (run, launch, split, step)


def test_runs_launches_and_splits_are_separate_arms_with_coordinates():
    """The merges of the first pass: two prime-rl runs of the multi-run trainer (trainer step 0,
    export step 7), two NeMo-RL launches with the same train_data_step1.jsonl, slime's eval dump
    of rollout 2 next to the training one; each is its own arm, selected by its coordinates."""
    multi = rio.read("prime-rl", PRIME_MULTI, temperature=0.7)
    table = rio.coordinates(multi)
    assert sorted(table["run"].values.tolist()) == ["run_a", "run_b"] and set(table["step"].values) == {7}
    for run in ("run_a", "run_b"):
        (ds,) = rio.select(multi, run=run, step=7).values()
        lines = _lines(PRIME_MULTI / run / "token_exports" / "step_7" / "rank_0.jsonl")
        assert {r["run_id"] for r in lines} == {run} and {r["step"] for r in lines} == {0}  # the trainer's own step
        assert ds.attrs["import"]["trainer_step"] == 0 and ds.sizes["sequence"] == len(lines)
        assert ds["token_id"].values[0][ds["response_mask"].values[0]].tolist() == \
            [t for t, m in zip(lines[0]["token_ids"], lines[0]["loss_mask"]) if m]
    nemo = rio.read("nemo-rl", NEMO, **K8)
    assert {a: ds.attrs["import"]["coords"]["launch"] for a, ds in nemo.items()} == \
        {"exp_001_step_1": "exp_001", "exp_002_step_1": "exp_002"}
    assert set(rio.coordinates(nemo)["step"].values) == {1}
    slime = rio.read("slime", SLIME, temperature=0.7)
    split = {a: (ds.attrs["import"]["coords"]["split"], ds.attrs["import"]["coords"]["step"]) for a, ds in slime.items()}
    assert split == {"rollout_2": ("train", 2), "rollout_eval_2": ("eval", 2), "rollout_2_train": ("train", 2)}
    assert list(rio.select(slime, split="eval")) == ["rollout_eval_2"]
    assert list(rio.select(slime, kind="train")) == ["rollout_2_train"]
    # the eval dump holds other samples than the training one, and stays apart
    assert slime["rollout_eval_2"].sizes["sequence"] == 4 and slime["rollout_2"].sizes["sequence"] == 8
    pipe = rio.read("pipelinerl", PIPE, **K8)
    assert {a: (c["launch"], c["split"]) for a, c in ((a, ds.attrs["import"]["coords"]) for a, ds in pipe.items())} == {
        "exp_actor": ("exp", "train"), "exp_actor_test": ("exp", "eval"), "raw_exp_actor": ("raw_exp", "train")}
    with pytest.raises(ValueError, match="unknown coordinate"):
        rio.select(slime, rollout=2)


def test_shards_of_one_arm_join_other_files_of_one_arm_are_refused(tmp_path):
    """prime-rl's rank files and PipelineRL's partitions are parts of one arm; two NeMo-RL files
    of one step in one launch, or two slime dumps of one rollout, are refused naming both."""
    prime = rio.read("prime-rl", PRIME, temperature=0.7)["step_3"]
    ranks = [_lines(PRIME / "step_3" / f"rank_{r}.jsonl") for r in (0, 1)]
    assert prime.attrs["import"]["rank"] == [0, 1] and len(prime.attrs["import"]["file"]) == 2
    assert prime.attrs["import"]["n_records"] == sum(len(r) for r in ranks)
    actor = rio.read("pipelinerl", PIPE / "exp" / "streams" / "actor", **K8)["actor"]
    groups = [g for p in (0, 1) for g in _lines(PIPE / "exp" / "streams" / "actor" / "0" / str(p) / "0.jsonl")]
    assert actor.sizes["sequence"] == sum(len(g) for g in groups) == 16
    # PipelineRL groups: group_id -> prompt_index, metadata.rollout_index -> sample_index
    assert len(set(actor["prompt_index"].values.tolist())) == len(groups)
    assert sorted(actor["sample_index"].values.tolist()) == sorted(t["metadata"]["rollout_index"] for g in groups for t in g)
    d = tmp_path / "logs" / "exp_001"
    d.mkdir(parents=True)
    shutil.copy(NEMO / "exp_001" / "train_data_step1.jsonl", d / "train_data_step1.jsonl")
    shutil.copy(NEMO / "exp_001" / "train_data_step1.jsonl", d / "train_data_step01.jsonl")
    with pytest.raises(ImportFormatError, match=r"train_data_step1.jsonl and .*train_data_step01.jsonl both hold arm "
                                                r"'step_1'.*import them separately"):
        rio.read("nemo-rl", tmp_path / "logs", **K8)
    s = tmp_path / "slime"
    s.mkdir()
    shutil.copy(SLIME / "rollout_2.pt", s / "rollout_2.pt")
    shutil.copy(SLIME / "rollout_2.pt", s / "copy_of_rollout_2.pt")
    with pytest.raises(ImportFormatError, match="both hold arm 'rollout_2'"):
        rio.read("slime", s)


# ----------------------------------------------------------------------------- masks, nulls, rewards


def _prime_reference(path: Path) -> tuple[int, int, int]:
    """RL tokens, CE-only tokens and RL-weight-0 tokens of a prime-rl export, read directly:
    prime-rl measures its mismatch where loss_mask & (rl_weights != 0 | ref_kl_weights != 0)."""
    used = ce = zero = 0
    for r in _lines(path):
        for i, m in enumerate(r["loss_mask"]):
            rl, c, kl = (r[k][i] for k in ("rl_weights", "ce_weights", "ref_kl_weights"))
            if not m:
                continue
            if rl is None and kl is None:
                used += 1
            elif (rl or 0) != 0 or (kl or 0) != 0:
                used += 1
            elif (c or 0) != 0:
                ce += 1
            else:
                zero += 1
    return used, ce, zero


def test_prime_rl_weight_streams_are_honoured_and_counted():
    """A packed step with CE-only (distillation) samples, whose inference_logprobs are 0.0
    placeholders, and a zero-advantage sample (rl_weights 0): prime-rl leaves both out of its
    mismatch; so does the import, counting them. Counting them breaks the parity of the batch."""
    arms = rio.read("prime-rl", PRIME, temperature=0.7)
    ds = arms["step_3"]
    refs = [_prime_reference(PRIME / "step_3" / f"rank_{r}.jsonl") for r in (0, 1)]
    used, ce, zero = (sum(x) for x in zip(*refs))
    assert ce == 20 and zero == 10 and used == int(ds["response_mask"].sum()) == ds.attrs["import"]["n_tokens"]
    excluded = ds.attrs["import"]["excluded"]
    assert excluded["ce_only"]["tokens"] == ce and excluded["rl_weight_0"]["tokens"] == zero
    assert excluded["ce_only"]["records_left_empty"] == 2 and ds.attrs["import"]["n_excluded_tokens"] == ce + zero
    s = summary(ds, "processed")
    assert abs(float(s["log_ratio_mean"])) < 0.002 and float(s["abs_log_ratio_max"]) < 0.01
    assert abs(float(s["mean_ratio"]) - 1) < 0.005
    assert not diagnose(arms["step_3"]).problems()


def test_without_the_weight_streams_the_same_step_looks_broken(tmp_path):
    """The control: the same records with rl/ce weights removed (what the first importer read):
    the CE-only tokens' placeholder 0.0 count as engine logprobs and the batch fails parity."""
    d = tmp_path / "token_exports" / "step_3"
    d.mkdir(parents=True)
    for r in (0, 1):
        lines = _lines(PRIME / "step_3" / f"rank_{r}.jsonl")
        for rec in lines:
            for k in ("rl_weights", "ce_weights", "ref_kl_weights"):
                rec[k] = [None] * len(rec["token_ids"])
        (d / f"rank_{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    ds = rio.read("prime-rl", tmp_path / "token_exports", temperature=0.7)["step_3"]
    assert ds.attrs["import"]["n_excluded_tokens"] == 0
    s = summary(ds, "processed")
    assert float(s["mean_ratio"]) < 0.95 and float(s["abs_log_ratio_max"]) > 0.5
    assert diagnose(ds).problems()


def test_prime_rl_null_trainer_logprob_is_minus_inf_and_the_p0_check_runs():
    """prime-rl writes every non-finite float as null: a null trainer logprob (entropy finite)
    is a token of probability 0 for the trainer, imported as -inf and caught by the p=0 check."""
    lines = _lines(PRIME / "step_4" / "rank_0.jsonl")
    nulls = [(i, j) for i, r in enumerate(lines) for j, (v, m) in enumerate(zip(r["trainer_logprobs"], r["loss_mask"]))
             if v is None and m]
    assert len(nulls) == 1 and lines[nulls[0][0]]["entropy"][nulls[0][1]] is not None
    ds = rio.read("prime-rl", PRIME / "step_4", temperature=0.7)["step_4"]
    lp = ds["trainer_processed_logprob"].values[ds["response_mask"].values]
    assert int(np.isneginf(lp).sum()) == 1 and ds.attrs["trainer"]["zero_probability_tokens"] == 1
    report = diagnose(ds)
    assert "zero_probability_tokens" in report.names(Severity.ERROR)
    assert not {"logprobs_not_processed", "raw_logprobs_used_as_processed"} & report.names()


def test_prime_rl_null_with_null_entropy_and_null_engine_logprob_are_refused(tmp_path):
    """A null trainer logprob whose entropy is null too is NaN (a broken forward), a null engine
    logprob on a sampled token is no logprob: both refused with the file and line."""
    lines = _lines(PRIME / "step_4" / "rank_0.jsonl")
    i = next(k for k, r in enumerate(lines) if None in r["trainer_logprobs"])
    j = lines[i]["trainer_logprobs"].index(None)
    lines[i]["entropy"][j] = None
    f = tmp_path / "rank_0.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ImportFormatError, match=rf"rank_0.jsonl:{i + 1}: trainer_logprobs is NaN at token {j} "):
        rio.read("prime-rl", f, temperature=0.7)
    lines = _lines(PRIME / "step_3" / "rank_1.jsonl")
    k = lines[2]["loss_mask"].index(True)
    lines[2]["inference_logprobs"][k] = None
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ImportFormatError, match=rf"rank_0.jsonl:3: inference_logprobs is null/NaN at token {k} "):
        rio.read("prime-rl", f, temperature=0.7)


def test_nemo_rl_sample_mask_2d_rewards_groups_and_threshold(tmp_path):
    """exp_001: the two samples of one prompt carry sample_loss_mask 0; exp_002 (raw-mode) logs a
    2-d rewards and masks the sequences over seq_logprob_error_threshold (NeMo-RL's own function)."""
    arms = rio.read("nemo-rl", NEMO, **K8)
    for exp in ("exp_001", "exp_002"):
        rows = _lines(NEMO / exp / "train_data_step1.jsonl")
        masked = [r for r in rows if r["sample_loss_mask"][0] == 0]
        kept_tokens = sum(sum(r["token_loss_mask"][0]) for r in rows if r["sample_loss_mask"][0] == 1)
        ds = arms[f"{exp}_step_1"]
        assert int(ds["response_mask"].sum()) == kept_tokens and ds.sizes["sequence"] == len(rows) - len(masked)
        e = ds.attrs["import"]["excluded"]["sample_loss_mask_0"]
        assert e["records"] == len(masked) > 0 and e["tokens"] == sum(sum(r["token_loss_mask"][0]) for r in masked)
        # GRPO groups from identical prompt ids (idx is a row counter): consecutive pairs
        assert ds.attrs["import"]["n_records"] == len(rows)
    good, raw = arms["exp_001_step_1"], arms["exp_002_step_1"]
    assert len(_lines(NEMO / "exp_001" / "train_data_step1.jsonl")[0]["rewards"]) == 1
    assert np.isfinite(good["reward"].values).all()
    assert _lines(NEMO / "exp_002" / "train_data_step1.jsonl")[0]["rewards"][0][1] == pytest.approx(0.225)
    assert np.isnan(raw["reward"].values).all() and "rewards has 2 components" in " ".join(raw.attrs["import"]["notes"])
    pairs = good["prompt_index"].values
    assert len(set(pairs.tolist())) == 5 and all(np.bincount(pairs) == 2)  # 6 prompts x 2, one prompt masked
    warnings = rio.import_to_store("nemo-rl", NEMO, tmp_path / "n.zarr", progress=False, **K8
                                   ).arms["exp_002_step_1"]["warnings"]
    assert any("seq_logprob_error_threshold" in w and "1 sample(s)" in w for w in warnings)
    # sample_loss_mask is a loss multiplier: only 0 leaves a sample out
    rows = _lines(NEMO / "exp_001" / "train_data_step1.jsonl")
    rows[0]["sample_loss_mask"] = [0.5]
    (tmp_path / "train_data_step1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    weighted = rio.read("nemo-rl", tmp_path / "train_data_step1.jsonl", **K8)["step_1"]
    assert weighted.sizes["sequence"] == good.sizes["sequence"] and weighted.attrs["import"]["n_excluded_tokens"] == 20


def test_nemo_rl_text_only_logs_are_recognised(tmp_path):
    with pytest.raises(ImportFormatError, match=r"train_data_step1.jsonl:1: this is a distillation log "
                                                r"\(nemo_rl/algorithms/distillation.py.*no token ids or logprobs"):
        rio.read("nemo-rl", DATA / "nemo-rl" / "distillation")
    v = tmp_path / "only_val"
    v.mkdir()
    shutil.copy(NEMO / "exp_001" / "val_data_step0.jsonl", v)
    with pytest.raises(ImportFormatError, match="only val_data_step.*decoded text and rewards"):
        rio.read("nemo-rl", v)


def test_slime_train_dump_raw_reward_eval_and_removed_samples():
    import torch

    arms = rio.read("slime", SLIME, temperature=0.7)
    ro, tr = arms["rollout_2"], arms["rollout_2_train"]
    dump = torch.load(SLIME / "train_2_0.pt", weights_only=True)
    rollout = torch.load(SLIME / "rollout_2.pt", weights_only=True)["samples"]
    # the train dump's `rewards` are normalised; its reward is raw_reward[rollout_position]
    raw = dump["raw_reward"]
    assert raw == [s["reward"] for s in rollout]
    assert any(abs(float(s["rewards"]) - raw[s["rollout_position"]]) > 0.1 for s in dump["samples"])
    kept = [s for s in rollout if not s["remove_sample"]]
    assert sorted(set(tr["reward"].values.tolist())) == sorted(set(s["reward"] for s in kept))
    # remove_sample: left out of the rollout dump's arm (counted); zeroed loss mask in the train dump
    removed = [s for s in rollout if s["remove_sample"]]
    assert len(removed) == 1 and ro.attrs["import"]["excluded"]["remove_sample"]["tokens"] == sum(removed[0]["loss_mask"])
    assert tr.attrs["import"]["n_records_without_sampled_tokens"] == 1
    np.testing.assert_allclose(tr["rollout_logprob"].values, ro["rollout_logprob"].values, atol=1e-6)
    assert (ro["policy_version"].values[ro["response_mask"].values] == 5).all()  # weight_versions ["5"]
    assert ro.attrs["import"]["n_multi_turn_records"] == 1
    s = summary(tr, "processed")
    assert abs(float(s["log_ratio_mean"])) < 0.002 and float(s["abs_log_ratio_rms"]) < 0.005
    assert sorted(ro["prompt_index"].values.tolist()) == sorted(s["group_index"] for s in kept for _ in
                                                                 range(1 + (s["index"] == 0)))


def test_slime_dump_that_pickles_specinfo_is_refused_naming_the_class_and_versions(tmp_path):
    import torch

    with pytest.raises(PickleRefusedError) as err:
        rio.read("slime", DATA / "slime" / "specinfo")
    msg = str(err.value)
    assert "slime.utils.types.Sample.SpecInfo" in msg and "f81ecfe" in msg and "5472cab" in msg
    assert "getattr" not in msg and "weights_only=True" in msg
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({"rollout_id": 1, "samples": [Evil()]}, tmp_path / "evil.pt")
    with pytest.raises(PickleRefusedError, match="refused"):
        rio.read("slime", tmp_path / "evil.pt")
    assert not marker.exists()


# ----------------------------------------------------------------------------- every fixture, diagnosed

SEMANTIC_ERRORS = {"logprobs_not_processed", "raw_logprobs_used_as_processed", "logprobs_match_neither",
                   "zero_probability_tokens", "prompt_token_mismatch"}
# format, path, options, arm, built to show: "parity" (none of the semantic errors), "raw" (the
# raw-logprobs verdict), "p0" (a probability-0 trainer token, nothing else semantic)
VERDICTS = [
    ("prime-rl", PRIME, {"temperature": 0.7}, "step_3", "parity"),
    ("prime-rl", PRIME, {"temperature": 0.7}, "step_4", "p0"),
    ("prime-rl", PRIME_MULTI, {"temperature": 0.7}, "run_a_step_7", "parity"),
    ("prime-rl", PRIME_MULTI, {"temperature": 0.7}, "run_b_step_7", "parity"),
    ("nemo-rl", NEMO, K8, "exp_001_step_1", "parity"),
    ("nemo-rl", NEMO, K8, "exp_002_step_1", "raw"),
    ("slime", SLIME, T07, "rollout_2", "parity"),
    ("slime", SLIME, T07, "rollout_eval_2", "parity"),
    ("slime", SLIME, T07, "rollout_2_train", "parity"),
    ("pipelinerl", PIPE / "exp", K8, "actor", "parity"),
    ("pipelinerl", PIPE / "exp", K8, "actor_test", "parity"),
    ("pipelinerl", PIPE / "raw_exp", K8, "actor", "raw"),
    ("generic", VERL, {}, "step_5", "parity"),
    ("generic", TRL, {}, "step_5", "parity"),
    ("generic", CUSTOM / "rows.jsonl", {}, "rows", "parity"),
]


@pytest.fixture(scope="module")
def scorer(tiny_model):
    from rlparity.score import Scorer

    return Scorer(tiny_model, progress=False)


@pytest.mark.parametrize("fmt,path,opts,arm,shows", VERDICTS, ids=[f"{v[0]}:{v[1].relative_to(DATA)}:{v[3]}"
                                                                  for v in VERDICTS])
def test_every_fixture_is_diagnosed_with_the_verdict_it_was_built_for(fmt, path, opts, arm, shows, scorer):
    ds = rio.read(fmt, path, **opts)[arm]
    rescored = "trainer_processed_logprob" not in ds  # rollout side only: the tiny model adds the trainer
    if rescored:
        ds = scorer.score(ds)
    report = diagnose(ds)
    problems = report.names()
    if shows == "parity":
        assert not problems & SEMANTIC_ERRORS, str(report)
        assert ("logprobs_processed" in report.names(Severity.INFO)
                or "logprob_semantics_untestable" in report.names(Severity.INFO)), str(report)
    elif shows == "raw":
        assert problems & {"raw_logprobs_used_as_processed", "logprobs_not_processed"}, str(report)
    else:
        assert "zero_probability_tokens" in problems and not problems & (SEMANTIC_ERRORS - {"zero_probability_tokens"})
    if rescored and ds["prompt_text"].values[0]:
        # the imported prompt text, tokenized as the framework does, gives the engine's prompt ids
        assert "prompt_tokens_match" in report.names(Severity.INFO), str(report)


def test_prompt_text_is_imported_and_checked_with_the_frameworks_tokenization(scorer):
    """NeMo-RL's content and slime's prompt are chat-templated text tokenized without special
    tokens; PipelineRL's text[:-n_predicted] has the BOS stripped and is tokenized with them. Each
    import records the rule; tokenized the other way the check finds the extra BOS."""
    from rlparity.diagnose.processing import prompt_token_parity

    nemo = rio.read("nemo-rl", NEMO / "exp_001", **K8)["step_1"]
    row = _lines(NEMO / "exp_001" / "train_data_step1.jsonl")[0]
    assert nemo["prompt_text"].values[0] == row["content"][0][0]
    assert nemo.attrs["import"]["prompt_tokenization"]["add_special_tokens"] is False
    f = prompt_token_parity(scorer.score(nemo))
    assert f.name == "prompt_tokens_match" and f.evidence["n_checked"] == nemo.sizes["sequence"]
    wrong = nemo.copy()
    wrong.attrs = {**nemo.attrs, "import": {k: v for k, v in nemo.attrs["import"].items() if k != "prompt_tokenization"}}
    f = prompt_token_parity(scorer.score(wrong))
    assert f.name == "prompt_token_mismatch" and "one extra leading token" in f.summary
    pipe = rio.read("pipelinerl", PIPE / "exp" / "streams" / "actor_test", **K8)["actor_test"]
    text = _lines(PIPE / "exp" / "streams" / "actor_test" / "0" / "0" / "0.jsonl")[0][0]
    assert pipe["prompt_text"].values[0] == text["text"][: len(text["text"]) - text["n_predicted"]]
    slime = rio.read("slime", SLIME / "rollout_2.pt", **T07)["rollout_2"]
    f = prompt_token_parity(scorer.score(slime))
    # the multi-turn sample's second turn has no text of its own (its prompt holds turn 1)
    assert f.name == "prompt_tokens_match" and f.evidence["n_ids_only_unchecked"] == 1


def test_score_refuses_token_ids_beyond_the_models_vocabulary(tmp_path, tiny_model, cli):
    from rlparity.score import VocabularyError

    rows = _lines(CUSTOM / "rows.jsonl")
    rows[3]["input_ids"][-1] = 50_000  # the tiny model has 50 tokens
    (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rio.import_to_store("generic", tmp_path / "big.jsonl", tmp_path / "s.zarr", progress=False)
    ds = open_arms(tmp_path / "s.zarr")["big"]
    from rlparity.score import score

    with pytest.raises(VocabularyError, match=r"token id\(s\) \[50000\].*beyond the vocabulary of .*tiny \(50 tokens\)"):
        score(ds, tiny_model, progress=False)
    res = cli("score", tmp_path / "s.zarr", "--model", tiny_model)
    assert res.exit_code == 2 and "50000" in res.stderr and "tiny" in res.stderr and "Traceback" not in res.output


# ----------------------------------------------------------------------------- the generic format


def test_generic_npz_in_verls_layout():
    ds = rio.read("generic", VERL)["step_5"]
    with np.load(VERL) as z:
        ids, att, rm, lp = z["input_ids"], z["attention_mask"], z["response_mask"], z["rollout_log_probs"]
        assert int(z["step"]) == 5
    P = ids.shape[1] - rm.shape[1]
    for i in range(ids.shape[0]):
        prompt = ids[i, :P][att[i, :P] == 1]
        assert ds["prompt_token_id"].values[i][: len(prompt)].tolist() == prompt.tolist()
        n = int(rm[i].sum())
        assert ds["token_id"].values[i, :n].tolist() == ids[i, P: P + n].tolist()
        np.testing.assert_allclose(ds["rollout_logprob"].values[i, :n], lp[i, :n].astype(np.float64))
    assert set(ds["temperature"].values) == {0.7} and set(ds["top_k"].values) == {0}
    assert ds.attrs["import"]["user_supplied"] == {} and ds.attrs["sampling_unknown"] == []
    assert ds.attrs["import"]["file_sampling"] == {"temperature": 0.7, "top_k": -1, "top_p": 1.0}
    assert ds.attrs["import"]["coords"]["step"] == 5
    # GRPO groups found from identical prompt ids: 4 prompts x 2 samples
    assert np.bincount(ds["prompt_index"].values).tolist() == [2, 2, 2, 2]


def _snippet(title: str) -> str:
    doc = (Path(rio.__file__).parent / "GENERIC_FORMAT.md").read_text()
    return doc.split(f"**{title}**")[1].split("```python")[1].split("```")[0]


def test_verl_and_trl_recipes_of_the_docs_write_importable_files(tmp_path, monkeypatch):
    """The snippets of GENERIC_FORMAT.md run on verl-shaped (batch.batch) and TRL-shaped
    (_generate_and_score_completions output) tensors give the committed fixtures' arms."""
    import torch

    assert len(_snippet("From verl").strip().splitlines()) == 5
    with np.load(VERL) as z:
        tensors = {k: torch.tensor(z[k]) for k in ("input_ids", "attention_mask", "response_mask",
                                                   "rollout_log_probs", "old_log_probs")}
    trainer = types.SimpleNamespace(global_steps=5, config=types.SimpleNamespace(
        actor_rollout_ref=types.SimpleNamespace(rollout=types.SimpleNamespace(temperature=0.7, top_k=-1, top_p=1.0))))
    monkeypatch.chdir(tmp_path)
    exec(_snippet("From verl"), {"batch": types.SimpleNamespace(batch=tensors), "self": trainer})
    got = rio.read("generic", tmp_path / "rlparity_dump")["step_5"]
    xr.testing.assert_identical(_data(got), _data(rio.read("generic", VERL)["step_5"]))
    assert len(_snippet("From TRL").strip().splitlines()) <= 5
    (npz,) = TRL.glob("*.npz")
    with np.load(npz) as z:
        ids, att, rm = z["input_ids"], z["attention_mask"], z["response_mask"]
        P = ids.shape[1] - rm.shape[1]
        out = {"prompt_ids": torch.tensor(ids[:, :P]), "prompt_mask": torch.tensor(att[:, :P]),
               "completion_ids": torch.tensor(ids[:, P:]), "completion_mask": torch.tensor(rm),
               "sampling_per_token_logps": torch.tensor(z["rollout_log_probs"]),
               "old_per_token_logps": torch.tensor(z["old_log_probs"])}
    trl = types.SimpleNamespace(args=types.SimpleNamespace(temperature=0.9, top_k=0, top_p=1.0),
                                state=types.SimpleNamespace(global_step=5),
                                accelerator=types.SimpleNamespace(process_index=1))
    (tmp_path / "rlparity_dump").mkdir(exist_ok=True)
    for f in (tmp_path / "rlparity_dump").iterdir():
        f.unlink()
    exec(_snippet("From TRL"), {"out": out, "self": trl})
    exec(_snippet("From TRL"), {"out": out, "self": trl})  # a second generation batch of the same step
    both = rio.read("generic", tmp_path / "rlparity_dump")
    one = rio.read("generic", TRL)["step_5"]
    assert list(both) == ["step_5"] and both["step_5"].sizes["sequence"] == 2 * one.sizes["sequence"]
    assert set(both["step_5"]["temperature"].values) == {0.9}


def test_text_only_dumps_are_recognised_and_pointed_to_the_recipe():
    with pytest.raises(ImportFormatError, match=r"5.jsonl:1: this is verl's rollout_data_dir dump.*'From verl' in "
                                                r"rlparity/importers/GENERIC_FORMAT.md"):
        rio.read("verl", DATA / "verl" / "rollout_data_dir")
    with pytest.raises(ImportFormatError, match=r"completions_00005.parquet \[row 0\]: this is TRL's completions "
                                                r"log.*'From TRL'"):
        rio.read("generic", DATA / "trl" / "completions")


def test_generic_identity_sampling_fills_both_readings_and_diagnoses():
    arms = rio.read("generic", CUSTOM / "rows.jsonl", temperature=1.0, top_k=0, top_p=1.0)
    ds = arms["rows"]
    np.testing.assert_array_equal(ds["trainer_logprob"].values, ds["trainer_processed_logprob"].values)
    assert ds.attrs["import"]["n_multi_turn_records"] == 1 and ds.attrs["import"]["fields_missing"] == []
    assert (ds["policy_version"].values[ds["response_mask"].values] == 7).all()
    report = diagnose(arms)
    assert "logprob_semantics_untestable" in report.names(Severity.INFO) and not report.problems()


def test_missing_sampling_parameters_are_recorded_and_asked_for():
    ds = rio.read("pipelinerl", PIPE / "exp")["actor"]
    assert ds.attrs["sampling_unknown"] == ["temperature", "top_k", "top_p"]
    assert np.isnan(ds["temperature"].values).all() and (ds["top_k"].values == -1).all()
    assert rio.sampling_unknown(ds) == ["temperature", "top_k", "top_p"]
    with pytest.raises(MissingSamplingError) as err:
        rio.require_sampling(ds, ["temperature"], needed_for="rescoring the processed reading")
    msg = str(err.value)
    assert "rescoring the processed reading needs temperature" in msg and "--temperature 0.7" in msg
    assert "rlparity import pipelinerl" in msg and "top_k" not in msg
    given = rio.read("pipelinerl", PIPE / "exp", temperature=0.7, top_k=-1)["actor"]
    assert given.attrs["import"]["user_supplied"] == {"temperature": 0.7, "top_k": 0}
    assert given.attrs["sampling_unknown"] == ["top_p"]
    rio.require_sampling(given, ["temperature", "top_k"])
    with pytest.raises(ImportFormatError, match=r"records temperature=0.7 but --temperature 1.0"):
        rio.read("generic", VERL, temperature=1.0)
    with pytest.raises(ValueError, match="top_p=1.5"):
        rio.read("pipelinerl", PIPE / "exp", top_p=1.5)


def test_trainer_reading_can_be_overridden():
    raw = rio.read("prime-rl", PRIME, temperature=0.7, trainer_reading="raw")["step_3"]
    assert "trainer_logprob" in raw and "trainer_processed_logprob" not in raw
    assert raw.attrs["trainer"]["reading"] == "raw"
    none = rio.read("prime-rl", PRIME, temperature=0.7, trainer_reading="none")["step_3"]
    assert not any(v.startswith("trainer_") for v in none.data_vars) and "trainer" not in none.attrs
    with pytest.raises(ValueError, match="trainer_reading='tempered'"):
        rio.read("prime-rl", PRIME, trainer_reading="tempered")


def test_cut_the_trainer_does_not_apply_and_copied_trainer_side_are_flagged(tmp_path):
    rows = _lines(CUSTOM / "rows.jsonl")
    for r in rows:
        r["top_k"] = 50
    rows[1]["old_log_probs"] = rows[1]["rollout_log_probs"]  # bypass mode: a copy
    (tmp_path / "cut.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = rio.import_to_store("generic", tmp_path / "cut.jsonl", tmp_path / "s.zarr", progress=False)
    tr = open_arms(tmp_path / "s.zarr")["cut"].attrs["trainer"]
    assert tr["not_renormalized_sequences"] == 9 and tr["copied_from_rollout_sequences"] == 1
    text = str(result)
    assert "top-k/top-p cut the framework's trainer does not apply" in text and "a copy" in text


# ----------------------------------------------------------------------------- streaming and failures


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
    stream = PIPE / "exp" / "streams" / "actor" / "0" / "0" / "0.jsonl"
    group = json.loads(stream.read_text().splitlines()[2])
    group[1]["logprobs"] = group[1]["logprobs"][:-2]
    bad = _corrupt(stream, tmp_path / "p.jsonl", 3, json.dumps(group) + "\n")
    with pytest.raises(ImportFormatError, match=rf"{bad}:3 \(text 1\): \d+ predicted tokens .* but \d+ logprobs"):
        rio.read("pipelinerl", bad)


def test_small_chunks_give_the_same_store_as_one_chunk(tmp_path, monkeypatch):
    from rlparity.importers import generic

    monkeypatch.setattr(generic, "NPZ_ROWS", 3)  # .npz members read 3 rows at a time from the zip
    for fmt, path, opts in (("prime-rl", PRIME, {"temperature": 0.7}), ("generic", VERL, {}),
                            ("nemo-rl", NEMO, K8)):
        one = rio.import_to_store(fmt, path, tmp_path / f"{fmt}1.zarr", chunk_size=10_000, progress=False, **opts)
        many = rio.import_to_store(fmt, path, tmp_path / f"{fmt}3.zarr", chunk_size=3, progress=False, **opts)
        a, b = open_arms(one.store), open_arms(many.store)
        assert list(a) == list(b)
        for arm in a:
            xr.testing.assert_identical(_data(a[arm]), _data(b[arm]))
            strip = ("created_at",)
            assert {k: v for k, v in a[arm].attrs.items() if k not in strip} == \
                   {k: v for k, v in b[arm].attrs.items() if k not in strip}
    from rlparity.importers.sampling import SamplingResolver
    from rlparity.importers.formats import get_format, stream_chunks

    chunks = list(stream_chunks(get_format("pipelinerl"), PIPE / "exp" / "streams" / "actor",
                                sampling=SamplingResolver({}), trainer_reading=None, chunk_size=3, progress=False,
                                builders={}))
    assert [c.sizes["sequence"] for _, c in chunks] == [3, 3, 3, 3, 3, 1]


def test_progress_bar_and_summary(tmp_path, capsys):
    result = rio.import_to_store("nemo-rl", NEMO, tmp_path / "s.zarr", temperature=0.7, top_k=8)
    err = capsys.readouterr().err
    assert "import nemo-rl" in err
    text = str(result)
    assert "exp_001_step_1 (launch exp_001, step 1): 10 sequences" in text and "20 excluded" in text
    assert "--top-p 0.95" in text and "unknown: top_p" in text and "sample_loss_mask 0" in text


def test_nothing_half_written_on_failure(tmp_path):
    src = tmp_path / "dump"
    src.mkdir()
    shutil.copy(CUSTOM / "rows.jsonl", src / "a_good.jsonl")
    _corrupt(CUSTOM / "rows.jsonl", src / "b_bad.jsonl", 6, "not json\n")
    out = tmp_path / "out" / "s.zarr"
    with pytest.raises(ImportFormatError, match=r"b_bad.jsonl:6"):
        rio.import_to_store("generic", src, out, progress=False, chunk_size=2)
    assert not out.exists() and os.listdir(out.parent) == []
    good = rio.import_to_store("generic", CUSTOM / "rows.jsonl", out, progress=False).store
    before = {p.relative_to(good): p.read_bytes() for p in good.rglob("*") if p.is_file()}
    with pytest.raises(FileExistsError, match="overwrite"):
        rio.import_to_store("generic", CUSTOM / "rows.jsonl", out, progress=False)
    with pytest.raises(ImportFormatError):
        rio.import_to_store("generic", src, out, progress=False, overwrite=True)
    after = {p.relative_to(good): p.read_bytes() for p in good.rglob("*") if p.is_file()}
    assert before == after and sorted(os.listdir(out.parent)) == ["s.zarr"]
    assert math.isclose(float(open_arms(out)["rows"]["reward"].values[0]), _lines(CUSTOM / "rows.jsonl")[0]["reward"])
