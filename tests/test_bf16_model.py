"""The second built-in model, tiny-bf16 (bf16 weights, logits up to ~22, a 32k vocabulary), on real
vLLM (CPU build) against a bf16-body trainer with an fp32 head: the parity setup's numerics are far
noisier than the float32 tiny model's, and the shipped defaults must still judge it correctly, so
that no CPU test passes on float32 luck."""

from __future__ import annotations

import pytest

from rlparity.capture import EngineSettings, SamplingSettings
from rlparity.diagnose import Layer, Severity, diagnose
from rlparity.diagnose.check import check

pytestmark = pytest.mark.engine

SAMPLING = SamplingSettings(temperature=0.7, top_k=20, max_tokens=24, seed=0)


@pytest.fixture(scope="module")
def bf16_arms(pool, prompts):
    from rlparity.models import make_model
    from rlparity.score import Scorer

    model = str(make_model("tiny-bf16", progress=False))
    scorer = Scorer(model, dtype="bfloat16", head_dtype="float32", progress=False)
    arms = {}
    for mode in ("raw_logprobs", "processed_logprobs"):
        eng = pool.get(model, EngineSettings(logprobs_mode=mode, head_dtype="float32", generation_config="vllm",
                                             enable_prefix_caching=False))
        arms[mode] = scorer.score(eng.capture(prompts, SAMPLING, arm=mode, progress=False))
    pool.close()
    return arms


def test_the_model_looks_like_a_checkpoint(bf16_arms):
    ds = bf16_arms["processed_logprobs"]
    assert ds.attrs["engine_effective"]["dtype"] == "bfloat16"
    assert float(ds["trainer_max_logit"].max()) > 15  # large logits, as trained LLMs have


def test_parity_setup_gets_no_semantic_alarm_and_passes_check(bf16_arms):
    report = diagnose(bf16_arms)
    proc = [f for f in report if f.arm == "processed_logprobs" and f.layer == Layer.SEMANTIC]
    assert not [f for f in proc if f.severity.rank >= Severity.WARNING.rank], [str(f) for f in proc]
    main = next(f for f in proc if f.name == "logprobs_processed")
    # bf16 noise far above the tiny float32 model's (~1e-6): the old fixed tolerance of 0.02 nats
    # RMS would have called this "match neither"
    assert main.evidence["noise_floor_rms"] > 0.01 and abs(main.evidence["alpha_processed"] - 1) < 0.05
    assert check(bf16_arms["processed_logprobs"]).passed


def test_raw_arm_is_caught(bf16_arms):
    report = diagnose(bf16_arms)
    f = next(f for f in report if f.arm == "raw_logprobs" and f.layer == Layer.SEMANTIC)
    assert f.name == "raw_logprobs_used_as_processed" and abs(f.evidence["alpha_processed"]) < 0.05
    assert not check(bf16_arms["raw_logprobs"]).passed


def test_trainer_floor_finding_fires_on_a_batch_variant_trainer_only(bf16_arms):
    """The checkpoint-like bf16 model on real vLLM: the default trainer (right-padded batches) is
    batch-invariant on this CPU (its self-check moves nothing) and gets no floor finding; a trainer
    that left-pads without position ids moves its logprobs with the batch's longest sequence, its
    self-check measures it, and the finding says the trainer alone makes a share of the gap."""
    from rlparity.config.settings import TrainerSettings
    from rlparity.diagnose.trainer import FLOOR_SHARE
    from rlparity.metrics.floors import recorded_floors
    from rlparity.models import make_model
    from rlparity.score import Scorer

    trace = bf16_arms["processed_logprobs"]
    model = str(make_model("tiny-bf16", progress=False))
    found = {}
    for layout in ("padded", "left_padded"):
        scored = Scorer(model, dtype="bfloat16", progress=False, settings=TrainerSettings(layout=layout)).score(trace)
        f = recorded_floors(scored)
        report = diagnose({layout: scored})
        found[layout] = (f, [x for x in report if x.name == "trainer_not_batch_invariant"], scored)
    f, none, _ = found["padded"]
    assert f["batch_shape_mean_abs"] == 0 and none == []
    f, fired, scored = found["left_padded"]
    assert f["batch_shape_mean_abs"] > 1e-3 and len(fired) == 1, fired
    assert fired[0].severity == Severity.WARNING and fired[0].evidence["share_of_gap"] >= FLOOR_SHARE
    assert fired[0].cause == "trainer_batch_variance" and "batch_invariant=True" in fired[0].fix
    # a floor lies under the excess (share 0): its line says how much of mean |d| the floor is, not
    # "explains 0%"; checked against mean |d| taken from the arrays here
    import numpy as np

    d = scored["trainer_processed_logprob"].values - scored["rollout_logprob"].values
    ok = scored["response_mask"].values.astype(bool) & np.isfinite(d)
    floor = max(v for v in (f["batch_shape_mean_abs"], f["engine_batch_mean_abs"]) if np.isfinite(v))
    expected = floor / np.abs(d[ok]).mean()
    assert fired[0].share == 0 and fired[0].attribution.startswith("the floor: ")
    assert fired[0].evidence["floor_share_of_mean_abs_d"] == pytest.approx(expected, rel=0.02)
    assert f"{fired[0].evidence['floor_share_of_mean_abs_d']:.0%} of mean |d|" in fired[0].attribution
