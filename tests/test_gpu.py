"""The CUDA paths, against float64 computations on the CPU (skipped without a CUDA GPU).

    python -m pytest -m gpu tests/test_gpu.py

Needs torch with CUDA, transformers, tokenizers, numpy, xarray, pydantic, pyyaml and tqdm; no vLLM
engine and no zarr (nothing here saves a store). Every model is built here (``make_model`` on the
GPU, into a temporary folder), nothing is downloaded. Tolerances, in nats unless said:

* 1e-4 for a float32 body and head on CUDA against the same model in float64 on the CPU (the
  float32 rounding of a 2-layer body is about 1e-6; the mismatches rlparity judges are 1e-3 and up);
* 1e-5 for the LM-head statistics against float64 on the very same logits (as on the CPU);
* logits of a float32 head over a bf16 body (``fp32_gemm="auto"``: tensor cores; ``"cast"``:
  SGEMM) within 1e-5 x (1 + |logit|) of the exact float64 product of the same bf16 values.

Processed statistics are compared on the rows whose top-k/top-p kept set cannot flip under those
roundings (``head_reference.head_stats_float64(..., margin=...)``), the others on every row.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from head_reference import compare, head_stats_float64, rows_case  # noqa: E402

pytestmark = pytest.mark.gpu

BODY_TOL = 1e-4
HEAD_TOL = 1e-5


@pytest.fixture(scope="module")
def cuda_model(tmp_path_factory):
    """The tiny model, trained on the GPU (make_model's CUDA path), in a folder of this test run."""
    from rlparity.models import make_model

    return str(make_model("tiny", tmp_path_factory.mktemp("gpu") / "tiny", device="cuda", progress=False))


def _trace(vocab: int, n: int = 24, seed: int = 0):
    """Random prompts and responses of the model's token ids, with every sampling branch."""
    from rlparity.trace import from_rollouts

    rng = np.random.default_rng(seed)
    prompts = [[int(t) for t in rng.integers(4, vocab, rng.integers(3, 12))] for _ in range(n)]
    resp = [[int(t) for t in rng.integers(4, vocab, rng.integers(1, 20))] for _ in range(n)]
    trace = from_rollouts(prompt_token_ids=prompts, token_ids=resp, rollout_logprobs=[[-1.0] * len(r) for r in resp],
                          temperature=[0.7, 1.0, 0.0, 1.3] * (n // 4), top_k=[0, 5, 20, 0, 3, 0] * (n // 6),
                          top_p=[1.0, 1.0, 0.9, 0.8] * (n // 4))
    return trace, prompts, resp


def _float64_rows(model_path: str, prompts, resp, trace):
    """Per response token, from the model in float64 on the CPU: logits (one unpadded forward per
    sequence), the sampled tokens and their rows' settings."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float64).eval()
    logits, toks, temp, topk, topp = [], [], [], [], []
    with torch.no_grad():
        for i, (p, r) in enumerate(zip(prompts, resp)):
            out = model(input_ids=torch.tensor([p + r])).logits[0]
            logits.append(out[len(p) - 1: len(p) - 1 + len(r)].numpy())
            toks += r
            temp += [float(trace["temperature"].values[i])] * len(r)
            topk += [int(trace["top_k"].values[i])] * len(r)
            topp += [float(trace["top_p"].values[i])] * len(r)
    return np.concatenate(logits), np.array(toks), np.array(temp), np.array(topk), np.array(topp)


def _rank_stable(logits: np.ndarray, toks: np.ndarray, margin: float) -> np.ndarray:
    """Rows where no other logit lies within ``margin`` of the sampled token's (its rank cannot flip)."""
    tok = logits[np.arange(len(toks)), toks][:, None]
    near = np.abs(logits - tok) <= margin
    near[np.arange(len(toks)), toks] = False
    return ~near.any(axis=1)


def _flat(scored, resp, name):
    return np.concatenate([scored[name].values[i, : len(r)] for i, r in enumerate(resp)])


def test_scorer_on_cuda_equals_the_float64_model_on_the_cpu(cuda_model):
    """Scorer(device="cuda"), float32 body and head: every statistic of every response token within
    1e-4 nats of the same model run in float64 on the CPU (processed ones where the kept set is
    stable), ranks equal where no logit is within 1e-4 of the token's."""
    from rlparity.score import Scorer

    cfg = json.loads((Path(cuda_model) / "config.json").read_text())
    trace, prompts, resp = _trace(cfg["vocab_size"])
    scorer = Scorer(cuda_model, dtype="float32", head_dtype="float32", device="cuda", batch_size=5,
                    tokenize_prompts=False, progress=False)
    assert scorer.head_weight.is_cuda
    scored = scorer.score(trace)
    assert scored.attrs["trainer"]["device"] == "cuda"
    logits, toks, temp, topk, topp = _float64_rows(cuda_model, prompts, resp, trace)
    ref = head_stats_float64(logits, toks, temp, topk, topp, margin=BODY_TOL)
    got = {name: _flat(scored, resp, name) for name in ref if name != "stable"}
    assert ref["stable"].mean() > 0.8 and np.isneginf(ref["trainer_processed_logprob"][ref["stable"]]).any()
    stable_rank = _rank_stable(logits, toks, BODY_TOL)
    assert stable_rank.mean() > 0.8
    # ranks where a logit within the tolerance of the token's could reorder are not compared
    ref["trainer_token_rank"] = np.where(stable_rank, ref["trainer_token_rank"], got["trainer_token_rank"])
    compare(got, ref, BODY_TOL)


@pytest.mark.parametrize("compile_head", [True, False])
def test_head_stats_on_cuda_equal_float64_on_the_same_logits(compile_head, recwarn):
    """head_stats on CUDA (compiled: CUDA's default, and eager) on hidden states and a head covering
    every branch (ties at the k-th value, top-p, greedy): within 1e-5 nats of float64 on the same
    float32 logits; the compiled path really compiles (no fallback warning)."""
    from rlparity.score import lm_head_stats as H

    h, w, tok, temp, k, p = rows_case(4096, seed=11)
    dev = [x.cuda() for x in (h, w, tok, temp, k, p)]
    got = H.head_stats(*dev[:2], None, *dev[2:], "float32", compile=compile_head, fp32_gemm="cast")
    assert not [str(r.message) for r in recwarn if "torch.compile of" in str(r.message)]  # no eager fallback
    logits = torch.nn.functional.linear(dev[0], dev[1]).cpu().numpy()
    ref = head_stats_float64(logits, tok.numpy(), temp.numpy(), k.numpy(), p.numpy(), margin=HEAD_TOL)
    assert ref["stable"].mean() > 0.8
    compare(got, ref, HEAD_TOL)
    cpu = H.head_stats(h, w, None, tok, temp, k, p, "float32", compile=False)
    same = ref["stable"]
    for name in ("trainer_logprob", "trainer_entropy", "trainer_processed_entropy"):
        assert np.allclose(got[name][same], cpu[name][same], atol=HEAD_TOL, rtol=0, equal_nan=True), name


@pytest.mark.parametrize("fp32_gemm", ["auto", "cast"])
def test_fp32_head_over_a_bf16_body_on_cuda(cuda_model, fp32_gemm):
    """What README and rlparity.score say of fp32_gemm on CUDA: the logits of either GEMM are within
    1e-5 x (1 + |logit|) of the exact product of the same bf16 hidden states and weights, and the
    statistics are within 1e-5 nats of float64 on those logits (rows whose kept set is stable)."""
    from rlparity.score import Scorer
    from rlparity.score import lm_head_stats as H

    cfg = json.loads((Path(cuda_model) / "config.json").read_text())
    trace, prompts, resp = _trace(cfg["vocab_size"], seed=1)
    scorer = Scorer(cuda_model, dtype="bfloat16", head_dtype="float32", device="cuda", tokenize_prompts=False,
                    progress=False, fp32_gemm=fp32_gemm)
    seqs = list(zip(prompts, resp))
    with torch.inference_mode():
        hidden = torch.cat(scorer.response_hidden(seqs, list(range(len(seqs)))))
        assert hidden.dtype == torch.bfloat16 and scorer.head_weight.dtype == torch.bfloat16
        logits = H.project(hidden, scorer.head_weight, scorer.head_bias, "float32", fp32_gemm)
        exact = hidden.double() @ scorer.head_weight.double().T  # bf16 values are exact in float64
        err = ((logits.double() - exact).abs() / (1 + exact.abs())).max().item()
        assert err <= 1e-5, err
        toks = torch.tensor([t for r in resp for t in r], device="cuda")
        per = {name: torch.tensor([float(trace[name].values[i]) for i, r in enumerate(resp) for _ in r], device="cuda")
               for name in ("temperature", "top_p")}
        topk = torch.tensor([int(trace["top_k"].values[i]) for i, r in enumerate(resp) for _ in r], device="cuda")
        got = H.head_stats(hidden, scorer.head_weight, scorer.head_bias, toks, per["temperature"], topk, per["top_p"],
                           "float32", fp32_gemm=fp32_gemm)
    ref = head_stats_float64(logits.cpu().numpy(), toks.cpu().numpy(), per["temperature"].cpu().numpy(),
                             topk.cpu().numpy(), per["top_p"].cpu().numpy(), margin=HEAD_TOL)
    compare(got, ref, HEAD_TOL)
    scored = scorer.score(trace)  # the same through Scorer.score, end to end
    assert np.allclose(_flat(scored, resp, "trainer_logprob"), got["trainer_logprob"], atol=HEAD_TOL, rtol=0)
    assert scored.attrs["trainer"]["fp32_gemm"] == fp32_gemm


def test_train_step_on_cuda(cuda_model):
    """rlparity.train.train_step with device="cuda": the step runs (denominator, weights and mask on
    the model's device), the model stays on the GPU, pi_old before the step equals the trace's to
    float32 rounding, and the GSPO step moves pi_theta."""
    from rlparity.score import Scorer
    from rlparity.train import train_step

    cfg = json.loads((Path(cuda_model) / "config.json").read_text())
    trace, _, _ = _trace(cfg["vocab_size"], n=12, seed=2)
    trace["prompt_index"] = ("sequence", np.repeat(np.arange(3), 4))
    trace = Scorer(cuda_model, device="cuda", tokenize_prompts=False, progress=False).score(trace)
    rewards = np.array([1.0, 0.0, 0.5, 0.2] * 3)
    mask = trace["response_mask"].values
    weights = np.where(mask, 1.0, np.nan)
    keep = mask.copy()
    keep[0, 0] = False
    res = train_step(cuda_model, trace, rewards=rewards, loss="gspo", lr=1e-3, device="cuda", token_weights=weights,
                     keep=keep, return_gradient=True)
    assert next(res.model.parameters()).is_cuda
    m = res.metrics
    usable = keep & np.isfinite(trace["trainer_processed_logprob"].values)  # tokens outside top-k/top-p drop out
    assert m["n_loss_tokens"] == int(usable.sum()) > 20 and m["pi_old_max_abs_diff_vs_trace"] < 1e-4, m
    assert np.isfinite(m["loss_value"]) and m["grad_norm"] > 0 and np.isfinite(res.gradient).all()
    moved = np.abs(res.trace["trainer_updated_processed_logprob"].values - trace["trainer_processed_logprob"].values)
    assert np.nanmax(moved[mask]) > 1e-4
    # the same step with mu as the ratio's denominator (PipelineRL's), also on the GPU
    res_mu = train_step(res.model, trace, rewards=rewards, loss="ppo", lr=1e-4, device="cuda",
                        old_logprob=trace["rollout_logprob"].values, step=False)
    assert res_mu.metrics["ratio_denominator"] == "given (old_logprob)" and np.isfinite(res_mu.metrics["loss_value"])


def test_make_model_tiny_bf16_on_cuda(tmp_path, monkeypatch):
    """make_model("tiny-bf16", device="cuda"): the base is trained on the GPU and finished there
    (the head scaled, the vocabulary grown to 32000 with tokens far below the typical logits),
    saved in bfloat16, and it loads back."""
    from transformers import AutoModelForCausalLM

    from rlparity.models import CHARS, SPECIAL_TOKENS, make_model, make_prompts

    monkeypatch.setenv("RLPARITY_CACHE", str(tmp_path / "cache"))  # the base model goes here
    path = make_model("tiny-bf16", tmp_path / "tiny-bf16", device="cuda", progress=False)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["vocab_size"] == 32000 and cfg.get("torch_dtype", cfg.get("dtype")) == "bfloat16"
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    base = len(SPECIAL_TOKENS) + len(CHARS)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    ids = torch.tensor([tok(make_prompts(1)[0])["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    top = logits[:, :base].max(dim=1).values
    assert (logits[:, base:].max(dim=1).values < top - 8).all()  # the grown tail is never predicted
    assert torch.softmax(logits, dim=-1)[:, base:].sum(dim=1).max().item() < 1e-3
    assert top.max().item() > 12  # logit_scale 3 on the tiny model's ~7 (the CPU build: 31-34)
