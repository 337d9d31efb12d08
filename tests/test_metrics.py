"""Metrics on synthetic traces with known answers."""

import numpy as np

from rlparity.metrics import core, log_ratio, summary
from rlparity.testing import synthetic_trace


def test_processed_trace_has_exact_parity():
    s = summary(synthetic_trace(logprobs_mode="processed_logprobs"))
    assert s["abs_log_ratio_max"].item() < 1e-9
    assert abs(s["mean_ratio"].item() - 1) < 1e-9


def test_raw_trace_shows_temperature_offset():
    s = summary(synthetic_trace(logprobs_mode="raw_logprobs", temperature=0.6, n_sequences=32))
    assert abs(s["mean_ratio"].item() - 1) > 0.03
    # against the raw trainer side the raw rollout matches
    assert summary(synthetic_trace(logprobs_mode="raw_logprobs"), trainer="raw")["abs_log_ratio_max"].item() < 1e-9


def test_zero_probability_tokens_are_counted_not_averaged():
    ds = synthetic_trace(top_k=5)
    lp = ds["trainer_processed_logprob"].values.copy()
    lp[0, 0] = -np.inf
    lp[3, 2] = -np.inf
    ds["trainer_processed_logprob"] = (("sequence", "position"), lp)
    s = summary(ds)
    assert s["n_zero_prob"].item() == 2
    assert np.isfinite(s["abs_log_ratio_mean"].item())
    per_sequence = summary(ds, dim="position")["n_zero_prob"]
    assert per_sequence.dims == ("sequence",) and per_sequence.values[[0, 3]].tolist() == [1, 1]
    assert int(per_sequence.sum()) == 2 and s["n_used"].item() == s["n_tokens"].item() - 2


def test_log_ratio_names_pair_and_direction():
    d = log_ratio(synthetic_trace())
    assert d.attrs["pair"] == "backend (pi_old, mu)"
    assert d.attrs["units"] == "nats"


def test_core_estimators():
    d = np.array([[0.1, -0.1, np.nan]])
    m = np.array([[True, True, False]])
    kl = core.kl_estimators(d, m)
    assert abs(kl["k1"]) < 1e-12 and kl["k3"] > 0
    assert core.ess(np.ones(10)) == 1.0
    assert core.ess(np.array([1.0, 0, 0, 0])) == 0.25
    from rlparity.metrics.objective import token_clip_fraction, weights_ess

    assert token_clip_fraction(np.array([[0.3, 0.0]]), np.ones((1, 2), bool), eps_low=0.2, eps_high=0.2).value == 0.5
    # one ESS: the objective layer's counts around the core's value
    w = np.array([[1.0, 2.0, np.inf], [0.5, np.nan, 1.0]])
    m = weights_ess(w, axis=-1)
    np.testing.assert_array_equal(m.value, core.ess(w, axis=-1))
    assert m.n_used.tolist() == [2, 2] and m.n_excluded.tolist() == [1, 1]


def test_semantic_finding_on_synthetic_traces():
    from rlparity.diagnose.semantic import logprob_semantics

    raw = logprob_semantics(synthetic_trace(logprobs_mode="raw_logprobs"))
    assert raw.name == "raw_logprobs_used_as_processed" and raw.severity.value == "error"
    assert "processed_logprobs" in raw.fix
    ok = logprob_semantics(synthetic_trace(logprobs_mode="processed_logprobs"))
    assert ok.name == "logprobs_processed" and ok.severity.value == "info"
    assert logprob_semantics(synthetic_trace(temperature=1.0)).name == "logprob_semantics_untestable"


def test_dim_reductions_agree_with_a_plain_numpy_pass():
    """summary(dim=...) reduces the named dims (ArviZ's sample_dims): per position, per sequence and
    over all tokens, each equal to the same statistic computed with plain numpy on the real tokens."""
    ds = synthetic_trace(logprobs_mode="raw_logprobs", n_sequences=12, top_k=7)
    d = (ds["trainer_processed_logprob"] - ds["rollout_logprob"]).values
    m = ds["response_mask"].values
    per_pos = summary(ds, dim="sequence")
    per_seq = summary(ds, dim="position")
    assert per_pos["abs_log_ratio_rms"].dims == ("position",)
    for j in range(d.shape[1]):
        x = d[m[:, j], j]
        assert np.isclose(per_pos["abs_log_ratio_rms"].values[j], np.sqrt((x ** 2).mean()))
        assert np.isclose(per_pos["mean_ratio"].values[j], np.exp(x).mean())
    for i in range(d.shape[0]):
        x = d[i, m[i]]
        assert np.isclose(per_seq["log_ratio_mean"].values[i], x.mean())
        assert np.isclose(per_seq["log_ratio_q50"].values[i], np.median(x))
    s = summary(ds)
    assert np.isclose(s["prob_pearson"].item(), np.corrcoef(np.exp(ds["trainer_processed_logprob"].values[m]),
                                                             np.exp(ds["rollout_logprob"].values[m]))[0, 1])
    assert s["n_tokens"].item() == int(m.sum()) == int(per_seq["n_tokens"].sum())
    # the accessor is the same computation
    assert float(ds.parity.summary()["abs_log_ratio_rms"]) == s["abs_log_ratio_rms"].item()
    assert "parity summary" in str(ds.parity)
