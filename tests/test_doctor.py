"""``rlparity doctor RUN`` (issue 37, first slice): run stores written with the real Recorder (no
engine), a cause planted from step N named from the window holding N and never before, the growth
decomposition against a float64 simulator whose contributions are planted, the per-step and
per-lag numbers against plain recomputations, the CLI's exit codes, --json and bad input; and one
engine test: rlparity's own RL runner, recorded, with raw logprobs switched on at step 6."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rlparity.diagnose.doctor import doctor
from rlparity.metrics import run as mr
from rlparity.record import Recorder, StepRecord, open_run, run_record, step_trace
from rlparity.testing import synthetic_trace
from rlparity.trace import arm_record

N_SEQ, MAX_LEN = 32, 48


def strict(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: bare {name}")

    return json.loads(text, parse_constant=refuse)


def record_synthetic_run(path, steps: int, *, raw_from: int | None = None, noise: float = 0.01):
    """A run store of ``steps`` steps from rlparity's synthetic logit model (temperature 0.7): the
    engine returns processed logprobs, or raw ones (untempered) from step ``raw_from`` on."""
    with Recorder(path, sampling={"temperature": 0.7}, trainer_side="processed", background=False) as rec:
        for k in range(steps):
            raw = raw_from is not None and k >= raw_from
            tr = synthetic_trace(n_sequences=N_SEQ, max_len=MAX_LEN, noise=noise, seed=100 + k,
                                 logprobs_mode="raw_logprobs" if raw else "processed_logprobs")
            rec.step(StepRecord.from_trace(tr, trainer="processed"), trainer_version=k, policy_versions=k)
    return path


def read(path):
    run = open_run(path)
    return {k: step_trace(run, k) for k in range(run.attrs["steps"])}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("doctor")
    return {"clean": record_synthetic_run(d / "clean.zarr", 12),
            "raw6": record_synthetic_run(d / "raw6.zarr", 12, raw_from=6), "dir": d}


# ------------------------------------------------------------------------------ causes over steps

def test_a_clean_run_names_no_cause(stores):
    rep = doctor({"clean": read(stores["clean"])}, window=4, n_boot=20)
    r = rep.runs["clean"]
    assert r.first_named == {} and not rep.problem
    assert all(w["headline"] is None and not w["causes"] for w in r.windows)
    assert [w["steps"] for w in r.windows] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert "no cause named" in str(rep)


def test_raw_logprobs_from_step_6_are_named_from_step_6_and_never_before(stores):
    rep = doctor({"raw6": read(stores["raw6"])}, window=4, n_boot=20)
    r = rep.runs["raw6"]
    assert r.first_named["raw_logprobs"] == {"step": 6, "window": [4, 7]}
    named = [k for k, v in r.step_causes.items() if "raw_logprobs" in v["causes"]]
    assert named == list(range(6, 12))  # every step from the switch on, none before
    w0, w1, w2 = r.windows
    assert w0["headline"] is None and "raw_logprobs" not in w0["causes"]
    assert w1["causes"]["raw_logprobs"] == 2 and w1["headline"]["cause"] == "raw_logprobs" and w1["headline"]["steps"] == 2
    assert w2["causes"]["raw_logprobs"] == 4
    assert rep.problem
    # the recorder's alarms are on the page's timeline: a floor jump where the switch happened
    assert {"step": 6, "code": "floor_jump", "level": "warning"} in r.alarms
    assert not any(a["step"] < 6 and a["code"] == "floor_jump" for a in r.alarms)
    page = str(rep)
    assert "raw_logprobs at step 6 (window 4-7)" in page and "steps 0-3 (4 recorded): no cause named" in page


def test_step_and_lag_tables_equal_a_plain_recomputation(tmp_path):
    """Mean |d|, k3, lengths, -log mu, the low-probability share and the per-lag table against plain
    Python over the ragged rows that were recorded (float32 storage: rel 1e-5)."""
    rng = np.random.default_rng(3)
    rows = []
    floors = {"trainer": {"self_check": {"batch_shape_processed": {"mean_abs": 0.0012, "rms": 0.002}}},
              "engine_floor": {"batch_shape": {"mean_abs": 0.0007, "rms": 0.001}}}
    with Recorder(tmp_path / "lag.zarr", background=False, attrs=floors) as rec:
        for k in range(4):
            n = 6
            lengths = rng.integers(1, 20, n)
            mu = [np.log(rng.uniform(0.02, 0.99, L)) for L in lengths]
            pi = [np.minimum(m + rng.normal(0, 0.05, len(m)), 0.0) for m in mu]
            pv = [np.full(L, k - int(rng.integers(0, 3)) if k >= 2 else k) for L in lengths]
            rec.step(prompt_token_ids=[[1, 2]] * n, token_ids=[np.arange(L) for L in lengths], rollout_logprobs=mu,
                     trainer_logprobs=pi, policy_versions=pv, trainer_version=k)
            rows.append((mu, pi, pv, k))
    rep = doctor({"lag": read(tmp_path / "lag.zarr")}, window=2, n_boot=0)
    r = rep.runs["lag"]
    for k, (mu, pi, pv, tv) in enumerate(rows):
        toks = [(float(np.float32(p) - np.float32(m)), -float(np.float32(m)), tv - int(v))
                for mr_, pr_, vr_ in zip(mu, pi, pv) for m, p, v in zip(mr_, pr_, vr_)]
        absd = [abs(t[0]) for t in toks]
        assert r.steps["abs_log_ratio_mean"].sel(step=k) == pytest.approx(sum(absd) / len(absd), rel=1e-5)
        k3 = sum(math.exp(t[0]) - 1 - t[0] for t in toks) / len(toks)
        assert r.steps["kl_k3"].sel(step=k) == pytest.approx(k3, rel=1e-4)
        assert r.steps["response_length_mean"].sel(step=k) == pytest.approx(len(toks) / len(mu))
        assert r.steps["neg_log_mu_mean"].sel(step=k) == pytest.approx(sum(t[1] for t in toks) / len(toks), rel=1e-6)
        assert r.steps["low_prob_share"].sel(step=k) == pytest.approx(sum(t[1] > math.log(10) for t in toks) / len(toks))
        for lag in range(4):
            sel = [t for t in toks if min(t[2], 3) == lag]
            assert int(r.lags["n_tokens"].sel(step=k, lag=lag)) == len(sel)
            if sel:
                assert float(r.lags["abs_log_ratio_mean"].sel(step=k, lag=lag)) == pytest.approx(
                    sum(abs(t[0]) for t in sel) / len(sel), rel=1e-5)
    # the floors the run recorded stand beside every step
    assert r.steps["trainer_floor"].values.tolist() == [0.0012] * 4
    assert r.steps["engine_floor"].values.tolist() == [0.0007] * 4
    assert "0.0012/0.0007" in str(rep)
    data = rep.to_dict()["runs"]["lag"]
    assert sum(x["n_tokens"] for x in data["lags"] if x["step"] == 3) == int(r.steps["n_tokens"].sel(step=3))


# ------------------------------------------------------------------------------ the decomposition

# planted per-cell |d| (nats), additive: intercept + position bucket + -log mu band + lag
BETA = {"intercept": 0.010, "length": {1: 0.004, 2: 0.010}, "confidence": {1: 0.002, 2: 0.005, 3: 0.009},
        "low_prob": {1: 0.020, 2: 0.040}, "lag": {1: 0.006, 2: 0.012, 3: 0.015}}


def categories(position, nlm, lag):
    """The simulator's own cell of each token, written out by hand (not the module's bucketing)."""
    pos = np.where(position >= 64, 2, np.where(position >= 16, 1, 0))  # every length here is below 256
    conf = np.select([nlm >= math.log(10), nlm >= 1.0, nlm >= 0.3, nlm >= 0.05], [0, 3, 2, 1], 0)
    low = np.select([nlm >= math.log(100), nlm >= math.log(10)], [2, 1], 0)
    return {"length": pos, "confidence": conf, "low_prob": low, "lag": np.minimum(lag, 3)}


def simulate(rng, steps, *, lengths, nlm_scale, lag_p, shift=0.0, shift_from=None, n_seq=60):
    """Float64 tokens of ``steps`` with a planted |d|: per cell BETA, plus ``shift`` nats on every token
    from step ``shift_from`` (the kernels changed), plus mean-zero noise."""
    parts, offset = [], 0
    for k in steps:
        L = rng.integers(lengths[0], lengths[1] + 1, n_seq)
        seq = np.repeat(np.arange(n_seq) + offset, L)
        pos = np.concatenate([np.arange(x) for x in L])
        nlm = rng.exponential(nlm_scale, seq.size)
        lag = rng.choice(len(lag_p), seq.size, p=lag_p)
        c = categories(pos, nlm, lag)
        y = np.full(seq.size, BETA["intercept"])
        for g in mr.PARTS:
            y += np.array([BETA[g].get(int(v), 0.0) for v in range(5)])[c[g]]
        if shift_from is not None and k >= shift_from:
            y += shift
        y += rng.exponential(0.003, seq.size) - 0.003
        d = y * np.where(nlm < y, -1.0, rng.choice([-1.0, 1.0], seq.size))  # log pi = log mu + d stays <= 0
        parts.append(mr.StepTokens(d=d, neg_log_mu=nlm, position=pos, lag=lag.astype(float), sequence=seq,
                                   step=np.full(seq.size, k)))
        offset += n_seq
    return mr.concat_tokens(parts)


def planted_truth(base, later, shift, shift_from):
    """The true parts: the sample's covariate shift times the planted BETA, and the planted shift's mean."""
    cb = categories(base.position, base.neg_log_mu, base.lag.astype(int))
    cl = categories(later.position, later.neg_log_mu, later.lag.astype(int))
    out = {g: sum(((cl[g] == v).mean() - (cb[g] == v).mean()) * b for v, b in BETA[g].items()) for g in mr.PARTS}
    out["residual"] = shift * float(np.mean(later.step >= shift_from)) if shift_from is not None else 0.0
    return out


SCENARIOS = {
    "longer responses": dict(later=dict(lengths=(60, 250))),
    "kernels change at step 13": dict(later=dict(shift=0.004, shift_from=13)),
    "less confident, more low-probability tokens": dict(later=dict(nlm_scale=1.2)),
    "staler rollouts": dict(later=dict(lag_p=[0.3, 0.3, 0.2, 0.2])),
    "everything at once": dict(later=dict(lengths=(40, 200), nlm_scale=1.0, lag_p=[0.4, 0.3, 0.2, 0.1], shift=0.003,
                                          shift_from=12)),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_decomposition_recovers_planted_contributions(name):
    rng = np.random.default_rng(7)
    base_kw = dict(lengths=(10, 120), nlm_scale=0.6, lag_p=[0.7, 0.2, 0.07, 0.03])
    later_kw = {**base_kw, **SCENARIOS[name]["later"]}
    base = simulate(rng, range(0, 10), **base_kw)
    later = simulate(rng, range(10, 20), **later_kw)
    g = mr.growth_decomposition(base, later, n_boot=300, seed=1)
    # the change is the measured one (an independent float64 mean) and the parts add up to it exactly
    measured = float(np.mean(np.abs(later.d))) - float(np.mean(np.abs(base.d)))
    assert g["change"] == pytest.approx(measured, rel=1e-12, abs=1e-15)
    assert sum(p["value"] for p in g["parts"].values()) == pytest.approx(measured, rel=1e-9, abs=1e-12)
    truth = planted_truth(base, later, later_kw.get("shift", 0.0), later_kw.get("shift_from"))
    for part, true in truth.items():
        p = g["parts"][part]
        assert p["low"] <= true <= p["high"], (name, part, true, p)
        assert p["high"] - p["low"] < max(0.25 * abs(measured), 5e-4), (name, part, p)  # informative, not vacuous


def test_the_decomposition_would_catch_a_misattribution():
    """A kernel change planted alone: the residual carries it, and its interval excludes 0 while the
    composition parts' intervals hold 0 (the planted truth is 0 for them up to sampling)."""
    rng = np.random.default_rng(11)
    kw = dict(lengths=(10, 120), nlm_scale=0.6, lag_p=[0.7, 0.2, 0.07, 0.03])
    base, later = simulate(rng, range(0, 8), **kw), simulate(rng, range(8, 16), **kw, shift=0.005, shift_from=8)
    g = mr.growth_decomposition(base, later, n_boot=300, seed=2)
    res = g["parts"]["residual"]
    assert res["low"] > 0.0035 and res["high"] < 0.0065 and res["share"] > 0.8
    for part in mr.PARTS:
        assert abs(g["parts"][part]["value"]) < 0.1 * res["value"]


def test_the_intervals_cover_the_truth_at_about_their_level():
    """Over 20 simulated runs the 95% intervals of the residual and the length part cover the planted
    truth at least 17 times each (a calibration check of the bootstrap over sequences)."""
    hits = {"residual": 0, "length": 0}
    for s in range(20):
        rng = np.random.default_rng(100 + s)
        base = simulate(rng, range(0, 6), lengths=(10, 120), nlm_scale=0.6, lag_p=[1.0], n_seq=40)
        later = simulate(rng, range(6, 12), lengths=(40, 200), nlm_scale=0.6, lag_p=[1.0], shift=0.002,
                         shift_from=9, n_seq=40)
        g = mr.growth_decomposition(base, later, n_boot=200, seed=s)
        truth = planted_truth(base, later, 0.002, 9)
        for part in hits:
            hits[part] += g["parts"][part]["low"] <= truth[part] <= g["parts"][part]["high"]
    assert min(hits.values()) >= 17, hits


def test_the_decomposition_through_a_recorded_run_store(tmp_path):
    """The simulator's tokens written with the real Recorder (float32 storage) and read back by the
    doctor: the window's decomposition still covers the planted truth."""
    rng = np.random.default_rng(5)
    kw = dict(lengths=(10, 120), nlm_scale=0.6, lag_p=[1.0], n_seq=30)
    sims = [simulate(rng, [k], **kw) if k < 4 else simulate(rng, [k], **{**kw, "lengths": (50, 200)}, shift=0.004,
                                                                                       shift_from=6)
            for k in range(8)]
    with Recorder(tmp_path / "sim.zarr", background=False, dashboards=()) as rec:
        for k, t in enumerate(sims):
            seqs = np.unique(t.sequence)
            rows = [t.sequence == s for s in seqs]
            rec.step(prompt_token_ids=[[1]] * len(seqs), token_ids=[np.zeros(int(r.sum()), int) for r in rows],
                     rollout_logprobs=[-t.neg_log_mu[r] for r in rows],
                     trainer_logprobs=[-t.neg_log_mu[r] + t.d[r] for r in rows], trainer_version=k)
    rep = doctor({"sim": read(tmp_path / "sim.zarr")}, window=4, n_boot=300)
    g = rep.runs["sim"].windows[1]["growth"]
    base, later = mr.concat_tokens(sims[:4]), mr.concat_tokens(sims[4:])
    truth = planted_truth(base, later, 0.004, 6)
    for part in ("length", "residual"):
        assert g["parts"][part]["low"] <= truth[part] <= g["parts"][part]["high"], (part, truth[part], g["parts"][part])
    assert g["change"] == pytest.approx(float(np.abs(later.d).mean() - np.abs(base.d).mean()), abs=1e-6)
    k3 = rep.runs["sim"].windows[1]["growth_k3"]  # the k3 term decomposed the same way: parts add to its change
    k3_change = float(np.mean(np.expm1(later.d) - later.d) - np.mean(np.expm1(base.d) - base.d))
    assert k3["change"] == pytest.approx(k3_change, rel=1e-3)
    assert sum(p["value"] for p in k3["parts"].values()) == pytest.approx(k3["change"], rel=1e-9)


# ------------------------------------------------------------------------------ the command

def test_cli_exit_codes_and_json(stores, cli):
    res = cli("doctor", stores["clean"], "--window", "4", "--boot", "20")
    assert res.exit_code == 0, res.output[-2000:]
    assert "verdict: no cause named" in res.stdout
    res = cli("doctor", stores["raw6"], "--window", "4", "--boot", "20", "--json")
    assert res.exit_code == 1, res.output[-2000:]
    data = strict(res.stdout)
    run = data["runs"]["raw6"]
    assert run["first_named"]["raw_logprobs"]["step"] == 6 and data["problem"] is True
    assert [s["step"] for s in run["steps"]] == list(range(12))
    assert run["windows"][1]["growth"]["parts"]["residual"]["value"] > 0


def test_cli_reads_a_store_of_rl_step_arms_grouped_by_run(cli):
    res = cli("doctor", "h200-rl", "--json", "--boot", "0")
    assert res.exit_code in (0, 1), res.output[-2000:]
    data = strict(res.stdout)
    assert sorted(data["runs"]) == sorted(f"{p}+{o}" for p in ("parity-bf16-head", "pipelinerl-parity",
                                                               "vllm-v1-defaults") for o in ("mu", "pi_old"))
    assert all([s["step"] for s in r["steps"]] == [0, 99] for r in data["runs"].values())


def test_cli_bad_input_is_one_line_exit_2(stores, cli, tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    Recorder(tmp_path / "empty.zarr").close()  # a run store with no committed step
    from rlparity.trace import save

    save({"processed": synthetic_trace(arm="processed")}, tmp_path / "arms.zarr")  # arms that are no RL steps
    for path, text in ((folder, "is not a store"), (tmp_path / "missing.zarr", "is not a store"),
                       (tmp_path / "empty.zarr", "no committed step"),
                       (tmp_path / "arms.zarr", "neither a run store nor a store of RL steps")):
        res = cli("doctor", path)
        assert res.exit_code == 2, (path, res.output[-2000:])
        lines = [x for x in res.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and text in lines[0] and "Traceback" not in res.stderr, res.stderr
    res = cli("doctor", stores["clean"], "--window", "0")
    assert res.exit_code == 2


# ------------------------------------------------------------------------------ is it normal (issue 37)

def test_a_recorded_run_with_its_engine_settings_gets_the_exact_baseline_row(tmp_path):
    """The Recorder records what the engine settings it is given say; the doctor's key reads them, so
    the steps land on the row of that setting (the shipped H200 bf16 FLASH_ATTN fp32-head row, vLLM
    0.26.0: the run's versions, not the reader's). Without them the key says "?" and names the
    nearest row."""
    from rlparity.config.settings import EngineSettings
    from rlparity.metrics import baselines as mb

    want = {"family": "dense", "dtype": "bf16", "engine": "vllm 0.26.0", "attention_backend": "FLASH_ATTN",
            "head": "fp32 head", "device": "H200"}
    assert any(r.key == want for r in mb.load_baselines())  # the row the run must land on
    eng = EngineSettings(dtype="bfloat16", head_dtype="float32", attention_backend="FLASH_ATTN").model_dump(mode="json")
    with Recorder(tmp_path / "given.zarr", engine=eng, background=False, dashboards=(),
                  attrs={"trainer": {"dtype": "bfloat16", "head_dtype": "float32", "device": "cuda"},
                         "versions": {"vllm": "0.26.0"}}) as rec:
        for k in range(3):
            tr = synthetic_trace(n_sequences=8, max_len=16, noise=0.01, seed=k)
            rec.step(StepRecord.from_trace(tr, trainer="processed"), trainer_version=k, policy_versions=k)
    with Recorder(tmp_path / "bare.zarr", background=False, dashboards=()) as rec:
        for k in range(3):
            tr = synthetic_trace(n_sequences=8, max_len=16, noise=0.01, seed=k)
            rec.step(StepRecord.from_trace(tr, trainer="processed"), trainer_version=k, policy_versions=k)
    run = open_run(tmp_path / "given.zarr")
    assert run_record(run).given.to_attrs() == {"dtype": "bfloat16", "head_dtype": "float32",
                                                "attention_backend": "FLASH_ATTN"}
    assert "engine_requested" not in step_trace(run, 0).attrs  # partial: never a capture's full settings
    rep = doctor({"given": read(tmp_path / "given.zarr"), "bare": read(tmp_path / "bare.zarr")},
                 window=2, n_boot=10, device="H200")
    given, bare = rep.runs["given"].normal, rep.runs["bare"].normal
    assert given["key"] == want
    assert sorted(given["steps"]) == ["0", "1", "2"]
    for placed in given["steps"].values():
        for p in placed.values():
            assert p["exact"] and p["row"] == want and "nearest row" not in p["text"]
    assert {f: bare["key"][f] for f in ("dtype", "attention_backend")} == {"dtype": "?", "attention_backend": "?"}
    assert bare["key"]["head"] == "? head"
    for placed in bare["steps"].values():
        for p in placed.values():
            assert not p["exact"] and {"dtype", "attention_backend", "head"} <= set(p["differs"])
            assert "nearest row, differs in dtype (yours ?" in p["text"]


def test_the_engine_settings_say_only_what_they_name():
    """vLLM keyword arguments give the head through hf_overrides; "auto" and unset settings stay unknown."""
    from rlparity.metrics import baselines as mb
    from rlparity.record.run_record import given_settings

    got = given_settings({"dtype": "bfloat16", "hf_overrides": {"head_dtype": "float32"},
                            "attention_backend": "auto", "logprobs_mode": None, "seed": 0})
    assert got == {"dtype": "bfloat16", "head_dtype": "float32"}
    assert given_settings(None) == {} and given_settings({"dtype": "auto"}) == {}
    assert given_settings({"dtype": "torch.float16", "head_dtype": "model"}) == {"dtype": "float16", "head_dtype": "model"}
    key = mb.baseline_key({"engine_given": got, "trainer": {"dtype": "bfloat16", "device": "cpu"}})
    # the trainer names no head: its head is its body's (bf16), the engine's is fp32
    assert key["dtype"] == "bf16" and key["attention_backend"] == "?"
    assert key["head"] == "fp32 engine / bf16 trainer head"
    # what the engine reported wins over what it was given
    both = mb.baseline_key({"engine_given": {"attention_backend": "FLASH_ATTN", "head_dtype": "model"},
                            "engine_effective": {"attention_backend": "TRITON_ATTN", "dtype": None}})
    assert both["attention_backend"] == "TRITON_ATTN" and both["dtype"] == "?"
    # a head "model" is the body's; the given settings fill what the engine did not report, not the reverse
    assert mb.baseline_key({"engine_given": {"dtype": "float16", "head_dtype": "model"}})["head"] == "fp16 engine / ? trainer head"
    fill = mb.baseline_key({"engine_given": {"dtype": "float16", "attention_backend": "FLASH_ATTN"},
                            "engine_effective": {"dtype": "bfloat16"}, "trainer": {"dtype": "bfloat16"}})
    assert fill["dtype"] == "bf16" and fill["attention_backend"] == "FLASH_ATTN" and fill["head"] == "bf16 head"
    # a capture's requested settings are not what a loop named: only engine_effective counts there
    assert mb.baseline_key({"engine_requested": {"dtype": "bfloat16"}})["dtype"] == "?"
    # the family: MoE where the routes were captured or the experiment says so, either alone
    assert mb.baseline_key({"routing_capture": {"mode": "replay"}})["family"] == "moe"
    assert mb.baseline_key({"moe_experiment": {"moe": True}})["family"] == "moe"
    assert mb.baseline_key({"routing_capture": {}, "moe_experiment": {"moe": False}})["family"] == "dense"


# ------------------------------------------------------------------------------ the page as tables (notebook 11)

def test_the_page_tables_say_what_the_steps_say(stores):
    """The tables notebook 11 shows, against the run's own per-step records read by hand: the alarm
    timeline against the raw alarm list, the window table against the per-step causes, the growth
    rows against the windows' decompositions (parts summing to the change), the placements."""
    from rlparity.diagnose.doctor_page import spans

    assert spans([8, 6, 7, 10, 12, 13]) == "6-8, 10, 12-13" and spans([]) == "" and spans([3]) == "3"
    steps = read(stores["raw6"])
    r = doctor({"raw6": steps}, window=4, n_boot=20).runs["raw6"]
    assert r.steps_naming("raw_logprobs") == list(range(6, 12)) and r.steps_naming("rollout_bf16_head") == []
    timeline = r.alarm_timeline()
    by_hand: dict = {}
    for a in r.alarms:
        by_hand.setdefault(a["code"], set()).add(a["step"])
    assert {t["alarm"]: set(t["steps"]) for t in timeline} == by_hand
    assert [t["first"] for t in timeline] == sorted(t["first"] for t in timeline)  # in the order they first fired
    jump = next(t for t in timeline if t["alarm"] == "floor_jump")
    assert jump["first"] == 6 and jump["level"] == "warning" and jump["n_steps"] == len(jump["steps"])
    rows = r.window_table()
    assert [w["steps"] for w in rows] == ["0-3", "4-7", "8-11"] and [w["recorded"] for w in rows] == [4, 4, 4]
    assert rows[0]["cause"] is None and rows[0]["on_steps"] == [] and rows[0]["finding"] is None
    assert rows[1]["cause"] == "raw_logprobs" and rows[1]["on_steps"] == [6, 7]
    assert rows[2]["on_steps"] == [8, 9, 10, 11] and rows[2]["severity"] == "error"
    mask_means = []
    for w in r.windows:  # the window's mean |d| recomputed from its steps' tokens
        toks = mr.run_tokens({k: steps[k] for k in w["steps"]})
        d = np.concatenate([t.d for t in toks.values()])
        mask_means.append(float(np.abs(d).mean()))
    np.testing.assert_allclose([w["mean_abs_d"] for w in rows], mask_means, rtol=1e-9)
    for target in ("abs_d", "k3"):
        grown = r.growth_table(target)
        assert [g["steps"] for g in grown] == ["4-7", "8-11"]
        for g in grown:
            parts = sum(g[p] for p in (*mr.PARTS, "residual"))
            assert abs(parts - g["change"]) <= 1e-9 + 1e-6 * abs(g["change"]), g
            assert all(g[f"{p}_low"] <= g[p] + 1e-12 and g[p] <= g[f"{p}_high"] + 1e-12 for p in ("residual",))
    # each row is its window's decomposition of the target asked for (mean |d| or k3), not the other's
    for target, key in (("abs_d", "growth"), ("k3", "growth_k3")):
        assert [g["change"] for g in r.growth_table(target)] == [w[key]["change"] for w in r.windows[1:]]
    assert rows[1]["other_causes"] == [] and rows[2]["other_causes"] == []  # the headline is not repeated
    late = r.growth_table()[-1]
    assert late["residual"] > 0.5 * late["change"] > 0  # the raw steps' excess is in the residual, not composition
    with pytest.raises(ValueError, match="use 'abs_d'"):
        r.growth_table("abs")
    placed = r.placement_table()
    assert [p["step"] for p in placed] == list(range(12))
    np.testing.assert_allclose([p["value"] for p in placed], r.steps["abs_log_ratio_mean"].values, rtol=1e-6)
    assert all(0 <= p["percentile"] <= 100 for p in placed)
    with pytest.raises(ValueError, match="use one of"):
        r.placement_table("nope")


def test_a_run_store_ships_as_an_example_the_doctor_reads_by_name(stores, tmp_path, cli, monkeypatch):
    """``save_run_example`` ships a recorded run store as an example of RL step arms: the steps read
    back with the recorder's numbers (float32 in both), its live alarms and the provenance; the
    doctor on it gives the same page numbers and cause as on the run store, by name too; the store
    holds no word of the planted fault; a folder that is no run store is refused."""
    import rlparity.datasets as ds_mod
    from rlparity.cli.doctor import read_runs
    from rlparity.experiments.rl_example import save_run_example

    ex = tmp_path / "examples"
    ex.mkdir()
    out = save_run_example(stores["raw6"], ex / "mine.zarr", {"description": "a test run", "date": "2026-12-06"})
    monkeypatch.setattr(ds_mod, "examples_dir", lambda: ex)
    assert ds_mod.list_examples() == {"mine": {"description": "a test run", "date": "2026-12-06"}}
    steps, shipped = read(stores["raw6"]), read_runs(out)["raw6"]
    assert sorted(shipped) == list(range(12))
    for k in range(12):
        m = steps[k]["response_mask"].values
        np.testing.assert_array_equal(shipped[k]["rollout_logprob"].values[m], steps[k]["rollout_logprob"].values[m])
        np.testing.assert_array_equal(shipped[k]["trainer_processed_logprob"].values[m],
                                      steps[k]["trainer_processed_logprob"].values[m])
        assert shipped[k].attrs.get("record_alarms") == steps[k].attrs.get("record_alarms")
    a, b = (doctor({"raw6": s}, window=4, n_boot=0).runs["raw6"] for s in (steps, shipped))
    np.testing.assert_allclose(b.steps["abs_log_ratio_mean"].values, a.steps["abs_log_ratio_mean"].values, rtol=1e-6)
    assert a.first_named == b.first_named and a.alarms == b.alarms
    text = "".join(f.read_text() for f in out.rglob(".z*"))
    assert "raw_from" not in text and '"fault"' not in text
    res = cli("doctor", "mine", "--window", "4", "--boot", "0", "--json")
    assert res.exit_code == 1 and strict(res.stdout)["runs"]["raw6"]["first_named"]["raw_logprobs"]["step"] == 6
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="no run store"):
        save_run_example(tmp_path / "plain", tmp_path / "x.zarr", {})


def test_a_run_stores_steps_saved_as_rl_arms_read_back_to_the_same_run(stores, tmp_path, cli):
    """``steps_as_arms`` turns a run store's steps into RL step arms a plain store keeps: saved and
    read back, they are grouped to the same run and steps, every arm validates as a scored trace,
    and the doctor reads the same numbers and names the same cause at the same step."""
    from rlparity.cli.doctor import read_runs
    from rlparity.metrics.rl import run_steps, steps_as_arms
    from rlparity.trace import open_arms, save, validate

    steps = read(stores["raw6"])
    arms = steps_as_arms({"raw6": steps})
    assert list(arms) == [f"raw6@step_{k:03d}" for k in range(12)]
    assert np.isnan(steps[0].attrs["record_metrics"]["rlparity/reward_mean"])  # NaN in the source
    store = save(arms, tmp_path / "arms.zarr")  # strict JSON: the NaN metrics became null
    back = open_arms(store)
    assert run_steps(back) == {f"raw6@step_{k:03d}": ("raw6", k) for k in range(12)}
    for arm, ds in back.items():
        validate(ds, require_trainer=True, where=arm)
    again = read_runs(store)["raw6"]
    a, b = (doctor({"raw6": s}, window=4, n_boot=0).runs["raw6"] for s in (steps, again))
    np.testing.assert_allclose(b.steps["abs_log_ratio_mean"].values, a.steps["abs_log_ratio_mean"].values, rtol=1e-12)
    assert a.first_named == b.first_named == {"raw_logprobs": {"step": 6, "window": [4, 7]}}
    assert steps[3].attrs.get("factors") is None  # the caller's traces are left as they were
    from rlparity.trace import arm_factors

    assert arm_factors(back["raw6@step_003"]) == {"profile": "raw6", "old_policy": "not recorded", "step": 3}
    named = steps_as_arms({"r": {0: steps[0].assign_attrs(old_policy="mu")}})  # a trace that says its denominator
    assert arm_factors(named["r@step_000"])["old_policy"] == "mu"


# ------------------------------------------------------------------------------ the figures

def test_figures_draw_the_doctors_numbers(stores):
    from rlparity.plot.doctor import plot_growth, plot_mismatch_over_steps
    from rlparity.plot.layout import book_layout, layout_problems

    r = doctor({"raw6": read(stores["raw6"])}, window=4, n_boot=20).runs["raw6"]
    fig = plot_mismatch_over_steps(r.steps, alarms=r.alarms, first_named=r.first_named)
    by_name = {t.name: t for t in fig.data}
    np.testing.assert_allclose(by_name["mean |d|"].y, r.steps["abs_log_ratio_mean"].values)
    np.testing.assert_allclose(by_name["k3"].y, r.steps["kl_k3"].values)
    warn = by_name["alarm (warning)"]
    assert sorted(set(warn.x)) == sorted({a["step"] for a in r.alarms if a["level"] == "warning"})
    assert [s["x0"] for s in fig.layout.shapes] == [6]  # raw_logprobs named at step 6
    bars = plot_growth(r.windows)
    parts = {t.name: t for t in bars.data}
    assert list(parts["residual"].x) == ["4-7", "8-11"]
    assert parts["measured change"].y[1] == pytest.approx(r.windows[2]["growth"]["change"])
    assert layout_problems(book_layout(fig)) == [] and layout_problems(book_layout(bars)) == []  # the book can show them
    with pytest.raises(ValueError, match="at least two windows"):
        plot_growth(r.windows[:1])


def test_a_category_the_base_window_never_held_is_merged_and_said():
    """Later tokens of a lag the base window never saw cannot be priced by its fit: they count in the
    nearest lag it held, so the lag part is 0 and their excess is in the residual, and the result says so."""
    rng = np.random.default_rng(2)
    base = simulate(rng, range(0, 5), lengths=(10, 60), nlm_scale=0.6, lag_p=[1.0], n_seq=30)
    later = simulate(rng, range(5, 10), lengths=(10, 60), nlm_scale=0.6, lag_p=[0.5, 0.5], n_seq=30)
    g = mr.growth_decomposition(base, later, n_boot=50)
    assert g["merged"] == {"lag": {"1": 0}} and g["parts"]["lag"]["value"] == 0.0
    truth_lag = BETA["lag"][1] * float(np.mean(later.lag == 1))
    assert g["parts"]["residual"]["low"] <= truth_lag <= g["parts"]["residual"]["high"]


def test_a_long_run_prints_one_row_per_window(tmp_path):
    path = tmp_path / "long.zarr"
    with Recorder(path, sampling={"temperature": 0.7}, background=False, dashboards=()) as rec:
        for k in range(35):
            tr = synthetic_trace(n_sequences=4, max_len=12, noise=0.01, seed=k)
            rec.step(StepRecord.from_trace(tr, trainer="processed"), trainer_version=k, policy_versions=k)
    rep = doctor({"long": read(path)}, window=10, n_boot=10)
    page = str(rep)
    assert "mismatch per window (35 steps; every step in --json)" in page
    for row in ("0-9", "10-19", "20-29", "30-39"):
        assert f"  {row:>9}  " in page
    assert len(rep.to_dict()["runs"]["long"]["steps"]) == 35 and "floors: none recorded" in page


def _log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def stale_like_step(rng, *, stale: int, n: int = 32, vocab: int = 32, temperature: float = 0.7, shift: float = 0.5):
    """One step where the first ``stale`` sequences were sampled by an engine whose logits differ from the
    trainer's (as KV left by older weights would make them): tokens drawn from the engine's own processed
    distribution, mu its logprob, pi_old the trainer's processed logprob of the same token."""
    toks, mus, pis = [], [], []
    for i in range(n):
        L = int(rng.integers(24, 49))
        logits = rng.normal(0, 2.5, (L, vocab))
        engine = _log_softmax((logits + (rng.normal(0, shift, logits.shape) if i < stale else 0.0)) / temperature)
        t = np.array([rng.choice(vocab, p=np.exp(row)) for row in engine])
        idx = np.arange(L)
        mus.append(np.minimum(engine[idx, t] + rng.normal(0, 0.01, L), 0.0))
        pis.append(_log_softmax(logits / temperature)[idx, t])
        toks.append(t)
    return {"prompt_token_ids": [[1, 2, 3]] * n, "token_ids": toks, "rollout_logprobs": mus, "trainer_logprobs": pis}


def test_a_stale_cache_like_excess_from_step_6_shows_from_step_6(tmp_path):
    """A run store carries no engine cache records, so no diagnosis can name the stale prefix cache
    itself: what the doctor shows from step 6, and not before, is the recorder's floor jump and a
    change of mean |d| the decomposition puts in the residual (the tokens did not move to other cells)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "stale.zarr"
    with Recorder(path, sampling={"temperature": 0.7}, background=False, dashboards=()) as rec:
        for k in range(12):
            rec.step(**stale_like_step(rng, stale=8 if k >= 6 else 0), trainer_version=k, policy_versions=k)
    r = doctor({"stale": read(path)}, window=4, n_boot=200).runs["stale"]
    jumps = sorted(a["step"] for a in r.alarms if a["code"] == "floor_jump")
    assert jumps == list(range(6, 12))
    assert all(w["headline"] is None for w in r.windows[:1]) and "raw_logprobs" not in r.first_named
    g = r.windows[2]["growth"]  # steps 8-11, all stale-like, against steps 0-3
    assert g["parts"]["residual"]["low"] > 0.5 * g["change"] > 0
    assert all(abs(g["parts"][p]["value"]) < 0.05 * g["change"] for p in mr.PARTS)


# ------------------------------------------------------------------------------ a real recorded run

@pytest.mark.engine
def test_the_doctor_on_a_real_run_with_raw_logprobs_switched_on_at_step_6(tiny_model, release_engines, tmp_path, cli):
    """rlparity's own RL runner on the tiny model with a real vLLM engine (parity profile, processed
    logprobs) and a real trainer, recorded through the Recorder; before step 6's rollouts the running
    engine is switched to raw logprobs (the fault, its ground truth only in the arms' attrs). The
    doctor, reading the run store alone, names raw_logprobs from step 6 and on no step before; each
    step's mean |d| on its page equals a plain recomputation from the runner's own traces."""
    from rlparity.experiments.rl import rl_run

    release_engines()
    arms = rl_run(tiny_model, ["pipelinerl-parity"], 12, old_policy="pi_old", n_prompts=8, n_samples=4,
                  max_tokens=12, lr=1e-3, fault="raw_logprobs", fault_from_step=6, log=lambda line: None,
                  record_dir=tmp_path)
    truth = [arm_record(ds).rl_step.fault.on for ds in arms.values()]
    assert truth == [False] * 6 + [True] * 6
    res = cli("doctor", tmp_path / "pipelinerl-parity.zarr", "--window", "4", "--boot", "50", "--json")
    assert res.exit_code == 1, res.output[-2000:]
    run = strict(res.stdout)["runs"]["pipelinerl-parity"]
    assert run["first_named"]["raw_logprobs"] == {"step": 6, "window": [4, 7]}
    named = {int(k): v["causes"] for k, v in run["step_causes"].items()}
    assert all(not named[k] for k in range(6)), named  # no cause at all before the switch
    assert [k for k in range(12) if "raw_logprobs" in named[k]] == list(range(6, 12)), named
    assert run["windows"][0]["headline"] is None and run["windows"][2]["headline"]["cause"] == "raw_logprobs"
    # the page's per-step mean |d| against the runner's traces, recomputed by hand
    means = []
    for ds in arms.values():
        mask = ds["response_mask"].values.astype(bool)
        means.append(float(np.abs(ds["trainer_processed_logprob"].values[mask] - ds["rollout_logprob"].values[mask]).mean()))
    page = [s["abs_log_ratio_mean"] for s in run["steps"]]
    np.testing.assert_allclose(page, means, rtol=1e-4, atol=1e-8)  # the store keeps float32 logprobs
    assert max(page[:6]) < 0.01 and min(page[6:]) > 10 * max(page[:6]), page
    # the runner's own traces (what `rlparity experiment rl` stores): the same cause from the same step, and
    # nothing else (the trainer's weight fingerprints follow its optimizer steps)
    full = doctor({"run": {arm_record(ds).rl_step.step: ds for ds in arms.values()}}, window=4, n_boot=0).runs["run"]
    assert full.first_named == {"raw_logprobs": {"step": 6, "window": [4, 7]}}, full.first_named
    text = cli("doctor", tmp_path / "pipelinerl-parity.zarr", "--window", "4", "--boot", "50")
    assert "raw_logprobs at step 6 (window 4-7)" in text.stdout
    assert "steps 0-3 (4 recorded): no cause named" in text.stdout
    print(text.stdout)
