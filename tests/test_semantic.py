"""Semantic checks on synthetic traces whose answer is known by construction (no engine).
The same checks on real vLLM captures are in test_engine.py."""

import json
import subprocess
import sys

import numpy as np
import pytest

from rlparity.diagnose import Severity, diagnose
from rlparity.diagnose import processing as P
from rlparity.diagnose import semantic as S
from rlparity.metrics import by_temperature, zero_prob_tokens
from rlparity.testing import synthetic_trace
from rlparity.trace import concat_sequences, save


def sweep(mode, temps=(0.5, 1.0, 1.5), **kw):
    return concat_sequences([synthetic_trace(temperature=t, top_k=8, logprobs_mode=mode, seed=i, **kw)
                             for i, t in enumerate(temps)])


def test_raw_mode_offset_moves_with_temperature_processed_stays_flat():
    raw = by_temperature(sweep("raw_logprobs"))
    proc = by_temperature(sweep("processed_logprobs"))
    assert raw["temperature"].values.tolist() == [0.5, 1.0, 1.5]
    spread = float(raw["log_ratio_mean"].max() - raw["log_ratio_mean"].min())
    assert spread > 0.1, raw["log_ratio_mean"].values
    assert np.abs(proc["log_ratio_mean"].values).max() < 1e-9
    f = S.logprob_semantics(sweep("raw_logprobs"))
    assert f.name == "raw_logprobs_used_as_processed" and f.severity == Severity.ERROR
    assert f.evidence["mean_d_range_over_temperatures"] == pytest.approx(spread)
    assert "processed_logprobs" in f.fix


def test_report_names_raw_and_clears_processed():
    bad = diagnose(synthetic_trace(top_k=8, logprobs_mode="raw_logprobs"))
    good = diagnose(synthetic_trace(top_k=8))
    assert bad.has_errors and "raw_logprobs_used_as_processed" in bad.names()
    assert not good.problems() and "logprobs_processed" in good.names(Severity.INFO)
    text, html = str(bad), bad._repr_html_()
    assert "fix:" in text and "semantic/raw_logprobs_used_as_processed" in text
    assert "<table>" in html and "raw_logprobs_used_as_processed" in html
    assert json.loads(bad.to_json())["findings"][0]["layer"] == "semantic"


def test_identity_sampling_is_untestable_not_clean():
    f = S.logprob_semantics(synthetic_trace(temperature=1.0, logprobs_mode="raw_logprobs"))
    assert f.name == "logprob_semantics_untestable"


def _excluded(tr, cells, margins):
    """The trainer excludes the tokens at ``cells``, each ``margins`` logits beyond its set's edge."""
    tr = tr.copy()
    lp, cm = tr["trainer_processed_logprob"].values.copy(), tr["trainer_cut_margin"].values.copy()
    for (i, j), m in zip(cells, margins):
        lp[i, j], cm[i, j] = -np.inf, m
    tr["trainer_processed_logprob"] = (("sequence", "position"), lp)
    tr["trainer_cut_margin"] = (("sequence", "position"), cm)
    return tr


def test_zero_probability_tokens_are_counted_located_and_split_by_cause():
    """Two tokens clearly outside the trainer's top-k set (other sampling parameters: an error)
    and one within rounding of the set's edge (a boundary flip: information); all counted."""
    base = synthetic_trace(top_k=8)
    assert np.nanmax(base["trainer_cut_margin"].values) <= 0  # every sampled token is inside the kept set
    tr = _excluded(base, [(3, 2), (5, 0), (6, 1)], [5.0, 3.0, 1e-3])
    z = zero_prob_tokens(tr)
    assert z.sizes["token"] == 3 and sorted(z["sequence_index"].values.tolist()) == [3, 5, 6]
    assert dict(zip(z["sequence_index"].values.tolist(), z["cause"].values.tolist())) == {
        3: "outside", 5: "outside", 6: "boundary"}
    found = {f.name: f for f in P.zero_probability_tokens(tr)}
    assert found["zero_probability_tokens"].severity == Severity.ERROR
    assert found["zero_probability_tokens"].evidence["n_tokens_with_cause"] == 2
    assert found["zero_probability_tokens"].evidence["positions"] == [0, 2]
    assert found["topk_boundary_flips"].severity == Severity.INFO  # 1 of ~290 tokens is below the share
    assert P.zero_probability_tokens(base) == []
    # many flips: a warning, and a larger measured noise widens the margin
    many = _excluded(base, [(i, 0) for i in range(16)], [0.05] * 16)
    assert {f.name: f.severity for f in P.zero_probability_tokens(many)} == {"topk_boundary_flips": Severity.WARNING}
    assert set(zero_prob_tokens(many)["cause"].values) == {"boundary"}  # 0.05 < 2 bf16 ulps of the max logit
    far = _excluded(base, [(i, 0) for i in range(4)], [0.5] * 4)
    assert set(zero_prob_tokens(far)["cause"].values) == {"outside"}
    assert set(zero_prob_tokens(far, noise_rms=0.5)["cause"].values) == {"boundary"}  # a noisy engine flips more


def test_renormalization_offset_and_unrenormalized_rollout():
    tr = synthetic_trace(top_k=4)
    f = P.renormalization(tr)
    assert f.name == "topk_topp_renormalization"
    assert f.evidence["mean_log_kept_mass"] < -0.01
    # a rollout that applied temperature but skipped the renormalization
    bad = tr.copy()
    bad["rollout_logprob"] = tr["trainer_processed_logprob"] + tr["trainer_log_kept_mass"]
    g = P.renormalization(bad)
    assert g.name == "rollout_not_renormalized" and g.severity == Severity.ERROR
    assert P.renormalization(synthetic_trace()) is None  # no top-k/top-p: nothing to renormalize


def _with_trainer_prompts(tr, rows):
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), -1)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    tr = tr.copy()
    tr["trainer_prompt_token_id"] = (("sequence", "trainer_prompt_position"), ids)
    tr["trainer_prompt_length"] = (("sequence",), np.array([len(r) for r in rows]))
    return tr


def test_prompt_token_parity():
    tr = synthetic_trace(n_sequences=4)
    same = [p[p >= 0].tolist() for p in tr["prompt_token_id"].values]
    assert P.prompt_token_parity(_with_trainer_prompts(tr, same)).name == "prompt_tokens_match"
    extra_bos = [[1] + r for r in same[:2]] + same[2:]
    f = P.prompt_token_parity(_with_trainer_prompts(tr, extra_bos))
    assert f.name == "prompt_token_mismatch" and f.evidence["n_mismatched"] == 2
    assert f.evidence["sequences"] == [0, 1] and "BOS" in f.summary
    assert P.prompt_token_parity(tr) is None


def test_cli_diagnose_exit_codes(tmp_path):
    save({"raw": synthetic_trace(top_k=8, logprobs_mode="raw_logprobs"),
          "processed": synthetic_trace(top_k=8)}, tmp_path / "x.zarr")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "rlparity", "diagnose", *map(str, args)],
                              capture_output=True, text=True)

    r = run(tmp_path / "x.zarr")
    assert r.returncode == 1 and "raw_logprobs_used_as_processed (arm raw)" in r.stdout
    assert "--logprobs-mode processed_logprobs" in r.stdout
    assert run(tmp_path / "x.zarr", "--arm", "processed").returncode == 0
    js = run(tmp_path / "x.zarr", "--json")
    assert json.loads(js.stdout)["verdict"].startswith("broken")
    missing = run(tmp_path / "nope.zarr")
    assert missing.returncode == 2 and "rlparity capture" in missing.stderr


@pytest.mark.engine
def test_semantic_notebook_results(executed_notebook):
    """Notebook 01 (ci=True) on the tiny model: its own numbers, checked again from its output."""
    from rlparity.trace import open_arms

    out = executed_notebook("01_semantic")
    r = json.loads((out / "results.json").read_text())
    by_arm = {}
    for f in r["findings"]:
        by_arm.setdefault(f["arm"], set()).add((f["name"], f["severity"]))
    assert ("raw_logprobs_used_as_processed", "error") in by_arm["raw_logprobs"]
    assert not [n for n, sev in by_arm["processed_logprobs"] if sev != "info"]
    assert r["raw_offset_range"] > 0.05 and r["processed_max_abs_offset"] < 0.02
    assert r["prompt_parity"]["prompt-ids-without-bos"] == "prompt_token_mismatch"
    arms = open_arms(out / "semantic.zarr")
    assert {"raw_logprobs", "processed_logprobs", "chat-messages"} <= set(arms)


# --- issue 42: a claim needs evidence that holds with its uncertainty -------------------------------------------

def _ols_slope(y, x, m):
    return float(np.sum(x[m] * y[m]) / np.sum(x[m] ** 2))


def test_jackknife_slope_se_equals_a_float64_delete_a_group_loop():
    from rlparity.metrics.core import jackknife_slope_se, reading_fit

    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, (37, 9))
    y = 0.7 * x + rng.normal(0, 0.3, (37, 9)) + rng.normal(0, 0.5, (37, 1))  # a per-sequence shift: clustered
    m = rng.random((37, 9)) < 0.8
    m[5] = False  # a sequence without tokens belongs to no group
    got = jackknife_slope_se(lambda k: reading_fit(y, x, k)["alpha"], m, groups=6)
    # reference: the 36 sequences with tokens dealt into 6 groups in index order, each left out in turn
    rows = [i for i in range(37) if m[i].any()]
    est = []
    for g in range(6):
        out = {r for j, r in enumerate(rows) if j % 6 == g}
        keep = np.array([[i not in out] * 9 for i in range(37)]) & m
        xx, yy = x[keep].astype(np.float64), y[keep].astype(np.float64)
        est.append(np.linalg.lstsq(xx[:, None], yy, rcond=None)[0][0])
    est = np.array(est)
    assert got["n_groups"] == 6
    assert got["se"] == pytest.approx(np.sqrt(5 / 6 * np.sum((est - est.mean()) ** 2)), rel=1e-10)
    assert jackknife_slope_se(lambda k: _ols_slope(y, x, k), m[:1], groups=6)["se"] != \
        jackknife_slope_se(lambda k: _ols_slope(y, x, k), m[:1], groups=6)["se"]  # one sequence: NaN
    empty = jackknife_slope_se(lambda k: _ols_slope(y, x, k), m[:0], groups=6)  # no sequence (all claimed)
    assert empty["n_groups"] == 0 and np.isnan(empty["se"])


def test_a_noisy_trainer_never_makes_a_processed_rollout_read_raw():
    """The false alarm of issue 42: dropout left on in the trainer moves both of its readings by one
    noisy forward; on 12 sequences the per-token error called the reading certain, and some draws
    read 'raw'. The error from a jackknife over sequences calls them inconclusive."""
    from rlparity.diagnose.evidence import semantic_fit

    readings, per_token = [], []
    for seed in range(40):
        tr = synthetic_trace(12, 16, 32, temperature=0.7, top_k=20, trainer_noise=0.5, seed=seed)
        f = semantic_fit(tr, tr["response_mask"].values.astype(bool))
        readings.append(f["reading"])
        a, se = f["alpha"], f["alpha_se_token"]  # the rule before: the per-token error alone
        band = max(0.2, 3 * se)
        per_token.append("untestable" if se > 0.2 else "processed" if abs(a - 1) <= band
                         else "raw" if abs(a) <= band else "neither")
        assert f["alpha_se"] >= f["alpha_se_token"]
    assert per_token.count("raw") >= 4, per_token  # the old rule's false alarms on these draws
    assert "raw" not in readings, readings
    assert readings.count("untestable") >= 30, readings


@pytest.mark.parametrize("mode,expected", [("processed_logprobs", "processed"), ("raw_logprobs", "raw")])
@pytest.mark.parametrize("head_noise", [0.0, 0.2])
def test_the_sequence_error_keeps_the_fit_s_power(mode, expected, head_noise):
    from rlparity.diagnose.evidence import semantic_fit

    for seed in range(10):
        tr = synthetic_trace(12, 16, 32, temperature=0.7, top_k=20, seed=seed, logprobs_mode=mode,
                             head_noise=head_noise)
        f = semantic_fit(tr, tr["response_mask"].values.astype(bool))
        assert f["reading"] == expected, (seed, f)
        assert f["n_sequences_fitted"] == 12


def test_too_few_sequences_is_inconclusive_not_a_verdict():
    tr = synthetic_trace(3, 24, 32, temperature=0.7, top_k=20, logprobs_mode="raw_logprobs")
    tr.attrs["engine_effective"] = {**tr.attrs["engine_effective"], "logprobs_mode": None}
    f = S.logprob_semantics(tr)
    assert f.name == "logprob_semantics_untestable" and f.severity == Severity.INFO
    assert "only 3 sequences" in f.summary
    assert f.evidence["n_sequences_fitted"] == 3


@pytest.mark.parametrize("rms,expected", [(2.0, "untestable"), (0.01, "raw")])
def test_a_trainer_that_does_not_repeat_itself_cannot_read_the_semantics(rms, expected):
    """Dropout 0.01 left on: the trainer's self-check measured run-to-run noise 4-6 times the gap between its
    two readings (CPU tiny-bf16 and H200 small); a fit on such readings named raw logprobs on 1 of 10 runs of
    the CI matrix (issue 42). Noise larger than the gap: untestable, said so; small noise: the reading stands."""
    tr = synthetic_trace(16, 24, 32, temperature=0.7, top_k=20, logprobs_mode="raw_logprobs")
    tr.attrs["engine_effective"] = {**tr.attrs["engine_effective"], "logprobs_mode": None}
    tr.attrs["trainer"] = {**tr.attrs.get("trainer", {}), "self_check": {
        "run_to_run_processed": {"rms": rms, "mean_abs": rms}, "run_to_run_raw": {"rms": rms, "mean_abs": rms}}}
    f = S.logprob_semantics(tr)
    sep = f.evidence["separation_rms"]
    assert f.evidence["trainer_noise_rms"] == pytest.approx(2 * rms / np.sqrt(2))
    assert f.evidence["trainer_noise_ratio"] == pytest.approx(2 * rms / np.sqrt(2) / sep)
    if expected == "untestable":
        assert f.name == "logprob_semantics_untestable" and f.severity == Severity.INFO
        assert "run-to-run noise" in f.summary
    else:
        assert f.name == "raw_logprobs_used_as_processed" and f.severity == Severity.ERROR


def test_the_processing_topic_reads_the_semantic_reading_and_says_nothing_after_a_copy():
    """diagnose.processing runs after the reading (issue 35's split of the semantic layer): it speaks
    whatever the reading said, and stops when the semantic topic found the trainer side a copy of mu."""
    from rlparity.diagnose.findings import Finding, Layer, Severity

    tr = synthetic_trace(top_k=8, arm="a")
    alone = {f.name for f in P.trace_findings(tr)}  # no options, no evidence, no prior: built here
    assert "topk_topp_renormalization" in alone
    reading = Finding(Layer.SEMANTIC, "logprobs_processed", Severity.INFO, "s", {"noise_floor_rms": 0.0}, "", "a")
    assert {f.name for f in P.trace_findings(tr, prior=[reading])} == alone
    copy = Finding(Layer.SEMANTIC, "trainer_is_rollout_copy", Severity.ERROR, "s", {}, "", "a")
    assert P.trace_findings(tr, prior=[reading, copy]) == []


def test_the_temperature_topic_says_nothing_after_a_copy():
    """diagnose.temperature reads the semantic topic's findings: after trainer_is_rollout_copy it is
    silent; after any other reading it speaks as temperature_from_numbers does."""
    from rlparity.diagnose import temperature as T
    from rlparity.diagnose.findings import Finding, Layer, Severity

    tr = synthetic_trace(top_k=8, arm="a")
    reading = Finding(Layer.SEMANTIC, "logprobs_processed", Severity.INFO, "s", {}, "", "a")
    want = [f.name for f in T.temperature_from_numbers(tr)]
    assert want and [f.name for f in T.trace_findings(tr, prior=[reading])] == want
    copy = Finding(Layer.SEMANTIC, "trainer_is_rollout_copy", Severity.ERROR, "s", {}, "", "a")
    assert T.trace_findings(tr, prior=[reading, copy]) == []
