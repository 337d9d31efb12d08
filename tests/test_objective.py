"""The objective layer: ratios of three policies, clips, corrections, ESS (numpy core with known
answers, xarray layer with dim=), the objective findings, and the correction demonstration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlparity.config import ObjectiveDefaults, defaults

from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.diagnose.objective import (
    backend_ratio_not_centred,
    correction_hides_backend_mismatch,
    ess_collapse,
    masked_fraction_high,
    objective_findings,
    trace_findings,
    update_ratio_clipped_often,
)
from rlparity.metrics import objective as ob
from rlparity.testing import synthetic_trace
from rlparity.trace import with_trainer

M = np.array([[True, True, True, False], [True, True, False, False]])


def with_theta(trace, scale: float, seed: int = 0):
    """pi_theta = pi_old moved by a seeded perturbation of ``scale`` nats per token."""
    rng = np.random.default_rng(seed)
    old = trace["trainer_processed_logprob"].values
    delta = rng.normal(0, scale, old.shape)
    return with_trainer(trace, {"trainer_updated_processed_logprob": np.minimum(old + delta, 0.0),
                                "trainer_updated_logprob": trace["trainer_logprob"].values + delta})


# ----------------------------------------------------------------------------------- numpy core
def test_sequence_ratios_and_exclusion():
    d = np.array([[0.1, -0.3, 0.2, 9.0], [0.0, -np.inf, 5.0, 5.0]])
    prod = ob.sequence_log_ratio(d, M, kind="product")
    geo = ob.sequence_log_ratio(d, M, kind="geometric")
    assert prod.value[0] == pytest.approx(0.0) and geo.value[0] == pytest.approx(0.0)
    assert np.isnan(prod.value[1]) and prod.n_excluded.tolist() == [0, 1]  # the -inf sequence is left out
    assert prod.n_used.tolist() == [3, 2]
    used, excl = ob.token_counts(d, M)
    assert (used, excl) == (4, 1)


def test_clip_fractions():
    d = np.log(np.array([[1.0, 1.25, 0.7, 1.0], [1.1, 0.85, 1.0, 1.0]]))
    cf = ob.token_clip_fraction(d, M)
    assert cf.value == pytest.approx(2 / 5) and cf.n_used == 5 and cf.n_excluded == 0
    per_seq = ob.token_clip_fraction(d, M, axis=1)
    np.testing.assert_allclose(per_seq.value, [2 / 3, 0.0])
    assert ob.token_clip_fraction(d, M, eps_low=0.35, eps_high=0.3).value == 0.0
    # GSPO: s_i = exp(mean d); sequence 0's geometric ratio is (1.25 * 0.7)^(1/3) = 0.956
    g = ob.sequence_clip_fraction(d, M)
    s0 = (1.25 * 0.7) ** (1 / 3)
    s1 = (1.1 * 0.85) ** 0.5
    assert g.value == pytest.approx(np.mean([abs(s0 - 1) > 3e-4, abs(s1 - 1) > 3e-4])) and g.n_used == 2
    assert ob.sequence_clip_fraction(d, M, eps_low=0.04, eps_high=0.04).value == pytest.approx(0.5)  # s0 = 0.957


def test_tis_band_and_kl_rejection():
    rho = np.array([[3.0, 1.0, 0.4, 1.0], [1.5, 0.9, 1.0, 1.0]])
    d = np.log(rho)
    w = ob.tis_weights(d, M, cap=2.0)
    np.testing.assert_allclose(w[0, :3], [2.0, 1.0, 0.4])
    assert np.isnan(w[0, 3])  # padding
    seq = ob.importance_weights(d, M, level="sequence", kind="product")
    assert seq[0, 0] == pytest.approx(1.2) and seq[1, 1] == pytest.approx(1.35)
    keep = ob.rejection_keep(d, M, rule="token_band")  # [0.5, 2]
    assert keep.tolist() == [[False, True, False, False], [True, True, False, False]]
    assert ob.rejection_keep(d, M, rule="product_band", threshold=(0.5, 1.25)).tolist() == \
        [[True, True, True, False], [False, False, False, False]]
    k3 = rho - 1 - d
    assert ob.kl_keep(d, M, rule="token_k3", threshold=0.1).tolist() == ((k3 <= 0.1) & M).tolist()
    seq_sum = np.where(M, k3, 0).sum(1)
    assert ob.kl_keep(d, M, rule="seq_sum_k3", threshold=0.5)[:, 0].tolist() == (seq_sum <= 0.5).tolist()
    seq_max_k2 = np.where(M, d ** 2 / 2, -1).max(1)
    assert ob.kl_keep(d, M, rule="seq_max_k2", threshold=0.2)[:, 0].tolist() == (seq_max_k2 <= 0.2).tolist()
    seq_mean_k1 = np.where(M, -d, 0).sum(1) / M.sum(1)
    band = (-0.1, 0.1)
    assert ob.kl_keep(d, M, rule="seq_mean_k1", threshold=band)[:, 0].tolist() == \
        ((seq_mean_k1 >= -0.1) & (seq_mean_k1 <= 0.1)).tolist()
    with pytest.raises(ValueError, match="band"):
        ob.kl_keep(d, M, rule="token_k1", threshold=0.3)
    with pytest.raises(ValueError, match="rule="):
        ob.rejection_keep(d, M, rule="seq_max_k1")
    frac = ob.rejected_fraction(keep, d, M)
    assert frac.value == pytest.approx(2 / 5)
    assert ob.rejected_fraction(keep, d, M, level="sequence").value == pytest.approx(0.5)


def test_rejection_never_keeps_probability_zero_tokens():
    d = np.array([[0.0, -np.inf, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    for rule in ob.RULES:
        thr = (-10.0, 10.0) if rule.endswith("k1") else (10.0 if "_k" in rule else (0.0, 1e9))
        keep = ob.rejection_keep(d, M, rule=rule, threshold=thr)
        assert not keep[0, 1]
        if rule.startswith("seq") or rule in ("geometric_band", "product_band"):
            assert not keep[0].any()  # a sequence rule drops the whole sequence
        assert keep[1, :2].all()


def test_ess():
    assert ob.weights_ess(np.ones(10)).value == pytest.approx(1.0)
    assert ob.weights_ess(np.array([1.0, 0, 0, 0])).value == pytest.approx(0.25)
    d = np.array([[800.0, 800.0, 799.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # exp(800) overflows float64
    m = np.array([[True, True, True, False], [False] * 4])
    w = np.exp(np.array([1.0, 1.0, 0.0]))
    assert ob.token_ess(d, m).value == pytest.approx(w.sum() ** 2 / (3 * (w ** 2).sum()))
    long = np.full((3, 400), 2.0)
    long[1] = 0.0
    e = ob.sequence_ess(long, kind="product")  # sums of 800 nats
    assert e.value == pytest.approx(2 / 3, rel=1e-9) and e.n_used == 3  # two of three sequences carry it all


def test_decoupled_equals_bypass_without_truncation():
    t = with_theta(synthetic_trace(noise=0.1, seed=4), 0.05)
    ds = ob.decoupled(t)
    m = t["response_mask"].values
    np.testing.assert_allclose(ds["weight"].values[m], ds["bypass_ratio"].values[m], rtol=1e-12)
    capped = ob.decoupled(t, cap=1.05)
    assert np.nanmax(capped["correction_weight"].values) <= 1.05
    assert capped["correction_weight"].attrs["pair"] == "backend (pi_old, mu)"
    assert capped["update_ratio"].attrs["pair"] == "update (pi_theta, pi_old)"


# ---------------------------------------------------------------------------------- xarray layer
def test_pairs_dims_and_attrs():
    t = with_theta(synthetic_trace(noise=0.05, seed=5), 0.1)
    assert ob.available_pairs(t) == ["backend", "update", "bypass"]
    cf = ob.clip_fraction(t, "update")
    assert cf.attrs["pair"] == "update (pi_theta, pi_old)"
    assert cf.attrs["direction"] == "trainer_updated_processed_logprob - trainer_processed_logprob"
    assert int(cf.n_used) == int(t["response_mask"].sum()) and int(cf.n_excluded) == 0
    per_seq = ob.clip_fraction(t, "update", dim="position")
    per_pos = ob.clip_fraction(t, "update", dim="sequence")
    assert per_seq.dims == ("sequence",) and per_pos.dims == ("position",)
    n = per_seq.n_used.values
    assert float((per_seq * n).sum() / n.sum()) == pytest.approx(float(cf))
    raw = ob.clip_fraction(t, "backend", trainer="raw")
    assert raw.attrs["direction"] == "trainer_logprob - rollout_logprob"
    s = ob.ratio(t, "update", level="sequence")
    assert s.dims == ("sequence",) and s.attrs["kind"] == "geometric"
    assert ob.effective_sample_size(t, "update", level="sequence").attrs["counts"] == "sequences"
    with pytest.raises(ValueError, match="unknown dim"):
        ob.clip_fraction(t, dim="token")
    with pytest.raises(ValueError, match="pi_theta"):
        ob.clip_fraction(synthetic_trace(), "update")
    with pytest.raises(ValueError, match="pair="):
        ob.pair_log_ratio(t, "forward")


def test_summary_counts_probability_zero_tokens():
    t = with_theta(synthetic_trace(seed=6), 1e-3)
    lp = t["trainer_processed_logprob"].values.copy()
    lp[2, 1] = -np.inf
    t["trainer_processed_logprob"] = (("sequence", "position"), lp)
    s = ob.objective_summary(t)
    assert list(s["pair"].values) == ["backend", "update", "bypass"]
    assert s["n_excluded_tokens"].sel(pair="backend").item() == 1
    assert s["n_excluded_tokens"].sel(pair="update").item() == 1  # pi_theta is finite, pi_old is not
    assert s["n_excluded_sequences"].sel(pair="backend").item() == 1
    assert s["mean_ratio"].sel(pair="backend").item() == pytest.approx(1.0)
    assert s["ess_token"].sel(pair="backend").item() == pytest.approx(1.0)
    # a sequence rule drops the sequence whose ratio is undefined (its other tokens count as masked)
    n, n2 = int(t["response_mask"].sum()), int(t["response_length"][2])
    assert s["masked_fraction_geometric_band"].sel(pair="backend").item() == pytest.approx((n2 - 1) / (n - 1))
    assert s["masked_fraction_token_band"].sel(pair="backend").item() == 0.0
    assert s["token_clip_fraction"].sel(pair="update").item() == 0.0
    assert s["pair_name"].sel(pair="update").item() == "update (pi_theta, pi_old)"


def test_defaults_are_one_frozen_object():
    o = ob.OBJECTIVE_DEFAULTS
    assert (o.is_cap, o.ppo_eps, o.gspo_eps_low, o.gspo_eps_high) == (2.0, 0.2, 3e-4, 4e-4)
    assert o.token_band == (1 / o.is_cap, o.is_cap)
    assert o.kl_thresholds["seq_mean_k1"] == pytest.approx((-math.log(1.001), -math.log(0.999)))
    with pytest.raises(Exception):
        defaults().objective.is_cap = 3.0
    with pytest.raises(ValueError, match="contain 1.0"):
        ObjectiveDefaults(geometric_band=(1.01, 1.02))


# -------------------------------------------------------------------------------------- findings
RAW = dict(logprobs_mode="raw_logprobs", temperature=0.6, n_sequences=32)


def semantic_error(arm="synthetic"):
    return Finding(Layer.SEMANTIC, "raw_logprobs_used_as_processed", Severity.ERROR, "raw", {}, "", arm)


def test_backend_ratio_not_centred():
    f = backend_ratio_not_centred(synthetic_trace(**RAW))
    assert [x.name for x in f] == ["backend_ratio_not_centred"] and f[0].severity == Severity.ERROR
    assert f[0].evidence["pair"] == "backend (pi_old, mu)" and f[0].evidence["mean_ratio"] > 1.1
    assert "processed logprobs" in f[0].fix
    assert backend_ratio_not_centred(synthetic_trace(temperature=0.6, n_sequences=32)) == []


def test_ess_and_masked_fraction_findings():
    raw = synthetic_trace(**RAW)
    f = ess_collapse(raw)
    assert f and f[0].evidence["weights"] == "raw (untruncated)" and f[0].evidence["ess_sequence_product"] < 0.3
    assert ess_collapse(synthetic_trace()) == []
    assert ess_collapse(raw, ess_min=0.1, ess_collapse=0.05) == []
    assert masked_fraction_high(raw) == []  # no mask configured: nothing to judge
    m = masked_fraction_high(raw, rules=["geometric_band", "product_band", "token_band"])
    assert {x.evidence["rule"] for x in m} >= {"geometric_band", "product_band"}
    assert all(x.evidence["direction"] == "trainer_processed_logprob - rollout_logprob" for x in m)
    assert masked_fraction_high(synthetic_trace(), rules=["product_band"]) == []
    configured = raw.assign_attrs(objective_correction={"masks": ["token_band"]})
    only = masked_fraction_high(configured, masked_fraction_max=0.05)
    assert [x.evidence["rule"] for x in only] == ["token_band"] and " drops " in only[0].summary


def test_update_ratio_clipped_often():
    t = synthetic_trace(seed=7)
    assert update_ratio_clipped_often(t) == []  # no pi_theta: nothing to say
    assert update_ratio_clipped_often(with_theta(t, 1e-6)) == []
    big = update_ratio_clipped_often(with_theta(t, 0.5))
    assert {x.evidence.get("level", "token") for x in big} == {"token", "sequence"}
    assert big[0].evidence["pair"] == "update (pi_theta, pi_old)" and big[0].evidence["ppo_token_clip_fraction"] > 0.2


def test_update_ratio_is_judged_by_the_loss_of_the_recorded_step():
    """A step of 0.02 nats per token leaves PPO's 0.2 trust region on no token but moves almost every
    sequence's geometric ratio outside GSPO's 3e-4 band: a PPO step is judged by PPO's rule only, a
    GSPO step by GSPO's (at its recorded clip), an unrecorded step by both. The fractions come from
    numpy here, not from rlparity.metrics.objective."""
    t = with_theta(synthetic_trace(seed=7, n_sequences=32), 0.02)
    m = t["response_mask"].values.astype(bool)
    d = t["trainer_updated_processed_logprob"].values - t["trainer_processed_logprob"].values
    tok = (np.abs(np.exp(d[m]) - 1) > 0.2).mean()
    geo = np.exp(np.where(m, d, 0).sum(1) / m.sum(1))
    seq = ((geo < 1 - 3e-4) | (geo > 1 + 4e-4)).mean()
    assert tok == 0 and seq > 0.5
    assert [f.evidence["level"] for f in update_ratio_clipped_often(t)] == ["sequence"]
    ppo = t.assign_attrs(train_step={"loss": "ppo", "eps_low": 0.2, "eps_high": 0.2})
    assert update_ratio_clipped_often(ppo) == []
    gspo = update_ratio_clipped_often(t.assign_attrs(train_step={"loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4}))
    assert len(gspo) == 1 and gspo[0].evidence["gspo_sequence_clip_fraction"] == pytest.approx(seq)
    assert gspo[0].evidence["loss"] == "gspo"
    # a PPO step with a tight recorded clip is held to it, per token
    tight = update_ratio_clipped_often(t.assign_attrs(train_step={"loss": "ppo", "eps_low": 0.01, "eps_high": 0.01}))
    assert [f.evidence.get("level", "token") for f in tight] == ["token"]
    assert tight[0].evidence["ppo_token_clip_fraction"] == pytest.approx((np.abs(np.exp(d[m]) - 1) > 0.01).mean())


def test_correction_hides_backend_mismatch():
    raw, par = synthetic_trace(**RAW), synthetic_trace(temperature=0.6, n_sequences=32)
    f = correction_hides_backend_mismatch(raw, [semantic_error()])
    assert [x.name for x in f] == ["correction_hides_backend_mismatch"] and f[0].severity == Severity.ERROR
    assert f[0].evidence["backend_errors"] == ["semantic/raw_logprobs_used_as_processed"]
    assert f[0].evidence["corrected_looks_healthy"] and "backend first" in f[0].fix
    assert correction_hides_backend_mismatch(raw, []) == []  # no backend error: nothing hidden
    assert correction_hides_backend_mismatch(par, [semantic_error()], correction={"tis": "token"})
    # a configured correction fires even when the corrected weights do not look healthy
    noisy = synthetic_trace(noise=3.0, seed=9)
    assert correction_hides_backend_mismatch(noisy, [semantic_error()]) == []
    configured = noisy.assign_attrs(objective_correction={"tis": "token", "cap": 2.0})
    assert correction_hides_backend_mismatch(configured, [semantic_error()])


def test_diagnose_runs_the_objective_layer_after_the_backend():
    """diagnose() runs the objective checks last, with the backend findings of the same arm: on a
    raw-mode trace the objective layer says the backend ratio is off and that a correction would
    hide the semantic error; on a parity trace it says nothing; the report lists the backend first."""
    from rlparity.diagnose import diagnose

    raw, par = synthetic_trace(**RAW), synthetic_trace(temperature=0.6, n_sequences=32)
    report = diagnose(raw, correction="token_tis, geometric_band")
    names_raw = {f.name for f in report.by_layer(Layer.OBJECTIVE)}
    assert {"backend_ratio_not_centred", "correction_hides_backend_mismatch", "masked_fraction_high"} <= names_raw
    hides = next(f for f in report if f.name == "correction_hides_backend_mismatch")
    # a configured correction over a broken backend stays an error and names the cause it hides
    assert hides.severity == Severity.ERROR and "backend first" in hides.fix
    assert hides.evidence["comes_from"] == ["raw_logprobs"]
    assert diagnose(par).by_layer(Layer.OBJECTIVE) == []
    # without a correction, the off-centre backend ratio is a consequence of raw mode: explained by it
    plain = diagnose(raw)
    centred = next(f for f in plain if f.name == "backend_ratio_not_centred")
    assert centred.severity == Severity.INFO and centred.explained_by == "raw_logprobs"
    assert "backend_ratio_not_centred" not in plain.names() and "masked_fraction_high" not in plain.names()
    assert plain.headline("synthetic").name == "raw_logprobs_used_as_processed"
    text = str(report)
    assert text.index("semantic/raw_logprobs_used_as_processed") < text.index("objective/")
    assert {f.name for f in trace_findings(raw, prior=list(plain.findings))} == \
        {f.name for f in plain.by_layer(Layer.OBJECTIVE)}
    with pytest.raises(ValueError, match="unknown objective option"):
        objective_findings(raw, tol=0.1)


# --------------------------------------------------------------------------------- demonstration
def test_correction_demo_on_one_step(tiny_model):
    """A raw_logprobs trace of the same samples (mu = the full-vocabulary T=1 reading), corrected
    by token TIS and a geometric mask, gives another update than the parity trace; without a
    correction the raw logprobs never reach a trainer that recomputes pi_old."""
    from rlparity.experiments.objective import correction_demo
    from rlparity.models import make_prompts
    from rlparity.score import score
    from rlparity.train import generate_trace

    par = score(generate_trace(tiny_model, make_prompts(4, seed=3), n=4, max_new_tokens=12), tiny_model,
                progress=False)
    raw = par.copy()
    raw["rollout_logprob"] = (("sequence", "position"),
                              np.where(par["response_mask"], par["trainer_logprob"].values, np.nan))
    raw.attrs.update(arm="raw", engine_effective={**par.attrs["engine_effective"], "logprobs_mode": "raw_logprobs"})
    rewards = (par["sample_index"].values < 2).astype(float)
    out = correction_demo(raw, par, tiny_model, rewards=rewards, mask_rule="geometric_band", threshold=(0.9, 1.1))
    assert out["same_samples"]
    assert abs(out["after"]["mean_ratio"] - 1) < abs(out["before"]["mean_ratio"] - 1)  # looks fixed
    assert 0 < out["masked_fraction"]["tokens"] < 1
    assert out["effective_batch"]["kept_tokens"] < int(par["response_mask"].sum())
    assert out["cosine_raw_uncorrected_vs_parity"] == pytest.approx(1.0, abs=1e-9)
    assert out["cosine_raw_corrected_vs_parity"] < 0.95
    # a ratio against mu (PipelineRL, prime-rl) lets the raw logprobs into the uncorrected update itself
    assert out["cosine_raw_vs_parity_mu_denominator"] < 0.99
    m = par["response_mask"].values.astype(bool)
    w = np.exp(par["trainer_processed_logprob"].values[m] - par["trainer_logprob"].values[m])
    assert out["truncated_fraction"] == pytest.approx((w > 2.0).mean())
    assert not out["uncorrected_health"]["looks_healthy"] or out["corrected_health"]["looks_healthy"]
    assert [f.name for f in out["findings_raw"]] == ["correction_hides_backend_mismatch"]
    assert out["findings_parity"] == [] and out["other_errors_parity"] == []
    # the paper's geometric band rejects the whole raw batch: no update at all
    strict = correction_demo(raw, par, tiny_model, rewards=rewards, findings_raw=[], findings_parity=[])
    assert strict["masked_fraction"]["tokens"] == 1.0 and math.isnan(strict["cosine_raw_corrected_vs_parity"])


def test_quantile_cap_truncates_the_asked_share():
    """The cap at which token TIS truncates a share of the tokens, against numpy's quantile of
    exp(pi_old - mu) over the real, finite tokens; a trace with no usable token is refused."""
    from rlparity.experiments.objective import quantile_cap

    t = synthetic_trace(n_sequences=24, max_len=32, top_k=8, seed=5)
    noise = np.random.default_rng(0).normal(0.0, 0.2, t["rollout_logprob"].shape)  # a spread of weights
    t["rollout_logprob"] = t["trainer_processed_logprob"] - noise
    m = t["response_mask"].values.astype(bool)
    d = (t["trainer_processed_logprob"].values - t["rollout_logprob"].values)[m]
    w = np.exp(d[np.isfinite(d)].astype(np.float64))
    for share in (0.05, 0.1, 0.3):
        c = quantile_cap(t, share)
        assert c == pytest.approx(max(np.quantile(w, 1 - share), 1.0), rel=1e-9)
        assert (w > c).mean() == pytest.approx(share, abs=2 / w.size)
    with pytest.raises(ValueError, match="no usable token"):
        quantile_cap(t.assign(response_mask=t["response_mask"] * 0), 0.1)


def test_token_band_follows_the_cap():
    assert ObjectiveDefaults(is_cap=4.0).token_band == (0.25, 4.0)
    assert ObjectiveDefaults(is_cap=4.0, token_band=(0.2, 3.0)).token_band == (0.2, 3.0)


def test_the_trainer_default_comes_from_defaults_in_every_objective_function():
    """``defaults_context(trainer="raw")`` moves the objective layer as it moves ``summary`` (issue 23)."""
    from rlparity.config import defaults_context
    from rlparity.metrics import summary

    t = synthetic_trace(n_sequences=12, max_len=16, top_k=8, seed=3)
    processed, raw = ob.objective_summary(t), ob.objective_summary(t, trainer="raw")
    assert float(processed["mean_log_ratio"].sel(pair="backend")) != float(raw["mean_log_ratio"].sel(pair="backend"))
    with defaults_context(trainer="raw"):
        s = ob.objective_summary(t)
        assert s.attrs["trainer_side"] == "raw"
        assert s["direction"].sel(pair="backend").item() == "trainer_logprob - rollout_logprob"
        np.testing.assert_array_equal(s["mean_log_ratio"].values, raw["mean_log_ratio"].values)
        assert ob.pair_log_ratio(t).attrs["direction"] == "trainer_logprob - rollout_logprob"
        assert ob.clip_fraction(t, "backend").attrs["trainer_side"] == "raw"
        assert summary(t).attrs["trainer_side"] == "raw"  # the same default as the summary's
