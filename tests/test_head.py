"""LM-head precision: the rollout x trainer head-dtype matrix (issue 5).

Unit tests run on seeded synthetic traces (known answer by construction). The real experiment
(two vLLM engine starts, four cells) runs once, inside notebook 03 with ci=True; the last tests
check what that notebook wrote (results.json and the zarr store) against a recomputation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlparity.diagnose import diagnose
from rlparity.diagnose import head_precision as dhead
from rlparity.diagnose.findings import Layer, Severity
from rlparity.config.settings import normalize_dtype
from rlparity.experiments.head_precision import head_matrix
from rlparity.metrics import head_precision as H
from rlparity.metrics import log_ratio, summary
from rlparity.testing import synthetic_trace
from rlparity.trace import arm_factors, with_factors

CELLS = [("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "bfloat16"), ("float32", "float32")]


def _cell(rollout_head, trainer_head, head_noise, seed=0, **kw):
    ds = synthetic_trace(24, 20, head_noise=head_noise, seed=seed, arm=H.arm_name(rollout_head, trainer_head), **kw)
    ds.attrs["engine_effective"] = {**ds.attrs["engine_effective"], "head_dtype": rollout_head, "dtype": "bfloat16"}
    ds.attrs["trainer"] = {**ds.attrs["trainer"], "head_dtype": trainer_head, "dtype": "bfloat16"}
    return with_factors(ds, rollout_head=rollout_head, trainer_head=trainer_head)  # as head_matrix records them


def _heads(ds) -> tuple[str, str]:
    f = arm_factors(ds)
    return f["rollout_head"], f["trainer_head"]


def synthetic_matrix(noise=None, seed=0):
    """Four cells from the same seed (same tokens); a stand-in head error per cell."""
    noise = noise or {("bfloat16", "bfloat16"): 0.03, ("bfloat16", "float32"): 0.06,
                      ("float32", "bfloat16"): 0.06, ("float32", "float32"): 0.005}
    return {H.arm_name(r, t): _cell(r, t, noise[(r, t)], seed) for r, t in CELLS}


def rms_ratios(arms) -> dict[str, float]:
    """RMS of d = trainer_processed - rollout over the finite response tokens of each mismatched cell,
    over the fp32/fp32 cell's: plain numpy from the arrays, independent of rlparity.metrics."""
    def rms(ds):
        d = ds["trainer_processed_logprob"].values - ds["rollout_logprob"].values
        use = ds["response_mask"].values & np.isfinite(d)
        return float(np.sqrt(np.mean(d[use] ** 2)))

    best = rms(arms[H.arm_name("float32", "float32")])
    return {name: rms(ds) / best for name, ds in arms.items() if len(set(_heads(ds))) == 2}


# -- names and input checks ----------------------------------------------------------------
def test_dtype_names_and_arm_names():
    assert normalize_dtype("bf16") == "bfloat16" and normalize_dtype("torch.float32") == "float32"
    assert H.arm_name("fp32", "bf16") == "rollout-float32_trainer-bfloat16"
    with pytest.raises(ValueError, match="unknown head dtype 'float64'"):
        normalize_dtype("float64", what="head dtype")


@pytest.mark.parametrize("kw, match", [
    ({"rollout_head": ("float64",)}, "unknown rollout head dtype"),
    ({"trainer_head": ("bf16", "bfloat16")}, "repeated dtype"),
    ({"dtype": "int8"}, "unknown body dtype"),
    ({"trainer_head": ()}, "at least one dtype"),
])
def test_head_matrix_rejects_bad_input_before_starting_anything(kw, match):
    # the model path does not exist: the check must fail on the dtype before any load or engine start
    with pytest.raises(ValueError, match=match):
        head_matrix("/nonexistent/model", ["1+1="], **kw)


def test_head_matrix_rejects_empty_prompts():
    with pytest.raises(ValueError, match="at least one prompt"):
        head_matrix("/nonexistent/model", [])


def test_cell_dtypes_prefers_the_engines_effective_value():
    ds = _cell("float32", "bfloat16", 0.0)
    ds.attrs["engine_requested"] = {"head_dtype": "bfloat16"}
    assert H.cell_dtypes(ds) == {"rollout_head": "float32", "trainer_head": "bfloat16",
                                 "rollout_body": "bfloat16", "trainer_body": "bfloat16"}
    ds.attrs["engine_effective"] = {"head_dtype": "model", "dtype": "bfloat16"}
    assert H.cell_dtypes(ds)["rollout_head"] == "bfloat16"  # vLLM's "model" = the body dtype


# -- table -------------------------------------------------------------------------------
def test_head_table_matches_per_arm_summary():
    arms = synthetic_matrix()
    table = H.head_table(arms)
    assert table["abs_log_ratio_rms"].dims == ("rollout_head", "trainer_head")
    assert list(table["rollout_head"].values) == ["bfloat16", "float32"]
    assert table["abs_log_ratio_rms"].attrs["units"] == "nats"
    for name, ds in arms.items():
        r, t = _heads(ds)
        s = summary(ds)
        cell = table.sel(rollout_head=r, trainer_head=t)
        assert str(cell["arm"].values) == name
        for var in ("abs_log_ratio_rms", "abs_log_ratio_max", "mean_ratio", "prob_pearson", "clip_fraction"):
            assert float(cell[var]) == pytest.approx(float(s[var]), rel=1e-12, nan_ok=True)
    assert bool(table["matched"].sel(rollout_head="float32", trainer_head="float32"))
    assert not bool(table["matched"].sel(rollout_head="float32", trainer_head="bfloat16"))


def test_head_table_orders_the_error_like_the_injected_head_noise():
    table = H.head_table(synthetic_matrix())
    rms = table["abs_log_ratio_rms"]
    best = float(rms.sel(rollout_head="float32", trainer_head="float32"))
    worst = float(rms.sel(rollout_head="float32", trainer_head="bfloat16"))
    # Gaussian logit noise of sigma 0.06 vs 0.005: the log-ratio scales about like sigma
    assert 5 < worst / best < 20, (worst, best)
    pearson = table["prob_pearson"]
    assert float(pearson.sel(rollout_head="float32", trainer_head="float32")) > float(
        pearson.sel(rollout_head="bfloat16", trainer_head="float32"))
    adv = H.matched_advantage(table)
    ratios = rms_ratios(synthetic_matrix())
    assert set(adv["mismatched"]) == set(ratios) == {"rollout-bfloat16_trainer-float32", "rollout-float32_trainer-bfloat16"}
    for name, r in ratios.items():
        assert adv["mismatched"][name]["ratio"] == pytest.approx(r, rel=1e-9)
    assert min(ratios.values()) > 5 and adv["min_ratio"] == pytest.approx(min(ratios.values()), rel=1e-9)
    # the flag agrees with the ratios, and says no when the matched cell is not the lowest
    assert adv["matched_is_lowest"]
    swapped = synthetic_matrix({("bfloat16", "bfloat16"): 0.03, ("bfloat16", "float32"): 0.003,
                                ("float32", "bfloat16"): 0.06, ("float32", "float32"): 0.005})
    flipped = H.matched_advantage(H.head_table(swapped))
    assert not flipped["matched_is_lowest"] and flipped["min_ratio"] == pytest.approx(min(rms_ratios(swapped).values()))


def test_head_table_rejects_duplicate_and_unlabelled_cells():
    a = _cell("float32", "float32", 0.0)
    with pytest.raises(ValueError, match="same cell"):
        H.head_table({"x": a, "y": a.copy()})
    b = synthetic_trace(4, 6)
    b.attrs["engine_effective"] = {"logprobs_mode": "processed_logprobs"}
    with pytest.raises(ValueError, match="records no rollout/trainer head dtype"):
        H.head_table({"unnamed": b})


def test_matched_advantage_needs_a_fp32_cell_and_a_mismatched_one():
    arms = synthetic_matrix()
    with pytest.raises(ValueError, match="no float32/float32"):
        H.matched_advantage(H.head_table({k: v for k, v in arms.items() if k != "rollout-float32_trainer-float32"}))
    with pytest.raises(ValueError, match="no mismatched"):
        H.matched_advantage(H.head_table({"rollout-float32_trainer-float32": arms["rollout-float32_trainer-float32"]}))


# -- breakdowns ----------------------------------------------------------------------------
def test_gap_by_logit_bins_against_a_loop():
    ds = _cell("bfloat16", "float32", 0.05)
    lp = ds["trainer_processed_logprob"].values.copy()
    first = np.argwhere(ds["response_mask"].values)[0]
    lp[tuple(first)] = -np.inf  # a probability-0 token never enters an average
    ds["trainer_processed_logprob"] = (("sequence", "position"), lp)
    x, mask = ds["trainer_max_logit"].values, ds["response_mask"].values
    d = log_ratio(ds).values
    edges = np.quantile(x[mask], [0, 0.3, 0.5, 0.8, 1.0])
    g = H.gap_by_logit({"rollout-bfloat16_trainer-float32": ds}, edges=edges)
    cell = g.sel(rollout_head="bfloat16", trainer_head="float32")
    for k in range(4):
        hi = (x <= edges[k + 1]) if k == 3 else (x < edges[k + 1])  # the largest logit lands in the last bin
        sel = mask & np.isfinite(d) & (x >= edges[k]) & hi
        assert int(cell["n_tokens"][k]) == sel.sum() > 0
        assert float(cell["abs_log_ratio_rms"][k]) == pytest.approx(np.sqrt(np.mean(d[sel] ** 2)))
        assert float(cell["log_ratio_mean"][k]) == pytest.approx(np.mean(d[sel]))
    assert int(cell["n_tokens"].sum()) == int(mask.sum()) - 1


def test_gap_by_logit_and_position_count_every_real_token():
    arms = synthetic_matrix()
    g = H.gap_by_logit(arms, n_bins=5)
    assert g["abs_log_ratio_rms"].dims == ("rollout_head", "trainer_head", "logit_bin")
    assert g.sizes["logit_bin"] == 5 and np.all(np.diff(g["logit_center"].values) > 0)
    p = H.gap_by_position(arms)
    for name, ds in arms.items():
        r, t = _heads(ds)
        n = int(summary(ds)["n_tokens"])
        assert int(g["n_tokens"].sel(rollout_head=r, trainer_head=t).sum()) == n
        assert int(p["n_tokens"].sel(rollout_head=r, trainer_head=t).sum()) == n
        d = log_ratio(ds).values
        pos0 = d[:, 0][ds["response_mask"].values[:, 0]]
        assert float(p["abs_log_ratio_rms"].sel(rollout_head=r, trainer_head=t, position=0)) == pytest.approx(
            np.sqrt(np.mean(pos0 ** 2)))
    with pytest.raises(ValueError, match="increasing"):
        H.gap_by_logit(arms, edges=[3.0, 1.0])


def test_gap_by_logit_sees_an_error_that_grows_with_logit_magnitude():
    # a bf16-like relative rounding error: noise proportional to the logit's size
    ds = _cell("bfloat16", "float32", 0.0)
    d_scale = 0.01 * np.abs(ds["trainer_max_logit"].values)
    noise = np.random.default_rng(3).normal(0, 1, d_scale.shape) * d_scale
    ds["rollout_logprob"] = ds["rollout_logprob"] - np.where(ds["response_mask"].values, np.abs(noise), 0.0)
    g = H.gap_by_logit({"rollout-bfloat16_trainer-float32": ds}, n_bins=4)
    rms = g["abs_log_ratio_rms"].sel(rollout_head="bfloat16", trainer_head="float32").values
    assert rms[-1] > 1.5 * rms[0], rms


# -- findings ------------------------------------------------------------------------------
def test_finding_names_the_mismatch_and_the_fix_in_user_terms():
    arms = synthetic_matrix()
    f = dhead.head_precision(arms["rollout-bfloat16_trainer-float32"])
    assert f.name == "head_precision_mismatch" and f.severity == Severity.WARNING
    assert f.layer == Layer.INFERENCE_PATH and f.arm == "rollout-bfloat16_trainer-float32"
    assert f.evidence["rollout_head_dtype"] == "bfloat16" and f.evidence["trainer_head_dtype"] == "float32"
    assert f.evidence["rms_d"] == pytest.approx(float(summary(arms["rollout-bfloat16_trainer-float32"])["abs_log_ratio_rms"]))
    assert "hf_overrides={'head_dtype': 'float32'}" in f.fix and "--hf-overrides" in f.fix
    g = dhead.head_precision(arms["rollout-float32_trainer-bfloat16"])
    assert g.name == "head_precision_mismatch" and "trainer's logits in float32" in g.fix
    ok = dhead.head_precision(arms["rollout-float32_trainer-float32"])
    assert ok.name == "head_precision_matched" and ok.severity == Severity.INFO
    low = dhead.head_precision(arms["rollout-bfloat16_trainer-bfloat16"], tol=0.001)
    assert low.name == "head_precision_low" and low.severity == Severity.WARNING
    assert dhead.head_precision(arms["rollout-bfloat16_trainer-bfloat16"], tol=10).severity == Severity.INFO
    assert dhead.head_precision(synthetic_trace(4, 6, scored=False)) is None


def test_a_mismatch_without_a_float32_side_asks_both_fixes_and_the_low_cell_names_its_cause():
    """bf16 against fp16: neither side is float32, so both fixes; the side with fewer bits is the cause
    (bf16: 8 significant bits, fp16: 11). head_precision_low carries a cause only when it warns."""
    f = dhead.head_precision(_cell("bfloat16", "float16", 0.01))
    assert f.name == "head_precision_mismatch" and f.cause == "rollout_bf16_head"
    assert f.fix == dhead.FIX_ROLLOUT_FP32 + "; and " + dhead.FIX_TRAINER_FP32
    arms = synthetic_matrix()
    assert dhead.head_precision(arms["rollout-bfloat16_trainer-bfloat16"], tol=0.001).cause == "rollout_bf16_head"
    assert dhead.head_precision(arms["rollout-bfloat16_trainer-bfloat16"], tol=10).cause is None


def test_finding_reads_the_engines_effective_head_not_the_arm_name():
    ds = _cell("float32", "float32", 0.0)
    ds.attrs["engine_effective"]["head_dtype"] = "bfloat16"  # what the running engine reported
    assert dhead.head_precision(ds).name == "head_precision_mismatch"
    ds.attrs["engine_effective"].pop("head_dtype")
    ds.attrs["engine_requested"] = {}
    assert dhead.head_precision(ds).name == "head_precision_unrecorded"


def test_diagnose_discovers_the_head_checks():
    arms = synthetic_matrix()
    report = diagnose(arms)
    by_arm = {f.arm: f.name for f in report if f.name.startswith("head_precision")}
    assert by_arm == {"rollout-bfloat16_trainer-bfloat16": "head_precision_low",
                      "rollout-bfloat16_trainer-float32": "head_precision_mismatch",
                      "rollout-float32_trainer-bfloat16": "head_precision_mismatch",
                      "rollout-float32_trainer-float32": "head_precision_matched"}
    assert "head_fp32_matched_closest" in {f.name for f in report}
    # a matrix where the body, not the head, dominates: same noise everywhere except a worse fp32 cell
    flat = synthetic_matrix({c: 0.02 for c in CELLS} | {("float32", "float32"): 0.04})
    assert "head_fp32_not_closest" in diagnose(flat).names()


def test_arms_findings_ignore_stores_that_are_not_a_matrix():
    a, b = synthetic_trace(8, 8, arm="a"), synthetic_trace(8, 8, arm="b", seed=1)
    assert dhead.arms_findings({"a": a, "b": b}) == []  # two fp32/fp32 arms of another experiment


# -- plots ---------------------------------------------------------------------------------
def test_plots_return_figures_with_one_trace_per_cell():
    from rlparity.plot import head_precision as phead

    arms = synthetic_matrix()
    heat = phead.plot_matrix_heatmap(H.head_table(arms))
    assert len(heat.data) == len(phead.HEATMAP_VARIABLES)
    assert np.allclose(np.asarray(heat.data[0].z, dtype=float), H.head_table(arms)["abs_log_ratio_rms"].values)
    scatter = phead.plot_probability_scatter(arms, max_points=50)
    assert sum(len(t.x) == 50 for t in scatter.data) == 4
    assert len(phead.plot_gap_by_logit(H.gap_by_logit(arms)).data) == 4
    assert len(phead.plot_gap_by_position(H.gap_by_position(arms)).data) == 4
    with pytest.raises(ValueError, match="not a head_table variable"):
        phead.plot_matrix_heatmap(H.head_table(arms), "nope")


# -- the real experiment (notebook 03, ci=True) ---------------------------------------------------
@pytest.fixture(scope="module")
def nb03(executed_notebook):
    out = executed_notebook("03_lm_head")
    return out, json.loads((out / "results.json").read_text())


@pytest.mark.engine
def test_notebook_03_measures_the_matrix_with_real_engines(nb03):
    from rlparity import trace

    out, res = nb03
    arms = trace.open_arms(out / "lm_head.zarr")
    assert set(arms) == {H.arm_name(r, t) for r, t in CELLS}
    tokens = {name: ds["token_id"].values for name, ds in arms.items()}
    for name, ds in arms.items():
        r, t = _heads(ds)
        eff = ds.attrs["engine_effective"]
        # the engine itself reported these (read back from vLLM's config), and the body is pinned
        assert (eff["head_dtype"], eff["dtype"], eff["logprobs_mode"]) == (r, "bfloat16", "processed_logprobs")
        assert (ds.attrs["trainer"]["head_dtype"], ds.attrs["trainer"]["dtype"]) == (t, "bfloat16")
        assert ds.attrs["head_experiment"]["trainer_body_dtype_effective"] == "bfloat16"
        same_rollout = H.arm_name(r, "float32")
        assert np.array_equal(tokens[name], tokens[same_rollout])
    # the numbers in results.json are the store's numbers
    table = H.head_table(arms)
    for name, cell in res["cells"].items():
        r, t = _heads(arms[name])
        assert cell["abs_log_ratio_rms"] == pytest.approx(
            float(table["abs_log_ratio_rms"].sel(rollout_head=r, trainer_head=t)), rel=1e-9)
        assert 0 < cell["abs_log_ratio_rms"] < 0.5 and 0.9 < cell["mean_ratio"] < 1.1
        assert 0.99 < cell["prob_pearson"] <= 1 and 0 <= cell["clip_fraction"] < 0.05
    # the head result itself, recomputed from the store's arrays (not from the notebook's numbers):
    # every mismatched cell's RMS of d is above the matched fp32/fp32 cell's
    ratios = rms_ratios(arms)
    assert min(ratios.values()) > res["thresholds"]["min_rms_ratio"] >= 1.0, ratios
    assert res["matched_advantage"]["min_ratio"] == pytest.approx(min(ratios.values()), rel=1e-9)


@pytest.mark.engine
def test_notebook_03_reports_the_head_mismatch_finding(nb03):
    _, res = nb03
    names = {f["arm"]: f["name"] for f in res["findings"] if f["name"].startswith("head_precision")}
    assert names["rollout-bfloat16_trainer-float32"] == "head_precision_mismatch"
    assert names["rollout-float32_trainer-bfloat16"] == "head_precision_mismatch"
    assert names["rollout-float32_trainer-float32"] == "head_precision_matched"
    fix = next(f["fix"] for f in res["findings"] if f["arm"] == "rollout-bfloat16_trainer-float32"
               and f["name"] == "head_precision_mismatch")
    assert "hf_overrides" in fix and "float32" in fix
    assert res["engine_starts"] == 2
