"""Issue 41: causes read from the logprobs alone: the temperature each side applied, and bf16 rounding of
the logits on one side.

The reference is a float64 simulator written here: random logits per position, tokens drawn at the
request's temperature, each side's logprob computed as ``log softmax(z / T_side)`` by numpy. The
detector reads only the logprobs and the request's temperature (no recorded trainer setting, no
``logprobs_mode``); the truth (which side divided by the temperature) stays in this file.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlparity.diagnose.findings import Severity
from rlparity.diagnose.temperature import _temperature_state, temperature_from_numbers
from rlparity.metrics import core, effective_temperature
from rlparity.metrics.semantic import sharpness_fit
from rlparity.trace import from_rollouts


def _log_softmax(z):
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def _arm(*, rollout_t, trainer_t, temperature=0.7, n_seq=24, length=24, vocab=64, seed=0):
    """A scored arm from the simulator: tokens drawn at ``temperature``; the rollout reports
    ``log softmax(z / rollout_t)``, the trainer's processed reading ``log softmax(z / trainer_t)`` and
    its raw one ``log softmax(z)``."""
    rng = np.random.default_rng(seed)
    # peaked distributions like a language model's: one strong logit, a few near it, a long tail
    z = rng.normal(0.0, 1.0, size=(n_seq, length, vocab))
    z[..., 0] += rng.uniform(2.0, 7.0, size=(n_seq, length))
    z[..., 1:4] += rng.uniform(0.0, 2.0, size=(n_seq, length, 3))
    p = np.exp(_log_softmax(z / temperature))
    u = rng.random((n_seq, length, 1))
    tok = np.minimum((p.cumsum(axis=-1) < u).sum(axis=-1), vocab - 1)

    def at(t):
        return np.take_along_axis(_log_softmax(z / t), tok[..., None], axis=-1)[..., 0]

    tr = from_rollouts(prompt_token_ids=[[1, 2, 3]] * n_seq, token_ids=tok.tolist(),
                       rollout_logprobs=at(rollout_t).tolist(), temperature=temperature, attrs={"arm": "sim"})
    tr["trainer_logprob"] = (("sequence", "position"), at(1.0))
    tr["trainer_processed_logprob"] = (("sequence", "position"), at(trainer_t))
    tr.attrs["trainer"] = {"model": "m"}
    return tr


def test_sharpness_fit_recovers_the_inverse_temperature_of_a_two_logit_law():
    """Where one competitor holds the tail, -log p_beta = log(1 + exp(-beta gap)): the slope of
    log(-log p) on the temperature-1 reading's is beta, up to the log(1 + x) ~ x step."""
    rng = np.random.default_rng(1)
    gap = rng.uniform(1.5, 4.5, size=(30, 20))
    ref = -np.log1p(np.exp(-gap))  # temperature 1
    for beta in (0.8, 1.0, 1.0 / 0.7, 2.0):
        f = sharpness_fit(-np.log1p(np.exp(-beta * gap)), ref, np.ones(gap.shape, bool))
        assert f["beta"] == pytest.approx(beta, rel=0.06), beta
        assert f["n_sequences"] == 30 and (f["beta_se"] > 0 or beta == 1.0)
    # the same reading against itself: exactly 1, whatever the tokens
    f = sharpness_fit(ref, ref, np.ones(gap.shape, bool))
    assert f["beta"] == pytest.approx(1.0, abs=1e-12)
    # tokens outside the band are not used: an empty band gives no fit
    f = sharpness_fit(ref, ref, np.ones(gap.shape, bool), band=(5.0, 6.0))
    assert f["n_tokens"] == 0 and np.isnan(f["beta"])


def test_sharpness_fit_uses_exactly_the_band_and_a_sequence_jackknife():
    """The tokens used, the error and the smallest fit, against references written here."""
    rng = np.random.default_rng(5)
    n_seq, length = 25, 8
    ref = -rng.uniform(0.02, 0.3, size=(n_seq, length))
    lp = -np.exp(1.3 * np.log(-ref) + 0.05 * rng.standard_normal(ref.shape))
    ref[0, :4] = [-0.01, -0.37, -0.0099, -0.3701]  # both edges kept, just outside them not
    lp[1, 0] = 0.0  # a logprob of exactly 0 has no log(-log p): left out
    mask = np.ones(ref.shape, bool)
    mask[2, :] = False
    f = sharpness_fit(lp, ref, mask)
    used = mask & (-ref >= 0.01) & (-ref <= 0.37) & (lp < 0)
    assert f["n_tokens"] == int(used.sum()) == n_seq * length - 8 - 2 - 1
    assert f["n_sequences"] == n_seq - 1
    # the jackknife by hand: sequence i (of those with tokens) in group i mod 20, the Huber slope refitted
    x, y = np.log(-ref), np.log(-np.where(lp < 0, lp, -1.0))
    rows = [i for i in range(n_seq) if used[i].any()]
    est = []
    for g in range(20):
        keep = used & np.array([i in rows and rows.index(i) % 20 != g for i in range(n_seq)])[:, None]
        est.append(core.robust_reading_fit(np.where(keep, y, 0.0), np.where(keep, x, 0.0), keep)["alpha"])
    est = np.array(est)
    se_jk = np.sqrt(19 / 20 * np.sum((est - est.mean()) ** 2))
    assert f["beta_se_jackknife"] == pytest.approx(se_jk, rel=1e-6)
    assert f["beta_se"] == max(f["beta_se_jackknife"], f["beta_se_token"])
    assert f["beta"] == pytest.approx(1.3, abs=0.05)
    # fewer than three tokens: no fit; three: a fit
    few = np.zeros(ref.shape, bool)
    few[3, :2] = True
    assert np.isnan(sharpness_fit(lp, ref, few)["beta"])
    few[3, 2] = True
    assert np.isfinite(sharpness_fit(lp, ref, few)["beta"])


def test_effective_temperature_reads_each_side_from_the_simulator():
    et = effective_temperature(_arm(rollout_t=0.7, trainer_t=1.0))
    row = et.sel(temperature=0.7, method="nearest")
    assert float(row["temperature_trainer"]) == pytest.approx(1.0, abs=0.01)  # untempered: exactly 1
    # tempered: the near-tied competitors of this simulator (three logits boosted beside the argmax) bias the fit's
    # inverse temperature up, so the reading sits below 0.7, far from 1: the rule only needs the side of the midpoint
    assert 0.4 < float(row["temperature_rollout"]) < 0.7
    assert int(row["n_sequences"]) == 24


@pytest.mark.parametrize("rollout_t, trainer_t, expected", [
    (0.7, 0.7, {}),
    (0.7, 1.0, {"trainer_logprobs_untempered": "trainer_temperature"}),
    (1.0, 0.7, {"rollout_logprobs_untempered": "raw_logprobs"}),
    (1.0, 1.0, {"trainer_logprobs_untempered": "trainer_temperature", "rollout_logprobs_untempered": "raw_logprobs"}),
], ids=["parity", "trainer-untempered", "rollout-raw", "both-untempered"])
def test_temperature_from_numbers_names_the_side_that_did_not_temper(rollout_t, trainer_t, expected):
    found = temperature_from_numbers(_arm(rollout_t=rollout_t, trainer_t=trainer_t))
    errors = {f.name: f.cause for f in found if f.severity is Severity.ERROR}
    assert errors == expected
    if not expected:
        (f,) = found
        assert f.name == "effective_temperatures" and f.evidence["rollout"] == f.evidence["trainer"] == "tempered"


def test_a_recorded_setting_the_numbers_contradict_is_said():
    tr = _arm(rollout_t=0.7, trainer_t=1.0)
    tr["trainer_temperature"] = ("sequence", np.full(tr.sizes["sequence"], 0.7, dtype=np.float32))
    (f,) = [g for g in temperature_from_numbers(tr) if g.severity is Severity.ERROR]
    assert f.evidence["record_contradicted"] == "trainer_temperature" and "contradict" in f.summary
    raw = _arm(rollout_t=1.0, trainer_t=0.7)
    raw.attrs["engine_effective"] = {"logprobs_mode": "processed_logprobs"}
    (f,) = temperature_from_numbers(raw)
    assert f.cause == "raw_logprobs" and f.evidence["record_contradicted"] == "logprobs_mode"


def test_nothing_to_read_at_temperature_one_or_on_a_noisy_side():
    assert temperature_from_numbers(_arm(rollout_t=1.0, trainer_t=1.0, temperature=1.0)) == []
    # states by hand: the midpoint between log 1 = 0 and log(1/0.7) = 0.357 is 0.178
    assert _temperature_state(1.0, 0.01, 0.7) == "untempered"
    assert _temperature_state(1 / 0.66, 0.02, 0.7) == "tempered"
    assert _temperature_state(1.22, 0.03, 0.7) == "inconclusive"  # the penalty arm's reading: between them
    assert _temperature_state(1.0, 0.1, 0.7) == "inconclusive"  # 3 errors of 0.1 reach past the midpoint
    assert _temperature_state(1 / 1.3, 0.001, 1.3) == "tempered"  # a temperature above 1: beta below 1
    assert _temperature_state(1 / 0.7, 0.001, 1.3) == "inconclusive"  # sharper than 1 at T = 1.3: neither
    assert _temperature_state(1.5, 0.01, 0.97) == "identity"


def test_the_h200_arms_read_from_the_numbers_alone():
    """The shipped H200 matrix, blind (no recorded setting): the trainer that does not divide by the
    temperature and the engine's raw logprobs are named from the logprobs; the clean arm is at parity."""
    from rlparity.datasets import load_example
    from rlparity.diagnose.scoring import blind_view

    m = load_example("h200-faults")
    causes = {a: {f.cause for f in temperature_from_numbers(blind_view(m[a])) if f.severity is Severity.ERROR}
              for a in ("clean", "trainer_temperature", "raw_logprobs+trainer_temperature", "sampling_penalty",
                        "trainer_dropout")}
    assert causes == {"clean": set(), "trainer_temperature": {"trainer_temperature"},
                      "raw_logprobs+trainer_temperature": {"trainer_temperature", "raw_logprobs"},
                      "sampling_penalty": set(), "trainer_dropout": set()}


# ------------------------------------------------------------------------------ bf16 rounding of the logits
def _to_bf16(x):
    """Round float32 values to bfloat16 (nearest, ties to even) by hand on the bits: the reference."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def test_bf16_rounding_by_hand():
    from rlparity.metrics.head_precision import bf16_spacing

    assert _to_bf16(1.0 + 2 ** -9) == 1.0 and _to_bf16(1.0 + 3 * 2 ** -9) == 1.0 + 2 ** -7
    assert bf16_spacing(np.array([1.0, 1.99, 2.0, 6.4, -6.4, 8.0]) ).tolist() == [2 ** -7, 2 ** -7, 2 ** -6, 2 ** -5,
                                                                                 2 ** -5, 2 ** -4]
    assert np.isnan(bf16_spacing(np.array([0.0, np.nan]))).all()


def _rounded_arm(*, rollout_bf16, trainer_bf16, n_seq=24, length=24, vocab=64, temperature=0.7, seed=0, noise=0.0):
    """Tokens drawn at ``temperature``; each side's processed logprob from the same logits, rounded to bf16
    on the side(s) asked, plus optional independent noise (nats) on the rollout."""
    rng = np.random.default_rng(seed)
    # a language model's logits: the argmax at 5-9 and a few runners-up 1-3 below it (the same bf16 spacing),
    # a long tail far below
    z = rng.normal(0.0, 1.0, size=(n_seq, length, vocab))
    top = rng.uniform(5.0, 9.0, size=(n_seq, length, 1))
    z[..., :1] = top
    z[..., 1:4] = top - rng.uniform(1.0, 3.0, size=(n_seq, length, 3))
    p = np.exp(_log_softmax(z / temperature))
    u = rng.random((n_seq, length, 1))
    tok = np.minimum((p.cumsum(axis=-1) < u).sum(axis=-1), vocab - 1)

    def lp(logits, t):
        return np.take_along_axis(_log_softmax(logits / t), tok[..., None], axis=-1)[..., 0]

    zr = _to_bf16(z) if rollout_bf16 else z
    zt = _to_bf16(z) if trainer_bf16 else z
    mu = np.minimum(lp(zr, temperature) + noise * rng.standard_normal(tok.shape), 0.0)
    tr = from_rollouts(prompt_token_ids=[[1, 2, 3]] * n_seq, token_ids=tok.tolist(), rollout_logprobs=mu.tolist(),
                       temperature=temperature, attrs={"arm": "sim"})
    tr["trainer_logprob"] = (("sequence", "position"), lp(zt, 1.0))
    tr["trainer_processed_logprob"] = (("sequence", "position"), lp(zt, temperature))
    tr["trainer_max_logit"] = (("sequence", "position"), zt.max(axis=-1))
    order = np.argsort(-zt, axis=-1)
    tr["trainer_token_rank"] = (("sequence", "position"), np.argmax(order == tok[..., None], axis=-1))
    tr.attrs["trainer"] = {"model": "m"}
    return tr


@pytest.mark.parametrize("rollout_bf16, trainer_bf16, noise, rounding", [
    (True, False, 0.0, True), (False, True, 0.0, True), (False, False, 1e-4, False), (True, True, 1e-4, False),
], ids=["rollout-bf16", "trainer-bf16", "parity", "both-bf16-same-kernel"])
def test_rounding_from_numbers_sees_one_side_rounded(rollout_bf16, trainer_bf16, noise, rounding):
    from rlparity.diagnose.head_precision import head_precision, rounding_from_numbers

    tr = _rounded_arm(rollout_bf16=rollout_bf16, trainer_bf16=trainer_bf16, noise=noise)
    r = rounding_from_numbers(tr)
    assert r["testable"] and r["rounding"] is rounding, r
    f = head_precision(tr)
    if trainer_bf16:  # the trainer's own logits carry the bf16 grid: the side is named (trainer_head_from_numbers)
        assert (f.name, f.severity, f.cause) == ("trainer_head_quantised", Severity.WARNING, "trainer_bf16_head")
    if rounding:
        assert 0.4 < r["share"] < 1.0  # the triangular law's median, 0.72 at the largest logit's spacing
        if not trainer_bf16:
            assert (f.name, f.severity, f.cause) == ("head_rounding_in_differences", Severity.WARNING,
                                                     "bf16_head_rounding")
    else:
        assert r["share"] < 0.1
        if not trainer_bf16:
            assert f.name == "head_precision_unrecorded"


def test_a_recorded_fp32_head_the_numbers_contradict_is_said():
    from rlparity.diagnose.head_precision import head_precision

    tr = _rounded_arm(rollout_bf16=True, trainer_bf16=False)
    tr.attrs["engine_effective"] = {"head_dtype": "float32"}
    tr.attrs["trainer"]["head_dtype"] = "float32"
    f = head_precision(tr)
    assert (f.name, f.cause) == ("head_record_contradicted", "bf16_head_rounding")


def test_rounding_is_untestable_beside_a_noisy_trainer_or_another_global_cause():
    from rlparity.diagnose.head_precision import rounding_from_numbers

    for var in ("trainer_max_logit", "trainer_token_rank"):
        r = rounding_from_numbers(_rounded_arm(rollout_bf16=True, trainer_bf16=False).drop_vars(var))
        assert not r["testable"] and not r["rounding"] and "records" in r["why"]
    tr = _rounded_arm(rollout_bf16=True, trainer_bf16=False)
    tr.attrs["trainer"]["self_check"] = {"run_to_run_processed": {"rms": 0.5, "mean_abs": 0.5}}
    r = rounding_from_numbers(tr)
    assert not r["testable"] and "run-to-run" in r["why"]
    from rlparity.diagnose.findings import Finding, Layer

    pen = Finding(Layer.SEMANTIC, "sampling_penalty_not_in_trainer", Severity.ERROR, "s", cause="sampling_penalty")
    r = rounding_from_numbers(_rounded_arm(rollout_bf16=True, trainer_bf16=False), prior=(pen,))
    assert not r["testable"] and "sampling_penalty" in r["why"]
    # tokens at the cut's edge name the trainer's cut from a few tokens, and a bf16 head makes them itself: no gate
    # (held-out H100 matrices: the bf16 head beside KV carried over was missed before)
    edge = Finding(Layer.SEMANTIC, "zero_probability_tokens", Severity.ERROR, "s", cause="trainer_top_k")
    assert rounding_from_numbers(_rounded_arm(rollout_bf16=True, trainer_bf16=False), prior=(edge,))["rounding"]


def test_the_h200_head_arms_read_from_the_numbers_alone():
    """Blind (the head dtypes stripped): both bf16-head arms of the H200 matrix are named, the rollout's with the
    side left open, the trainer's by its side (its largest logits on the bf16 grid); the clean arm and the arms of
    other causes are not."""
    from rlparity.datasets import load_example
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.scoring import blind_view

    m = load_example("h200-faults")
    arms = {a: blind_view(m[a]) for a in ("clean", "rollout_bf16_head", "trainer_bf16_head", "sampling_penalty",
                                          "trainer_dropout", "partial_weight_sync")}
    rep = diagnose(arms)
    named = {a: {f.name for f in rep if f.arm == a and f.cause in ("bf16_head_rounding", "trainer_bf16_head",
                                                                     "rollout_bf16_head")} for a in arms}
    assert named == {"clean": set(), "rollout_bf16_head": {"head_rounding_in_differences"},
                     "trainer_bf16_head": {"trainer_head_quantised"}, "sampling_penalty": set(),
                     "trainer_dropout": set(), "partial_weight_sync": set()}


def test_effective_temperature_needs_the_raw_reading_and_the_temperature():
    tr = _arm(rollout_t=0.7, trainer_t=0.7)
    assert effective_temperature(tr.drop_vars("trainer_logprob")).sizes["temperature"] == 0
    assert effective_temperature(tr.drop_vars("temperature")).sizes["temperature"] == 0
    assert effective_temperature(tr).sizes["temperature"] == 1


# ------------------------------------------------------------------------------ scoring: effect and dominance
def _truth_arm(causes, *, shift_trainer=0.0, shift_rollout=0.0, floor=0.01):
    tr = _arm(rollout_t=0.7, trainer_t=0.7)
    tr["trainer_processed_logprob"] = tr["trainer_processed_logprob"] - shift_trainer
    tr["rollout_logprob"] = tr["rollout_logprob"] - shift_rollout
    tr.attrs["faults"] = {"causes": list(causes)}
    tr.attrs["trainer"]["self_check"] = {"batch_shape_processed": {"mean_abs": floor, "rms": floor}}
    tr.attrs["engine_floor"] = {"batch_shape": {"mean_abs": floor, "rms": floor}}
    return tr


def test_a_recipe_that_moved_no_number_is_left_out_and_dominance_comes_from_the_single_arms():
    from rlparity.diagnose.scoring import dominance, no_effect, reading_effect

    clean = _truth_arm(())
    idle = _truth_arm(("trainer_top_k",), shift_trainer=0.009 * 0.01)  # under a hundredth of the floor 0.01
    moved = _truth_arm(("trainer_temperature",), shift_trainer=0.011 * 0.01 * 100)  # 0.011 nats: above it
    head = _truth_arm(("rollout_bf16_head",), shift_rollout=0.05)
    pair = _truth_arm(("trainer_temperature", "rollout_bf16_head"), shift_trainer=0.011, shift_rollout=0.05)
    both_trainer = _truth_arm(("trainer_top_k", "trainer_temperature"), shift_trainer=0.0)
    arms = {"clean": clean, "idle": idle, "moved": moved, "head": head, "pair": pair, "both": both_trainer}
    assert reading_effect(idle, clean, "trainer_top_k") == pytest.approx(0.009 * 0.01, rel=1e-6)
    assert reading_effect(head, clean, "rollout_bf16_head") == pytest.approx(0.05, rel=1e-6)
    assert reading_effect(head, clean, "kv_carried_over") is None  # no single reading
    out = no_effect(arms)
    # two causes on the trainer's reading: which one moved it cannot be told, so neither is left out
    assert set(out) == {"idle"} and set(out["idle"]) == {"trainer_top_k"}
    # the bar is a hundredth of the side's own floor: 1.5 hundredths is an effect; the engine's side is measured
    # against the engine's floor (here 10x the trainer's)
    assert no_effect({"clean": clean, "x": _truth_arm(("trainer_top_k",), shift_trainer=0.015 * 0.01)}) == {}
    eng_clean = _truth_arm(())
    eng_clean.attrs["engine_floor"] = {"batch_shape": {"mean_abs": 0.1, "rms": 0.1}}
    small = _truth_arm(("rollout_bf16_head",), shift_rollout=0.5 * 0.01 * 0.1)
    assert set(no_effect({"clean": eng_clean, "x": small})) == {"x"}
    assert no_effect({"clean": clean, "x": small}) == {}  # against the trainer's floor (0.01) it would count
    assert no_effect({k: v for k, v in arms.items() if k != "clean"}) == {}
    # dominance: the single arms' excess mean |d| over the clean arm's (a clean arm off by 0.02 nats: the excess
    # is measured from there)
    base = _truth_arm((), shift_rollout=-0.02)
    dom = dominance({"clean": base, "moved": _truth_arm(("trainer_temperature",), shift_trainer=0.011, shift_rollout=-0.02),
                     "head": _truth_arm(("rollout_bf16_head",), shift_rollout=-0.07),
                     "pair": pair})
    assert dom["pair"]["excess"]["rollout_bf16_head"] == pytest.approx(0.05, rel=1e-3)
    assert dom["pair"]["excess"]["trainer_temperature"] == pytest.approx(0.011, rel=1e-3)
    assert dom["pair"]["dominant"] == "rollout_bf16_head"
    dom = dominance(arms)
    assert set(dom) == {"pair", "both"}
    assert dom["pair"]["dominant"] == "rollout_bf16_head" and not dom["pair"]["tie"]
    assert dom["pair"]["excess"]["rollout_bf16_head"] == pytest.approx(0.05, rel=1e-3)
    # within a tenth of the larger: a tie
    close = _truth_arm(("rollout_bf16_head",), shift_rollout=0.0115)
    dom = dominance({"clean": clean, "moved": moved, "head": close, "pair": pair})
    assert dom["pair"]["tie"] and dom["pair"]["dominant"] is None


def test_rounding_scale_against_a_reference_by_hand():
    """The statistic written out: the median over tokens below the argmax of |r| over the bf16 spacing of the
    largest logit (2^(floor(log2|z|) - 7)) / sqrt 6 / T, T = 1 where the request's is 0; its error a delete-a-group
    jackknife over sequences (group i mod 20)."""
    from rlparity.metrics.head_precision import rounding_scale

    rng = np.random.default_rng(11)
    n_seq, length = 26, 6
    r = np.abs(rng.normal(0.0, 0.01, size=(n_seq, length)))
    z = rng.uniform(2.5, 12.0, size=(n_seq, length))
    t = np.where(rng.random((n_seq, length)) < 0.2, 0.0, 0.7)
    rank = rng.integers(0, 3, size=(n_seq, length))
    mask = np.ones((n_seq, length), bool)
    mask[0] = False
    r[1, 0] = np.nan
    f = rounding_scale(r, z, t, rank, mask)
    spacing = 2.0 ** (np.floor(np.log2(z)) - 7)
    q = r / (spacing / np.sqrt(6.0) / np.where(t > 0, t, 1.0))
    sel = mask & (rank >= 1) & np.isfinite(q)
    assert f["n_tokens"] == int(sel.sum()) and f["n_sequences"] == int(sel.any(axis=1).sum())
    assert f["share"] == pytest.approx(np.median(q[sel]), rel=1e-12)
    rows = [i for i in range(n_seq) if sel[i].any()]
    est = np.array([np.median(q[sel & np.array([i in rows and rows.index(i) % 20 != g for i in range(n_seq)])[:, None]])
                    for g in range(20)])
    assert f["share_se"] == pytest.approx(np.sqrt(19 / 20 * np.sum((est - est.mean()) ** 2)), rel=1e-9)
    two = np.zeros_like(mask)
    two[2, :2] = True
    rank2 = np.ones_like(rank)
    assert np.isnan(rounding_scale(r, z, t, rank2, two)["share"])
    two[2, 2] = True
    assert np.isfinite(rounding_scale(r, z, t, rank2, two)["share"])


def test_temperature_states_at_their_edges():
    assert _temperature_state(2.0, 0.2, 0.5) == "tempered"  # error 3 x 0.2 / 2 in log beta: inside the half
    assert _temperature_state(2.0, 0.3, 0.5) == "inconclusive"
    for t in (float("nan"), 0.0, -0.7):
        assert _temperature_state(1.0, 0.01, t) == "identity"
    for beta, se in ((float("nan"), 0.01), (0.0, 0.01), (-1.0, 0.01), (1.0, float("nan"))):
        assert _temperature_state(beta, se, 0.7) == "inconclusive"


def test_what_the_record_says_is_confirmed_or_contradicted():
    from rlparity.diagnose.findings import Finding, Layer

    # the trainer's temperature recorded as 1 (it did not temper) and already named from the record: confirmed
    tr = _arm(rollout_t=0.7, trainer_t=1.0)
    tr["trainer_temperature"] = ("sequence", np.ones(tr.sizes["sequence"], dtype=np.float32))
    rec = Finding(Layer.SEMANTIC, "trainer_temperature_differs", Severity.ERROR, "s", cause="trainer_temperature")
    found = temperature_from_numbers(tr, recorded=(rec,))
    assert [f.name for f in found] == ["effective_temperatures"]
    assert rec.evidence["confirmed_by_numbers"]["trainer"] == "untempered"
    # the semantic fit already names raw logprobs: the numbers add no second finding for it
    raw = _arm(rollout_t=1.0, trainer_t=0.7)
    sem = Finding(Layer.SEMANTIC, "raw_logprobs_used_as_processed", Severity.ERROR, "s", cause="raw_logprobs")
    assert [f.name for f in temperature_from_numbers(raw, semantics=sem)] == ["effective_temperatures"]
    # both untempered: the rollout's finding says the trainer's are too
    both = {f.name: f for f in temperature_from_numbers(_arm(rollout_t=1.0, trainer_t=1.0))}
    assert "the trainer's are too" in both["rollout_logprobs_untempered"].summary
    one = {f.name: f for f in temperature_from_numbers(_arm(rollout_t=1.0, trainer_t=0.7))}
    assert "the trainer's are too" not in one["rollout_logprobs_untempered"].summary
    # an engine that says raw_logprobs while its logprobs follow the temperature
    said_raw = _arm(rollout_t=0.7, trainer_t=0.7)
    said_raw.attrs["engine_effective"] = {"logprobs_mode": "raw_logprobs"}
    (f,) = temperature_from_numbers(said_raw)
    assert f.name == "effective_temperatures" and "yet its logprobs follow the temperature" in f.summary
    (f,) = temperature_from_numbers(_arm(rollout_t=0.7, trainer_t=0.7))
    assert "yet" not in f.summary and "T=0.7" in f.summary


def test_rounding_reading_at_its_gates():
    """The noise gate at a quarter of the typical rounding scale (written out here), the smallest sample, the
    error that must clear the bar, and a prior finding that is only information."""
    from rlparity.diagnose.evidence import build
    from rlparity.diagnose.findings import Finding, Layer
    from rlparity.diagnose.head_precision import rounding_from_numbers

    tr = _rounded_arm(rollout_bf16=True, trainer_bf16=False)
    ev = build(tr)
    use = ev.unclaimed() & np.isfinite(ev.residual)
    spacing = 2.0 ** (np.floor(np.log2(np.abs(tr["trainer_max_logit"].values))) - 7)
    typical = float(np.median((spacing / np.sqrt(6.0) / 0.7)[use]))
    for factor, gated in ((1.02, True), (0.98, False)):
        t = tr.copy()
        t.attrs = {**tr.attrs, "trainer": {**tr.attrs["trainer"], "self_check": {
            "run_to_run_processed": {"rms": factor * 0.25 * typical, "mean_abs": factor * 0.25 * typical}}}}
        assert (not rounding_from_numbers(t)["testable"]) is gated, factor
    info = Finding(Layer.SEMANTIC, "sampling_penalty_not_in_trainer", Severity.INFO, "s", cause="sampling_penalty")
    assert rounding_from_numbers(tr, prior=(info,))["rounding"]
    few = _rounded_arm(rollout_bf16=True, trainer_bf16=False, n_seq=3)
    r = rounding_from_numbers(few)
    assert not r["testable"] and "sequences" in r["why"]
    at_min = rounding_from_numbers(_rounded_arm(rollout_bf16=True, trainer_bf16=False, n_seq=4))  # min_fit_sequences
    assert at_min["testable"] and at_min["n_sequences"] == at_min["n_groups"] == 4
    # the bar is cleared by the share less 3 errors: a share above it whose error reaches below is not enough
    from rlparity.config import defaults_context

    r = rounding_from_numbers(tr)
    with defaults_context(head_rounding_share=r["share"] - 2 * r["share_se"]):
        assert not rounding_from_numbers(tr)["rounding"]
    with defaults_context(head_rounding_share=r["share"] - 4 * r["share_se"]):
        assert rounding_from_numbers(tr)["rounding"]
    # with the full jackknife (24 sequences: 20 groups) the bar is temperature_z itself; with 6 sequences (6 groups)
    # it is 3 t(5) / t(19), the t law's quantiles at 3 normal errors (5.5071 / 3.4472 from tables)
    from rlparity.config.defaults import defaults
    from rlparity.metrics.head_precision import student_t_level

    assert r["n_groups"] == 20 and r["errors_level"] == defaults().temperature_z == 3.0
    six = rounding_from_numbers(_rounded_arm(rollout_bf16=True, trainer_bf16=False, n_seq=6))
    assert six["n_groups"] == 6 and six["testable"]
    assert six["errors_level"] == pytest.approx(3.0 * 5.5071 / 3.4472, rel=2e-4)
    assert six["errors_level"] == 3.0 * student_t_level(3.0, 5) / student_t_level(3.0, 19)
    sbar = six["share"] - six["errors_level"] * six["share_se"]
    with defaults_context(head_rounding_share=sbar):
        assert rounding_from_numbers(_rounded_arm(rollout_bf16=True, trainer_bf16=False, n_seq=6))["rounding"]
    with defaults_context(head_rounding_share=sbar * (1 + 1e-12) + 1e-15):
        assert not rounding_from_numbers(_rounded_arm(rollout_bf16=True, trainer_bf16=False, n_seq=6))["rounding"]
    with defaults_context(jackknife_groups=6):  # 6 groups is then the full jackknife: the plain bar
        assert rounding_from_numbers(_rounded_arm(rollout_bf16=True, trainer_bf16=False, n_seq=6))["errors_level"] == 3.0
    bar = r["share"] - r["errors_level"] * r["share_se"]
    with defaults_context(head_rounding_share=bar):
        assert rounding_from_numbers(tr)["rounding"]
    with defaults_context(head_rounding_share=bar * (1 + 1e-12) + 1e-15):
        assert not rounding_from_numbers(tr)["rounding"]


def test_student_t_level_against_closed_forms():
    """The t quantile at the normal level's upper tail p: for 1 degree of freedom (Cauchy) tan(pi (1/2 - p)), for 2
    sqrt(8 a^2 / (1 - 4 a^2)) with a = 1/2 - p (F(x) = 1/2 + x / (2 sqrt(2 + x^2))); the normal z for many; the
    sign follows z; no level below 1 degree of freedom."""
    import math

    from rlparity.metrics.head_precision import student_t_level

    for z in (1.0, 2.5, 3.0):
        p = 0.5 * math.erfc(z / math.sqrt(2.0))
        a = 0.5 - p
        assert student_t_level(z, 1) == pytest.approx(math.tan(math.pi * a), rel=1e-9)
        assert student_t_level(z, 2) == pytest.approx(math.sqrt(8 * a * a / (1 - 4 * a * a)), rel=1e-9)
        assert student_t_level(z, 10 ** 7) == pytest.approx(z, rel=1e-5)
        assert student_t_level(-z, 2) == pytest.approx(-student_t_level(z, 2), rel=1e-12)
        # more degrees of freedom, a smaller level, always above z
        levels = [student_t_level(z, k) for k in (1, 3, 5, 10, 19, 100)]
        assert all(x > y for x, y in zip(levels, levels[1:])) and levels[-1] > z
    # 3 normal errors at 5 degrees of freedom (6 jackknife groups): 5.507 (tables: t_{0.99865, 5})
    assert student_t_level(3.0, 5) == pytest.approx(5.5071, abs=5e-4)
    assert math.isnan(student_t_level(3.0, 0)) and student_t_level(float("inf"), 3) == float("inf")


def test_bf16_grid_by_hand():
    """bfloat16 numbers are float32s whose low 16 bits are zero: 8 significant bits."""
    from rlparity.metrics.head_precision import bf16_representable, quantised_share

    x = np.array([1.0, 1.0 + 2 ** -7, 1.0 + 2 ** -8, 3.140625, -201.0 * 2 ** 40, 0.1, float(np.float32(0.1)),
                  1.0 + 2 ** -30, 0.0, np.nan, np.inf, -np.inf, 255.0, 257.0])
    assert bf16_representable(x).tolist() == [True, True, False, True, True, False, False, False, True, False, False,
                                              False, True, False]
    assert bf16_representable(x.astype(np.float32)[:5]).tolist() == [True, True, False, True, True]
    # against an independent reference: round to nearest bf16 (test helper) and compare
    rng = np.random.default_rng(3)
    y = np.concatenate([_to_bf16(rng.normal(0, 8, 500)), rng.normal(0, 8, 500).astype(np.float32).astype(float)])
    assert (bf16_representable(y) == (_to_bf16(y) == y)).all()
    q = quantised_share(np.array([[1.0, 0.1, 2.0], [np.nan, 0.5, 0.3]]), np.array([[True, True, False],
                                                                                   [True, True, True]]))
    assert q == {"share": 2 / 4, "n_tokens": 4, "n_bf16": 2}
    assert np.isnan(quantised_share(np.array([1.0]), np.array([False]))["share"])


def _with_max_logits(tr, n_on_grid, n=100):
    """``tr`` with its first ``n`` response tokens' largest logits replaced: ``n_on_grid`` of them bf16
    numbers, the rest off the grid; the others masked out."""
    x = np.full(tr["trainer_max_logit"].shape, np.nan)
    flat = np.where(tr["response_mask"].values.reshape(-1))[0][:n]
    vals = 4.0 + np.arange(n) * 2 ** -5  # on the bf16 grid in [4, 8) (spacing 2**-5)
    vals[n_on_grid:] += 2 ** -12  # off it
    x.reshape(-1)[flat] = vals
    out = tr.copy()
    out["trainer_max_logit"] = (tr["trainer_max_logit"].dims, x)
    return out


@pytest.mark.parametrize("on_grid, bf16", [(100, True), (90, True), (89, False), (0, False)])
def test_trainer_head_from_numbers_at_the_threshold(on_grid, bf16):
    from rlparity.diagnose.head_precision import trainer_head_from_numbers

    tr = _with_max_logits(_rounded_arm(rollout_bf16=False, trainer_bf16=False), on_grid)
    g = trainer_head_from_numbers(tr)  # default head_quantised_share 0.9
    assert g["testable"] and g["n_tokens"] == 100 and g["n_bf16"] == on_grid and g["bf16"] is bf16, g


def test_trainer_head_from_numbers_needs_tokens_and_the_record():
    from rlparity.diagnose.head_precision import trainer_head_from_numbers

    tr = _rounded_arm(rollout_bf16=False, trainer_bf16=True)
    assert trainer_head_from_numbers(tr)["bf16"] and trainer_head_from_numbers(tr)["share"] == 1.0
    assert trainer_head_from_numbers(_rounded_arm(rollout_bf16=True, trainer_bf16=False))["share"] == 0.0
    g = trainer_head_from_numbers(tr.drop_vars("trainer_max_logit"))
    assert not g["testable"] and not g["bf16"] and "largest logit" in g["why"]
    few = _with_max_logits(tr, 31, n=31)  # default min_quantised_tokens 32
    g = trainer_head_from_numbers(few)
    assert not g["testable"] and not g["bf16"] and g["n_tokens"] == 31 and "needs 32" in g["why"]
    assert trainer_head_from_numbers(_with_max_logits(tr, 32, n=32))["bf16"]


def test_a_trainer_head_recorded_float32_on_the_bf16_grid_is_contradicted():
    from rlparity.diagnose.head_precision import head_precision

    tr = _rounded_arm(rollout_bf16=False, trainer_bf16=True)
    tr.attrs["trainer"]["head_dtype"] = "float32"
    f = head_precision(tr)
    assert (f.name, f.severity, f.cause) == ("head_record_contradicted", Severity.WARNING, "trainer_bf16_head")
    tr.attrs["trainer"]["head_dtype"] = "bfloat16"
    tr.attrs["engine_effective"] = {"head_dtype": "float32"}
    f = head_precision(tr)  # recorded and agreeing with the numbers: the recorded mismatch, as before
    assert (f.name, f.cause) == ("head_precision_mismatch", "trainer_bf16_head")
    tr = _rounded_arm(rollout_bf16=False, trainer_bf16=False, noise=1e-4)
    tr.attrs["trainer"]["head_dtype"] = "float32"
    assert head_precision(tr).name == "head_precision_unrecorded"  # float32 numbers: nothing to contradict
    tr = _rounded_arm(rollout_bf16=True, trainer_bf16=False)  # the rollout's dtype unrecorded, the trainer's fp32
    tr.attrs["trainer"]["head_dtype"] = "float32"
    f = head_precision(tr)  # the trainer's logits are off the grid; the rounding is read without naming the side
    assert (f.name, f.cause) == ("head_rounding_in_differences", "bf16_head_rounding")


def test_an_effect_under_a_thousandth_of_the_gap_is_no_effect_when_the_floors_are_zero():
    """CPU matrices: floors at float32 rounding (here 0), a top-k cut that removes no mass moves the trainer's
    reading by ~1e-7 nats; under NO_EFFECT_GAP_SHARE of the clean arm's mean |d| it took no effect."""
    from rlparity.diagnose.scoring import NO_EFFECT_GAP_SHARE, no_effect

    clean = _truth_arm((), shift_rollout=0.02, floor=0.0)  # the two sides 0.02 nats apart on every token
    m = clean["response_mask"].values.astype(bool)
    gap = float(np.abs(clean["trainer_processed_logprob"].values - clean["rollout_logprob"].values)[m].mean())
    assert NO_EFFECT_GAP_SHARE == 1e-3 and gap == pytest.approx(0.02, rel=1e-9)
    idle = _truth_arm(("trainer_top_k",), shift_trainer=0.9e-3 * gap, shift_rollout=0.02, floor=0.0)
    real = _truth_arm(("trainer_top_k",), shift_trainer=1.1e-3 * gap, shift_rollout=0.02, floor=0.0)
    out = no_effect({"clean": clean, "idle": idle, "real": real})
    assert set(out) == {"idle"} and "of the clean arm's mean |d|" in out["idle"]["trainer_top_k"]


def _flat_arm(causes, *, trainer=-0.75, rollout=-1.0, trainer_floor=0.0, engine_floor=0.0, n_seq=6, length=5):
    """An arm whose every token has the same readings (exact in binary): the trainer's processed reading
    ``trainer``, the rollout's ``rollout``, the recorded floors given (mean |x|, nats)."""
    tr = from_rollouts(prompt_token_ids=[[1, 2, 3]] * n_seq, token_ids=[[4] * length] * n_seq,
                       rollout_logprobs=[[rollout] * length] * n_seq, temperature=1.0, attrs={"arm": "flat"})
    tr["trainer_logprob"] = (("sequence", "position"), np.full((n_seq, length), trainer))
    tr["trainer_processed_logprob"] = (("sequence", "position"), np.full((n_seq, length), trainer))
    tr.attrs["trainer"] = {"model": "m", "self_check": {"batch_shape_processed": {"mean_abs": trainer_floor,
                                                                                  "rms": trainer_floor}}}
    tr.attrs["engine_floor"] = {"batch_shape": {"mean_abs": engine_floor, "rms": engine_floor}}
    tr.attrs["faults"] = {"causes": list(causes)}
    return tr


def test_no_effect_measures_each_side_against_its_own_floor_when_the_floors_differ():
    """The trainer's floor 0.1 nats, the engine's 0.01: a move of 2^-11 nats (4.9e-4) is under a hundredth
    of the trainer's side floor (1e-3) and over a hundredth of the engine's (1e-4); the clean arm's mean |d|
    is 0.25, so the gap bar (2.5e-4) leaves both alone. A trainer-side cause took no effect, an engine-side
    one did. With the engine's floor the larger (0.1) both took none: the engine's side reads its own floor,
    the trainer's side the larger of the two (the floor of |d|, metrics.floor_records.floor_mean_abs)."""
    from rlparity.diagnose.scoring import no_effect

    move = 2.0 ** -11
    assert 0.01 * 0.01 < move < 0.01 * 0.1 and 1e-3 * 0.25 < move  # the premise, by hand
    for tf, ef, idle in ((0.1, 0.01, "trainer"), (0.01, 0.1, None)):
        clean = _flat_arm((), trainer_floor=tf, engine_floor=ef)
        trainer = _flat_arm(("trainer_top_k",), trainer=-0.75 - move, trainer_floor=tf, engine_floor=ef)
        engine = _flat_arm(("rollout_bf16_head",), rollout=-1.0 - move, trainer_floor=tf, engine_floor=ef)
        out = no_effect({"clean": clean, "trainer": trainer, "engine": engine})
        if idle == "trainer":
            assert out == {"trainer": {"trainer_top_k": out["trainer"]["trainer_top_k"]}}
            assert "under a hundredth of that side's floor (0.1)" in out["trainer"]["trainer_top_k"]
        else:
            assert set(out) == {"trainer", "engine"}
            assert "floor (0.1)" in out["engine"]["rollout_bf16_head"]


def test_no_effect_at_its_bars_exactly():
    """A move of exactly a hundredth of the floor, or exactly NO_EFFECT_GAP_SHARE of the clean arm's mean |d|,
    is an effect (the bars are strict); 2^-10 nats less is not. Every number is exact in binary: the floor
    3.125 (a hundredth: 0.03125 = 2^-5), the gap 31.25 (a thousandth: 0.03125)."""
    from rlparity.diagnose.scoring import NO_EFFECT_GAP_SHARE, no_effect

    bar = 2.0 ** -5
    assert 0.01 * 3.125 == bar and NO_EFFECT_GAP_SHARE * 31.25 == bar  # the premise: the products are exact
    # the floor's bar: floor 3.125 on the trainer's side, gap 0.25 (its bar 2.5e-4 is far below)
    clean = _flat_arm((), trainer_floor=3.125)
    at = _flat_arm(("trainer_top_k",), trainer=-0.75 - bar, trainer_floor=3.125)
    under = _flat_arm(("trainer_top_k",), trainer=-0.75 - bar + 2.0 ** -10, trainer_floor=3.125)
    assert set(no_effect({"clean": clean, "at": at, "under": under})) == {"under"}
    # the gap's bar: no floor, the two sides 31.25 nats apart on every token
    clean = _flat_arm((), trainer=-0.75, rollout=-32.0)
    at = _flat_arm(("trainer_top_k",), trainer=-0.75 - bar, rollout=-32.0)
    under = _flat_arm(("trainer_top_k",), trainer=-0.75 - bar + 2.0 ** -10, rollout=-32.0)
    out = no_effect({"clean": clean, "at": at, "under": under})
    assert set(out) == {"under"} and "of the clean arm's mean |d| (31)" in out["under"]["trainer_top_k"]


# ------------------------------------------------------------------------------ the trainer's top-k cut from the numbers
def _cut_arm(*, engine_k=5, trainer_k=5, temperature=0.7, n_seq=12, length=10, vocab=64, flat_every=7, seed=4):
    """The float64 simulator with a top-k cut: the engine samples from the top ``engine_k`` at ``temperature``
    (renormalised) and reports that logprob; the trainer's processed reading and its entropy cut at ``trainer_k``
    (0: no cut). Every ``flat_every``-th position has near-flat logits (a tail that carries mass)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.0, size=(n_seq, length, vocab))
    z[..., 0] += rng.uniform(2.0, 6.0, size=(n_seq, length))
    flat = (np.arange(n_seq * length).reshape(n_seq, length) % flat_every) == 0
    z[flat] = rng.normal(0.0, 0.05, size=(int(flat.sum()), vocab))

    def processed(k):
        zt = z / temperature
        if k:
            kth = np.sort(zt, axis=-1)[..., -k][..., None]
            zt = np.where(zt >= kth, zt, -np.inf)
        return _log_softmax(zt)

    eng = processed(engine_k)
    p = np.exp(eng)
    tok = np.minimum((p.cumsum(axis=-1) < rng.random((n_seq, length, 1))).sum(axis=-1), vocab - 1)
    trn = processed(trainer_k)
    pt = np.exp(trn)
    entropy = -np.sum(pt * np.where(pt > 0, trn, 0.0), axis=-1)
    at = lambda lp: np.take_along_axis(lp, tok[..., None], axis=-1)[..., 0]  # noqa: E731
    tr = from_rollouts(prompt_token_ids=[[1, 2, 3]] * n_seq, token_ids=tok.tolist(), rollout_logprobs=at(eng).tolist(),
                       temperature=temperature, top_k=engine_k, attrs={"arm": "sim"})
    tr["trainer_logprob"] = (("sequence", "position"), at(_log_softmax(z)))
    tr["trainer_processed_logprob"] = (("sequence", "position"), at(trn))
    tr["trainer_processed_entropy"] = (("sequence", "position"), entropy)
    tr["trainer_max_logit"] = (("sequence", "position"), z.max(axis=-1) + 1e-3)  # float32-like: off the bf16 grid
    tr.attrs["trainer"] = {"model": "m"}
    return tr, entropy


def test_a_trainer_that_skips_the_engines_cut_is_read_from_its_entropy():
    """No distribution over k tokens has entropy above log k. The trainer that skips the engine's top-5 gives
    the flat positions an entropy near log 64 (4.16 nats), 2.5 nats over log 5: named trainer_top_k, with the
    positions over log 5 + log 2 counted by hand. A trainer that cuts the engine's 5 stays at or under log 5."""
    from rlparity.diagnose.processing import cut_spread, trainer_cut_from_numbers

    tr, h = _cut_arm(trainer_k=0)
    s = cut_spread(tr)
    over = h - np.log(5)
    assert s["testable"] and s["n_tested"] == h.size and s["top_k"] == [5]
    assert s["max_excess"] == pytest.approx(over.max(), rel=1e-12) and over.max() > 2.0
    assert s["n_tokens"] == int((over > np.log(2)).sum()) > 0 and np.array_equal(s["tokens"], over > np.log(2))
    f = trainer_cut_from_numbers(tr)
    assert (f.name, f.severity, f.cause) == ("trainer_cut_wider", Severity.WARNING, "trainer_top_k")
    assert f.tokens["n_tokens"] == s["n_tokens"] and "although" not in f.summary
    # the engine's cut applied: every position at most log 5 (up to float rounding), nothing named
    tr, h = _cut_arm(trainer_k=5)
    assert (h - np.log(5)).max() <= 1e-12
    s = cut_spread(tr)
    assert s["testable"] and s["n_tokens"] == 0 and trainer_cut_from_numbers(tr) is None


def test_the_cut_margin_and_where_the_entropy_cannot_tell():
    """A trainer cutting 8 where the engine cuts 5 widens the set by less than 2x: under log 5 + log 2, not
    named (the margin leaves room for a tie pile at the k-th logit). At a margin just under the measured excess
    it is. Untestable: no engine top-k, no entropy, or bf16 trainer logits (ties at the k-th logit)."""
    from rlparity.config import defaults_context
    from rlparity.diagnose.processing import cut_spread, trainer_cut_from_numbers

    tr, h = _cut_arm(trainer_k=8)
    over = (h - np.log(5)).max()
    assert 0.0 < over <= np.log(8 / 5) + 1e-12 < np.log(2)
    assert cut_spread(tr)["n_tokens"] == 0 and trainer_cut_from_numbers(tr) is None
    with defaults_context(cut_entropy_margin=over * 0.99):
        assert cut_spread(tr)["n_tokens"] >= 1 and trainer_cut_from_numbers(tr).cause == "trainer_top_k"
    assert cut_spread(tr, margin=over * 1.01)["n_tokens"] == 0
    assert cut_spread(tr, margin=over)["n_tokens"] == 0  # strictly above the bound plus the margin
    greedy, h = _cut_arm(engine_k=1, trainer_k=0)  # top-k 1: any entropy above log 2 is more than one token
    s = cut_spread(greedy)
    assert s["top_k"] == [1] and s["n_tokens"] == int((h > np.log(2)).sum()) > 0
    skip, _ = _cut_arm(trainer_k=0)
    no_k = skip.copy()
    no_k["top_k"] = ("sequence", np.zeros(skip.sizes["sequence"], dtype=np.int64))
    assert not cut_spread(no_k)["testable"] and "top-k" in cut_spread(no_k)["why"]
    assert not cut_spread(skip.drop_vars("trainer_processed_entropy"))["testable"]
    grid = skip.copy()
    grid["trainer_max_logit"] = (skip["trainer_max_logit"].dims, np.round(skip["trainer_max_logit"].values * 8) / 8)
    s = cut_spread(grid)
    assert not s["testable"] and "bfloat16" in s["why"] and trainer_cut_from_numbers(grid) is None


def test_a_recorded_cut_decides_first_and_a_contradicted_one_is_said():
    """A recorded trainer cut that differs is trainer_cut_differs (semantic topic): the numbers add nothing.
    A recorded cut equal to the engine's that the entropy contradicts is said."""
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.processing import trainer_cut_from_numbers

    tr, _ = _cut_arm(trainer_k=0)
    blind = {f.name: f.cause for f in diagnose({"sim": tr}) if f.severity.rank >= 1}
    assert blind.get("trainer_cut_wider") == "trainer_top_k"
    told = tr.copy()
    told["trainer_top_k"] = ("sequence", np.zeros(tr.sizes["sequence"], dtype=np.int64))
    names = {f.name for f in diagnose({"sim": told}) if f.severity.rank >= 1}
    assert "trainer_cut_differs" in names and "trainer_cut_wider" not in names
    lied = tr.copy()
    lied["trainer_top_k"] = ("sequence", np.full(tr.sizes["sequence"], 5, dtype=np.int64))
    f = trainer_cut_from_numbers(lied)
    assert f.cause == "trainer_top_k" and "although its recorded cut is the engine's" in f.summary
