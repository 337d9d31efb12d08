"""rlparity's run recorder inside a real TRL GRPOTrainer (rlparity.record.trl): a short GRPO run of the
tiny bf16 model with vLLM colocated on the CPU, checked against readings the recorder does not make
(vLLM's own outputs, TRL's own metrics, the weights counted value by value)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4
JUDGED = 6  # steps of the script's runs (4 prompt groups a step): ratio_offset is judged from step 4


def _shut_down(trainer) -> None:
    """End the colocated engine and the process group vLLM's external launcher started."""
    import gc

    import torch.distributed as dist
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    trainer.vllm_generation.llm.llm_engine.engine_core.shutdown()
    del trainer.vllm_generation.llm
    destroy_model_parallel()
    destroy_distributed_environment()
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


@pytest.fixture(scope="module")
def tiny_bf16_model():
    from rlparity.models import make_model

    return str(make_model("tiny-bf16", progress=False))


@pytest.fixture(scope="module")
def trl():
    return pytest.importorskip("trl", reason="TRL is not installed (pip install 'rlparity[trl]')")


def test_without_trl_record_grpo_says_how_to_install_it(monkeypatch, tmp_path):
    import rlparity.record.trl as rt

    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'rlparity\[trl\]'"):
        rt.record_grpo(object(), tmp_path / "run.zarr")
    assert not (tmp_path / "run.zarr").exists()


@pytest.fixture(scope="module")
def grpo_run(trl, tiny_bf16_model, tmp_path_factory):
    """A clean 4-step GRPO run recorded by record_grpo, with vLLM's outputs captured beside it."""
    import torch
    from datasets import Dataset

    from rlparity.capture.lock import engine_lock
    from rlparity.models import make_prompts
    from rlparity.record.trl import record_grpo

    sys.path.insert(0, str(ROOT / "scripts"))
    from trl_grpo import answer_reward

    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")
    out = tmp_path_factory.mktemp("trl")
    args = trl.GRPOConfig(
        output_dir=str(out / "trainer"), use_vllm=True, vllm_mode="colocate", use_cpu=True,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=8, max_steps=STEPS,
        learning_rate=1e-5, lr_scheduler_type="constant", temperature=0.7, logging_steps=1, report_to="none",
        save_strategy="no", seed=0, vllm_max_model_length=256, gradient_checkpointing=False,
        model_init_kwargs={"dtype": torch.float32})
    ds = Dataset.from_dict({"prompt": make_prompts(2 * STEPS, seed=1)})
    with engine_lock():
        trainer = trl.GRPOTrainer(model=tiny_bf16_model, reward_funcs=answer_reward, args=args, train_dataset=ds)
        seen = []  # what vLLM returned, before TRL pads it into tensors
        generate = trainer.vllm_generation.generate

        def capture(*a, **kw):
            result = generate(*a, **kw)
            seen.append(result)
            return result

        trainer.vllm_generation.generate = capture
        hook = record_grpo(trainer, out / "run.zarr", keep_tensors=True)
        trainer.train()
        hook.close()
        left = [n for n in ("_generate_and_score_completions", "_calculate_rewards") if n in vars(trainer)]
        left += ["sync_weights"] if "sync_weights" in vars(trainer.vllm_generation) else []
        history = list(trainer.state.log_history)
        _shut_down(trainer)  # before the lock goes: the next engine may start in another process
    return {"store": out / "run.zarr", "hook": hook, "seen": seen, "history": history, "left_wrapped": left}


@pytest.mark.engine
def test_every_grpo_step_is_in_the_run_store_with_trl_token_counts(grpo_run):
    from rlparity.record import open_run

    run = open_run(grpo_run["store"])
    records = grpo_run["hook"].records
    assert run.sizes["step"] == STEPS == len(records) == len(grpo_run["seen"])
    assert run["step_index"].values.tolist() == list(range(STEPS))  # TRL's global_step at each generation
    for k, rec in enumerate(records):
        counts = rec.response_mask.sum(dim=1).numpy()  # TRL's completion_mask
        np.testing.assert_array_equal(run["response_length"].values[k], counts)
        np.testing.assert_array_equal(run["response_mask"].values[k].sum(axis=1), counts)
        _, completion_ids, _, _ = grpo_run["seen"][k]
        assert [len(c) for c in completion_ids] == counts.tolist()  # vLLM's own token counts
        for i, ids in enumerate(completion_ids):
            assert run["token_id"].values[k, i, : len(ids)].tolist() == list(ids)


@pytest.mark.engine
def test_recorded_mu_is_what_vllm_returned_and_pi_old_gives_trls_own_gap(grpo_run):
    """mu against vLLM's outputs captured at the engine's call, and mean |pi_old - mu| recomputed from
    the store against the figure TRL logs itself (sampling/sampling_logp_difference/mean)."""
    from rlparity.record import open_run

    run = open_run(grpo_run["store"])
    old = run[f"trainer_{run.attrs['trainer_side']}_logprob"].values
    mu, mask = run["rollout_logprob"].values, run["response_mask"].values
    for k, (_, completion_ids, logprobs, _) in enumerate(grpo_run["seen"]):
        for i, row in enumerate(logprobs):
            engine = np.array([lp[0] for lp in row], np.float32)  # the sampled token's logprob
            np.testing.assert_array_equal(mu[k, i, : len(engine)], engine)
    logged = [h for h in grpo_run["history"] if "sampling/sampling_logp_difference/mean" in h]
    assert len(logged) == STEPS
    for k, h in enumerate(logged):
        gap = np.abs(old[k] - mu[k])[mask[k]].astype(np.float64).mean()
        assert gap == pytest.approx(h["sampling/sampling_logp_difference/mean"], rel=1e-5)
        assert 0 < gap < 0.1  # the bf16 engine against TRL's bf16-autocast forward: a clean pair


@pytest.mark.engine
def test_rlparity_metrics_and_alarms_reach_trls_log_history(grpo_run):
    from rlparity.record import ALARMS, open_run

    run = open_run(grpo_run["store"])
    logged = [h for h in grpo_run["history"] if "rlparity/abs_log_ratio_mean" in h]
    assert [h["step"] for h in logged] == list(range(1, STEPS + 1))
    names = list(run["metric"].values)
    for k, h in enumerate(logged):
        for name in ("rlparity/abs_log_ratio_mean", "rlparity/kl_k3", "rlparity/n_tokens", "rlparity/reward_mean"):
            assert h[name] == pytest.approx(float(run["metric_value"].values[k, names.index(name)]))
        assert {f"rlparity/alarm/{code}" for code in ALARMS} <= set(h)
        assert h["rlparity/reward_mean"] == pytest.approx(h["reward"])  # TRL's own weighted reward
    assert int(run["alarm_level"].values.max()) < 2  # a clean run: no alarm at error level
    versions = run["weight_version"].values.tolist()
    assert versions == list(range(STEPS))  # a sync before every generation, at the trainer's step
    changed = [h["rlparity/weights_changed_share"] for h in logged[1:]]
    assert all(c > 0 for c in changed)
    assert grpo_run["left_wrapped"] == []  # close() gave the trainer its own methods back


@pytest.mark.engine
def test_a_float32_trainer_with_a_step_below_bf16_resolution_raises_weights_unchanged_at_those_syncs(
        trl, grpo_run, tiny_bf16_model, tmp_path):
    """The planted fault, run by the benchmark script in its own process (one engine per process): the
    alarm fires exactly at the syncs where no bf16 value of the weights sent changed, counted value by
    value, while the trainer's float32 weights did move. Run for the steps the ratio_offset window needs to
    be judged: it stays silent (the engine's logprobs are those of what it sampled)."""
    result = _script_run("fp32_tiny_step", JUDGED, tmp_path)
    assert result["steps_recorded"] == JUDGED
    # a faithful rollout however far the trainer's float32 forward is from the bf16 engine: no ratio_offset
    assert not any("ratio_offset" in codes for codes in result["alarms_by_step"].values())
    still = [c["version"] for c in result["weight_changes_per_sync"] if c["sent_bf16_values_changed"] == 0]
    assert still  # the fault is there
    assert all(c["trainer_fp32_values_changed"] > 0 for c in result["weight_changes_per_sync"])
    fired = sorted(int(s) for s, codes in result["alarms_by_step"].items() if "weights_unchanged" in codes)
    assert fired == still  # step k is generated after the sync of version k


def _script_run(name: str, steps: int, tmp_path) -> dict:
    """One run of scripts/trl_grpo.py in its own process (one engine per process), its JSON result."""
    out = tmp_path / f"{name}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "trl_grpo.py"), "--one", name, "--steps", str(steps),
                    "--out", str(out), "--store-dir", str(tmp_path)], check=True, env=env, cwd=tmp_path,
                   capture_output=True)
    return json.loads(out.read_text())


@pytest.mark.engine
def test_an_engine_on_raw_logprobs_raises_ratio_offset_from_the_first_step_its_window_is_judged(
        trl, grpo_run, tiny_bf16_model, tmp_path):
    """Planted fault (a): vLLM started with logprobs_mode=raw_logprobs under TRL (temperature 0.7). The
    mean pi_old/mu over the trailing window is judged once it holds 20 prompt groups (4 a step: from
    step 4) and is then an error at every step; no step before it raises it."""
    from rlparity.config import defaults

    r = defaults().record
    result = _script_run("raw_logprobs", JUDGED, tmp_path)
    first = -(-r.ratio_min_units // 4) - 1
    fired = sorted(int(s) for s, codes in result["alarms_by_step"].items() if "ratio_offset" in codes)
    assert fired == list(range(first, JUDGED))
    assert result["error_alarms"] == ["ratio_offset"]
    z = [p["rlparity/ratio_offset_z"] for p in result["per_step"][first:]]
    assert min(z) > r.ratio_z, z
