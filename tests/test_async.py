"""Capture through a real vLLM ``AsyncLLM`` (CPU build, tiny model): the same trace schema and
the same tokens and logprobs as the offline engine on the same prompts and seeds, and a pause /
resume in the middle of a capture stamps the tokens after it with the new policy version."""

import numpy as np
import pytest

from conftest import fp32_parity_sampling, fp32_parity_settings

from rlparity.capture import SamplingSettings
from rlparity.capture.async_engine import AsyncEngine

pytestmark = pytest.mark.engine

SETTINGS = fp32_parity_settings()
SAMPLING = fp32_parity_sampling()


@pytest.fixture(scope="module")
def offline_trace(offline_fp32_trace):
    return offline_fp32_trace


@pytest.fixture(scope="module")
def engine(tiny_model, offline_trace, release_engines):
    release_engines()  # one engine at a time: the offline one goes first
    with AsyncEngine(tiny_model, SETTINGS) as eng:
        yield eng


def test_async_capture_equals_offline(engine, offline_trace, prompts8):
    from rlparity import trace as T

    import gc

    llm, generate, seen = engine.llm, engine.llm.generate, []

    def watched(*args, **kw):  # AsyncLLM.generate, on the engine's event loop
        seen.append(gc.isenabled())
        return generate(*args, **kw)

    llm.generate = watched
    try:
        assert gc.isenabled()
        tr = engine.capture(prompts8, SAMPLING, arm="async")
        assert gc.isenabled()  # the sync capture paused the collector (defaults().capture_gc_pause) and put it back
    finally:
        llm.generate = generate
    assert seen == [False] * len(prompts8)
    T.validate(tr)
    # the same variables, plus what only the async engine records (timing, attempts, prefix-cache state)
    assert set(tr.data_vars) - set(offline_trace.data_vars) == {
        "token_time", "submit_time", "attempt", "prefix_cache_generation", "prefix_cache_stale"}
    assert set(offline_trace.data_vars) <= set(tr.data_vars)
    assert tr.attrs["capture_backend"] == "vllm-async"
    assert tr.attrs["engine_effective"]["logprobs_mode"] == "processed_logprobs"
    assert (tr.prompt_token_id.values == offline_trace.prompt_token_id.values).all()
    same = (tr.token_id.values == offline_trace.token_id.values).all(axis=1)
    assert same.mean() == 1.0, same
    mask = tr.response_mask.values
    diff = np.abs(tr.rollout_logprob.values - offline_trace.rollout_logprob.values)[mask]
    assert diff.max() < 1e-4, diff.max()
    assert (tr.policy_version.values[mask] == 0).all()


def test_pause_keep_resume_stamps_the_new_policy_version(engine, prompts8):
    long = SamplingSettings(temperature=0.7, top_k=20, max_tokens=96, seed=0, ignore_eos=True)
    fut = engine.capture_async(prompts8, long, arm="inflight")
    assert engine.wait_first_token(120)
    engine.pause(mode="keep", clear_cache=False)
    engine.set_policy_version(1)  # a trainer would load new weights here
    engine.resume()
    tr = fut.result(timeout=300)
    engine.set_policy_version(0)
    v = tr.policy_version.values
    m = tr.response_mask.values
    for i in range(v.shape[0]):
        seq = v[i][m[i]]
        assert (np.diff(seq) >= 0).all(), seq  # versions never go back within a sequence
    mixed = [i for i in range(v.shape[0]) if {0, 1} <= set(v[i][m[i]].tolist())]
    assert mixed, "no sequence straddles the update: the pause did not land mid-generation"
    with pytest.raises(ValueError, match="pause mode"):
        engine.pause(mode="later")
