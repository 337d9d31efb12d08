"""Capture through a real vLLM OpenAI-compatible server (CPU build, tiny model), as PipelineRL
runs it, against the offline engine with the same settings and against the trainer.

One server starts for the whole module. The offline trace is captured first: the pool's engine
and the server share the machine-wide engine lock, so the pool is released before the server
starts.
"""

import json

import numpy as np
import pytest

from conftest import fp32_parity_sampling, fp32_parity_settings

from rlparity.capture import SamplingSettings
from rlparity.capture.server import Server
from rlparity.capture.server_client import ServerClient, ServerError

pytestmark = pytest.mark.engine

SETTINGS = fp32_parity_settings()
SAMPLING = fp32_parity_sampling()
MAX_ABS_DIFF = 1e-3  # on tokens of sequences the two sides sampled identically (fp32: ~1e-6)


@pytest.fixture(scope="module")
def offline_trace(offline_fp32_trace):
    return offline_fp32_trace


@pytest.fixture(scope="module")
def server(tiny_model, offline_trace, release_engines):
    release_engines()  # the server process needs the engine lock this process holds
    with Server(tiny_model, SETTINGS, startup_timeout=600) as srv:
        yield srv


@pytest.fixture(scope="module")
def server_trace(server, prompts8):
    return server.capture(prompts8, SAMPLING, arm="server", progress=False)


def _matched(a, b):
    """Per sequence: token ids identical? and the |diff| of rollout logprobs where they are."""
    same = (a.token_id.values == b.token_id.values).all(axis=1)
    mask = a.response_mask.values & same[:, None]
    diff = np.abs(a.rollout_logprob.values - b.rollout_logprob.values)[mask]
    return same, diff


def test_server_trace_has_the_offline_schema(server, server_trace, offline_trace):
    from rlparity import trace as T

    assert set(server_trace.data_vars) == set(offline_trace.data_vars)
    for name, var in offline_trace.data_vars.items():
        other = server_trace[name]
        assert other.dims == var.dims, name
        assert other.dtype.kind == var.dtype.kind, (name, other.dtype, var.dtype)
        if var.dtype.kind != "U":
            assert other.dtype == var.dtype, (name, other.dtype, var.dtype)
    assert server_trace.sizes == offline_trace.sizes
    T.validate(server_trace)
    a = server_trace.attrs
    assert a["capture_backend"] == "vllm-server"
    assert a["server_url"] == server.url and server.url.startswith("http://127.0.0.1:")
    assert a["return_tokens_as_token_ids"] is True
    assert a["engine_requested"]["logprobs_mode"] == "processed_logprobs"
    assert a["engine_effective"]["effective_source"] == "resolved from the server command line by vLLM"
    assert a["engine_effective"]["logprobs_mode"] == "processed_logprobs"
    assert a["engine_effective"]["generation_config"] == "vllm"
    assert a["startup_s"] > 0
    print(f"\nserver start-up (Popen to healthy): {a['startup_s']:.1f} s")
    assert a["seeds"]["requests"] == list(range(8))


def test_server_matches_offline_engine(server_trace, offline_trace):
    # prompt ids the server tokenised are the offline engine's
    np.testing.assert_array_equal(server_trace.prompt_token_id.values,
                                  offline_trace.prompt_token_id.values)
    same, diff = _matched(server_trace, offline_trace)
    print(f"\nserver vs offline: {int(same.sum())}/{same.size} sequences identical, "
          f"max |d logprob| {diff.max():.3g}, mean {diff.mean():.3g} over {diff.size} tokens")
    assert same.sum() >= 7, same
    assert diff.size >= 7 * SAMPLING.max_tokens
    assert diff.max() < MAX_ABS_DIFF, diff.max()
    assert (server_trace.finish_reason.values == offline_trace.finish_reason.values).all()
    assert (server_trace.response_text.values[same] == offline_trace.response_text.values[same]).all()


def test_server_trace_matches_trainer(server_trace, scorer_fp32):
    from rlparity.metrics import summary

    s = summary(scorer_fp32.score(server_trace), trainer="processed")
    mean_abs = s["abs_log_ratio_mean"].item()
    print(f"\nserver vs trainer (fp32): mean |log-ratio| {mean_abs:.3g}, "
          f"max {s['abs_log_ratio_max'].item():.3g}")
    assert mean_abs < 1e-3, mean_abs
    assert s["n_zero_prob"].item() == 0
    assert s["n_tokens"].item() == 8 * SAMPLING.max_tokens


def test_token_id_and_chat_prompts(server, tiny_model):
    from transformers import AutoTokenizer

    from rlparity.trace.prompts import chat_token_ids

    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok("12+7=19;4+4=")["input_ids"]
    messages = [{"role": "user", "content": "3+4="}]
    ds = server.capture([ids, {"messages": messages}], SamplingSettings(max_tokens=4, temperature=0.0),
                        progress=False)
    n0, n1 = int(ds.prompt_length[0]), int(ds.prompt_length[1])
    assert ds.prompt_token_id.values[0, :n0].tolist() == ids
    assert ds.prompt_token_id.values[1, :n1].tolist() == chat_token_ids(tok, messages)
    assert json.loads(str(ds.prompt_messages.values[1])) == messages
    assert ds.response_mask.values.all()


def test_bad_requests_raise_the_servers_message(server, tiny_model):
    with pytest.raises(ServerError, match=r"HTTP 400.*maximum context length"):
        server.capture(["1+1=2;" * 400], SamplingSettings(max_tokens=4), progress=False)
    with pytest.raises(ServerError, match=r"HTTP 404.*does not exist"):
        ServerClient(server.url, "no-such-model").capture(["1+1="], SamplingSettings(max_tokens=4),
                                                           progress=False)
    with pytest.raises(ServerError, match="cannot reach"):
        ServerClient("http://127.0.0.1:9", "m", timeout=5).capture(["1+1="], progress=False)


def test_text_tokens_are_refused(server):
    """A response whose logprobs.tokens are text (what a server without
    --return-tokens-as-token-ids sends) is refused: here the per-request override turns the
    server's flag off, on the real server."""

    class TextTokens(ServerClient):
        def request_body(self, req):
            return {**super().request_body(req), "return_tokens_as_token_ids": False}

    with pytest.raises(ServerError, match="--return-tokens-as-token-ids"):
        TextTokens(server.url, server.model).capture(["1+1="], SamplingSettings(max_tokens=4),
                                                     progress=False)


def test_foreign_server_client(server, prompts8, server_trace):
    """A client that only knows the URL finds the model and reports what /v1/models says."""
    client = ServerClient(server.url + "/v1")
    assert client.model == server.model
    eff = client.effective_config()
    assert eff["max_model_len"] == 1024
    ds = client.capture(prompts8[:2], SAMPLING, progress=False)
    np.testing.assert_array_equal(ds.token_id.values, server_trace.token_id.values[:2])


def test_audit_server(server, tiny_model):
    from rlparity.capture.audit import audit

    res = audit(server, "pipelinerl-parity")
    assert res.ok, str(res)
    cmd = server.command_line()
    assert "--return-tokens-as-token-ids" in cmd and cmd[3:5] == ["--model", tiny_model]
    # the server default is --generation-config auto: the audit names it (command line only)
    unstarted = Server(tiny_model, SETTINGS.replace(generation_config=None), port=8765)
    assert not unstarted.running
    assert "--port" in unstarted.command_line() and "8765" in unstarted.command_line()
    res2 = audit(unstarted, "pipelinerl-parity")
    assert "generation_config" in res2.names(), str(res2)
    with pytest.raises(ServerError, match="not running"):
        unstarted.capture(["1+1="])
