"""The fast trainer LM-head statistics (issue 16) equal the reference implementation.

``rlparity.score.lm_head_stats.head_stats`` (one fused full-vocabulary pass, processed statistics from a
top-k window) against ``head_stats_reference`` (the implementation before issue 16) on the same
hidden states and weights: every statistic within 1e-5 nats, the same ``-inf`` tokens, the same
ranks and max logits, ties at the top-k boundary kept as vLLM keeps them. Both are also compared
with an independent float64 computation (``tests/head_reference.py``: numpy, top-p included),
since they share helpers. Also a known answer for the ties, a float64 check of the accuracy, the
Scorer end to end on the tiny model, and the summary's fast scalar path against its general path.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from head_reference import rows_case  # noqa: E402
from rlparity.score import lm_head_stats as H  # noqa: E402

TOL = 1e-5  # nats, float32 head


def assert_same(new: dict, ref: dict, tol: float = TOL) -> dict[str, float]:
    worst = {}
    for name in H.STATS:
        x, y = np.asarray(new[name], dtype=float), np.asarray(ref[name], dtype=float)
        assert x.shape == y.shape, name
        inf = ~np.isfinite(y)
        assert np.array_equal(~np.isfinite(x), inf), f"{name}: -inf on other tokens"
        assert np.array_equal(x[inf], y[inf], equal_nan=True), name  # -inf where excluded, NaN where nothing cut
        d = float(np.abs(x[~inf] - y[~inf]).max()) if (~inf).any() else 0.0
        worst[name] = d
        assert d <= tol, f"{name}: max |new - reference| = {d:.2e} > {tol:.0e}"
    assert np.array_equal(new["trainer_token_rank"], ref["trainer_token_rank"])
    assert np.array_equal(new["trainer_max_logit"], ref["trainer_max_logit"])
    return worst


@pytest.mark.parametrize("vocab", [5000, 4096])  # no blocks (5000 = 8 x 625) / blocks of 128 (top-k window)
def test_head_stats_equals_reference_fp32(vocab):
    h, w, tok, temp, k, p = rows_case(vocab)
    ref = H.head_stats_reference(h, w, None, tok, temp, k, p, "float32", chunk_tokens=128)
    new = H.head_stats(h, w, None, tok, temp, k, p, "float32", chunk_tokens=100, compile=False)
    assert_same(new, ref)
    no_p = torch.ones_like(p)  # chunks with top-k and no top-p take the plain window path
    assert_same(H.head_stats(h, w, None, tok, temp, k, no_p, "float32", compile=False),
                H.head_stats_reference(h, w, None, tok, temp, k, no_p, "float32"))
    # the cases really occur: -inf tokens, cut mass, ties wider than the window's slack
    assert np.isneginf(ref["trainer_processed_logprob"]).sum() > 20
    assert (ref["trainer_log_kept_mass"] < -1e-3).sum() > 100
    tied = (k.numpy() == 5) & (temp.numpy() > 0) & (p.numpy() == 1.0)
    tied[np.arange(len(tied)) % 8 != 3] = False
    assert tied.sum() > 5


def test_head_stats_equals_reference_bf16_head_and_bias():
    h, w, tok, temp, k, p = rows_case(4096, n=300, seed=1)
    bias = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    h, w = h.bfloat16(), w.bfloat16()
    for hd in ("bfloat16", "float32"):
        ref = H.head_stats_reference(h, w, bias, tok, temp, k, p, hd)
        new = H.head_stats(h, w, bias, tok, temp, k, p, hd, compile=False)
        assert_same(new, ref)


def test_head_stats_compiled_equals_reference():
    """The torch.compile path (CUDA's default; on CPU from a 32k vocabulary) gives the same."""
    h, w, tok, temp, k, p = rows_case(4096, n=300, seed=3)
    ref = H.head_stats_reference(h, w, None, tok, temp, k, p, "float32")
    new = H.head_stats(h, w, None, tok, temp, k, p, "float32", compile=True)
    assert_same(new, ref)
    no_p = torch.ones_like(p)
    assert_same(H.head_stats(h, w, None, tok, temp, k, no_p, "float32", compile=True),
                H.head_stats_reference(h, w, None, tok, temp, k, no_p, "float32"))


def test_ties_at_the_kth_value_are_kept_known_answer():
    """Logits [9, 8, 5 x 20, 0 ...]: top-k 3 keeps the two largest and all 20 tied at 5."""
    vocab = 4096
    w = torch.zeros(vocab, 2)
    w[:, 0] = 0.0
    w[0, 0], w[1, 0] = 9.0, 8.0
    w[10:30, 0] = 5.0
    h = torch.tensor([[1.0, 0.0]] * 3)
    tok = torch.tensor([15, 0, 500])  # a tied token, the top one, one outside the kept set
    temp = torch.full((3,), 0.5)
    k = torch.full((3,), 3)
    p = torch.ones(3)
    new = H.head_stats(h, w, None, tok, temp, k, p, "float32", compile=False)
    kept = np.array([9.0, 8.0] + [5.0] * 20) / 0.5
    lse = np.log(np.exp(kept - kept.max()).sum()) + kept.max()
    full = np.array([9.0, 8.0] + [5.0] * 20 + [0.0] * (vocab - 22)) / 0.5
    lse_full = np.log(np.exp(full - full.max()).sum()) + full.max()
    lp = new["trainer_processed_logprob"]
    assert math.isclose(lp[0], 10.0 - lse, abs_tol=1e-6)
    assert math.isclose(lp[1], 18.0 - lse, abs_tol=1e-6)
    assert lp[2] == -np.inf
    assert np.allclose(new["trainer_log_kept_mass"], lse - lse_full, atol=1e-6)
    assert new["trainer_token_rank"].tolist() == [2, 0, 22]
    assert_same(new, H.head_stats_reference(h, w, None, tok, temp, k, p, "float32"))


def _logits(h, w, bias, head_dtype):
    """The LM head's logits as both implementations compute them on the CPU (16-bit inputs cast to the head
    dtype, float32 result): the float64 reference then starts from the very same numbers."""
    hd = getattr(torch, head_dtype)
    return torch.nn.functional.linear(h.to(hd), w.to(hd), None if bias is None else bias.to(hd)).float()


@pytest.mark.parametrize("case", ["fp32 head", "bf16 head, bias", "fp32 head over bf16, bias"])
def test_both_implementations_equal_an_independent_float64_computation(case):
    """``head_stats`` and ``head_stats_reference`` share helpers (processed_logits, project, ...), so
    their agreement alone could hide a shared mistake: both are compared with
    ``tests/head_reference.py`` (numpy float64, one row at a time, vLLM's rules restated, top-p
    included) on the same float32 logits, every statistic within 1e-5 nats."""
    from head_reference import compare, head_stats_float64

    h, w, tok, temp, k, p = rows_case(4096 if case == "fp32 head" else 5000, seed=7)
    bias = None if case == "fp32 head" else torch.randn(w.shape[0], generator=torch.Generator().manual_seed(8))
    hd = "bfloat16" if case.startswith("bf16") else "float32"
    if case != "fp32 head":
        h, w = h.bfloat16(), w.bfloat16()
    ref = head_stats_float64(_logits(h, w, bias, hd).numpy(), tok.numpy(), temp.numpy(), k.numpy(), p.numpy(),
                             margin=1e-5)
    stable = ref["stable"]
    assert stable.mean() > 0.8, stable.mean()  # the comparison covers most rows (bf16 logits tie often at the top-p cut)
    has_p = (p.numpy() < 1) & (temp.numpy() > 0)
    assert (stable & has_p).sum() > 100 and np.isneginf(ref["trainer_processed_logprob"][stable]).sum() > 20
    for impl in (H.head_stats(h, w, bias, tok, temp, k, p, hd, chunk_tokens=100, compile=False),
                 H.head_stats_reference(h, w, bias, tok, temp, k, p, hd, chunk_tokens=128)):
        compare(impl, ref, TOL)


def test_the_float64_reference_can_fail():
    """The comparison is not vacuous: 2e-5 nats of error on the top-p rows, a top-k one smaller
    than asked, or a top-p a little wider than asked are each caught."""
    from head_reference import compare, head_stats_float64

    h, w, tok, temp, k, p = rows_case(4096, n=200, seed=9)
    logits = _logits(h, w, None, "float32").numpy()
    ref = head_stats_float64(logits, tok.numpy(), temp.numpy(), k.numpy(), p.numpy(), margin=1e-5)
    good = H.head_stats(h, w, None, tok, temp, k, p, "float32", compile=False)
    compare(good, ref, TOL)
    bad = dict(good)
    bad["trainer_processed_entropy"] = good["trainer_processed_entropy"] + 2e-5 * (p.numpy() < 1)
    with pytest.raises(AssertionError, match="trainer_processed_entropy"):
        compare(bad, ref, TOL)
    for k2, p2 in ((torch.where(k > 1, k - 1, k), p), (k, torch.where(p < 1, p + 0.02, p))):
        with pytest.raises(AssertionError, match="trainer_processed|trainer_log_kept_mass|trainer_cut_margin"):
            compare(H.head_stats(h, w, None, tok, temp, k2, p2, "float32", compile=False), ref, TOL)


def test_fp32_gemm_auto_is_cast_off_cuda():
    """``fp32_gemm="auto"`` only changes the GEMM on CUDA over 16-bit inputs: elsewhere it is
    bit-for-bit ``"cast"`` (the GPU side is in tests/test_gpu.py)."""
    h, w, tok, temp, k, p = rows_case(4096, n=200, seed=10)
    h, w = h.bfloat16(), w.bfloat16()
    a = H.head_stats(h, w, None, tok, temp, k, p, "float32", compile=False, fp32_gemm="auto")
    b = H.head_stats(h, w, None, tok, temp, k, p, "float32", compile=False, fp32_gemm="cast")
    for name in H.STATS:
        assert np.array_equal(a[name], b[name], equal_nan=True), name


def test_head_stats_is_closer_to_float64_than_the_reference():
    """Same float32 logits: the new sums (float64 accumulation) are within 1e-6 nats of a float64
    computation; the reference's float32 passes are the larger part of their difference."""
    h, w, tok, temp, k, p = rows_case(4096, n=200, scale=0.1, seed=4)  # flat rows: the hard case for sums
    logits = (h @ w.T).double()
    logp = logits.log_softmax(dim=1)
    exact_lp = logp.gather(1, tok.unsqueeze(1)).squeeze(1).numpy()
    exact_ent = (-(logp.exp() * logp).sum(dim=1)).numpy()
    new = H.head_stats(h, w, None, tok, temp, k, p, "float32", compile=False)
    ref = H.head_stats_reference(h, w, None, tok, temp, k, p, "float32")
    err_new = max(np.abs(new["trainer_logprob"] - exact_lp).max(), np.abs(new["trainer_entropy"] - exact_ent).max())
    err_ref = max(np.abs(ref["trainer_logprob"] - exact_lp).max(), np.abs(ref["trainer_entropy"] - exact_ent).max())
    assert err_new < 1e-6, err_new
    assert err_new < err_ref


def test_top_window_is_exact():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(64, 8192, generator=g)
    logits[:, 100:140] = logits[:, :1]  # ties spread over blocks
    m, vals, idx = H.row_max_and_window(logits, 58)
    ref = logits.topk(58, dim=1).values
    assert torch.equal(vals, ref)
    assert torch.equal(logits.gather(1, idx), vals)
    assert torch.equal(m.squeeze(1), logits.amax(dim=1))
    assert H.block_size(151936) == 128 and H.block_size(152064) == 128 and H.block_size(5000) == 0


def test_empty_and_bad_gemm():
    w = torch.randn(64, 8)
    e = torch.zeros(0, dtype=torch.long)
    out = H.head_stats(torch.zeros(0, 8), w, None, e, e.float(), e, e.float(), "float32")
    assert all(v.shape == (0,) for v in out.values())
    with pytest.raises(ValueError, match="fp32_gemm='fast'; use one of"):
        H.project(torch.zeros(2, 8), w, None, "float32", "fast")


def test_scorer_matches_reference_end_to_end(tiny_model):
    """Scorer.score (new head) against the reference head on the same forward, tiny model."""
    from rlparity.score import Scorer
    from rlparity.trace import from_rollouts

    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(3, 40, rng.integers(3, 9))) for _ in range(10)]
    resp = [list(rng.integers(3, 40, rng.integers(1, 12))) for _ in range(10)]
    trace = from_rollouts(prompt_token_ids=prompts, token_ids=resp,
                          rollout_logprobs=[[-1.0] * len(r) for r in resp],
                          temperature=[0.7, 1.0, 0.0, 1.3, 0.7] * 2, top_k=[0, 5, 20, 3, 0] * 2,
                          top_p=[1.0, 1.0, 0.9, 1.0, 0.8] * 2)
    scorer = Scorer(tiny_model, progress=False, tokenize_prompts=False, batch_size=4)
    scored = scorer.score(trace)
    seqs = [(p, r) for p, r in zip(prompts, resp)]
    with torch.inference_mode():
        for batch in scorer.batches(seqs):
            hidden = scorer.response_hidden(seqs, batch)
            rows = torch.cat(hidden)
            tok = torch.tensor([t for i in batch for t in resp[i]])
            def per(name, dt, batch=batch):
                return torch.tensor([trace[name].values[i] for i in batch for _ in resp[i]], dtype=dt)

            ref = H.head_stats_reference(rows, scorer.head_weight, scorer.head_bias, tok,
                                         per("temperature", torch.float32), per("top_k", torch.long),
                                         per("top_p", torch.float32), "float32")
            got = {name: np.concatenate([scored[name].values[i, : len(resp[i])] for i in batch]) for name in H.STATS}
            assert_same(got, ref)
    assert scored.attrs["trainer"]["fp32_gemm"] == "auto"


# -- metrics: the fast scalar summary ------------------------------------------------------
def _traces():
    from rlparity.testing import synthetic_trace

    out = [synthetic_trace(40, 30, noise=0.1, top_k=5, seed=0),
           synthetic_trace(12, 50, noise=0.5, top_p=0.9, seed=1, logprobs_mode="raw_logprobs"),
           synthetic_trace(30, 8, noise=0.0, seed=2)]
    t = synthetic_trace(25, 20, noise=0.2, top_k=3, seed=3)
    mask = t["response_mask"].values
    lp = t["trainer_processed_logprob"].values.copy()
    mu = t["rollout_logprob"].values.copy()
    real = np.argwhere(mask)
    lp[tuple(real[0])] = -np.inf  # probability 0 under the trainer
    lp[tuple(real[1])] = np.nan  # a NaN reading
    lp[tuple(real[2])] = 800.0  # exp overflows: excluded from the ratio averages
    mu[tuple(real[3])] = -np.inf  # mu = 0: d = +inf
    t["trainer_processed_logprob"] = (t["trainer_processed_logprob"].dims, lp)
    t["rollout_logprob"] = (t["rollout_logprob"].dims, mu)
    out.append(t)
    return out


@pytest.mark.parametrize("i", range(4))
def test_scalar_summary_equals_general_path(i):
    from rlparity.metrics import summary

    for trainer in ("processed", "raw"):
        trace = _traces()[i]
        fast = summary(trace, trainer)
        general = summary(trace, trainer, dim=("sequence", "position"))
        assert list(fast.data_vars) == list(general.data_vars)
        for name in general.data_vars:
            a, b = fast[name], general[name]
            assert a.dtype == b.dtype and a.shape == b.shape == (), name
            assert a.attrs == b.attrs, name
            x, y = float(a), float(b)
            assert (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-12, (name, x, y)
        assert {k: v for k, v in fast.attrs.items() if k != "created_at"} == \
            {k: v for k, v in general.attrs.items() if k != "created_at"}
        if i == 3 and trainer == "processed":  # the edge cases are there
            assert int(fast["n_zero_prob"]) == 1 and int(fast["n_used"]) == int(fast["n_tokens"]) - 3


def _reference(lp, lm, eps):
    """The summary of the real tokens ``lp``/``lm`` (1-d), in float64 from the definitions, with
    nothing of rlparity: sums with math.fsum, quantiles and correlation from numpy."""
    lp, lm = np.asarray(lp, np.float64), np.asarray(lm, np.float64)
    d = lp - lm
    x = d[np.isfinite(d)]
    n = x.size
    mean = (lambda v: math.fsum(v) / len(v) if len(v) else math.nan)
    with np.errstate(over="ignore"):
        r, k3 = np.exp(x), np.expm1(x) - x
    rf = r[np.isfinite(r)]
    keep = np.isfinite(lm) & ~np.isnan(lp)
    with np.errstate(over="ignore"):
        pi, mu = np.exp(lp[keep]), np.exp(lm[keep])  # pi = 0 counts; an overflowing pi is left out
    diff = np.abs(pi - mu)
    diff = diff[np.isfinite(diff)]
    both = np.isfinite(pi) & np.isfinite(mu)
    pi, mu = pi[both], mu[both]
    out = {"n_tokens": lp.size, "n_used": n, "n_zero_prob": int(np.isneginf(lp).sum()),
           "log_ratio_mean": mean(x), "abs_log_ratio_mean": mean(np.abs(x)),
           "abs_log_ratio_rms": math.sqrt(mean(x * x)) if n else math.nan,
           "abs_log_ratio_max": float(np.abs(x).max()) if n else math.nan,
           "mean_ratio": mean(rf), "kl_k1": mean(-x), "kl_k2": mean(x * x / 2),
           "kl_k3": mean(k3[np.isfinite(k3)]),
           "clip_fraction": float(np.count_nonzero((r < 1 - eps) | (r > 1 + eps))) / n if n else math.nan,
           "ess_token": math.fsum(rf) ** 2 / (rf.size * math.fsum(rf * rf)) if rf.size else math.nan,
           "prob_diff_mean": mean(diff), "prob_diff_max": float(diff.max()) if diff.size else math.nan,
           "prob_diff_std": float(np.std(diff)) if diff.size else math.nan,
           "prob_pearson": float(np.corrcoef(pi, mu)[0, 1]) if pi.size > 1 else math.nan}
    for q in (0.01, 0.05, 0.5, 0.95, 0.99):
        out[f"log_ratio_q{int(q * 100):02d}"] = float(np.quantile(x, q)) if n else math.nan
    return out


@pytest.mark.parametrize("dtype, rtol, atol", [("float64", 1e-12, 0.0), ("float32", 2e-5, 1e-6)])
@pytest.mark.parametrize("i", range(4))
def test_summary_equals_a_float64_reference(i, dtype, rtol, atol):
    """One code serves every ``dim`` (issue 23 item 4): the summary over every token, per sequence
    and per position equals a float64 reference from the definitions, within 1e-12 relative on a
    float64 trace (a float32 computation is 1e-7 off and fails) and within float32 rounding on a
    trace stored in float32 (computed in its dtype, so the shipped examples keep their numbers)."""
    from rlparity.metrics import summary

    trace = _traces()[i]
    for var in ("trainer_processed_logprob", "rollout_logprob"):
        trace[var] = trace[var].astype(dtype)
    mask = trace["response_mask"].values
    lp, lm = trace["trainer_processed_logprob"].values, trace["rollout_logprob"].values
    eps = 0.2
    groups = {None: [(slice(None), slice(None))],
              "position": [(s, slice(None)) for s in range(mask.shape[0])],
              "sequence": [(slice(None), p) for p in range(mask.shape[1])]}
    checked = 0
    for dim, cells in groups.items():
        got = summary(trace, "processed", eps, dim=dim)
        for k, cell in enumerate(cells):
            m = mask[cell]
            ref = _reference(lp[cell][m], lm[cell][m], eps)
            for name, want in ref.items():
                have = float(got[name].values if dim is None else got[name].values[k])
                if math.isnan(want):
                    assert math.isnan(have), (dim, k, name, have)
                else:
                    assert abs(have - want) <= rtol * abs(want) + atol, (dim, k, name, have, want)
                    checked += 1
    assert checked > 200
