"""Readers of a verl or prime-rl run into a run store, tested on data the peers' own writer code
produces (scripts/peers, run as scripts/make_io_fixtures.py runs it, for 5 steps), against numbers
recomputed straight from the peers' files; then `rlparity doctor` on the store, clean and with a
planted fault (the engine's logprobs raw from step 3 on, while sampling at T = 0.7)."""

from __future__ import annotations

import json
import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest

from rlparity.experiments.run_import import RunImportError, import_run
from rlparity.record import open_run, run_record
from rlparity.record.verl import per_sequence, record_verl

ROOT = Path(__file__).resolve().parents[1]
STEPS = 5
FAULT_FROM = 3  # the engine's logprobs raw from this step on (3 clean steps: the floor jump's history)
T = 0.7
NS = types.SimpleNamespace
GATE = "rlparity/abs_log_ratio_mean"


@pytest.fixture(scope="module")
def fx():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_io_fixtures as F
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return F, F.TinyModel()


def prompts_at(step: int, fault: bool) -> int:
    """3 prompts (6 sequences) a step; 24 at the faulted steps, enough tokens (~480) for the step's
    diagnosis to separate the raw engine's offset from noise."""
    return 24 if fault and step >= FAULT_FROM else 3


def sampled(fx, n_prompts: int, seed: int) -> list:
    """The tiny model's samples (2 per prompt at T): ``make_io_fixtures.samples``, kept in the JSON
    file ``$RLPARITY_PEER_SAMPLES`` when set (mutation runs: the samples do not depend on the readers)."""
    from dataclasses import asdict

    F, model = fx
    cache = os.environ.get("RLPARITY_PEER_SAMPLES")
    key = f"{n_prompts}/{seed}"
    store = json.loads(Path(cache).read_text()) if cache and Path(cache).exists() else {}
    if key in store:
        return [F.Sampled(**{**d, "turns": [tuple(x) for x in d["turns"]]}) for d in store[key]]
    ss = F.samples(model, n_prompts, per_prompt=2, t=T, seed=seed)
    if cache:
        store[key] = [asdict(s) for s in ss]
        Path(cache).write_text(json.dumps(store))
    return ss


def _raw(s, values):
    """The engine's logprobs replaced by the raw ones (full vocabulary, T = 1) on sampled tokens."""
    return [float(np.float32(r)) if m else v for r, v, m in zip(s.raw, values, s.sampled)]


def write_prime_rl(fx, out: Path, fault: bool) -> None:
    """token_exports/step_0..4 by prime-rl's TokenExporter (scripts/peers), 3 prompts x 2 samples a step."""
    F, model = fx
    from peers import stubs

    stubs.install_prime_rl()
    te = F.load_peer("prime_rl_token_export")
    rng = np.random.default_rng(1)
    loss = stubs.DefaultLossConfig()
    for step in range(STEPS):
        ss = sampled(fx, prompts_at(step, fault), 200 + step)
        batch = [F._prime_sample(model, s, rng, t=T, advantage=round(0.25 * (i - 2), 2)) for i, s in enumerate(ss)]
        if fault and step >= FAULT_FROM:
            for b, s in zip(batch, ss):
                b["inference_logprobs"] = _raw(s, b["inference_logprobs"])
        exporter = te.TokenExporter(out, 0)
        half = len(batch) // 2
        for micro, idx in enumerate((range(half), range(half, len(batch)))):  # two packed micro-batches a step
            mb, mo, lengths = F._micro_batch(model, [batch[i] for i in idx], pad_to_multiple_of=8)
            exporter.export(step, micro, mb, mo, lengths, loss)
        exporter.mark_stable()


def verl_batches(fx, fault: bool):
    """Per step, verl's batch (``DataProto``-shaped: left-padded prompts, right-padded responses,
    the engine's and the trainer's logprobs, scores, GRPO advantages, group uids)."""
    F, model = fx
    torch = model.torch
    rng = np.random.default_rng(2)
    for step in range(1, STEPS + 1):  # verl's global_steps start at 1
        ss = sampled(fx, prompts_at(step - 1, fault), 300 + step)
        prompts, pmask, responses, rmask, rollout, old, scores = F._padded(model, ss, rng, "tempered")
        if fault and step - 1 >= FAULT_FROM:
            for i, s in enumerate(ss):
                r = len(s.ids) - s.prompt_len
                rollout[i, :r] = torch.tensor(s.raw[s.prompt_len:])
        adv = torch.tensor([0.5, -0.5, 1.0, -1.0, 0.0, 0.25] * (len(ss) // 6))[:, None] * rmask
        yield step, NS(batch={"prompts": prompts, "responses": responses, "response_mask": rmask,
                              "input_ids": torch.cat([prompts, responses], 1),
                              "attention_mask": torch.cat([pmask, rmask], 1), "rollout_log_probs": rollout,
                              "old_log_probs": old, "token_level_scores": scores, "advantages": adv},
                       non_tensor_batch={"reward_model": [{"ground_truth": "arith"}] * len(ss),
                                         "uid": np.array([f"g{i // 2}" for i in range(len(ss))], dtype=object)})


def write_verl(fx, folder: Path, store: Path, fault: bool) -> None:
    """verl's RolloutDataDir._log_rollout_data (scripts/peers) hooked by record_verl (-> ``store``), and
    GENERIC_FORMAT.md's "From verl" recipe run beside it into the same folder (step_N.npz + N.jsonl)."""
    F, model = fx
    vr = F.load_peer("verl_rollout_data_dir")
    trainer = vr.RolloutDataDir(model.tok, 0)
    trainer.config = NS(actor_rollout_ref=NS(rollout=NS(temperature=T, top_k=-1, top_p=1.0)))
    hook = record_verl(trainer, store, background=False)
    recipe = F._snippet("From verl")
    cwd = os.getcwd()
    folder.mkdir(parents=True)
    t0 = time.perf_counter()
    try:
        for step, batch in verl_batches(fx, fault):
            trainer.global_steps = step
            trainer._log_rollout_data(batch, {}, str(folder / "rlparity_dump"))
            os.chdir(folder)
            exec(recipe, {"batch": batch, "self": trainer})
            os.chdir(cwd)
    finally:
        os.chdir(cwd)
        hook.close()
    assert 0 < hook.seconds < time.perf_counter() - t0  # the recorder's share, within the loop's own time
    assert "_log_rollout_data" not in trainer.__dict__  # verl's own method back


@pytest.fixture(scope="module")
def prime(fx, tmp_path_factory):
    root = tmp_path_factory.mktemp("prime")
    for name, fault in (("clean", False), ("raw", True)):
        write_prime_rl(fx, root / name, fault)
    return root


@pytest.fixture(scope="module")
def verl(fx, tmp_path_factory):
    root = tmp_path_factory.mktemp("verl")
    for name, fault in (("clean", False), ("raw", True)):
        write_verl(fx, root / name, root / f"{name}-hook.zarr", fault)
    return root


def prime_reference(folder: Path) -> dict[int, dict]:
    """Per step, straight from prime-rl's files: tokens, mean |trainer - inference| over the loss
    mask, the engine's logprobs sorted, the advantage of each packed sample."""
    out = {}
    for step_dir in sorted((folder / "token_exports").iterdir()):
        step = int(step_dir.name.split("_")[1])
        d, mu, adv = [], [], []
        for line in (step_dir / "rank_0.jsonl").read_text().splitlines():
            r = json.loads(line)
            m = np.array(r["loss_mask"], bool)
            inf = np.array(r["inference_logprobs"], float)[m]
            tr = np.array(r["trainer_logprobs"], float)[m]
            d.extend(np.abs(tr - inf))
            mu.extend(inf)
            pos = np.array(r["position_ids"])
            adv.extend(np.array(r["advantages"], float)[pos == 0])  # one per packed sample
        out[step] = {"n": len(d), "gap": float(np.mean(d)), "mu": np.sort(mu), "adv": sorted(adv)}
    return out


def metric(ds, name):
    return ds["metric_value"].sel(metric=name).values.astype(float)


def test_prime_rl_run_store_matches_the_export_files(prime, tmp_path):
    res = import_run("prime-rl", prime / "clean", tmp_path / "run.zarr", temperature=T)
    ref = prime_reference(prime / "clean")
    assert res.steps == list(range(STEPS))
    ds = open_run(tmp_path / "run.zarr")
    assert int(ds.attrs["steps"]) == STEPS
    mask = ds["response_mask"].values
    for k in range(STEPS):
        assert int(mask[k].sum()) == ref[k]["n"]
        assert abs(metric(ds, GATE)[k] - ref[k]["gap"]) < 1e-9 * max(1.0, ref[k]["gap"]) + 1e-12
        mu = np.sort(ds["rollout_logprob"].values[k][mask[k]].astype(float))
        np.testing.assert_allclose(mu, ref[k]["mu"], rtol=0, atol=1e-12)
        n = int(ds["n_sequences"][k])
        assert len(ref[k]["adv"]) == n
        assert int(ds["step_index"][k]) == k and int(ds["trainer_version"][k]) == k
    # what the export lacks is missing, and said so
    real = mask
    assert (ds["policy_version"].values[real] == -1).all() and (ds["scored_version"].values[real] == -1).all()
    assert np.isnan(ds["reward"].values[:, :6]).all()
    missing = run_record(ds).peer.missing
    assert np.isnan(ds["advantage"].values[:, :6]).all()
    for name in ("policy_version", "scored_version", "weight_digest", "reward", "advantage", "top_k"):
        assert name in missing
    assert "temperature" not in missing  # given
    assert "weight_digest" not in ds
    assert np.isnan(metric(ds, "rlparity/lag_max")).all()
    assert (ds["temperature"].values[:, :6] == T).all()
    assert not (ds["alarm_level"].values >= 2).any()
    peer = run_record(ds).peer
    assert "prime-rl" in peer.source and peer.framework == "prime-rl" and peer.path == str(prime / "clean")
    with pytest.raises(FileExistsError, match="already holds a run"):  # never replaced unless asked
        import_run("prime-rl", prime / "clean", tmp_path / "run.zarr", temperature=T)
    import_run("prime-rl", prime / "clean", tmp_path / "run.zarr", temperature=T, overwrite=True)
    assert int(open_run(tmp_path / "run.zarr").attrs["steps"]) == STEPS


def test_verl_hook_and_dir_reader_match_verls_files(verl, tmp_path):
    hook = open_run(verl / "clean-hook.zarr")
    folder = verl / "clean" / "rlparity_dump"
    res = import_run("verl", folder, tmp_path / "dir.zarr")
    dir_run = open_run(tmp_path / "dir.zarr")
    assert res.steps == list(range(1, STEPS + 1))
    for ds in (hook, dir_run):
        assert int(ds.attrs["steps"]) == STEPS
        for k, step in enumerate(range(1, STEPS + 1)):
            z = np.load(folder / f"step_{step}.npz")
            m = z["response_mask"].astype(bool)
            d = np.abs(z["old_log_probs"].astype(float) - z["rollout_log_probs"].astype(float))[m]
            assert int(ds["response_mask"].values[k].sum()) == int(m.sum())
            assert abs(metric(ds, GATE)[k] - d.mean()) < 1e-9
            scores = [json.loads(x)["score"] for x in (folder / f"{step}.jsonl").read_text().splitlines()]
            n = int(ds["n_sequences"][k])
            np.testing.assert_allclose(ds["reward"].values[k, :n], scores, rtol=0, atol=1e-6)
            real = ds["response_mask"].values[k]
            assert (ds["policy_version"].values[k][real] == step).all()
            assert int(ds["step_index"][k]) == step
            np.testing.assert_array_equal(ds["prompt_token_id"].values[k, :n][ds["prompt_token_id"].values[k, :n] >= 0],
                                          z["input_ids"][:, : z["input_ids"].shape[1] - m.shape[1]][
                                              z["attention_mask"][:, : z["input_ids"].shape[1] - m.shape[1]] > 0])
    n = int(hook["n_sequences"][0])
    assert hook["advantage"].values[0, :n].tolist() == [0.5, -0.5, 1.0, -1.0, 0.0, 0.25]
    assert hook["prompt_index"].values[0, :n].tolist() == [0, 0, 1, 1, 2, 2]
    assert np.isnan(dir_run["advantage"].values[:, :n]).all()  # the recipe saves none
    assert "_dump_generations" in run_record(dir_run).peer.source and "_log_rollout_data" in run_record(hook).peer.source
    for ds in (hook, dir_run):
        assert "weight_digest" in run_record(ds).peer.missing and "weight_digest" not in ds
        assert (ds["temperature"].values[:, :n] == T).all() and (ds["top_k"].values[:, :n] == 0).all()
        assert not (ds["alarm_level"].values >= 2).any()


def test_per_sequence_keeps_constant_advantages_only():
    m = np.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]], bool)
    v = np.array([[0.5, 0.5, 9.0], [0.1, 0.2, 0.1], [1.0, 1.0, 1.0]])
    out = per_sequence(v, m)
    assert out[0] == 0.5 and np.isnan(out[1]) and np.isnan(out[2])


def test_unknown_versions_claim_no_lag_and_no_same_weights():
    """A version < 0 (a dump that records none) is unknown: no lag, no 'scored with the weights
    that generated it' (the confident-disagreement rule), no older-version count."""
    from rlparity.metrics.core import token_lag
    from rlparity.record.live import StepArrays, confident_disagreements, step_metrics

    m = np.ones((1, 3), bool)
    lag = token_lag(np.array([[3, -1, 2]]), m, latest=4)
    assert lag[0, 0] == 1 and np.isnan(lag[0, 1]) and lag[0, 2] == 2
    mu, pi = np.log(np.full((1, 3), 0.9)), np.log(np.full((1, 3), 0.9)) - 5.0  # engine sure, trainer 5 nats lower
    for pv, sv, hits in ((0, 0, 3), (-1, -1, 0), (2, -1, 0)):
        a = StepArrays(log_mu=mu, log_pi=pi, mask=m, policy_version=np.full((1, 3), pv),
                       scored_version=np.full((1, 3), sv), trainer_version=2)
        assert confident_disagreements(a, 0.5, 2.0)[0] == hits
        out = step_metrics(a, eps=0.2, dashboards=())
        assert out["rlparity/scored_by_older_tokens"] == 0
        assert np.isnan(out["rlparity/lag_max"]) == (pv < 0)


def test_step_record_defaults_and_refusals():
    from rlparity.record.verl import step_record

    t = {"prompts": np.array([[0, 5, 6]]), "responses": np.array([[7, 8, 0]]),
         "attention_mask": np.array([[0, 1, 1, 1, 1, 0]]), "rollout_log_probs": np.full((1, 3), -0.5),
         "old_log_probs": np.full((1, 3), -0.4)}
    r = step_record(NS(batch=t), 4, {"temperature": 0.7})
    assert r.top_k == 0 and r.top_p == 1.0 and r.temperature == 0.7 and r.trainer_version == 4 and r.step == 4
    assert r.response_mask.tolist() == [[True, True, False]] and r.prompt_mask.tolist() == [[False, True, True]]
    assert r.rewards is None and r.advantages is None and r.prompt_index is None
    for key, what in (("rollout_log_probs", "calculate_log_probs=True"), ("old_log_probs", "compute_log_prob")):
        with pytest.raises(ValueError, match=what):
            step_record(NS(batch={k: v for k, v in t.items() if k != key}), 4, {"temperature": 0.7})
    with pytest.raises(ValueError, match="neither response_mask nor attention_mask"):
        step_record(NS(batch={k: v for k, v in t.items() if k != "attention_mask"}), 4, {"temperature": 0.7})
    with pytest.raises(ValueError, match="no _log_rollout_data"):
        record_verl(NS(), "unused.zarr", sampling={"temperature": 1.0})
    for sampling in (None, {"top_k": 5}):
        with pytest.raises(ValueError, match="sampling is unknown"):
            record_verl(NS(_log_rollout_data=print), "unused.zarr", sampling=sampling)


def test_record_verl_never_appends_to_or_replaces_a_run_unasked(verl):
    for kw in ({}, {"sampling": {"temperature": 1.0}}):
        with pytest.raises(FileExistsError, match="already holds a run"):
            record_verl(NS(_log_rollout_data=print, config=NS(actor_rollout_ref=NS(rollout=NS(temperature=T)))),
                        verl / "clean-hook.zarr", **kw)
    assert int(open_run(verl / "clean-hook.zarr").attrs["steps"]) == STEPS


def test_verl_sampling_reads_the_rollout_config_with_verls_defaults():
    from rlparity.record.verl import verl_sampling

    def cfg(**kw):
        return NS(config=NS(actor_rollout_ref=NS(rollout=NS(**kw))))

    assert verl_sampling(cfg(temperature=0.6, top_k=5, top_p=0.9)) == {"temperature": 0.6, "top_k": 5, "top_p": 0.9}
    assert verl_sampling(cfg(temperature=1, top_k=-1)) == {"temperature": 1.0, "top_k": 0, "top_p": 1.0}  # -1: off
    assert verl_sampling(cfg(temperature=1, top_k=None)) == {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
    assert verl_sampling(cfg(temperature=1)) == {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
    assert verl_sampling(NS()) is None


def _alarm_steps(ds, code):
    lv = ds["alarm_level"].sel(alarm=code).values
    return [int(k) for k in np.flatnonzero(lv > 0)]


def test_planted_raw_logprobs_raise_the_floor_jump_at_its_step_and_doctor_names_it(prime, verl, tmp_path, cli):
    import_run("prime-rl", prime / "raw", tmp_path / "prime-raw.zarr", temperature=T)
    import_run("verl", verl / "raw" / "rlparity_dump", tmp_path / "verl-raw.zarr")
    for store in (tmp_path / "prime-raw.zarr", tmp_path / "verl-raw.zarr", verl / "raw-hook.zarr"):
        ds = open_run(store)
        gap = metric(ds, GATE)
        assert gap[FAULT_FROM] > 10 * np.median(gap[:FAULT_FROM])
        assert _alarm_steps(ds, "floor_jump")[0] == FAULT_FROM, store  # the median of 4 steps is still clean's at 4
        r = cli("doctor", store, "--boot", "0")
        assert r.exit_code == 1, r.output
        assert "floor_jump (warning) at 2 steps from step 3" in r.stdout, r.stdout
        assert "gap_above_gate" in r.stdout
        assert _alarm_steps(ds, "ratio_offset")[0] == FAULT_FROM and ds["alarm_level"].sel(alarm="ratio_offset").values[
            FAULT_FROM] == 2  # error
        assert "first named: raw_logprobs at step 3" in r.stdout and "verdict: problem found" in r.stdout
        assert not (ds["alarm_level"].values[:FAULT_FROM] > 0).any()  # nothing before the fault
        lag_line = ("policy lag: unknown (the run records no version per token)" if "prime" in store.name else
                    "policy lag: every token on-policy (lag 0)")
        assert lag_line in r.stdout
    # the clean runs: doctor exits 0 and names nothing
    import_run("prime-rl", prime / "clean", tmp_path / "prime-clean.zarr", temperature=T)
    for store in (tmp_path / "prime-clean.zarr", verl / "clean-hook.zarr"):
        r = cli("doctor", store, "--boot", "0")
        assert r.exit_code == 0 and "verdict: no cause named, no error alarm" in r.stdout, r.output
        assert "floor_jump" not in r.stdout


def test_bad_input_is_one_line(prime, verl, tmp_path, cli):
    cases = [
        (("import", "prime-rl", tmp_path / "nowhere", "--out", tmp_path / "a.zarr", "--as-run"), "does not exist"),
        (("import", "prime-rl", verl / "clean", "--out", tmp_path / "b.zarr", "--as-run"), "no token_exports/step_N"),
        (("import", "verl", verl / "clean" / "rlparity_dump", "--out", tmp_path / "c.zarr", "--as-run", "--top-k",
          "3"), "top_k"),
        (("import", "nemo-rl", prime / "clean", "--out", tmp_path / "d.zarr", "--as-run"), "--as-run reads"),
    ]
    text = tmp_path / "text"
    text.mkdir()
    (text / "3.jsonl").write_text(json.dumps({"input": "a", "output": "b", "score": 1.0, "step": 3}) + "\n")
    cases.append((("import", "verl", text, "--out", tmp_path / "e.zarr", "--as-run"), "text dump"))
    for args, what in cases:
        r = cli(*args)
        assert r.exit_code == 2, r.output
        assert len(r.stderr.strip().splitlines()) == 1 and what in r.stderr, r.stderr
    with pytest.raises(RunImportError, match="unknown format"):
        import_run("slime", prime / "clean", tmp_path / "f.zarr")


def test_verl_scores_must_match_the_batch(verl, tmp_path):
    import shutil

    src = verl / "clean" / "rlparity_dump"
    dst = tmp_path / "dump"
    shutil.copytree(src, dst)
    lines = (dst / "2.jsonl").read_text().splitlines()
    (dst / "2.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(RunImportError, match=r"2.jsonl: 5 lines for the 6 sequences"):
        import_run("verl", dst, tmp_path / "g.zarr")
