"""Real vLLM (CPU build) + real transformers on the tiny model: capture -> score -> save -> load,
and the processed-vs-raw behaviour the foundation must show."""

import json

import numpy as np
import pytest

from rlparity import trace as T
from rlparity.capture import EngineSettings, SamplingSettings
from rlparity.metrics import summary

pytestmark = pytest.mark.engine

SAMPLING = SamplingSettings(temperature=0.7, top_k=20, max_tokens=24, seed=0)
PROCESSED = EngineSettings(logprobs_mode="processed_logprobs", head_dtype="float32")
RAW = EngineSettings(logprobs_mode="raw_logprobs", head_dtype="float32")


@pytest.fixture(scope="module")
def processed(capture_trace, scorer_fp32):
    return scorer_fp32.score(capture_trace(PROCESSED, SAMPLING, arm="processed"))


@pytest.fixture(scope="module")
def raw(capture_trace, scorer_fp32):
    return scorer_fp32.score(capture_trace(RAW, SAMPLING, arm="raw"))


def test_processed_logprobs_match_trainer(processed):
    s = summary(processed, trainer="processed")
    assert abs(s["mean_ratio"].item() - 1) < 0.01, s["mean_ratio"].item()
    assert s["abs_log_ratio_rms"].item() < 0.02
    assert s["n_zero_prob"].item() == 0
    assert s["n_tokens"].item() == 16 * 24


SWEEP_T = (0.5, 1.0, 1.5)


def _sweep(capture_trace, scorer, settings, prompts, arm):
    from rlparity.experiments.semantic import sweep_sampling

    index, sampling = sweep_sampling(8, SWEEP_T, top_k=20, max_tokens=16)
    return scorer.score(capture_trace(settings, sampling, [prompts[i] for i in index], arm=arm))


# --- tests on the processed engine (kept together so it starts once) ---------------------
def test_processed_report_has_no_semantic_problem(processed, capture_trace, scorer_fp32, prompts):
    from rlparity.diagnose import diagnose
    from rlparity.metrics import by_temperature

    report = diagnose(processed)
    assert not report.problems(), str(report)
    assert {"logprobs_processed", "prompt_tokens_match"} <= report.names("info")
    sw = _sweep(capture_trace, scorer_fp32, PROCESSED, prompts, "sweep-processed")
    bt = by_temperature(sw)
    assert bt["temperature"].values.tolist() == list(SWEEP_T)
    assert np.abs(bt["log_ratio_mean"].values).max() < 0.01, bt["log_ratio_mean"].values
    assert not diagnose(sw).problems()


def test_prompt_tokenized_without_special_tokens_is_flagged(capture_trace, scorer_fp32, tiny_model):
    from transformers import AutoTokenizer

    from rlparity.diagnose import processing as S
    from rlparity.experiments.semantic import prompts_with_ids
    from rlparity.models import make_prompts

    tok = AutoTokenizer.from_pretrained(tiny_model)
    texts = make_prompts(6, seed=3)
    # the pipeline tokenized with add_special_tokens=False; the trainer tokenizes with it
    no_bos = scorer_fp32.score(capture_trace(PROCESSED, SAMPLING, prompts_with_ids(tok, texts, add_special_tokens=False),
                                             arm="no-bos"))
    f = S.prompt_token_parity(no_bos)
    assert f.name == "prompt_token_mismatch" and f.evidence["n_mismatched"] == 6, str(f)
    assert f.evidence["length_difference_engine_minus_trainer"] == -1 and "BOS" in f.summary
    # chat prompts go through the chat template once: one BOS, and the trainer agrees
    chat = scorer_fp32.score(capture_trace(PROCESSED, SAMPLING, [{"messages": [{"role": "user", "content": t}]}
                                                                 for t in texts], arm="chat"))
    assert S.prompt_token_parity(chat).name == "prompt_tokens_match"
    ids = chat["prompt_token_id"].values[0]
    assert (ids == tok.bos_token_id).sum() == 1
    assert json.loads(str(chat["prompt_messages"].values[0]))[0]["content"] == texts[0]


def test_token_id_prompts_and_per_request_sampling(capture_trace, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok("3+4=")["input_ids"]
    sweep = [SamplingSettings(temperature=t, max_tokens=8, seed=0) for t in (0.5, 1.0)]
    tr = capture_trace(PROCESSED, sweep, [ids, ids], arm="ids")
    assert tr["prompt_token_id"].values[0, : len(ids)].tolist() == ids
    assert tr["temperature"].values.tolist() == [0.5, 1.0]
    assert (tr["response_length"].values == 8).all()


def test_the_collector_is_paused_in_generate_and_the_capture_is_the_same_without_the_pause(pool, tiny_model, prompts):
    """defaults().capture_gc_pause (issue 39): vLLM's generate runs with the collector off, the state found
    comes back (enabled or not), and the trace equals, bit for bit, one captured with the setting off."""
    import gc

    import xarray as xr

    from rlparity.config import defaults_context

    eng = pool.get(tiny_model, PROCESSED)  # the module's engine: no new start
    llm, generate, seen = eng.llm, eng.llm.generate, []

    def watched(*args, **kw):
        seen.append(gc.isenabled())
        return generate(*args, **kw)

    sampling = SamplingSettings(temperature=0.7, top_k=20, max_tokens=8, seed=3)
    llm.generate = watched
    try:
        assert gc.isenabled()
        paused = eng.capture(prompts[:4], sampling, progress=False)
        assert gc.isenabled()
        with defaults_context(capture_gc_pause=False):
            plain = eng.capture(prompts[:4], sampling, progress=False)
        gc.disable()
        try:
            eng.capture(prompts[:4], sampling, progress=False)
            assert not gc.isenabled()  # disabled stays disabled
        finally:
            gc.enable()
    finally:
        llm.generate = generate
    assert seen == [False, True, False]
    xr.testing.assert_identical(paused.drop_attrs(), plain.drop_attrs())
    assert ({k: v for k, v in paused.attrs.items() if k != "generate_s"}
            == {k: v for k, v in plain.attrs.items() if k != "generate_s"})



# --- tests on the raw engine ------------------------------------------------------------
def test_raw_logprobs_are_off_and_match_the_raw_trainer_side(raw):
    s = summary(raw, trainer="processed")
    assert abs(s["mean_ratio"].item() - 1) > 0.03, s["mean_ratio"].item()
    # the raw rollout agrees with the trainer's full-vocabulary temperature-1 logprob instead
    assert summary(raw, trainer="raw")["abs_log_ratio_rms"].item() < 0.02


def test_raw_report_names_the_mismatch_and_its_temperature_signature(raw, capture_trace, scorer_fp32, prompts):
    from rlparity.diagnose import diagnose
    from rlparity.metrics import by_temperature

    report = diagnose(raw)
    assert report.has_errors and "raw_logprobs_used_as_processed" in report.names("error"), str(report)
    (f,) = [x for x in report if x.name == "raw_logprobs_used_as_processed"]
    assert "--logprobs-mode processed_logprobs" in f.fix
    sw = _sweep(capture_trace, scorer_fp32, RAW, prompts, "sweep-raw")
    means = by_temperature(sw)["log_ratio_mean"].values
    assert means.max() - means.min() > 0.05, means  # the offset moves with temperature
    g = diagnose(sw).by_layer("semantic")[0]
    assert g.name == "raw_logprobs_used_as_processed" and g.evidence["mean_d_range_over_temperatures"] > 0.05


def test_trainer_with_other_top_k_gives_probability_zero_tokens(processed, scorer_fp32):
    from rlparity.diagnose import processing as S

    rollout = processed.drop_vars([v for v in processed.data_vars if v.startswith("trainer_")])
    other = scorer_fp32.score(rollout.assign(top_k=rollout["top_k"] * 0 + 2))  # trainer uses top-k 2
    found = {f.name: f for f in S.zero_probability_tokens(other)}
    # the trainer's set is smaller than the engine's: clearly outside, an error, not a boundary flip
    f = found["zero_probability_tokens"]
    assert f.severity.name == "ERROR" and f.evidence["n_tokens_with_cause"] > 0
    assert all(r >= 2 for r in f.evidence["trainer_rank_of_token"])


def test_effective_config_is_read_back(processed, raw):
    eff = processed.attrs["engine_effective"]
    assert eff["logprobs_mode"] == "processed_logprobs"
    assert eff["head_dtype"] == "float32"
    assert raw.attrs["engine_effective"]["logprobs_mode"] == "raw_logprobs"
    # what was not asked is still recorded as the engine's own value
    assert isinstance(eff["enable_prefix_caching"], bool)
    assert processed.attrs["versions"]["vllm"]
    assert processed.attrs["trainer"]["head_dtype"] == "float32"


def test_capture_score_save_load_round_trip(processed, raw, tmp_path):
    path = T.save({"processed": processed, "raw": raw}, tmp_path / "exp.zarr")
    got = T.load(path, "processed")
    np.testing.assert_array_equal(got["token_id"].values, processed["token_id"].values)
    np.testing.assert_allclose(got["trainer_processed_logprob"].values,
                               processed["trainer_processed_logprob"].values)
    assert got.attrs["engine_effective"] == processed.attrs["engine_effective"]
    assert summary(got)["mean_ratio"].item() == pytest.approx(summary(processed)["mean_ratio"].item())


def test_chunked_scoring_equals_unchunked(processed, tiny_model):
    from rlparity.score import Scorer

    rollout = processed.drop_vars([v for v in processed.data_vars if v.startswith("trainer_")])
    small = Scorer(tiny_model, chunk_tokens=7, batch_size=3, progress=False).score(rollout)
    np.testing.assert_allclose(small["trainer_processed_logprob"].values,
                               processed["trainer_processed_logprob"].values, atol=1e-5)


def test_semantic_finding_on_real_captures(processed, raw):
    from rlparity.diagnose.semantic import logprob_semantics

    assert logprob_semantics(raw).name == "raw_logprobs_used_as_processed"
    assert logprob_semantics(processed).name == "logprobs_processed"


def test_a_short_model_starts_and_each_start_gets_its_own_logging(tiny_model, tmp_path, monkeypatch):
    """A checkpoint whose max_position_embeddings (256) is below the default max_model_len (1024)
    starts: the default is lowered to the model's (vLLM refuses a longer context). vLLM's log lines
    go to the chosen file through a logging config made for this start: nothing exists before the
    engine starts, and the config is gone after its shutdown."""
    import os
    import shutil
    import tempfile
    from pathlib import Path

    from rlparity.capture import Engine
    from rlparity.config import logs

    short = tmp_path / "short"
    short.mkdir()
    for f in Path(tiny_model).iterdir():
        if f.suffix == ".safetensors":
            (short / f.name).symlink_to(f)
        else:
            shutil.copy(f, short / f.name)
    cfg = json.loads((short / "config.json").read_text())
    cfg["max_position_embeddings"] = 256
    (short / "config.json").write_text(json.dumps(cfg))

    monkeypatch.setattr(logs, "_CHOICE", {"file": None})
    monkeypatch.setattr(logs, "_OURS", set())
    for k in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_STREAM", *logs.QUIET_ENV):
        monkeypatch.setenv(k, "")  # recorded, so the test's changes are undone after it
        monkeypatch.delenv(k)
    log_file = logs.engine_logs_to_file(tmp_path / "logs")
    assert not (tmp_path / "logs").exists()

    with Engine(short, EngineSettings(dtype="float32", head_dtype="float32")) as eng:
        trace = eng.capture(["1+1="], SamplingSettings(max_tokens=4, temperature=0.0), progress=False)
        cfg_path = Path(os.environ["VLLM_LOGGING_CONFIG_PATH"])
        assert cfg_path.exists() and json.loads(cfg_path.read_text())["handlers"]["file"]["filename"] == str(log_file)
    assert not cfg_path.exists() and "VLLM_LOGGING_CONFIG_PATH" not in os.environ
    assert not list(Path(tempfile.gettempdir()).glob(cfg_path.name))  # (other processes may have their own)
    assert trace.attrs["engine_requested"]["max_model_len"] == 256
    assert trace.attrs["engine_effective"]["max_model_len"] == 256
    assert log_file.exists() and log_file.stat().st_size > 0


def test_an_in_process_core_captures_the_same_and_leaves_its_caller_as_it_was(tiny_model, release_engines, monkeypatch):
    """``RLPARITY_ENGINE_IN_PROCESS=on`` (the test lanes' setting): the offline engine's core runs in this process
    and captures the very tokens and logprobs of vLLM's default core process (same seed, per-request seeds), and
    what vLLM changes in its caller comes back on close: the global random state, ``torch.set_num_threads`` and the
    thread count, vLLM's environment-variable cache (a later engine reads its own ``VLLM_BATCH_INVARIANT``), the
    process group, the ``vllm`` logger."""
    import logging
    import random

    import torch
    import vllm.envs as envs

    from rlparity.capture import Engine
    from rlparity.capture.in_process import IN_PROCESS_ENV

    release_engines()
    settings = EngineSettings(logprobs_mode="processed_logprobs", dtype="float32", head_dtype="float32",
                              enable_prefix_caching=False)
    sampling = SamplingSettings(temperature=0.7, top_k=20, max_tokens=12, seed=3)
    prompts = ["1+2=", "7*6=", "the sky is"]
    traces = {}
    for mode in ("off", "on"):
        monkeypatch.setenv(IN_PROCESS_ENV, mode)
        random.seed(11)
        np.random.seed(11)
        torch.manual_seed(11)
        before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone(),
                  torch.set_num_threads, torch.get_num_threads(), list(logging.getLogger("vllm").handlers))
        with Engine(tiny_model, settings) as eng:
            traces[mode] = eng.capture(prompts, sampling, arm=mode, progress=False)
            if mode == "on":  # vLLM's offline core is here: no process of its own
                assert type(eng.llm.llm_engine.engine_core).__name__ == "InprocClient"
        after = (random.getstate(), np.random.get_state()[1], torch.get_rng_state(), torch.set_num_threads,
                 torch.get_num_threads(), list(logging.getLogger("vllm").handlers))
        assert after[0] == before[0] and np.array_equal(after[1], before[1]) and torch.equal(after[2], before[2]), mode
        assert after[3] is before[3] and after[4] == before[4], mode
        assert mode == "off" or after[5] == before[5]  # (vLLM's own LLM() configures the logger of its caller)
        assert not hasattr(envs.__getattr__, "cache_clear"), mode  # vLLM's env cache is off again
        assert not torch.distributed.is_initialized(), mode
    off, on = traces["off"], traces["on"]
    assert off.attrs["engine_effective"] == on.attrs["engine_effective"]
    np.testing.assert_array_equal(on["token_id"].values, off["token_id"].values)
    np.testing.assert_array_equal(on["rollout_logprob"].values, off["rollout_logprob"].values)
    assert on["response_mask"].values.sum() == off["response_mask"].values.sum() > len(prompts)
