"""The doctor's second slice (issue 37): the baseline table (is my number normal), the
sequence-level views, and the correction counterfactuals, each against an independent reference
(hand-computed numbers, pure-Python float64 loops written from the peers' formulas, a float64
recomputation of the gradient with a plain transformers forward)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

from rlparity.metrics import baselines as bl
from rlparity.metrics import counterfactual as cf
from rlparity.metrics import sequences as sq


def _d():
    rng = np.random.default_rng(3)
    d = rng.normal(0, 0.02, (6, 8))
    d[0, 0] = 0.0005       # inside [0.999, 1.002]
    d[1, 3] = 0.9          # |d| > ln 2
    d[2, 5] = -np.inf      # the trainer gives probability 0
    d[3, 1] = 0.04         # outside +-1%, inside +-5%
    d[4, :] = 0.0003       # a whole sequence inside the tightest band
    mask = np.ones_like(d, bool)
    mask[5, 4:] = False
    return np.where(mask, d, np.nan), mask


# ---------------------------------------------------------------- sequence views

def test_band_shares_match_a_python_loop():
    d, mask = _d()
    bands = {"a": (0.999, 1.002), "b": (0.99, 1.01), "c": (0.95, 1.05)}
    got = sq.band_shares(d, mask, bands=bands)
    for name, (lo, hi) in bands.items():
        tok_in = seq_in = 0
        n_tok = 0
        for i in range(d.shape[0]):
            all_in = True
            for t in range(d.shape[1]):
                if not mask[i, t]:
                    continue
                n_tok += 1
                x = float(d[i, t])
                inside = math.isfinite(x) and lo <= math.exp(x) <= hi
                tok_in += inside
                all_in &= inside
            seq_in += all_in
        assert got["token_share"][name] == pytest.approx(tok_in / n_tok, abs=1e-12)
        assert got["sequence_share"][name] == pytest.approx(seq_in / 6, abs=1e-12)
    assert got["sequence_share"]["a"] == pytest.approx(1 / 6)  # only row 4
    far = sum(1 for i in range(6) for t in range(8) if mask[i, t] and not (abs(d[i, t]) <= math.log(2)))
    assert far == 2 and got["above_ln2_token_share"] == pytest.approx(far / mask.sum())
    assert got["above_ln2_sequence_share"] == pytest.approx(2 / 6)
    assert got["n_zero_prob"] == 1 and got["n_tokens"] == int(mask.sum())


def test_sequence_mean_and_top_kl():
    d, mask = _d()
    m = sq.sequence_mean_abs(d, mask)
    for i in range(6):
        xs = [abs(float(x)) for x, k in zip(d[i], mask[i]) if k and math.isfinite(x)]
        assert m[i] == pytest.approx(sum(xs) / len(xs), rel=1e-12)
    top = sq.top_kl(d, mask, n=3)
    assert (top[0][0], top[0][1]) == (2, 5) and top[0][3] == math.inf  # probability 0 first
    assert (top[1][0], top[1][1]) == (1, 3)
    assert top[1][3] == pytest.approx(math.exp(0.9) - 1 - 0.9, rel=1e-12)
    k3 = sorted(math.expm1(float(d[i, t])) - float(d[i, t]) for i in range(6) for t in range(8)
                if mask[i, t] and math.isfinite(d[i, t]))
    assert top[2][3] == pytest.approx(k3[-2], rel=1e-12)


def _trace(d, mask, attrs=None):
    n, w = d.shape
    mu = np.where(mask, -1.0, np.nan)
    pi = np.where(mask, -1.0 + d, np.nan)
    return xr.Dataset({"rollout_logprob": (("sequence", "position"), mu),
                       "trainer_processed_logprob": (("sequence", "position"), pi),
                       "trainer_logprob": (("sequence", "position"), pi),
                       "response_mask": (("sequence", "position"), mask),
                       "token_id": (("sequence", "position"), np.arange(n * w).reshape(n, w))},
                      coords={"sequence": np.arange(n), "position": np.arange(w)}, attrs=attrs or {})


def test_sequence_view_dataset_and_text():
    d, mask = _d()
    t = _trace(d, mask)
    v = sq.sequence_view(t)
    ref = sq.band_shares(d, mask)
    assert list(v["band"].values) == list(ref["token_share"])
    np.testing.assert_allclose(v["token_share"].values, list(ref["token_share"].values()))
    assert v["sequence_mean_abs_log_ratio"].sizes["sequence"] == 6
    rows = sq.top_kl_tokens(t, n=2, decode=lambda ids: f"<{ids[0]}>")
    assert rows[1]["token_id"] == 1 * 8 + 3 and rows[1]["text"] == "<11>"
    assert rows[1]["mu"] == pytest.approx(math.exp(-1.0)) and rows[1]["pi_old"] == pytest.approx(math.exp(-0.1))


# ---------------------------------------------------------------- baseline table

def test_percentile_against_hand_values():
    vals = [0.010, 0.020, 0.020, 0.030, 0.050]
    assert bl.percentile_of(0.005, vals) == 0.0
    assert bl.percentile_of(0.020, vals) == pytest.approx(100 * (1 + 1) / 5)  # 1 below, 2 equal
    assert bl.percentile_of(0.040, vals) == pytest.approx(80.0)
    assert bl.percentile_of(0.060, vals) == 100.0
    assert math.isnan(bl.percentile_of(float("nan"), vals))


def _attrs(dtype="bfloat16", head="float32", device="cuda", backend="FLASH_ATTN", **extra):
    return {"engine_effective": {"dtype": dtype, "head_dtype": head, "attention_backend": backend,
                                 "logprobs_mode": "processed_logprobs"},
            "trainer": {"dtype": dtype, "head_dtype": head, "device": device},
            "versions": {"vllm": "0.26.0"}, **extra}


def test_table_places_a_number_and_names_the_nearest_row():
    rng = np.random.default_rng(0)
    units = []
    scales = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06]
    for k, s in enumerate(scales):
        d = np.full((4, 5), s)
        units.append(("store", f"run{k}", f"run{k}@step_000", _trace(d, np.ones_like(d, bool), _attrs()), "H200"))
    d = rng.normal(0, 1, (4, 5))
    units.append(("store", "bad", "bad", _trace(d, np.ones_like(d, bool), _attrs(faults={"causes": ["x"]})), "H200"))
    units.append(("store", "f32", "f32", _trace(np.full((2, 2), 0.001), np.ones((2, 2), bool),
                                                _attrs(dtype="float32")), "H200"))
    rows = bl.build_rows(units)
    assert len(rows) == 2  # the faulty arm is left out
    bf = next(r for r in rows if r.key["dtype"] == "bf16")
    assert len(bf.runs) == 6 and bf.n_units == 6 and bf.n_tokens == 120 and not bf.few
    key = bl.baseline_key(_attrs(), device="H200")
    p = bl.place(0.045, "abs_log_ratio_mean", key, rows)
    assert p["exact"] and p["percentile"] == pytest.approx(100 * 4 / 6)  # 4 of 6 below
    assert p["text"].startswith("p67 of 6 clean batches (6 runs) of dense bf16")
    # k3 of a constant d is exp(d) - 1 - d: the same ranks
    assert bl.place(math.expm1(0.045) - 0.045, "kl_k3", key, rows)["percentile"] == pytest.approx(100 * 4 / 6)
    near = bl.place(0.045, "abs_log_ratio_mean", bl.baseline_key(_attrs(backend="TRITON_ATTN"), device="H100"), rows)
    assert not near["exact"] and set(near["differs"]) == {"attention_backend", "device"}
    assert near["row"]["dtype"] == "bf16"
    few = bl.place(0.0005, "abs_log_ratio_mean", bl.baseline_key(_attrs(dtype="float32"), device="H200"), rows)
    assert few["few_runs"] and few["percentile"] == 0.0 and "too few runs" in few["text"]


def test_shipped_table_reads_and_says_what_it_was_measured_on():
    rows = bl.load_baselines()
    assert rows and all(r.sources and r.n_tokens > 0 for r in rows)
    assert all(r.few == (len(r.runs) < 5) for r in rows)
    keys = [r.key for r in rows]
    assert any(k["device"] == "H200" and k["dtype"] == "fp32" for k in keys)
    assert any(k["device"] == "cpu" for k in keys) and any(k["family"] == "moe" for k in keys)


def test_clean_rule():
    assert bl.is_clean(_attrs())[0]
    assert not bl.is_clean(_attrs(faults={"causes": ["stale_prefix_cache"]}))[0]
    assert not bl.is_clean(_attrs(layer_scenario="partial_weight_sync"))[0]
    raw = _attrs()
    raw["engine_effective"]["logprobs_mode"] = "raw_logprobs"
    assert bl.is_clean(raw) == (False, "raw engine logprobs")
    # a recorded loop's step: the engine reported nothing, the loop named raw logprobs (engine_given)
    given = {"engine_given": {"logprobs_mode": "raw_logprobs", "dtype": "bfloat16"}}
    assert bl.is_clean(given) == (False, "raw engine logprobs")
    assert bl.is_clean({"engine_given": {"logprobs_mode": "processed_logprobs"}}) == (True, "")
    # what the engine reported wins over what the loop named
    both = {"engine_effective": {"logprobs_mode": "processed_logprobs"}, "engine_given": {"logprobs_mode": "raw_logprobs"}}
    assert bl.is_clean(both)[0]
    stale = _attrs(weight_updates=[{"cache_reset": False}])
    stale["engine_effective"]["enable_prefix_caching"] = True
    assert not bl.is_clean(stale)[0]


# ---------------------------------------------------------------- corrections vs the peers' formulas

C = 2.0


def _peer_reference(d, mask, correction, log_mu, adv):
    """Pure-Python float64 per-token (weight, keep) from the peers' formulas: verl rollout_corr
    (token / sequence IS truncated at C, rollout_rs seq_mean_k3), the IcePop token mask (masked
    where ratio < 1/C or > C), MIS (ratio > C dropped), geometric / product bands, prime-rl's DPPO
    mask (scripts/peers/prime_rl_token_export.py: torch.where(A > 0, p > high, p < -low) with
    p = exp(trainer) - exp(inference), 0.2 / 0.2) and NeMo-RL's sequence mask
    (scripts/peers/nemo_rl_logger.py: keep mean_t exp(|d|) <= threshold)."""
    n, L = d.shape
    W = np.full(d.shape, np.nan)
    K = np.zeros(d.shape, bool)
    for i in range(n):
        toks = [(t, float(d[i, t])) for t in range(L) if mask[i, t]]
        ok = all(math.isfinite(x) for _, x in toks)
        s = sum(x for _, x in toks) if ok else float("nan")
        for t, x in toks:
            if not math.isfinite(x):
                continue
            r = math.exp(x)
            if correction == "none":
                w, k = 1.0, True
            elif correction == "token_tis":
                w, k = min(r, C), True
            elif correction == "sequence_tis":
                w, k = (min(math.exp(s), C), True) if ok else (float("nan"), False)
            elif correction == "token_mis":
                w, k = r, r <= C
            elif correction == "token_mask":
                w, k = 1.0, 1 / C <= r <= C
            elif correction == "sequence_mean_mask":
                mean_k3 = sum(math.exp(y) - 1 - y for _, y in toks) / len(toks) if ok else float("inf")
                w, k = 1.0, mean_k3 <= 5e-7
            elif correction == "geometric_rejection":
                w, k = 1.0, ok and 0.999 <= math.exp(s / len(toks)) <= 1.001
            elif correction == "product_band_mask":
                w, k = 1.0, ok and 0.5 <= math.exp(s) <= 2.0
            elif correction == "dppo_mask":
                p = math.exp(float(log_mu[i, t]) + x) - math.exp(float(log_mu[i, t]))
                w, k = 1.0, not (p > 0.2 if adv[i] > 0 else p < -0.2)
            else:  # seq_error_mask
                err = sum(math.exp(abs(y)) for _, y in toks) / len(toks) if ok else float("inf")
                w, k = 1.0, err <= 1.05
            W[i, t], K[i, t] = w, k
    return W, K


@pytest.mark.parametrize("correction", list(cf.CORRECTIONS))
def test_each_correction_equals_the_peer_formula(correction):
    rng = np.random.default_rng(7)
    d = rng.normal(0, 0.4, (12, 6))
    d[:3] = rng.normal(0, 3e-4, (3, 6))  # sequences the tight rules keep
    d[4, 2] = np.inf
    mask = np.ones_like(d, bool)
    mask[6, 3:] = False
    d = np.where(mask, d, np.nan)
    log_mu = np.log(rng.uniform(0.05, 0.9, d.shape))
    adv = rng.normal(size=12)
    adv[5] = 0.0
    w, keep = cf.correction_weights(d, mask, correction=correction, log_mu=log_mu, advantages=adv)
    W, K = _peer_reference(d, mask, correction, log_mu, adv)
    np.testing.assert_array_equal(keep, K)
    np.testing.assert_allclose(np.where(K, w, 0.0), np.where(K, W, 0.0), rtol=0, atol=1e-9)
    row = cf.counterfactual_row(d, mask, correction=correction, log_mu=log_mu, advantages=adv)
    usable = mask & np.isfinite(d)
    eff = [W[i, t] if K[i, t] else 0.0 for i in range(12) for t in range(6) if usable[i, t]]
    ess = sum(eff) ** 2 / (len(eff) * sum(x * x for x in eff)) if any(eff) else float("nan")
    assert row["ess"] == pytest.approx(ess, abs=1e-9) or (math.isnan(ess) and math.isnan(row["ess"]))
    dropped = [i for i in range(12) if any(usable[i, t] and not K[i, t] for t in range(6))]
    assert row["dropped_sequences"] == dropped
    assert row["dropped_sequence_share"] == pytest.approx(len(dropped) / 12)
    assert row["dropped_token_share"] == pytest.approx(sum(1 for i in range(12) for t in range(6)
                                                           if usable[i, t] and not K[i, t]) / usable.sum())


def test_dppo_mask_matches_the_prime_rl_dashboard_and_needs_advantages():
    from rlparity.metrics.dashboard import prime_rl_metrics

    rng = np.random.default_rng(4)
    log_mu = np.log(rng.uniform(0.05, 0.95, (10, 7)))
    log_pi = np.minimum(log_mu + rng.normal(0, 0.5, log_mu.shape), 0.0)
    mask = np.ones(log_mu.shape, bool)
    adv = rng.normal(size=10)
    _, keep = cf.correction_weights(log_pi - log_mu, mask, correction="dppo_mask", log_mu=log_mu, advantages=adv)
    peer = prime_rl_metrics(log_pi, log_mu, mask, advantages=adv)
    share = (~keep).mean(axis=1)
    assert 0 < share.mean() < 1
    assert share.mean() == pytest.approx(peer["is_masked/mean"], abs=1e-12)
    assert share.max() == pytest.approx(peer["is_masked/max"], abs=1e-12)
    for given in ({}, {"log_mu": log_mu}, {"advantages": adv}):
        with pytest.raises(ValueError, match="needs log_mu"):
            cf.correction_weights(log_pi - log_mu, mask, correction="dppo_mask", **given)
    assert "dppo_mask" not in [r["correction"] for r in cf.counterfactual_table(log_pi - log_mu, mask)]


def test_would_hide_rules():
    base = {"correction": "token_tis", "ess": 0.9, "dropped_token_share": 0.0}
    assert cf.would_hide(base)
    assert not cf.would_hide({**base, "ess": 0.2})
    assert not cf.would_hide({**base, "dropped_token_share": 0.5})
    assert not cf.would_hide({**base, "correction": "none"})
    assert cf.would_hide({**base, "ess": 0.3, "dropped_token_share": 0.1})  # the rules' edges are healthy
    w, keep = cf.correction_weights(np.array([[math.log(2.0), math.log(2.5)]]), correction="token_mis")
    assert keep.tolist() == [[True, False]] and w[0, 0] == pytest.approx(2.0)  # rho == C is kept


# ---------------------------------------------------------------- gradients on the tiny model

def _f64_gradient(model_path, trace, coef):
    """-(1/n_kept) sum_t A_i w_t grad log pi(t) in float64 with a plain transformers forward (raw
    reading: full vocabulary, T = 1), independent of rlparity's scorer and train_step."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float64)
    model.eval()
    params = [p for p in model.parameters() if p.requires_grad]
    adv = trace["advantage"].values
    n_kept = int((coef != 0).sum())
    total = 0.0
    for i in range(trace.sizes["sequence"]):
        pl = int(trace["prompt_length"].values[i])
        prompt = [int(x) for x in trace["prompt_token_id"].values[i, :pl]]
        L = int(trace["response_mask"].values[i].sum())
        resp = [int(x) for x in trace["token_id"].values[i, :L]]
        ids = torch.tensor([prompt + resp])
        logits = model(ids).logits[0, pl - 1: pl - 1 + L].double()
        lp = logits.log_softmax(-1).gather(1, torch.tensor(resp).unsqueeze(1)).squeeze(1)
        c = torch.tensor(coef[i, :L], dtype=torch.float64)
        total = total - (lp * c).sum() * float(adv[i]) / n_kept
    grads = torch.autograd.grad(total, params, allow_unused=True)
    return np.concatenate([(g if g is not None else torch.zeros_like(p)).detach().numpy().ravel()
                           for g, p in zip(grads, params)])


def test_correction_gradients_against_float64(tiny_model):
    from rlparity.experiments.counterfactual import correction_gradients
    from rlparity.models import make_prompts
    from rlparity.score import score
    from rlparity.train import generate_trace

    t = score(generate_trace(tiny_model, make_prompts(3, seed=5), n=4, max_new_tokens=10), tiny_model,
              progress=False)
    m = t["response_mask"].values.astype(bool)
    rng = np.random.default_rng(1)
    mu = np.minimum(t["trainer_logprob"].values - rng.normal(0, 0.3, m.shape), -1e-6)  # an engine off by noise
    t["rollout_logprob"] = (("sequence", "position"), np.where(m, mu, np.nan))
    t["reward"] = ("sequence", (t["sample_index"].values % 2).astype(float))
    rows = correction_gradients(t, tiny_model, corrections=["none", "token_tis", "token_mask", "token_mis", "dppo_mask",
                                                          "sequence_mean_mask"], trainer="raw")
    by = {r["correction"]: r for r in rows}
    assert len(rows) == 6  # the corrections asked for, no more
    assert by["none"]["cosine_vs_parity"] == pytest.approx(1.0, abs=1e-9)
    gone = by["sequence_mean_mask"]  # its bound (5e-7 nats) drops every sequence of this noisy engine: no update
    assert gone["dropped_token_share"] == 1.0 and gone["grad_norm"] == 0.0
    assert gone["norm_ratio_vs_parity"] == 0.0 and gone["norm_ratio_vs_full_is"] == 0.0
    assert math.isnan(gone["cosine_vs_parity"]) and not gone["looks_healthy"]
    from rlparity.train.reward import group_advantages

    adv = group_advantages(t["reward"].values, t["prompt_index"].values, scale="std")
    ref = t.assign(advantage=("sequence", adv))
    d = t["trainer_logprob"].values - t["rollout_logprob"].values
    g = {}
    for c in ("none", "token_tis", "token_mask", "token_mis", "dppo_mask"):
        w, keep = cf.correction_weights(np.where(m, d, np.nan), m, correction=c,
                                        log_mu=t["rollout_logprob"].values, advantages=adv)
        g[c] = _f64_gradient(tiny_model, ref, np.where(keep, w, 0.0))
    w_is = np.where(m, np.exp(np.where(m, d, 0.0)), 0.0)
    g_is = _f64_gradient(tiny_model, ref, w_is)

    def cos(a, b):
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    for c in ("token_tis", "token_mask", "token_mis", "dppo_mask"):
        assert by[c]["cosine_vs_parity"] == pytest.approx(cos(g[c], g["none"]), abs=2e-4)
        assert by[c]["cosine_vs_full_is"] == pytest.approx(cos(g[c], g_is), abs=2e-4)
        assert by[c]["norm_ratio_vs_parity"] == pytest.approx(np.linalg.norm(g[c]) / np.linalg.norm(g["none"]),
                                                              rel=2e-4)
    assert by["token_tis"]["cosine_vs_parity"] < 0.999  # the noise moves the update: the check can fail
    assert by["token_mask"]["dropped_token_share"] > 0


# ---------------------------------------------------------------- the doctor's page

def test_doctor_places_views_and_counterfactuals():
    from rlparity.diagnose.doctor import doctor
    from rlparity.plot.doctor import plot_sequence_views
    from rlparity.testing import synthetic_trace

    steps = {k: synthetic_trace(n_sequences=8, max_len=10, noise=0.01 * (k + 1), seed=k).assign_attrs(_attrs())
             for k in range(3)}
    table = [0.002, 0.004, 0.009, 0.05, 0.1]
    rows = bl.build_rows([("s", f"r{j}", f"r{j}", _trace(np.full((4, 4), s), np.ones((4, 4), bool), _attrs()), "H200")
                          for j, s in enumerate(table)])
    rep = doctor({"run": steps}, n_boot=0, baselines=rows, device="H200")
    r = rep.runs["run"]
    for k in range(3):
        p = r.normal["steps"][str(k)]["abs_log_ratio_mean"]
        m = steps[k]["response_mask"].values.astype(bool)
        d = np.where(m, steps[k]["trainer_processed_logprob"].values - steps[k]["rollout_logprob"].values, np.nan)
        x = [abs(float(v)) for v in d[m]]
        ref = 100 * (sum(t < sum(x) / len(x) for t in table)) / len(table)
        assert p["exact"] and p["percentile"] == pytest.approx(ref)
        assert r.views[k]["token_share"] == pytest.approx(sq.band_shares(d, m)["token_share"])
    names = [c["correction"] for c in r.counterfactual["rows"]]
    assert r.counterfactual["step"] == 2 and names == [c for c in cf.CORRECTIONS if c not in cf.NEEDS_ADVANTAGES]
    clean = {k: synthetic_trace(n_sequences=8, max_len=10, noise=0.0, seed=k).assign_attrs(_attrs()) for k in range(3)}
    rc = doctor({"clean": clean}, n_boot=0, baselines=rows, device="H200").runs["clean"]
    assert not rc.first_named and rc.counterfactual["step"] == 2  # no cause: the last step
    page = str(rep)
    assert "is it normal" in page and "does it matter" in page and "inside ratio bands" in page
    fig = plot_sequence_views(r.views)
    assert len(fig.data) == 2 * len(r.views[0]["token_share"]) + 2
    assert list(fig.data[0].x) == [0, 1, 2]
    from rlparity.plot.layout import trace_colors

    colours = trace_colors(fig)  # the book's rule: every trace coloured from the palette, never plotly's cycle
    assert None not in colours.values() and colours["tokens in 1%"] == colours["sequences in 1%"]


def test_edges_and_empty_sequences():
    d = np.array([[0.0, math.log(2.0), 0.0], [-np.inf, -np.inf, np.nan]])
    mask = np.array([[True, True, True], [True, True, False]])
    s = sq.band_shares(d, mask, bands={"exact": (1.0, 1.0)})
    assert s["token_share"]["exact"] == pytest.approx(2 / 5)  # rho == 1 on both edges is inside
    assert s["above_ln2_token_share"] == pytest.approx(2 / 5)  # |d| == ln 2 is not above; -inf is
    m = sq.sequence_mean_abs(d, mask)
    assert m[0] == pytest.approx(math.log(2) / 3) and math.isnan(m[1])
    assert len(sq.top_kl(d, mask, n=100)) == 5


def test_baseline_key_fields():
    assert bl.baseline_key(_attrs(), device="H100") == {
        "family": "dense", "dtype": "bf16", "engine": "vllm 0.26.0", "attention_backend": "FLASH_ATTN",
        "head": "fp32 head", "device": "H100"}
    moe = bl.baseline_key(_attrs(routing_capture={"mode": "engine"}))
    assert moe["family"] == "moe" and moe["device"] == "cuda"
    a = _attrs()
    a["engine_effective"]["head_dtype"] = None
    assert bl.baseline_key(a)["head"] == "bf16 engine / fp32 trainer head"  # falls back to the engine's dtype
    a["trainer"]["head_dtype"] = None
    assert bl.baseline_key(a)["head"] == "bf16 head"
    kept = _attrs(weight_updates=[{"cache_reset": False}])  # prefix cache off: nothing stale
    assert bl.is_clean(kept)[0]


def test_one_token_sequence_and_prefix_cache_reset():
    d = np.array([[0.5, np.nan], [0.1, 0.3]])
    m = sq.sequence_mean_abs(d, ~np.isnan(d))
    assert m[0] == pytest.approx(0.5) and m[1] == pytest.approx(0.2)
    on = _attrs(weight_updates=[{"cache_reset": True}])
    on["engine_effective"]["enable_prefix_caching"] = True
    assert bl.is_clean(on)[0]


def test_cli_json_places_the_shipped_runs_and_refuses_a_missing_model(cli):
    import json

    res = cli("doctor", "h200-rl", "--json", "--boot", "0")
    assert res.exit_code == 1, res.output[-2000:]  # causes are named on two profiles
    data = json.loads(res.stdout)
    par = data["runs"]["pipelinerl-parity+pi_old"]
    p0 = par["normal"]["steps"]["0"]["abs_log_ratio_mean"]
    assert p0["exact"] and p0["row"]["device"] == "H200" and p0["few_runs"]  # the device from the example's name
    assert 0 < p0["percentile"] < 100
    v1 = data["runs"]["vllm-v1-defaults+pi_old"]
    assert v1["normal"]["steps"]["0"]["abs_log_ratio_mean"]["percentile"] == 100.0
    assert v1["counterfactual"]["step"] == 0 and v1["counterfactual"]["causes"] == ["raw_logprobs"]
    hides = {r["correction"] for r in v1["counterfactual"]["rows"] if r["hides"]}
    assert {"token_tis", "token_mask", "dppo_mask"} <= hides and "geometric_rejection" not in hides
    assert set(par["views"]["99"]["token_share"]) == set(defaults_bands())
    bad = cli("doctor", "h200-rl", "--model", "/nonexistent-model")
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--model" in bad.stderr


def defaults_bands():
    from rlparity.config import defaults

    return defaults().ratio_bands
