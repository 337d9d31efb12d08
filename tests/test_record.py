"""The run recorder (issue 36): real zarr run stores in tmp_path, a run killed with SIGKILL mid-step,
every alarm on a synthetic step built to trigger it (and none on clean steps), lazy opening, and the
live metrics against an independent float64 recomputation (plain Python over the ragged lists)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rlparity.config import defaults, defaults_context
from rlparity.record import ALARMS, Recorder, RunAlarmError, is_run_store, open_run, step_trace, weight_digest
from rlparity.trace import StoreError

ROOT = Path(__file__).resolve().parents[1]


def synthetic_step(k: int, *, noise: float = 0.01, n: int | None = None, version: int | None = None) -> dict:
    """Step ``k`` of a clean synthetic run: ragged sequences, mu from the engine, pi_old = mu + small
    noise, on-policy tokens, rewards and advantages, a digest that changes every step."""
    rng = np.random.default_rng(1000 + k)
    n = int(rng.integers(3, 9)) if n is None else n
    lengths = rng.integers(1, 30, n)
    mu = [np.log(rng.uniform(0.05, 0.99, L)) for L in lengths]
    pi = [m + rng.normal(0.0, noise, len(m)) for m in mu]
    pi = [np.minimum(p, 0.0) for p in pi]
    v = k if version is None else version
    return {"prompt_token_ids": [list(rng.integers(0, 500, int(rng.integers(2, 6)))) for _ in range(n)],
            "token_ids": [rng.integers(0, 1000, L) for L in lengths], "rollout_logprobs": mu, "trainer_logprobs": pi,
            "policy_versions": v, "trainer_version": v, "rewards": rng.uniform(0, 1, n),
            "advantages": rng.normal(0, 1, n), "weight_version": v,
            "weight_digest": {"model.embed_tokens.weight": f"{1000 + v:08x}", "lm_head.weight": f"{2000 + v:08x}"}}


def codes(metrics) -> set[str]:
    return {a.code for a in metrics.alarms}


# ------------------------------------------------------------------------------------- the store

def test_steps_round_trip_through_one_run_store(tmp_path):
    path = tmp_path / "run.zarr"
    steps = [synthetic_step(k) for k in range(6)]
    with Recorder(path, model="tiny", sampling={"temperature": 0.7, "top_k": 20}) as rec:
        for s in steps:
            rec.step(**s)
    assert is_run_store(path)
    run = open_run(path)
    assert run.attrs["steps"] == 6 and run.sizes["step"] == 6
    for k, s in enumerate(steps):
        n = len(s["token_ids"])
        assert int(run["n_sequences"][k]) == n
        for i in range(n):
            L = len(s["token_ids"][i])
            assert int(run["response_length"][k, i]) == L
            np.testing.assert_array_equal(run["token_id"].values[k, i, :L], s["token_ids"][i])
            assert (run["token_id"].values[k, i, L:] == -1).all() and not run["response_mask"].values[k, i, L:].any()
            np.testing.assert_allclose(run["rollout_logprob"].values[k, i, :L], s["rollout_logprobs"][i], rtol=1e-6)
            np.testing.assert_allclose(run["trainer_processed_logprob"].values[k, i, :L], s["trainer_logprobs"][i],
                                       rtol=1e-6)
            P = len(s["prompt_token_ids"][i])
            np.testing.assert_array_equal(run["prompt_token_id"].values[k, i, :P], s["prompt_token_ids"][i])
        np.testing.assert_allclose(run["reward"].values[k, :n], s["rewards"])
        assert float(run["temperature"][k, 0]) == pytest.approx(0.7) and int(run["top_k"][k, 0]) == 20
        assert int(run["weight_digest"].sel(tensor="lm_head.weight")[k]) == 2000 + k
    # a step is a trace of the schema: the summary of its trace matches the metric recorded live
    tr = step_trace(run, 3)
    from rlparity.metrics import scalars, summary

    got = scalars(summary(tr))["abs_log_ratio_mean"]
    live = float(run["metric_value"].sel(step=3, metric="rlparity/abs_log_ratio_mean"))
    assert got == pytest.approx(live, rel=1e-4)  # stored float32, live float64


def test_a_store_opens_lazily_and_grows_past_a_chunk_of_steps(tmp_path):
    path = tmp_path / "run.zarr"
    with Recorder(path, dashboards=()) as rec:
        for k in range(260):  # past one chunk (256 steps) of the per-step arrays
            rec.step(**synthetic_step(k % 7, n=2, version=k))
    lazy = open_run(path, chunks=16)
    assert lazy.attrs["steps"] == 260
    assert hasattr(lazy["token_id"].data, "dask") and hasattr(lazy["metric_value"].data, "dask")
    eager = open_run(path)
    for name in ("token_id", "rollout_logprob", "metric_value", "trainer_version", "weight_digest"):
        np.testing.assert_array_equal(lazy[name].values, eager[name].values)
    assert eager["trainer_version"].values.tolist() == list(range(260))


def test_resume_appends_after_the_committed_steps_and_keeps_the_trailing_floor(tmp_path):
    path = tmp_path / "run.zarr"
    with Recorder(path) as rec:
        for k in range(4):
            rec.step(**synthetic_step(k, noise=0.02))
    with pytest.raises(FileExistsError, match="resume=True"):
        Recorder(path)
    with Recorder(path, resume=True) as rec:
        assert rec.steps == 4 and len(rec._history) == 4
        out = rec.step(**synthetic_step(4, noise=0.5))  # a jump against the 4 steps recorded before the restart
    assert "floor_jump" in codes(out) and out.step == 4
    assert open_run(path).attrs["steps"] == 5


def test_one_recorder_per_store_and_clear_errors(tmp_path):
    path = tmp_path / "run.zarr"
    rec = Recorder(path)
    with pytest.raises(StoreError, match="another process is recording"):
        Recorder(path, resume=True)
    s = synthetic_step(0)
    s["trainer_logprobs"] = [x[:-1] if i == 0 else x for i, x in enumerate(s["trainer_logprobs"])]
    with pytest.raises(ValueError, match="sequence 0: .* trainer_logprobs for .* tokens"):
        rec.step(**s)
    rec.close()
    with pytest.raises(StoreError, match="no committed step"):
        open_run(path)  # nothing was committed: the failed step never reached the store
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x").write_text("x")
    with pytest.raises(StoreError, match="not a run store"):
        Recorder(tmp_path / "other")
    with pytest.raises(StoreError, match="not a run store"):
        open_run(tmp_path / "other")


def test_padded_arrays_with_masks_record_as_ragged_ones(tmp_path):
    s = synthetic_step(2)
    n, width = len(s["token_ids"]), max(len(t) for t in s["token_ids"])
    mask = np.zeros((n, width), bool)
    pad = {k: np.zeros((n, width)) for k in ("token_ids", "rollout_logprobs", "trainer_logprobs")}
    for i in range(n):
        L = len(s["token_ids"][i])
        mask[i, :L] = True
        for k in pad:
            pad[k][i, :L] = s[k][i]
    pw = max(len(p) for p in s["prompt_token_ids"])
    prompt, pmask = np.zeros((n, pw), int), np.zeros((n, pw), bool)
    for i, p in enumerate(s["prompt_token_ids"]):  # left padding, as TRL pads prompts
        prompt[i, pw - len(p):], pmask[i, pw - len(p):] = p, True
    with Recorder(tmp_path / "a.zarr") as a, Recorder(tmp_path / "b.zarr") as b:
        ma = a.step(**s)
        mb = b.step(**{**s, **pad, "token_ids": pad["token_ids"].astype(int), "response_mask": mask,
                       "prompt_token_ids": prompt, "prompt_mask": pmask})
    assert ma.keys() == mb.keys()
    assert all(ma[k] == mb[k] or (math.isnan(ma[k]) and math.isnan(mb[k])) for k in ma)
    ra, rb = open_run(tmp_path / "a.zarr"), open_run(tmp_path / "b.zarr")
    for name in ("token_id", "prompt_token_id", "rollout_logprob", "response_length", "prompt_length"):
        np.testing.assert_array_equal(ra[name].values, rb[name].values)


# ------------------------------------------------------------------------------------- SIGKILL

CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
from test_record import synthetic_step
from rlparity.record import Recorder
rec = Recorder({path!r}, resume=True, background={background!r})
k = rec.steps
while True:
    s = synthetic_step(k, n=64)
    print("begin", k, flush=True)
    rec.step(**s)
    print("end", k, flush=True)
    k += 1
"""


@pytest.mark.parametrize("background", [False, True], ids=["inline", "background"])
def test_a_run_killed_mid_step_keeps_every_whole_step(tmp_path, background):
    """A recording subprocess is killed with SIGKILL right after it starts a step (three times,
    resuming in between): the store opens, every step committed is there with its data. Writing
    inline, every step ``step()`` returned from is committed and the one it was in is absent (or
    whole, if it finished before the signal landed); writing in the background, up to the queue's
    two steps and the one being written may be lost besides."""
    path = tmp_path / "run.zarr"
    with Recorder(path) as rec:  # created here; the child resumes it
        rec.step(**synthetic_step(0, n=64))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(ROOT / "tests"), path=str(path), background=background))
    ended, killed_inside = 0, 0
    for round_, (target, delay) in enumerate([(3, 0.002), (6, 0.01), (9, 0.0)]):
        proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
        try:
            while True:
                line = proc.stdout.readline()
                assert line, f"the recording child exited early (round {round_})"
                what, k = line.split()
                if what == "end":
                    ended = int(k) + 1
                if what == "begin" and int(k) >= target:
                    time.sleep(delay)
                    proc.send_signal(signal.SIGKILL)  # inside step(): metrics, writes or commit
                    break
        finally:
            proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        run = open_run(path)
        steps = run.attrs["steps"]
        if background:
            assert ended - 3 <= steps <= ended + 1, (steps, ended)
            ended = steps
        else:
            assert steps in (ended, ended + 1), (steps, ended)  # the step killed is absent, or whole
            killed_inside += steps == ended
        for k in range(steps):
            s = synthetic_step(k, n=64)
            for i in (0, 63):
                L = len(s["token_ids"][i])
                np.testing.assert_array_equal(run["token_id"].values[k, i, :L], s["token_ids"][i])
                np.testing.assert_allclose(run["trainer_processed_logprob"].values[k, i, :L], s["trainer_logprobs"][i],
                                           rtol=1e-6)
            assert int(run["trainer_version"][k]) == k
        assert np.isfinite(run["metric_value"].sel(metric="rlparity/abs_log_ratio_mean").values).all()
    assert background or killed_inside >= 1  # a kill landed inside a step (tens of ms at 64 sequences)
    assert open_run(path, chunks=1).attrs["steps"] >= (6 if background else 9)


# ------------------------------------------------------------------------------------- alarms

def test_clean_steps_raise_no_alarm(tmp_path):
    with Recorder(tmp_path / "run.zarr", stop_on="warning") as rec:
        for k in range(12):
            out = rec.step(**synthetic_step(k))
            assert out.alarms == [] and all(out[f"rlparity/alarm/{c}"] == 0 for c in ALARMS)
    assert (open_run(tmp_path / "run.zarr")["alarm_level"].values == 0).all()


def _recorder_with_history(tmp_path, steps=5, **kw):
    rec = Recorder(tmp_path / "run.zarr", **kw)
    for k in range(steps):
        assert rec.step(**synthetic_step(k)).alarms == []
    return rec


def test_confident_disagreement_fires_on_a_token_the_trainer_scores_nats_lower(tmp_path):
    rec = _recorder_with_history(tmp_path)
    s = synthetic_step(5)
    s["rollout_logprobs"][1] = s["rollout_logprobs"][1].copy()
    s["trainer_logprobs"][1] = s["trainer_logprobs"][1].copy()
    s["rollout_logprobs"][1][0] = math.log(0.9)
    s["trainer_logprobs"][1][0] = math.log(0.9) - 2.5
    out = rec.step(**s)
    assert "confident_disagreement" in codes(out)
    a = next(a for a in out.alarms if a.code == "confident_disagreement")
    assert a.level == "error" and a.value == 1 and a.step == 5
    # 2.5 nats lower but an engine probability of 0.4: not confident, no alarm
    s["rollout_logprobs"][1][0] = math.log(0.4)
    s["trainer_logprobs"][1][0] = math.log(0.4) - 2.5
    assert "confident_disagreement" not in codes(rec.step(**{**s, "trainer_version": 6, "policy_versions": 6,
                                                            "weight_version": 6}))
    rec.close()


def test_floor_jump_fires_at_the_step_the_floor_jumps(tmp_path):
    rec = _recorder_with_history(tmp_path, steps=5)
    out = rec.step(**synthetic_step(5, noise=0.08))  # mean |d| about 0.064 against about 0.008 before
    assert "floor_jump" in codes(out) and "gap_above_gate" not in codes(out)
    a = next(a for a in out.alarms if a.code == "floor_jump")
    assert a.level == "warning" and a.value > 0.03
    rec.close()
    # too little history: no judgement
    rec = _recorder_with_history(tmp_path / "b", steps=2) if (tmp_path / "b").mkdir() is None else None
    assert "floor_jump" not in codes(rec.step(**synthetic_step(2, noise=0.08)))
    rec.close()


def test_a_gap_above_the_check_gates_warns_from_the_first_step(tmp_path):
    with Recorder(tmp_path / "run.zarr") as rec:
        out = rec.step(**synthetic_step(0, noise=0.3))
    assert codes(out) >= {"gap_above_gate"} and out["rlparity/abs_log_ratio_mean"] > 0.1


def test_weights_unchanged_fires_when_the_digest_stays_although_the_trainer_stepped(tmp_path):
    rec = _recorder_with_history(tmp_path, steps=3)
    s = synthetic_step(3)
    s["weight_digest"] = synthetic_step(2)["weight_digest"]  # the engine still holds version 2's weights
    out = rec.step(**s)
    assert "weights_unchanged" in codes(out) and out["rlparity/weights_changed_share"] == 0.0
    # one tensor of two changed: no alarm, the share says how much
    s = synthetic_step(4)
    s["weight_digest"] = {**s["weight_digest"], "lm_head.weight": synthetic_step(2)["weight_digest"]["lm_head.weight"]}
    out = rec.step(**s)
    assert "weights_unchanged" not in codes(out) and out["rlparity/weights_changed_share"] == 0.5
    # the same digest with the trainer's version unchanged (no step in between): no alarm
    assert "weights_unchanged" not in codes(rec.step(**{**s, "rewards": None}))
    rec.close()


def test_tokens_scored_by_older_weights_than_generated_them_are_an_error(tmp_path):
    rec = _recorder_with_history(tmp_path, steps=2)
    s = synthetic_step(2)
    out = rec.step(**{**s, "scored_version": 1})
    assert "scored_by_older_version" in codes(out)
    assert out["rlparity/scored_by_older_tokens"] == sum(len(t) for t in s["token_ids"])
    rec.close()


def test_staleness_warns_on_tokens_more_than_max_lag_behind(tmp_path):
    rec = _recorder_with_history(tmp_path, steps=2)
    s = synthetic_step(5)
    old = [np.full(len(t), 2) for t in s["token_ids"]]
    out = rec.step(**{**s, "policy_versions": old, "scored_version": old})  # each token scored at its own version
    assert codes(out) == {"staleness"} and out["rlparity/lag_max"] == 3
    with defaults_context(record={"max_lag": 3}):
        assert "staleness" not in codes(rec.step(**{**s, "policy_versions": old, "scored_version": old}))
    rec.close()


def test_ess_collapse_and_low_ess_follow_the_objective_thresholds(tmp_path):
    rec = _recorder_with_history(tmp_path, steps=2)
    s = synthetic_step(2, n=4)
    s["trainer_logprobs"] = [m.copy() for m in s["rollout_logprobs"]]
    s["rollout_logprobs"] = [m.copy() for m in s["rollout_logprobs"]]
    s["rollout_logprobs"][0][0] -= 7.0  # one token pi_old/mu = e^7: it carries the batch
    out = rec.step(**s)
    assert "ess_collapse" in codes(out) and out["rlparity/ess_token"] < 0.1
    with defaults_context(objective={"ess_collapse": 0.01}):
        out = rec.step(**s)
    assert "ess_low" in codes(out) and "ess_collapse" not in codes(out)
    rec.close()


def test_stop_on_error_raises_after_the_step_is_recorded(tmp_path):
    path = tmp_path / "run.zarr"
    rec = _recorder_with_history(tmp_path, steps=2, stop_on="error")
    s = synthetic_step(2)
    with pytest.raises(RunAlarmError, match="scored_by_older_version.*stop_on='error'"):
        rec.step(**{**s, "scored_version": 0})
    rec.close()
    run = open_run(path)
    assert run.attrs["steps"] == 3
    assert int(run["alarm_level"].sel(step=2, alarm="scored_by_older_version")) == 2


# ------------------------------------------------------------------------------------- metrics

def test_live_metrics_equal_an_independent_float64_recomputation(tmp_path):
    s = synthetic_step(4, noise=0.05, n=6)
    s["trainer_updated_logprobs"] = [p - 0.01 for p in s["trainer_logprobs"]]  # a logprob stays <= 0
    with Recorder(tmp_path / "run.zarr", eps=0.2) as rec:
        out = rec.step(**s)
    d_seq = [[float(p) - float(m) for p, m in zip(ps, ms)] for ps, ms in zip(s["trainer_logprobs"], s["rollout_logprobs"])]
    d = [x for row in d_seq for x in row]
    n = len(d)
    pi = [math.exp(float(x)) for row in s["trainer_logprobs"] for x in row]
    mu = [math.exp(float(x)) for row in s["rollout_logprobs"] for x in row]
    w = [math.exp(x) for x in d]
    ref = {
        "rlparity/n_tokens": n,
        "rlparity/abs_log_ratio_mean": sum(abs(x) for x in d) / n,
        "rlparity/abs_log_ratio_rms": math.sqrt(sum(x * x for x in d) / n),
        "rlparity/abs_log_ratio_max": max(abs(x) for x in d),
        "rlparity/kl_k1": sum(-x for x in d) / n,
        "rlparity/kl_k3": sum(math.exp(x) - 1 - x for x in d) / n,
        "rlparity/ess_token": sum(w) ** 2 / (n * sum(x * x for x in w)),
        "rlparity/clip_fraction": sum(1 for x in w if x < 0.8 or x > 1.2) / n,
        "rlparity/prob_diff_mean": sum(abs(a - b) for a, b in zip(pi, mu)) / n,
        "rlparity/lag_max": 0.0,
        "rlparity/update/kl_k3": math.exp(-0.01) - 1 + 0.01,
        # verl: token means with its 1e-8 in the denominator; sequence means for the log-ppl
        "rollout_corr/kl": -sum(d) / (n + 1e-8),
        "rollout_corr/k3_kl": sum(math.exp(x) - x - 1 for x in d) / (n + 1e-8),
        "rollout_corr/chi2_token": sum(math.exp(2 * x) for x in d) / (n + 1e-8) - 1,
        "rollout_corr/chi2_seq": sum(math.exp(2 * sum(r)) for r in d_seq) / len(d_seq) - 1,
        "rollout_corr/log_ppl_diff": sum(-sum(r) / (len(r) + 1e-8) for r in d_seq) / len(d_seq),
        # slime: mean over sequences of per-sequence mean |d|
        "train/train_rollout_logprob_abs_diff": sum(sum(abs(x) for x in r) / len(r) for r in d_seq) / len(d_seq),
        # TRL
        "sampling/sampling_logp_difference/max": max(abs(x) for x in d),
        "sampling/sampling_logp_difference/mean": sum(abs(x) for x in d) / n,
        # PipelineRL token ESS and prime-rl's mismatch KL
        "rl/ess": sum(w) ** 2 / sum(x * x for x in w) / n,
        "mismatch_kl/all/mean": sum(math.exp(x) - x - 1 for x in d) / n,
        # NeMo-RL
        "token_mult_prob_error": sum(math.exp(abs(x)) for x in d) / n,
    }
    geo = [math.exp(sum(r) / len(r)) for r in d_seq]
    ref["rlparity/ess_geometric"] = sum(geo) ** 2 / (len(geo) * sum(g * g for g in geo))
    for name, value in ref.items():
        assert out[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert out["rlparity/reward_mean"] == pytest.approx(float(np.mean(s["rewards"])), rel=1e-12)


def test_weight_digest_is_verify_weights_checksum_of_every_tensor_or_the_same_sample():
    torch = pytest.importorskip("torch")
    from rlparity.trace.weights import checksums

    g = torch.Generator().manual_seed(0)
    named = [(f"layers.{i}.w", torch.randn(8, 8, generator=g)) for i in range(10)]
    full = weight_digest(named)
    assert {k: f"{v:08x}" for k, v in full.items()} == checksums(named)
    a, b = weight_digest(named, sample=3), weight_digest(reversed(named), sample=3)
    assert a == b and len(a) == 3 and set(a) < set(full)
    # a change below bf16 resolution is invisible, one above it is seen
    named2 = [(n, t * (1 + 1e-5)) if i == 0 else (n, t) for i, (n, t) in enumerate(named)]
    named3 = [(n, t * 1.05) if i == 0 else (n, t) for i, (n, t) in enumerate(named)]
    assert weight_digest(named2) == full and weight_digest(named3) != full


def test_tensor_checksum_is_the_plain_formula_on_every_kind_of_tensor_and_leaves_it_unchanged():
    """The cheaper checksum (one bf16 copy, zeros normalised in place, CRC over the buffer, min/max for
    finiteness) against the plain formula: bf16 copy + 0.0, CRC of its bytes, torch.isfinite."""
    import zlib

    torch = pytest.importorskip("torch")
    from rlparity.trace.weights import NOT_FINITE, tensor_checksum

    def plain(t):
        if not t.is_floating_point():
            return f"{zlib.crc32(t.contiguous().numpy().tobytes()) & 0xFFFFFFFF:08x}"
        b = t.to(torch.bfloat16) + 0.0
        crc = f"{zlib.crc32(b.contiguous().view(torch.int16).numpy().tobytes()) & 0xFFFFFFFF:08x}"
        return crc if bool(torch.isfinite(b).all()) else NOT_FINITE + crc

    g = torch.Generator().manual_seed(0)
    nan, inf = float("nan"), float("inf")
    cases = [torch.randn(100, 37, generator=g), torch.randn(5, generator=g).to(torch.bfloat16),
             torch.tensor([0.0, -0.0, 1.0]), torch.tensor([-0.0, 1.0], dtype=torch.bfloat16),
             torch.tensor([1.0, nan]), torch.tensor([inf, 1.0]), torch.tensor([-inf]), torch.tensor([nan, inf]),
             torch.zeros(0), torch.tensor(3.5), torch.arange(10), torch.randn(8, 8, generator=g).t(),
             torch.randn(4, 4, generator=g, dtype=torch.float64), torch.randn(3, 3, generator=g).half(),
             torch.tensor([True, False]), torch.tensor([1e39, -1e39], dtype=torch.float64)]
    for t in cases:
        before = t.clone()
        assert tensor_checksum(t) == plain(t), t
        if t.is_floating_point():  # the caller's values and zero signs untouched
            assert torch.equal(before.nan_to_num(7.0), t.nan_to_num(7.0)) and torch.equal(before.signbit(), t.signbit())
    with pytest.raises(ValueError, match="stride=0"):
        tensor_checksum(cases[0], stride=0)
    # checksums() works on several tensors at once (threads): the same values, in the caller's order
    from rlparity.trace.weights import checksums

    named = [(f"w{len(cases) - i}", t) for i, t in enumerate(cases)]
    got = checksums(named)
    assert list(got) == [n for n, _ in named] and got == {n: plain(t) for n, t in named}
    for k in (2, 3):  # every k-th value from the offset: the plain formula of that slice
        assert tensor_checksum(cases[0], stride=k, offset=1) == plain(cases[0].reshape(-1)[1::k])


def test_a_strided_digest_is_the_crc_of_the_sampled_bf16_values_and_sees_only_them():
    """``stride=k``: the CRC-32 of every k-th bf16 value from the name's offset, against zlib over the
    values picked by hand in numpy; a change of a sampled value is seen, one of an unsampled value is
    not (the sample's limit); NaN only where sampled; the caller's tensors are never changed."""
    import zlib

    torch = pytest.importorskip("torch")
    from rlparity.record.digest import digest_value, sample_offset

    g = torch.Generator().manual_seed(1)
    named = [(f"layers.{i}.w", torch.randn(12, 10, generator=g)) for i in range(6)]
    named.append(("neg_zero", torch.tensor([-0.0, 1.0, -0.0, 2.0, 3.0, -0.0, 4.0], dtype=torch.bfloat16)))
    before = [t.clone() for _, t in named]
    k = 7
    got = weight_digest(named, stride=k)
    assert got.stride == k and weight_digest(named).stride == 1
    for name, t in named:
        bits = t.to(torch.bfloat16).float().numpy().reshape(-1)  # exact: bf16 values are float32 values
        picked = np.array([bits[i] for i in range(sample_offset(name, k), bits.size, k)], np.float32) + np.float32(0.0)
        as_bf16 = (picked.view(np.uint32) >> 16).astype(np.uint16)  # a bf16 value is the float32's top half
        assert got[name] == zlib.crc32(as_bf16.tobytes()), name
    assert all(torch.equal(a, t) and torch.equal(a.signbit(), t.signbit()) for a, (_, t) in zip(before, named))
    assert len({sample_offset(n, k) for n, _ in named}) > 1  # the offsets spread over the tensors
    w = named[0][1]
    off = sample_offset(named[0][0], k)
    hit, miss = w.clone().reshape(-1), w.clone().reshape(-1)
    hit[off] += 1.0
    miss[(off + 1) % k] += 1.0
    for changed, seen in ((hit, True), (miss, False)):
        again = weight_digest([(named[0][0], changed.reshape(w.shape)), *named[1:]], stride=k)
        assert (again[named[0][0]] != got[named[0][0]]) is seen
        assert (weight_digest([(named[0][0], changed.reshape(w.shape))])[named[0][0]] != weight_digest(named[:1])[
            named[0][0]])  # the full digest sees both
    nan = w.clone().reshape(-1)
    nan[off] = float("nan")
    value = weight_digest([("x", nan)], stride=1)["x"]
    assert value >= 1 << 32 and value == digest_value("not-finite:" + f"{value - (1 << 32):08x}")
    with pytest.raises(ValueError, match="stride=0"):
        weight_digest(named, stride=0)


def test_digests_of_another_stride_are_never_compared_and_the_stride_is_in_the_store(tmp_path):
    rec = _recorder_with_history(tmp_path, steps=3)
    same = synthetic_step(2)["weight_digest"]
    out = rec.step(**{**synthetic_step(3), "weight_digest": same, "digest_stride": 61})
    assert "weights_unchanged" not in codes(out) and np.isnan(out["rlparity/weights_changed_share"])
    out = rec.step(**{**synthetic_step(4), "weight_digest": same, "digest_stride": 61})
    assert "weights_unchanged" in codes(out) and out["rlparity/weights_changed_share"] == 0.0
    assert "1 value in 61" in next(a.message for a in out.alarms if a.code == "weights_unchanged")
    rec.close()
    run = open_run(tmp_path / "run.zarr")
    assert run["digest_stride"].values.tolist() == [1, 1, 1, 61, 61]
    # a resumed run compares its next digest with the stride read back from the store
    with Recorder(tmp_path / "run.zarr", resume=True) as again:
        assert "weights_unchanged" in codes(again.step(**{**synthetic_step(5), "weight_digest": same,
                                                           "digest_stride": 61}))


def sampled_step(k: int, *, raw: bool, n_prompts: int = 4, group: int = 4, length: int = 8, vocab: int = 40,
                 temperature: float = 0.7, noise: float = 0.02) -> dict:
    """Step ``k`` of a run whose engine samples its processed distribution q = softmax(logits / T): mu is
    log q of the sampled token (faithful) or the temperature-1 log p (``raw``: vLLM's raw_logprobs);
    pi_old is the trainer's processed distribution of slightly different logits (a backend gap)."""
    rng = np.random.default_rng(5000 + k)
    n = n_prompts * group
    logits = rng.normal(0.0, 2.0, (n, length, vocab))
    trainer = logits + rng.normal(0.0, noise, logits.shape)

    def log_softmax(x):
        x = x - x.max(axis=-1, keepdims=True)
        return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))

    log_q, log_p, log_pi = log_softmax(logits / temperature), log_softmax(logits), log_softmax(trainer / temperature)
    u = rng.uniform(size=(n, length, 1))
    tok = (np.exp(log_q).cumsum(axis=-1) < u).sum(axis=-1).clip(0, vocab - 1)
    pick = lambda lp: np.take_along_axis(lp, tok[..., None], axis=-1)[..., 0]  # noqa: E731
    return {"prompt_token_ids": [[1, 2, 3]] * n, "token_ids": tok, "rollout_logprobs": pick(log_p if raw else log_q),
            "trainer_logprobs": pick(log_pi), "prompt_index": np.arange(n) // group, "policy_versions": k,
            "trainer_version": k}


def test_the_pooled_ratio_offset_equals_a_plain_delete_one_prompt_jackknife():
    from rlparity.record.live import pooled_ratio_offset, ratio_units

    steps = [sampled_step(k, raw=k == 1) for k in range(3)]
    for s in steps[1:]:  # ragged: the second step's last sequence is shorter; a token the trainer gives 0
        s["rollout_logprobs"][-1, 5:] = np.nan
        s["trainer_logprobs"][0, 0] = -np.inf
    units = [ratio_units(s["rollout_logprobs"], s["trainer_logprobs"], np.isfinite(s["rollout_logprobs"]),
                         s["prompt_index"]) for s in steps]
    got = pooled_ratio_offset(units)
    groups = []  # the reference: plain Python over (step, prompt) groups of tokens with a finite d
    for s in steps:
        for g in sorted(set(s["prompt_index"].tolist())):
            vals = [math.exp(p - m) for i in np.flatnonzero(s["prompt_index"] == g)
                    for m, p in zip(s["rollout_logprobs"][i], s["trainer_logprobs"][i])
                    if math.isfinite(m) and math.isfinite(p)]
            groups.append(vals)
    flat = [v for g in groups for v in g]
    off = sum(flat) / len(flat) - 1
    leave = [(sum(flat) - sum(g)) / (len(flat) - len(g)) - 1 for g in groups]
    mean = sum(leave) / len(leave)
    se = math.sqrt((len(groups) - 1) / len(groups) * sum((x - mean) ** 2 for x in leave))
    assert got["units"] == len(groups) == 12 and got["tokens"] == len(flat)
    assert got["offset"] == pytest.approx(off, rel=1e-9) and got["se"] == pytest.approx(se, rel=1e-9)
    assert got["z"] == pytest.approx(off / se, rel=1e-9)
    assert np.isnan(pooled_ratio_offset(units[:0])["z"]) and np.isnan(pooled_ratio_offset([(np.ones(1), np.ones(1))])["z"])
    # the edges by hand: two units of one token each (ratios 1.5 and 1.1: offset 0.3, leave-one-out 0.1
    # and 0.5, se = sqrt(1/2 * 2 * 0.2^2) = 0.2); one ratio everywhere (se 0: z infinite, or 0 when exactly 1)
    two = pooled_ratio_offset([(np.array([0.5]), np.array([1])), (np.array([0.1]), np.array([1]))])
    assert (two["units"], two["offset"], two["se"], two["z"]) == pytest.approx((2, 0.3, 0.2, 1.5), rel=1e-12)
    same = [(np.array([0.02, 0.04]), np.array([1, 2]))]
    assert pooled_ratio_offset(same)["z"] == math.inf and pooled_ratio_offset([(-same[0][0], same[0][1])])["z"] == -math.inf
    assert pooled_ratio_offset([(np.zeros(3), np.ones(3))])["z"] == 0.0
    # a prompt group without one usable token is no unit
    mu = np.log(np.full((3, 2), 0.5))
    pi = np.array([[np.nan, np.nan], [np.log(0.6), np.log(0.4)], [np.log(0.7), np.nan]])
    s_u, n_u = ratio_units(mu, pi, np.ones((3, 2), bool), np.array([7, 8, 9]))
    assert n_u.tolist() == [2, 1] and s_u == pytest.approx([0.2 - 0.2, 0.4], abs=1e-12)


def test_ratio_offset_fires_on_a_raw_logprobs_engine_once_its_window_is_judged_and_never_on_a_faithful_one(tmp_path):
    """The windowed test of mu on a simulated sampler (16 sequences of 8 tokens, 4 prompt groups a
    step, as the TRL runs): raw logprobs fire from the first step whose window holds
    ``ratio_min_units`` groups, a faithful engine with a backend gap never does; a resumed run reads
    its window back from the store and gives the uninterrupted run's z."""
    r = defaults().record
    first = -(-r.ratio_min_units // 4) - 1  # the first step whose window holds enough prompt groups
    fired = {}
    for raw in (False, True):
        with Recorder(tmp_path / f"raw{raw}.zarr") as rec:
            outs = [rec.step(**sampled_step(k, raw=raw)) for k in range(24)]
        fired[raw] = [k for k, o in enumerate(outs) if "ratio_offset" in codes(o)]
        assert all(o["rlparity/ratio_offset_units"] == 4 * min(k + 1, r.ratio_window) for k, o in enumerate(outs))
    assert fired[False] == []
    assert fired[True] == list(range(first, 24))
    alarm = next(a for a in outs[-1].alarms if a.code == "ratio_offset")
    assert alarm.level == "error" and alarm.value > r.ratio_z and "raw_logprobs" in alarm.message
    # resume after step 11: the window of steps 4..11 comes back from the store
    with Recorder(tmp_path / "resumed.zarr") as rec:
        for k in range(12):
            rec.step(**sampled_step(k, raw=True))
    with Recorder(tmp_path / "resumed.zarr", resume=True) as rec:
        again = rec.step(**sampled_step(12, raw=True))
    assert again["rlparity/ratio_offset_z"] == pytest.approx(outs[12]["rlparity/ratio_offset_z"], rel=1e-5)
    # a bias as sure as can be (pi_old = mu + 0.001 nats on every token: z infinite) but inside rlparity check's
    # mean_ratio band is no alarm; the same at 0.05 nats (ratio 1.051) is
    for shift, alarm in ((1e-3, False), (0.05, True)):
        with Recorder(tmp_path / f"shift{shift}.zarr") as rec:
            for k in range(6):
                s = sampled_step(k, raw=False)
                out = rec.step(**{**s, "trainer_logprobs": s["rollout_logprobs"], "rollout_logprobs": s["rollout_logprobs"] - shift})
        assert out["rlparity/ratio_offset_window"] == pytest.approx(math.expm1(shift), rel=1e-9)
        assert ("ratio_offset" in codes(out)) is alarm


def _version_findings(trace) -> set[str]:
    from rlparity.diagnose import diagnose

    return {f.name for f in diagnose({"step": trace}).findings} & {"scored_at_one_version"}


def test_a_lagged_step_scored_per_version_raises_no_version_warning_and_one_weight_set_does(tmp_path):
    """``scored_version`` is stored per token: a step whose older tokens the trainer scored with the
    weights that generated them reads as scored per version (no doctor warning); the same tokens
    scored with the trainer's newer weights still warn; a store without the variable keeps the
    warning (what it could not tell)."""
    path = tmp_path / "run.zarr"
    s = synthetic_step(5, n=6)
    pv = [np.full(len(t), 4 if i % 2 else 5) for i, t in enumerate(s["token_ids"])]  # half the sequences lag one
    with Recorder(path) as rec:
        own = rec.step(**{**s, "policy_versions": pv, "scored_version": pv})
        one = rec.step(**{**s, "policy_versions": pv})  # scored_version: the trainer's version 5, every token
        older = rec.step(**{**s, "policy_versions": pv, "scored_version": [v - 1 for v in pv]})
    assert "scored_by_older_version" not in codes(own) | codes(one)
    assert "scored_by_older_version" in codes(older)
    run = open_run(path)
    real = run["response_mask"].values[0]
    want = np.concatenate(pv)
    assert sorted(run["scored_version"].values[0][real].tolist()) == sorted(want.tolist())
    assert (run["scored_version"].values[1][real] == 5).all()
    traces = [step_trace(run, k) for k in range(3)]
    assert sorted(np.unique(traces[0]["policy_version"].values[traces[0]["response_mask"].values]).tolist()) == [4, 5]
    assert (traces[0].attrs.get("trainer") or {}).get("scored_by") == "policy_version"
    assert "scored_version" not in traces[0]  # the claim is in the attrs; the trace schema has no such variable
    assert all("scored_by" not in (t.attrs.get("trainer") or {}) for t in traces[1:])
    assert _version_findings(traces[0]) == set()
    assert _version_findings(traces[1]) == {"scored_at_one_version"}
    assert _version_findings(traces[2]) == {"scored_at_one_version"}
    # a store written before scored_version was recorded: today's reading, the warning on a lagged step
    old = step_trace(run.drop_vars("scored_version"), 0)
    assert "scored_by" not in (old.attrs.get("trainer") or {}) and _version_findings(old) == {"scored_at_one_version"}


def test_a_scored_trace_records_as_the_rl_runner_records_it(tmp_path):
    """``StepRecord.from_trace``, the path rlparity's RL runner takes: a scored trace's step gives the
    summary of the trace itself, and the engine's checksums of the version that generated it."""
    from rlparity.metrics import scalars, summary
    from rlparity.record import StepRecord
    from rlparity.testing import synthetic_trace

    with Recorder(tmp_path / "run.zarr") as rec:
        for k in range(2):
            tr = synthetic_trace(n_sequences=8, noise=0.02, seed=k)
            tr["policy_version"] = tr["policy_version"].where(~tr["response_mask"], k)
            tr.attrs.update(latest_policy_version=k, engine_weight_checksums={str(v): {"w": f"{v + 7:08x}"}
                                                                             for v in range(k + 1)})
            out = rec.step(StepRecord.from_trace(tr), step=10 + k)
            ref = scalars(summary(tr))
            for name in ("abs_log_ratio_mean", "kl_k3", "ess_token", "n_tokens"):
                assert out[f"rlparity/{name}"] == pytest.approx(ref[name], rel=1e-9), name
    run = open_run(tmp_path / "run.zarr")
    assert run["step_index"].values.tolist() == [10, 11] and run["weight_version"].values.tolist() == [0, 1]
    assert run["weight_digest"].sel(tensor="w").values.tolist() == [7, 8]
    assert float(run["metric_value"].sel(step=1, metric="rlparity/weights_changed_share")) == 1.0


def test_a_loop_that_never_closes_the_recorder_still_commits_its_steps_at_exit(tmp_path):
    path = tmp_path / "run.zarr"
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
            "from test_record import synthetic_step\nfrom rlparity.record import Recorder\n"
            f"rec = Recorder({str(path)!r})\n"
            "for k in range(4):\n    rec.step(**synthetic_step(k, n=32))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert open_run(path).attrs["steps"] == 4


def test_a_step_without_tokens_is_recorded_and_positive_logprobs_are_refused_in_one_line(tmp_path):
    """Found by the doctor's tests: a step whose responses are all empty crashed the metrics (a
    zero-size reduction); a trainer logprob above 0 was recorded and the store then refused by every
    reader (the trace schema). Now the empty step is recorded with NaN metrics, and a positive logprob
    is refused before anything is written, naming where it is."""
    from rlparity.record import Recorder, open_run

    path = tmp_path / "r.zarr"
    with Recorder(path) as rec:
        m = rec.step(prompt_token_ids=[[1, 2]] * 2, token_ids=[[], []], rollout_logprobs=[[], []],
                     trainer_logprobs=[[], []])
        assert np.isnan(m["rlparity/abs_log_ratio_mean"]) and not m.alarms
        with pytest.raises(ValueError, match=r"trainer_logprobs is positive at 1 tokens \(first: sequence 0, token "
                                             r"1, \+0\.5\)"):
            rec.step(prompt_token_ids=[[1, 2]] * 2, token_ids=[[3, 4], [5]], rollout_logprobs=[[-0.1, -0.2], [-0.3]],
                     trainer_logprobs=[[-0.1, 0.5], [-0.3]])
        m = rec.step(prompt_token_ids=[[1, 2]] * 2, token_ids=[[3, 4], [5]], rollout_logprobs=[[-0.1, -0.2], [-0.3]],
                     trainer_logprobs=[[-0.1, 1e-7], [-0.3]])  # rounding above 0 within the schema's tolerance
        assert m["rlparity/abs_log_ratio_mean"] == pytest.approx((0.2 + 1e-7) / 3)
    run = open_run(path)
    assert run.sizes["step"] == 2 and int(run["response_length"].isel(step=0).max()) == 0


def test_the_run_record_converts_old_stores_on_read(tmp_path):
    """issue 35/37: a run store's attributes are read through one typed record (run_record). A store
    written before engine_given was recorded gets it from the engine settings it kept (only what they
    name); one with no engine settings gets none; a development build's engine_requested is moved to
    engine_given; a value of the wrong type is refused in one line naming the store and the key."""
    import json

    from rlparity.record import RunRecord, run_record

    path = tmp_path / "run.zarr"
    with Recorder(path, model="m", engine={"dtype": "float16", "head_dtype": "model", "logprobs_mode": None,
                                           "attention_backend": "TRITON_ATTN", "seed": 3},
                  attrs={"peer": {"framework": "verl", "missing": {"reward": "not dumped"}}}) as rec:
        rec.step(**synthetic_step(0))
    root = json.loads((path / ".zattrs").read_text())
    assert root["engine_given"] == {"dtype": "float16", "head_dtype": "model", "attention_backend": "TRITON_ATTN"}
    rec = run_record(open_run(path))
    assert rec.given.attention_backend == "TRITON_ATTN" and rec.given.seed is None  # never a setting not named
    assert rec.peer.framework == "verl" and rec.peer.missing == {"reward": "not dumped"} and rec.steps == 1
    assert rec.model == "m" and rec.scorer.dtype is None
    old = {k: v for k, v in root.items() if k != "engine_given"}  # a store before it was recorded
    assert RunRecord.from_attrs(old).to_attrs()["engine_given"] == root["engine_given"]
    (path / ".zattrs").write_text(json.dumps(old))
    assert open_run(path).attrs["engine_given"] == root["engine_given"]
    assert step_trace(open_run(path), 0).attrs["engine_given"] == root["engine_given"]
    bare = {k: v for k, v in old.items() if k != "engine"}
    assert "engine_given" not in RunRecord.from_attrs(bare).to_attrs() and not run_record(bare).given
    dev = {**bare, "engine_requested": {"dtype": "bfloat16"}}
    conv = RunRecord.from_attrs(dev).to_attrs()
    assert conv["engine_given"] == {"dtype": "bfloat16"} and "engine_requested" not in conv
    both = RunRecord.from_attrs({**dev, "engine_given": {"dtype": "float32"}})  # the record's own name wins
    assert both.given.dtype == "float32" and both.get("engine_requested") == {"dtype": "bfloat16"}
    assert RunRecord.from_attrs({**bare, "engine_requested": "x"}).engine_given is None  # not a mapping: kept as is
    with pytest.raises(ValueError, match=r"^the run store: attrs\['peer'\]\['missing'\] = 3 is not a mapping: "
                                         r"record the run again"):
        run_record({"peer": {"missing": 3}})
    (path / ".zattrs").write_text(json.dumps({**old, "trainer": {"dtype": 16}}))
    with pytest.raises(ValueError, match=r"run\.zarr: attrs\['trainer'\]\['dtype'\] = 16 is not a string"):
        open_run(path)
