"""Every peer dashboard metric against an independent implementation of the published formula.

The references below are written from the peers' formulas (plain Python loops over sequences
and tokens, ``math`` only), not from rlparity's code, on seeded synthetic traces: a parity trace,
a raw-logprobs trace with rollout noise, a top-k trace with large noise, each also with a
constructed pi_theta (pi_old moved by a seeded perturbation) for the ``policy="theta"`` side.
Each test prints the max abs difference per metric (``pytest -s``).
"""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from rlparity.metrics.dashboard import DASHBOARDS, as_dashboard
from rlparity.metrics.objective import OBJECTIVE_DEFAULTS
from rlparity.testing import synthetic_trace
from rlparity.trace import with_trainer

CASES = {
    "parity": dict(noise=0.0, logprobs_mode="processed_logprobs", seed=1),
    "raw_noisy": dict(noise=0.05, logprobs_mode="raw_logprobs", seed=2),
    "topk_noisy": dict(noise=0.3, logprobs_mode="processed_logprobs", top_k=5, seed=3),
}
DIFFS: dict[str, dict[str, float]] = {}


def make_trace(case: str):
    t = synthetic_trace(n_sequences=24, **CASES[case])
    rng = np.random.default_rng(100 + CASES[case]["seed"])
    old = t["trainer_processed_logprob"].values
    theta = np.minimum(old + rng.normal(0, 0.08, old.shape), 0.0)
    raw_theta = t["trainer_logprob"].values + (theta - old)
    t = with_trainer(t, {"trainer_updated_processed_logprob": np.where(np.isnan(old), np.nan, theta),
                         "trainer_updated_logprob": raw_theta,
                         "advantage": rng.normal(0, 1, t.sizes["sequence"])})
    return t


def seqs_of(trace, policy="old"):
    """[(trainer logprobs, rollout logprobs)] per sequence, real tokens only (plain lists)."""
    var = {"old": "trainer_processed_logprob", "theta": "trainer_updated_processed_logprob"}[policy]
    out = []
    for i in range(trace.sizes["sequence"]):
        n = int(trace["response_length"].values[i])
        out.append(([float(x) for x in trace[var].values[i, :n]],
                    [float(x) for x in trace["rollout_logprob"].values[i, :n]]))
    return out


def mean(xs):
    return sum(xs) / len(xs)


plain_mean = mean


def vmean(xs):
    """verl_F.masked_mean of a list of masked-in values: sum / (count + 1e-8)."""
    return sum(xs) / (len(xs) + 1e-8)


def clamp(x, lo=-20.0, hi=20.0):
    return max(lo, min(hi, x))


def pearson(xs, ys):
    mx, my = mean(xs), mean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy)


# ---------------------------------------------------------------- verl, from rollout_corr_helper.py
def ref_verl(seqs, cap, level, rs):
    toks = [(a, b) for lt, lr in seqs for a, b in zip(lt, lr)]
    out = {}
    mean_ = plain_mean  # plain means (over sequences, torch .mean())
    mean = vmean  # noqa: F841  verl_F.masked_mean: sum / (count + 1e-8)
    # compute_offpolicy_metrics
    mt = [mean(lt) for lt, _ in seqs]
    mr = [mean(lr) for _, lr in seqs]
    out["training_ppl"] = mean_([math.exp(-x) for x in mt])
    out["training_log_ppl"] = mean_([-x for x in mt])
    out["kl"] = mean([b - a for a, b in toks])
    out["k3_kl"] = mean([math.exp(a - b) - (a - b) - 1 for a, b in toks])
    out["rollout_ppl"] = mean_([math.exp(-x) for x in mr])
    out["rollout_log_ppl"] = mean_([-x for x in mr])
    lpd = [r - t for t, r in zip(mt, mr)]
    out["log_ppl_diff"] = mean_(lpd)
    out["log_ppl_abs_diff"] = mean_([abs(x) for x in lpd])
    out["log_ppl_diff_max"] = max(lpd)
    out["log_ppl_diff_min"] = min(lpd)
    out["ppl_ratio"] = mean_([math.exp(x) for x in lpd])
    out["chi2_token"] = mean([math.exp(clamp(a - b)) ** 2 for a, b in toks]) - 1
    out["chi2_seq"] = mean_([math.exp(2 * clamp(sum(a - b for a, b in zip(lt, lr)))) for lt, lr in seqs]) - 1
    # compute_rollout_correction_weights + compute_is_metrics
    if level == "token":
        raw = [[math.exp(clamp(a - b)) for a, b in zip(lt, lr)] for lt, lr in seqs]
    else:
        raw = [[math.exp(clamp(sum(a - b for a, b in zip(lt, lr))))] * len(lt) for lt, lr in seqs]
    w = [[min(x, cap) for x in s] for s in raw]
    fw = [x for s in w for x in s]
    fr = [x for s in raw for x in s]
    out["rollout_is_mean"] = mean(fw)
    if level == "token":
        out["rollout_is_ratio_fraction_high"] = mean([float(x > cap) for x in fr])
        out["rollout_is_ratio_fraction_low"] = mean([float(x < 1 / cap) for x in fr])
        out["rollout_is_max"], out["rollout_is_min"] = max(fw), min(fw)
    else:
        sums = [sum(a - b for a, b in zip(lt, lr)) for lt, lr in seqs]
        out["rollout_is_max"] = math.exp(min(max(sums), 20.0))
        out["rollout_is_min"] = math.exp(min(sums))
        out["rollout_is_ratio_fraction_high"] = mean_([float(s > math.log(cap)) for s in sums])
        out["rollout_is_ratio_fraction_low"] = mean_([float(s < math.log(1 / cap)) for s in sums])
    wc = [min(max(x, 0.0), cap) for x in fw]
    m = mean(wc)
    out["rollout_is_std"] = math.sqrt(max(mean([x * x for x in wc]) - m * m, 0.0))
    m = mean(wc)
    out["rollout_is_eff_sample_size"] = 1.0 / mean([(x / (m + 1e-8)) ** 2 for x in wc])
    sm = [mean(s) for s in w]
    out["rollout_is_seq_mean"] = mean_(sm)
    out["rollout_is_seq_std"] = statistics.stdev(sm)
    out["rollout_is_seq_max"], out["rollout_is_seq_min"] = max(sm), min(sm)
    out["rollout_is_seq_max_deviation"] = max(abs(x - 1) for x in sm)
    rsm = [mean(s) for s in raw]
    out["rollout_is_seq_fraction_high"] = mean_([float(x > cap) for x in rsm])
    out["rollout_is_seq_fraction_low"] = mean_([float(x < 1 / cap) for x in rsm])
    # compute_rollout_rejection_mask + compute_rs_metrics
    keep_all = [[True] * len(lt) for lt, _ in seqs]
    for opt, thr in rs.items():
        level_name, est = opt.rsplit("_", 1)

        def k(a, b):
            x = clamp(a - b)
            return {"k1": -x, "k2": 0.5 * x * x, "k3": math.exp(x) - 1 - x}[est]

        if est == "k1":
            lo, hi = math.log(thr[0]), math.log(thr[1])
        else:
            lo, hi = None, thr

        def ok(v):
            return (lo <= v <= hi) if est == "k1" else v <= hi

        stats, keeps, seq_stats = [], [], []
        for lt, lr in seqs:
            ks = [k(a, b) for a, b in zip(lt, lr)]
            if level_name == "token":
                stats.append(ks)
                keeps.append([ok(v) for v in ks])
            else:
                s = {"seq_sum": sum(ks), "seq_mean": mean(ks), "seq_max": max(ks)}[level_name]
                seq_stats.append(s)
                stats.append([s] * len(ks))
                keeps.append([ok(s)] * len(ks))
        p = f"rollout_rs_{opt}"
        flat = [v for s in stats for v in s]
        out[f"{p}_mean"] = mean(flat)
        low = lo if est == "k1" else 0.0
        if seq_stats:
            out[f"{p}_max"], out[f"{p}_min"] = max(seq_stats), min(seq_stats)
            out[f"{p}_fraction_high"] = mean_([float(v > hi) for v in seq_stats])
            out[f"{p}_fraction_low"] = mean_([float(v < low) for v in seq_stats]) if est == "k1" else 0.0
        else:
            out[f"{p}_max"], out[f"{p}_min"] = max(flat), min(flat)
            out[f"{p}_fraction_high"] = mean([float(v > hi) for v in flat])
            out[f"{p}_fraction_low"] = mean([float(v < low) for v in flat]) if est == "k1" else 0.0
        out[f"{p}_masked_fraction"] = mean([float(not x) for s in keeps for x in s])
        out[f"{p}_seq_masked_fraction"] = mean_([float(not all(s)) for s in keeps])
        keep_all = [[a and b for a, b in zip(s, t)] for s, t in zip(keep_all, keeps)]
    out["rollout_rs_masked_fraction"] = mean([float(not x) for s in keep_all for x in s])
    out["rollout_rs_seq_masked_fraction"] = mean_([float(not all(s)) for s in keep_all])
    res = {f"rollout_corr/{k}": v for k, v in out.items()}
    # verl/utils/debug/metrics.py
    pt = [math.exp(a) for a, _ in toks]
    pr = [math.exp(b) for _, b in toks]
    diff = [abs(a - b) for a, b in zip(pt, pr)]
    res["training/rollout_probs_diff_max"] = max(diff)
    res["training/rollout_probs_diff_mean"] = mean_(diff)
    res["training/rollout_probs_diff_std"] = statistics.stdev(diff)
    res["training/rollout_actor_probs_pearson_corr"] = pearson(pt, pr)
    return res


# ------------------------------------------------------ PipelineRL, from finetune/rl/__init__.py
def ref_pipelinerl(seqs, loss, el, eh):
    B = len(seqs)
    kl = ratio = ind = 0.0
    rs = r2s = nt = 0.0
    for new, old in seqs:
        L = len(new)
        ds = [a - b for a, b in zip(new, old)]
        rs_ = [math.exp(x) for x in ds]
        kl += sum(r - x - 1 for r, x in zip(rs_, ds)) / L
        ratio += sum(rs_) / L
        rs += sum(rs_)
        r2s += sum(r * r for r in rs_)
        nt += L
        if loss == "ppo":
            ind += sum(float(r < 1 - el or r > 1 + eh) for r in rs_) / L
        else:
            g = math.exp(sum(ds) / L)
            ind += float(g < 1 - el or g > 1 + eh)
    return {"rl/kl_new_old": kl / B, "rl/ratio_new_old": ratio / B, "rl/ratio_new_old_sum": rs,
            "rl/ratio_new_old_squared_sum": r2s, "rl/num_output_tokens_sum": nt,
            "rl/clamp_log_ratio_new_old_indicator": ind / B, "rl/ess": rs * rs / r2s / nt}


# -------------------------------------------------------------- prime-rl, from trainer/rl/loss.py
def ref_prime(seqs, adv, low, high):
    ks = [math.exp(a - b) - (a - b) - 1 for t, i in seqs for a, b in zip(t, i)]
    out = {"mismatch_kl/all/mean": mean(ks), "mismatch_kl/all/std": statistics.stdev(ks),
           "mismatch_kl/all/max": max(ks)}
    per, per_lo, per_hi = [], [], []
    for (t, i), a in zip(seqs, adv):
        m = lo_ = hi_ = 0
        for x, y in zip(t, i):
            pd = math.exp(x) - math.exp(y)
            is_hi, is_lo = pd > high, pd < -low
            m += is_hi if a > 0 else is_lo
            hi_ += (a > 0) and is_hi
            lo_ += (a < 0) and is_lo
        per.append(m / len(t))
        per_lo.append(lo_ / len(t))
        per_hi.append(hi_ / len(t))
    out.update({"is_masked/mean": mean(per), "is_masked/max": max(per), "is_masked_low/mean": mean(per_lo),
                "is_masked_high/mean": mean(per_hi)})
    return out


def ref_slime(seqs):
    return {"train/train_rollout_logprob_abs_diff": mean([mean([abs(a - b) for a, b in zip(t, r)])
                                                          for t, r in seqs])}


def ref_trl(seqs, mode, cmin, cmax):
    deltas = [abs(a - b) for o, s in seqs for a, b in zip(o, s)]
    if mode.startswith("sequence"):
        rs = [math.exp(sum(a - b for a, b in zip(o, s))) for o, s in seqs]
    else:
        rs = [math.exp(a - b) for o, s in seqs for a, b in zip(o, s)]
    lo = -math.inf if cmin is None else cmin
    hi = math.inf if cmax is None else cmax
    if mode.endswith("truncate"):
        rs = [min(max(r, lo), hi) for r in rs]
    else:
        rs = [0.0 if (r < lo or r > hi) else r for r in rs]
    return {"sampling/sampling_logp_difference/mean": mean(deltas),
            "sampling/sampling_logp_difference/max": max(deltas),
            "sampling/importance_sampling_ratio/min": min(rs),
            "sampling/importance_sampling_ratio/mean": mean(rs),
            "sampling/importance_sampling_ratio/max": max(rs)}


def ref_nemo(seqs):
    toks = [(p, g) for pr, ge in seqs for p, g in zip(pr, ge)]
    return {"token_mult_prob_error": mean([math.exp(abs(g - p)) for p, g in toks]),
            "gen_kl_error": mean([math.exp(p - g) - 1 - (p - g) for p, g in toks])}


def compare(name: str, ours: dict, ref: dict) -> dict[str, float]:
    assert set(ref) <= set(ours), f"missing {sorted(set(ref) - set(ours))}"
    diffs = {}
    for k, v in ref.items():
        diffs[k] = abs(ours[k] - v)
        assert diffs[k] <= 1e-9 * max(1.0, abs(v)), f"{name} {k}: ours {ours[k]!r} vs formula {v!r}"
    agg = DIFFS.setdefault(name.split(":")[0], {})
    for k, v in diffs.items():
        agg[k] = max(agg.get(k, 0.0), v)
    return diffs


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("policy", ["old", "theta"])
def test_verl(case, policy):
    t = make_trace(case)
    o = OBJECTIVE_DEFAULTS
    rs = {"token_k1": o.token_band, "seq_mean_k1": o.geometric_band, "seq_sum_k1": o.product_band}
    compare("verl", as_dashboard(t, "verl", policy=policy), ref_verl(seqs_of(t, policy), o.is_cap, "token", rs))
    rs2 = {"token_k2": 0.05, "token_k3": 0.05, "seq_sum_k2": 0.4, "seq_sum_k3": 0.4, "seq_mean_k2": 0.01,
           "seq_mean_k3": 0.01, "seq_max_k2": 0.2, "seq_max_k3": 0.2, "seq_sum_k1": (0.3, 4.0)}
    ours = as_dashboard(t, "verl", policy=policy, rollout_is="sequence", rollout_is_threshold=3.0, rollout_rs=rs2)
    compare("verl", ours, ref_verl(seqs_of(t, policy), 3.0, "sequence", rs2))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("policy", ["old", "theta"])
def test_pipelinerl(case, policy):
    t = make_trace(case)
    compare("pipelinerl", as_dashboard(t, "pipelinerl", policy=policy),
            ref_pipelinerl(seqs_of(t, policy), "ppo", 0.2, 0.2))
    compare("pipelinerl", as_dashboard(t, "pipelinerl", policy=policy, policy_loss="gspo", epsilon_low=0.01,
                                       epsilon_high=0.02),
            ref_pipelinerl(seqs_of(t, policy), "gspo", 0.01, 0.02))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("policy", ["old", "theta"])
def test_prime_slime_trl_nemo(case, policy):
    t = make_trace(case)
    s = seqs_of(t, policy)
    compare("prime-rl", as_dashboard(t, "prime-rl", policy=policy, dppo_mask_low=0.02, dppo_mask_high=0.03),
            ref_prime(s, t["advantage"].values.tolist(), 0.02, 0.03))
    compare("slime", as_dashboard(t, "slime", policy=policy), ref_slime(s))
    for mode, cmin, cmax in [("sequence_mask", None, 3.0), ("token_truncate", 0.5, 1.5),
                             ("token_mask", 0.8, 1.25), ("sequence_truncate", None, 2.0)]:
        compare("trl", as_dashboard(t, "trl", policy=policy, vllm_importance_sampling_mode=mode,
                                    vllm_importance_sampling_clip_min=cmin,
                                    vllm_importance_sampling_clip_max=cmax), ref_trl(s, mode, cmin, cmax))
    compare("nemo-rl", as_dashboard(t, "nemo-rl", policy=policy), ref_nemo(s))


def test_metrics_move_with_the_mismatch():
    """The peers' gates read the mismatch: parity passes them, the raw trace fails them."""
    par, raw = make_trace("parity"), make_trace("raw_noisy")
    assert as_dashboard(par, "slime")["train/train_rollout_logprob_abs_diff"] < 1e-12
    assert as_dashboard(raw, "slime")["train/train_rollout_logprob_abs_diff"] > 0.1  # slime's CI gate
    assert abs(as_dashboard(par, "nemo-rl")["token_mult_prob_error"] - 1) < 1e-12
    assert as_dashboard(raw, "nemo-rl")["token_mult_prob_error"] > 1.05  # NeMo-RL's plot threshold
    assert as_dashboard(par, "prime-rl")["mismatch_kl/all/mean"] < 1e-12
    assert as_dashboard(raw, "prime-rl")["mismatch_kl/all/mean"] > 0.015  # prime-rl's new-model gate


def test_pair_recorded_and_zero_probability_tokens_excluded_and_counted():
    t = make_trace("topk_noisy")
    lp = t["trainer_processed_logprob"].values.copy()
    lp[0, 0] = lp[5, 2] = -np.inf
    t["trainer_processed_logprob"] = (("sequence", "position"), lp)
    for name in DASHBOARDS:
        d = as_dashboard(t, name)
        assert d.n_excluded == 2 and d.n_tokens == int(t["response_mask"].sum()) - 2
        assert d.pair == "backend (pi_old, mu)"
        assert d.direction == "trainer_processed_logprob - rollout_logprob"
        assert all(np.isfinite(v) for v in d.values()), name
    assert as_dashboard(t, "verl", policy="theta").pair == "bypass (pi_theta, mu)"
    # the excluded tokens are the only difference from a trace whose mask drops them
    s = seqs_of(t)
    s[0] = (s[0][0][1:], s[0][1][1:])
    s[5] = (s[5][0][:2] + s[5][0][3:], s[5][1][:2] + s[5][1][3:])
    compare("nemo-rl:excluded", as_dashboard(t, "nemo-rl"), ref_nemo(s))
    ds = as_dashboard(t, "trl", as_dataset=True)
    assert ds.attrs["n_excluded"] == 2 and "sampling/importance_sampling_ratio/mean" in ds


def test_options_are_checked():
    t = make_trace("parity")
    with pytest.raises(ValueError, match="has no option"):
        as_dashboard(t, "slime", rollout_is="token")
    with pytest.raises(ValueError, match="names="):
        as_dashboard(t, "openrlhf")
    with pytest.raises(ValueError, match="pi_theta"):
        as_dashboard(synthetic_trace(), "verl", policy="theta")


def test_every_peer_metric_was_checked_against_its_formula():
    """Runs last: every peer's dashboard took part in the comparisons above, and every metric name
    it reports (default options) was compared with the peer's own formula at least once."""
    if not DIFFS:
        pytest.skip("run with the other tests of this module")
    from rlparity.metrics.dashboard import DASHBOARDS

    assert set(DIFFS) == set(DASHBOARDS), sorted(set(DASHBOARDS) ^ set(DIFFS))
    t = make_trace("parity")
    for peer in DASHBOARDS:
        unchecked = sorted(set(as_dashboard(t, peer)) - set(DIFFS[peer]))
        assert not unchecked, f"{peer}: metrics never compared with a formula: {unchecked}"
