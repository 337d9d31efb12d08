"""Profiles (YAML) and the config audit, read from real vLLM engines and vLLM's own parser."""

from __future__ import annotations

import pytest

from rlparity.capture import EngineSettings
from rlparity.capture.audit import WHY, audit, compare
from rlparity.config.profiles import load_profile, profile_names, read_profile, save_profile


def test_builtin_profiles():
    assert {"vllm-v1-defaults", "pipelinerl-parity"} <= set(profile_names())
    assert load_profile("vllm-v1-defaults") == EngineSettings()
    p = load_profile("pipelinerl-parity")
    assert (p.logprobs_mode, p.enable_prefix_caching, p.async_scheduling, p.head_dtype, p.generation_config) == \
        ("processed_logprobs", False, False, "float32", "vllm")


def test_profile_yaml_roundtrip_and_errors(tmp_path):
    s = EngineSettings(logprobs_mode="processed_logprobs", max_num_seqs=4)
    path = save_profile(s, tmp_path / "mine.yaml", "test")
    assert load_profile(path) == s and read_profile(path)["description"] == "test"
    bare = tmp_path / "bare.yaml"
    bare.write_text("enable_prefix_caching: false\n")
    assert load_profile(bare).enable_prefix_caching is False
    bad = tmp_path / "bad.yaml"
    bad.write_text("settings:\n  prefix_caching: false\n")
    with pytest.raises(ValueError, match="'prefix_caching'.*valid settings: .*enable_prefix_caching"):
        load_profile(bad)
    with pytest.raises(ValueError, match="built-in profiles"):
        load_profile("no-such-profile")
    with pytest.raises(FileNotFoundError):
        load_profile(tmp_path / "missing.yaml")


def test_compare_synthetic_effective():
    eff = {"logprobs_mode": "raw_logprobs", "enable_prefix_caching": True, "async_scheduling": False,
           "dtype": "bfloat16", "head_dtype": "bfloat16", "generation_config": "auto",
           "generation_config_sampling_defaults": {"temperature": 0.6}, "seed": 0, "max_model_len": 1024,
           "device": "cpu"}
    res = compare(eff, "pipelinerl-parity")
    assert res.names() == ["logprobs_mode", "enable_prefix_caching", "head_dtype", "generation_config"]
    assert all(d.why == WHY[d.setting] and d.why.endswith(".") for d in res.differences)
    assert "async_scheduling" in res.matched
    assert any("temperature" in n for n in res.notes)
    assert compare(eff, "vllm-v1-defaults").names() == []  # nothing fixed except seed / length


@pytest.mark.engine
@pytest.mark.parametrize("profile", ["vllm-v1-defaults", "pipelinerl-parity"])
def test_audit_real_engine(pool, tiny_model, profile):
    """Every difference of vllm-v1-defaults from pipelinerl-parity, read from a running engine."""
    eng = pool.get(tiny_model, load_profile(profile))
    res = audit(eng, "pipelinerl-parity")
    assert res.effective["device"] == "cpu"
    if profile == "vllm-v1-defaults":
        # vLLM 0.32's own defaults, read back from the engine
        assert set(res.names()) == {"logprobs_mode", "enable_prefix_caching", "head_dtype", "generation_config"}, str(res)
        eff = res.effective
        assert eff["logprobs_mode"] == "raw_logprobs" and eff["enable_prefix_caching"] is True
        assert eff["generation_config"] == "auto"
        # the same engine as a vllm.LLM, and through a trace it captured
        assert audit(eng.llm, "pipelinerl-parity").names() == res.names()
        from rlparity.capture import SamplingSettings

        tr = eng.capture(["1+1="], SamplingSettings(max_tokens=2), progress=False)
        assert audit(tr, "pipelinerl-parity").names() == res.names()
    else:
        assert res.ok, str(res)
        assert {"logprobs_mode", "enable_prefix_caching", "head_dtype", "generation_config",
                "async_scheduling"} <= set(res.matched)


def test_audit_server_command_line(tiny_model):
    """The server path parses with vLLM's server parser: --generation-config defaults to auto."""
    plain = audit(f"python -m vllm.entrypoints.openai.api_server --model {tiny_model} --port 8000 "
                  "--return-tokens-as-token-ids --max-model-len 1024", "pipelinerl-parity")
    assert {"logprobs_mode", "enable_prefix_caching", "head_dtype", "generation_config"} <= set(plain.names())
    assert plain.effective["generation_config"] == "auto"
    fixed = audit(f"vllm serve {tiny_model} " + " ".join(
        __import__("shlex").quote(a) for a in load_profile("pipelinerl-parity").to_cli_args()), "pipelinerl-parity")
    assert fixed.ok, str(fixed)
    with pytest.raises(ValueError, match="no model"):
        audit("vllm serve --port 8000")


def test_the_reference_engine_reads_as_the_reference_profile_and_keeps_the_experiments_own_settings():
    """rlparity.config.profiles.reference_engine (issue 35: the reference engine written once): the
    profile YAML's reading of the logprobs and its head, read here with yaml itself, and the
    experiment's changes on top; nothing else of the profile (prefix caching and async scheduling are
    each experiment's factor)."""
    import yaml

    from rlparity.config.profiles import PROFILE_DIR, reference_engine
    from rlparity.config.settings import EngineSettings

    raw = yaml.safe_load((PROFILE_DIR / "pipelinerl-parity.yaml").read_text())["settings"]
    got = reference_engine(dtype="bfloat16", enable_prefix_caching=True)
    want = EngineSettings(logprobs_mode=raw["logprobs_mode"], head_dtype=raw["head_dtype"],
                          generation_config=raw["generation_config"], dtype="bfloat16", enable_prefix_caching=True)
    assert got == want and got.async_scheduling is None
    assert reference_engine(head_dtype="bfloat16").head_dtype == "bfloat16"  # a change wins over the profile
