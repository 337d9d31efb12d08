"""One real optimizer step on the tiny model (CPU), sequences sampled with transformers generate."""

from __future__ import annotations

import numpy as np
import pytest

from rlparity.metrics import objective as ob
from rlparity.trace import from_rollouts, validate
from rlparity.train import (
    StepSettings,
    arithmetic_reward,
    clip_range,
    generate_trace,
    group_advantages,
    train_step,
)


@pytest.fixture(scope="module")
def sampled(tiny_model):
    from rlparity.models import make_prompts
    from rlparity.score import score

    trace = generate_trace(tiny_model, make_prompts(4, seed=3), n=4, max_new_tokens=12, seed=0)
    return score(trace, tiny_model, progress=False)


def split_rewards(trace):
    """Within each prompt's group, samples 0 and 1 are rewarded: half the group has A > 0."""
    return (trace["sample_index"].values < 2).astype(float)


def seq_delta(trace, var="processed"):
    new = trace[ob.policy_variable("theta", var)].values
    old = trace[ob.policy_variable("old", var)].values
    return np.nansum(new - old, axis=1)


def test_group_advantages():
    adv = group_advantages([1.0, 0.0, 1.0, 0.0, 5.0, 3.0, 3.0], [0, 0, 0, 0, 1, 2, 2])
    g = np.array([1.0, 0.0, 1.0, 0.0])
    np.testing.assert_allclose(adv[:4], (g - 0.5) / (g.std(ddof=1) + 1e-6))
    assert adv[4] == 0  # a group of one sample
    assert (adv[5:] == 0).all()  # equal rewards
    np.testing.assert_allclose(group_advantages([1.0, 0.0], [0, 0], scale="none"), [0.5, -0.5])
    with pytest.raises(ValueError, match="not finite"):
        group_advantages([1.0, np.nan], [0, 0])


def test_arithmetic_reward():
    t = from_rollouts(prompt_token_ids=[[1], [1], [1]], token_ids=[[5], [5], [5]],
                      rollout_logprobs=[[-0.1]] * 3, prompt_texts=["1+1=2;3+4=", "2*3=6;9-5=", "7+1="],
                      response_texts=["7;2+2=5;", "3;1+1=2;", "8;1"])
    np.testing.assert_allclose(arithmetic_reward(t), [0.5, 0.5, 1.0])
    np.testing.assert_allclose(arithmetic_reward(t, which="first"), [1.0, 0.0, 1.0])


def test_generate_trace_is_in_parity_with_the_scorer(sampled):
    validate(sampled, require_trainer=True)
    d = ob.pair_log_ratio(sampled, "backend").values
    assert np.nanmax(np.abs(d)) < 1e-4  # same weights and precision; only KV-cache numerics differ
    assert set(np.unique(sampled["prompt_index"].values)) == {0, 1, 2, 3}


def test_zero_lr_leaves_pi_theta_equal_to_pi_old(sampled, tiny_model):
    res = train_step(tiny_model, sampled, rewards=split_rewards, loss="gspo", lr=0.0)
    for side in ("processed", "raw"):
        new = res.trace[ob.policy_variable("theta", side)].values
        old = res.trace[ob.policy_variable("old", side)].values
        assert np.nanmax(np.abs(new - old)) < 1e-5
    assert res.metrics["grad_norm"] > 0  # the loss had a gradient; only the step was empty
    # step 0: the gradient pass reproduces the no-grad pi_old exactly (same weights, shapes and mode)
    assert res.metrics["step0_consistent"] and res.metrics["step0_max_abs_diff"] == 0.0
    assert res.metrics["pi_old_max_abs_diff_vs_trace"] < 1e-5
    # a loaded model is trained in place and handed back for the next step
    # (the settings as one object this time: the same as the keywords)
    again = train_step(res.model, res.trace, settings=StepSettings(loss="ppo", lr=0.0))
    assert again.model is res.model and again.metrics["pi_old_max_abs_diff_vs_trace"] < 1e-5
    assert again.metrics["loss"] == "ppo" and again.metrics["lr"] == 0.0


@pytest.mark.parametrize("loss", ["gspo", "ppo", "grpo"])
def test_a_step_raises_positive_advantage_sequences(sampled, tiny_model, loss):
    # a step small enough for the first-order picture to hold on the tiny model: one AdamW step
    # moves every weight by about lr, and at 3e-4 a low-probability token of one sequence can fall
    # by several nats whatever its advantage (seen: -6 nats on a positive-advantage sequence)
    res = train_step(tiny_model, sampled, rewards=split_rewards, loss=loss, lr=3e-5)
    adv = res.trace["advantage"].values
    # the raw (full-vocabulary) reading moves smoothly with the weights; the processed one jumps
    # where a token crosses the top-k edge
    delta = seq_delta(res.trace, "raw")
    assert (adv > 0).sum() == 8 and (adv < 0).sum() == 8
    assert delta[adv > 0].mean() > 0 > delta[adv < 0].mean()
    assert (np.sign(delta) == np.sign(adv)).mean() >= 0.75
    np.testing.assert_allclose(res.trace["reward"].values, split_rewards(sampled))
    assert res.trace.attrs["train_step"]["loss"] == loss


def test_update_clip_fraction_zero_at_tiny_lr_and_not_at_large(sampled, tiny_model):
    tiny = train_step(tiny_model, sampled, rewards=split_rewards, loss="ppo", lr=1e-7)
    cf = ob.clip_fraction(tiny.trace, "update")
    assert cf.item() == 0.0 and cf.attrs["pair"] == "update (pi_theta, pi_old)"
    assert ob.effective_sample_size(tiny.trace, "update").item() > 0.9999
    big = train_step(tiny_model, sampled, rewards=split_rewards, loss="ppo", lr=3e-2)
    assert ob.clip_fraction(big.trace, "update").item() > 0.05


def test_corrections_enter_the_loss(sampled, tiny_model):
    n, w = sampled.sizes["sequence"], sampled.sizes["position"]
    zero = train_step(tiny_model, sampled, rewards=split_rewards, loss="ppo", lr=1e-3,
                      token_weights=np.zeros((n, w)))
    assert zero.metrics["grad_norm"] == 0.0
    assert np.nanmax(np.abs(seq_delta(zero.trace))) < 1e-6
    keep = np.zeros((n, w), bool)
    keep[:, :3] = True
    part = train_step(tiny_model, sampled, rewards=split_rewards, loss="ppo", lr=0.0, keep=keep,
                      return_gradient=True, step=False)
    usable = sampled["response_mask"].values
    assert part.metrics["n_loss_tokens"] == int((keep & usable).sum())
    assert abs(part.metrics["masked_fraction"] - (1 - (keep & usable).sum() / usable.sum())) < 1e-12
    full = train_step(tiny_model, sampled, rewards=split_rewards, loss="ppo", lr=0.0, return_gradient=True,
                      step=False)
    cos = part.gradient @ full.gradient / np.linalg.norm(part.gradient) / np.linalg.norm(full.gradient)
    assert part.gradient.shape == full.gradient.shape and cos < 0.999


def test_bad_input_is_refused(sampled, tiny_model):
    with pytest.raises(ValueError, match="loss="):
        train_step(tiny_model, sampled, rewards=split_rewards, loss="dpo")
    with pytest.raises(ValueError, match="loss='dpo'"):  # a keyword beside settings= replaces its field
        train_step(tiny_model, sampled, rewards=split_rewards, settings=StepSettings(loss="ppo"), loss="dpo")
    with pytest.raises(TypeError, match="unexpected keyword argument "
                       "'eps'; use one of the fields of StepSettings: loss, lr"):
        train_step(tiny_model, sampled, rewards=split_rewards, eps=0.2)
    with pytest.raises(ValueError, match="one reward per sequence"):
        train_step(tiny_model, sampled, rewards=[1.0, 0.0])
    with pytest.raises(ValueError, match="not both"):
        train_step(tiny_model, sampled, rewards=split_rewards, lr=1e-3, optimizer=object())
    with pytest.raises(ValueError, match="no finite reward"):
        train_step(tiny_model, sampled)


def test_clip_ranges_come_from_the_one_defaults_object():
    from rlparity.config import defaults_context

    o = ob.OBJECTIVE_DEFAULTS
    assert clip_range("ppo") == clip_range("grpo") == (o.ppo_eps, o.ppo_eps) == o.eps("token")
    assert clip_range("gspo") == (o.gspo_eps_low, o.gspo_eps_high) == o.eps("sequence")
    with defaults_context(eps=0.28, objective={"gspo_eps_high": 5e-4}):
        assert clip_range("ppo") == (0.28, 0.28) and o.ppo_eps == 0.28 and clip_range("gspo")[1] == 5e-4


def test_a_trainer_loaded_by_path_fingerprints_its_weights_again_after_an_in_place_step(tiny_model):
    """The RL runner loads its trainer by path and steps it in place: without weights_changed() the
    fingerprint stayed the initial weights' (every RL step >= 1 then read as trainer_stale_weights)."""
    import torch

    from rlparity.score import Scorer
    from rlparity.trace.weights import checksums

    trainer = Scorer(tiny_model, dtype="float32", head_dtype="float32", progress=False)
    before = dict(trainer.weight_checksums())
    name, param = next(iter(trainer.module.named_parameters()))
    with torch.no_grad():
        param.add_(1e-3)
    assert trainer.weight_checksums() == before  # a model loaded here is fingerprinted once
    trainer.weights_changed()
    after = trainer.weight_checksums()
    reference = checksums((k, v) for k, v in trainer.module.state_dict().items())
    changed = {k for k in after if after[k] != before[k]}
    assert changed and all(after[k] == reference[k] for k in changed)
    assert len(changed) <= 2, changed  # the stepped tensor (and a weight tied to it), nothing else


def test_a_model_passed_in_is_fingerprinted_beside_each_scoring_after_its_last_step(tiny_model, monkeypatch):
    """Issue 39: the checksums of a model passed in are computed beside the scoring (a thread of their own,
    started at each call) and are those of the weights the call scored: equal to the plain fingerprint
    (``rlparity.trace.weights.checksums`` of the state dict, computed after the call) before and after an
    in-place step between two calls; nothing is left pending after a call."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlparity.score import Scorer
    from rlparity.trace import from_rollouts
    from rlparity.trace.weights import checksums

    module = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    trace = from_rollouts(prompt_token_ids=[[3, 4, 5 + i] for i in range(4)], token_ids=[[5, 6, 7, 8]] * 4,
                          rollout_logprobs=[[-1.0] * 4] * 4, temperature=[1.0] * 4)
    import threading

    import rlparity.score.scorer as scorer_module

    threads = []

    def recorded(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return checksums_of(*args, **kwargs)

    checksums_of = scorer_module.checkpoint_checksums
    monkeypatch.setattr(scorer_module, "checkpoint_checksums", recorded)
    scorer = Scorer(module, progress=False)

    def plain():
        return checksums(module.state_dict().items())

    first = scorer.score(trace).attrs["trainer"]["weight_checksums"]
    assert scorer._fingerprint_job is None and first == plain()
    name, param = next(iter(module.named_parameters()))
    with torch.no_grad():
        param.mul_(1.5)
    second = scorer.score(trace).attrs["trainer"]["weight_checksums"]
    assert second == plain() and second != first
    assert {k for k in second if second[k] != first[k]} <= {name, "lm_head.weight", "model.embed_tokens.weight"}
    assert len(threads) == 2 and all(t.startswith("rlparity-fingerprint") for t in threads)  # beside, once a call
    # a distributed run: only rank 0 assembles, so only rank 0 fingerprints
    scorer.compute(trace, shard=(1, 2), self_check=False)
    assert scorer._fingerprint_job is None and len(threads) == 2
    scorer.compute(trace, shard=(0, 2), self_check=False)
    assert scorer.weight_checksums() == plain() and len(threads) == 3 and threads[-1].startswith("rlparity-fingerprint")
    # a model loaded by path is fingerprinted once: no job at later calls
    by_path = Scorer(tiny_model, dtype="float32", progress=False)
    by_path.score(trace)
    by_path.compute(trace, self_check=False)
    assert by_path._fingerprint_job is None and len(threads) == 4
