"""Unit tests of the diagnosis rules on traces built by hand (no engine, issue 41 item 4).

Every expected value is written out here, in float64 or by hand: the decomposition of an arm's
excess, the split rules of the causes acting on every token, the floor and run-to-run share rules,
the per-version excess (``version_excess``) and the localized test (its ratio and its z parts), the
weight-sync findings and the checksum comparisons they rest on.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlparity.diagnose import attribution as at
from rlparity.diagnose import evidence as evm
from rlparity.diagnose import sync, trainer
from rlparity.diagnose.evidence import ArmEvidence, build
from rlparity.diagnose.findings import Finding, Layer, Severity
from rlparity.metrics import versions as mv
from rlparity.metrics.floor_records import floor_mean_abs
from rlparity.trace import from_rollouts
from rlparity.trace.weights import compare_checksums, engine_effective, trainer_checksums, versions_that_differ


# ----------------------------------------------------------------------------------- helpers
def _scored(d, *, versions=None, trainer_attrs=None, attrs=None):
    """A scored trace with greedy-free identity sampling: trainer = rollout + ``d`` per token (so
    the residual is ``-d``); ``d`` and ``versions`` are lists of rows (ragged allowed)."""
    n = len(d)
    versions = versions if versions is not None else [[0] * len(row) for row in d]
    tr = from_rollouts(prompt_token_ids=[[1, 2, 3]] * n, token_ids=[[5] * len(row) for row in d],
                       rollout_logprobs=[[-1.0] * len(row) for row in d], policy_versions=versions,
                       attrs={"arm": "a", **(attrs or {})})
    dd = np.full((n, tr.sizes["position"]), np.nan)
    for i, row in enumerate(d):
        dd[i, :len(row)] = row
    for var in ("trainer_logprob", "trainer_processed_logprob"):
        tr[var] = (("sequence", "position"), -1.0 + dd)
    tr.attrs["trainer"] = {"model": "m", **(trainer_attrs or {})}
    return tr


def _self_check(batch_shape_mean_abs=None, run_to_run_rms=None, batch_shape_rms=None, kernel_mean_abs=None):
    out = {}
    if kernel_mean_abs is not None:
        out["kernel_processed"] = {"mean_abs": kernel_mean_abs, "rms": kernel_mean_abs}
        out["kernel_raw"] = {"mean_abs": 10.0, "rms": 10.0}  # the raw side is never read for a processed arm
    if batch_shape_mean_abs is not None:
        out["batch_shape_processed"] = {"mean_abs": batch_shape_mean_abs,
                                        "rms": batch_shape_rms if batch_shape_rms is not None else batch_shape_mean_abs}
    if run_to_run_rms is not None:
        out["run_to_run_processed"] = {"rms": run_to_run_rms, "mean_abs": run_to_run_rms}
    return out


def _evidence(d, r, claims=None, trainer_attrs=None, attrs=None):
    """An ArmEvidence over a rectangular ``d`` / residual ``r`` (every token real), claims by hand."""
    d = np.asarray(d, dtype=np.float64)
    tr = _scored(d.tolist(), trainer_attrs=trainer_attrs, attrs=attrs)
    mask = np.ones(d.shape, dtype=bool)
    ev = ArmEvidence(tr, "processed", mask, d, residual=np.asarray(r, dtype=np.float64))
    for c, t in (claims or {}).items():
        ev.claim(c, t, c)
    return ev


def _f(cause, sev=Severity.WARNING, name=None, layer=Layer.INFERENCE_PATH):
    return Finding(layer, name or f"found_{cause}", sev, "s", arm="a", cause=cause)


RNG = np.random.default_rng(41)
D = RNG.normal(0.0, 0.05, size=(6, 10))
R = 0.6 * D + RNG.normal(0.0, 0.002, size=D.shape)  # the semantic correction removes part of |d|
STALE = np.zeros(D.shape, dtype=bool)
STALE[:2] = True
D[:2] += 0.5
R[:2] += 0.3  # the stale sequences stand far above the background


def _reference(d, r, claimed, floor):
    """The decomposition written out in float64 (module docstring of attribution)."""
    ad, ar = np.abs(d.astype(np.float64)), np.abs(r.astype(np.float64))
    n = d.size
    b = ar[~claimed].mean()
    return {"n": n, "total": ad.sum(), "b": b, "semantic": ad.sum() - ar.sum(), "global": n * (b - floor),
            "localized": (ar[claimed] - b).sum()}


# ------------------------------------------------------------------------------ decomposition
def test_decomposition_is_the_float64_sums():
    f = 0.004
    ev = _evidence(D, R, {"stale_prefix_cache": STALE}, {"self_check": _self_check(batch_shape_mean_abs=f)})
    dec = at.decompose(ev)
    ref = _reference(D, R, STALE, f)
    assert dec.n_tokens == ref["n"] == 60
    assert dec.total == pytest.approx(ref["total"], rel=1e-12)
    assert dec.floor == f and dec.background == pytest.approx(ref["b"], rel=1e-12)
    assert dec.semantic == pytest.approx(ref["semantic"], rel=1e-12)
    assert dec.global_ == pytest.approx(ref["global"], rel=1e-12)
    assert dec.localized == {"stale_prefix_cache": pytest.approx(ref["localized"], rel=1e-12)}
    assert dec.excess == pytest.approx(ref["semantic"] + ref["global"] + ref["localized"], rel=1e-12)
    assert dec.floor_share == pytest.approx(f / (ref["total"] / 60), rel=1e-12)
    per = dec.to_dict()
    assert per["global_mean_abs"] == pytest.approx(ref["b"] - f, rel=1e-12)
    assert per["mean_abs_d"] == pytest.approx(np.abs(D).mean(), rel=1e-12)
    # a floor above the background leaves no global part; no part is ever negative
    dec = at.decompose(_evidence(D, R, {"stale_prefix_cache": STALE}, {"self_check": _self_check(1.0)}))
    assert dec.global_ == 0.0 and dec.floor == 1.0


def test_floor_is_the_larger_recorded_floor_of_a_deterministic_trainer():
    tr = _scored([[0.1] * 4], trainer_attrs={"self_check": _self_check(0.002)},
                 attrs={"engine_floor": {"batch_shape": {"mean_abs": 0.003, "rms": 0.004}}})
    assert floor_mean_abs(tr) == 0.003
    tr.attrs["engine_floor"]["batch_shape"]["mean_abs"] = 0.001
    assert floor_mean_abs(tr) == 0.002
    # a trainer moving from run to run has no floor to speak of
    tr.attrs["trainer"]["self_check"] = _self_check(0.002, run_to_run_rms=1e-4)
    assert floor_mean_abs(tr) == 0.0
    assert floor_mean_abs(_scored([[0.1] * 4])) == 0.0


# ------------------------------------------------------------------------------ split rules
def test_semantic_and_global_parts_split_evenly_among_their_causes():
    ev = _evidence(D, R, {"stale_prefix_cache": STALE}, {"self_check": _self_check(0.004)})
    dec = at.decompose(ev)
    ref = _reference(D, R, STALE, 0.004)
    findings = [_f("trainer_temperature", layer=Layer.SEMANTIC), _f("trainer_top_k", layer=Layer.SEMANTIC),
                _f("rollout_bf16_head"), _f("stale_prefix_cache", Severity.ERROR),
                _f("trainer_batch_variance"),  # a floor cause: never takes the global part
                _f("trainer_dropout", Severity.INFO),  # information names no cause
                _f("trainer_bf16_head", name="zero_probability_tokens")]  # local evidence of a global cause
    e = at.energies(findings, ev, dec)
    # the semantic part: half to each sampling cause; the global part: a third to each cause acting on every token
    assert e["trainer_temperature"] == pytest.approx(ref["semantic"] / 2 + ref["global"] / 3, rel=1e-12)
    assert e["trainer_top_k"] == pytest.approx(ref["semantic"] / 2 + ref["global"] / 3, rel=1e-12)
    assert e["rollout_bf16_head"] == pytest.approx(ref["global"] / 3, rel=1e-12)
    assert e["stale_prefix_cache"] == pytest.approx(ref["localized"], rel=1e-12)
    assert e["trainer_batch_variance"] == 0.0 and e["trainer_bf16_head"] == 0.0 and "trainer_dropout" not in e
    assert sum(e.values()) == pytest.approx(dec.excess, rel=1e-12)
    assert at._global_estimates(findings, ev, dec) == {c: pytest.approx(ref["global"] / 3, rel=1e-12) for c in
                                                       ("trainer_temperature", "trainer_top_k", "rollout_bf16_head")}
    # raw logprobs named: it takes the whole semantic part
    e = at.energies([_f("raw_logprobs", Severity.ERROR, layer=Layer.SEMANTIC), _f("trainer_temperature")], ev, dec)
    assert e["raw_logprobs"] == pytest.approx(ref["semantic"], rel=1e-12)
    assert e["trainer_temperature"] == pytest.approx(ref["global"], rel=1e-12)
    # no sampling cause: a noisy trainer makes the rollout match neither reading
    assert at.neither_makers({"trainer_dropout", "rollout_bf16_head"}) == ["trainer_dropout"]
    assert at.neither_makers({"trainer_top_k", "trainer_dropout"}) == ["trainer_top_k"]
    assert at.neither_makers({"rollout_bf16_head"}) == []


def test_dropout_takes_its_measured_run_to_run_noise_and_the_rest_goes_evenly():
    run = 0.004
    ev = _evidence(D, R, trainer_attrs={"self_check": _self_check(0.002, run_to_run_rms=run)})
    dec = at.decompose(ev)
    b = np.abs(R).mean()
    assert dec.floor == 0.0 and dec.global_ == pytest.approx(60 * b, rel=1e-12)  # a moving trainer has no floor
    est = 60 * run / np.sqrt(np.pi)  # one draw's mean |noise| from the RMS of two draws' difference
    assert est < dec.global_
    g = at._global_estimates([_f("trainer_dropout"), _f("rollout_bf16_head"), _f("trainer_bf16_head")], ev, dec)
    assert g["trainer_dropout"] == pytest.approx(est, rel=1e-12)
    assert g["rollout_bf16_head"] == pytest.approx((60 * b - est) / 2, rel=1e-12) == g["trainer_bf16_head"]
    # alone, dropout takes the whole global part; without its run-to-run number it takes nothing beside others
    assert at._global_estimates([_f("trainer_dropout")], ev, dec) == {"trainer_dropout": pytest.approx(60 * b)}
    ev.trace.attrs["trainer"]["self_check"] = _self_check(0.002)
    dec = at.decompose(ev)
    g = at._global_estimates([_f("trainer_dropout"), _f("rollout_bf16_head")], ev, dec)
    assert g["trainer_dropout"] == 0.0 and g["rollout_bf16_head"] == pytest.approx(dec.global_)
    assert at._global_estimates([_f("stale_prefix_cache")], ev, dec) == {}


def test_attribute_gives_shares_of_the_excess_and_the_headline():
    ev = _evidence(D, R, {"weights_differ": STALE}, {"self_check": _self_check(0.004)})
    ref = _reference(D, R, STALE, 0.004)
    findings = [_f("partial_weight_sync", Severity.ERROR), _f("rollout_bf16_head"),
                _f("raw_logprobs", Severity.ERROR, layer=Layer.SEMANTIC)]
    out, rec = at.attribute(findings, ev)
    total = ref["semantic"] + ref["global"] + ref["localized"]
    want = {"partial_weight_sync": ref["localized"] / total, "rollout_bf16_head": ref["global"] / total,
            "raw_logprobs": ref["semantic"] / total}
    assert rec["shares"] == {c: pytest.approx(v, rel=1e-10) for c, v in want.items()}
    assert rec["cause"] == max(want, key=want.get)
    assert {f.cause: f.share for f in out} == rec["shares"]
    assert rec["tokens_explained"] == {"weights_differ": 20}
    assert at.attribute(findings, None) == (findings, {})



def _sev(out):
    return {f.name: (f.severity, f.explained_by) for f in out}


def test_attribute_demotes_warnings_only_by_causes_named_at_warning():
    """A verdict at WARNING (not only an ERROR) is demoted when a cause named at WARNING or above explains it;
    a cause seen at INFO explains nothing, nor does a finding without a cause."""
    ev = _evidence(D, R, trainer_attrs={"self_check": _self_check(0.004)})
    neither = _f(None, name="logprobs_match_neither", layer=Layer.SEMANTIC)
    out, _ = at.attribute([neither, _f("trainer_temperature", layer=Layer.SEMANTIC)], ev)
    assert _sev(out)["logprobs_match_neither"] == (Severity.INFO, "trainer_temperature")
    out, _ = at.attribute([neither, _f("trainer_temperature", Severity.INFO, layer=Layer.SEMANTIC),
                           _f(None, name="no_cause_here")], ev)
    assert _sev(out)["logprobs_match_neither"] == (Severity.WARNING, None)


def test_attribute_demotes_a_backend_objective_finding_only_beside_a_backend_cause():
    """An objective finding about the backend pair is explained by the first inference-path cause named at
    WARNING or above; an objective finding never explains itself, and a path finding at INFO or without a
    cause explains nothing."""
    ev = _evidence(D, R, trainer_attrs={"self_check": _self_check(0.004)})
    ess = Finding(Layer.OBJECTIVE, "ess_collapse", Severity.WARNING, "s", {"pair": "backend (log pi_old - log mu)"},
                  arm="a")
    out, _ = at.attribute([ess, _f("rollout_bf16_head")], ev)
    assert _sev(out)["ess_collapse"] == (Severity.INFO, "rollout_bf16_head")
    for others in ([], [_f("rollout_bf16_head", Severity.INFO)], [_f(None, name="no_cause_here")]):
        out, _ = at.attribute([ess, *others], ev)
        assert _sev(out)["ess_collapse"] == (Severity.WARNING, None), others


def test_a_backend_objective_finding_at_parity_gets_the_objective_fix():
    """Issue 41: on an arm at parity (gap_within_floor) a backend-pair objective finding keeps its severity but
    its fix is the objective's (the backend has nothing left to fix); the update pair's, a correction hiding a
    mismatch, and every finding of an arm not at parity keep their own fix."""
    from rlparity.diagnose.objective import FIX_BACKEND_FIRST, FIX_UPDATE

    ev = _evidence(D, R, trainer_attrs={"self_check": _self_check(0.004)})
    parity = Finding(Layer.INFERENCE_PATH, "gap_within_floor", Severity.INFO, "s", {}, arm="a")
    backend = "backend (log pi_old - log mu)"
    ess = Finding(Layer.OBJECTIVE, "ess_collapse", Severity.WARNING, "s", {"pair": backend}, FIX_BACKEND_FIRST,
                  arm="a")
    update = Finding(Layer.OBJECTIVE, "ess_collapse", Severity.ERROR, "s", {"pair": "update (log pi - log pi_old)"},
                     FIX_UPDATE, arm="a")
    hides = Finding(Layer.OBJECTIVE, "correction_hides_backend_mismatch", Severity.ERROR, "s",
                    {"pair": backend, "correction": "tis (cap 2)"}, FIX_BACKEND_FIRST, arm="a")
    out, rec = at.attribute([parity, ess, update, hides], ev)
    assert [(f.severity, f.fix) for f in out[1:]] == [(Severity.WARNING, at.FIX_AT_PARITY), (Severity.ERROR, FIX_UPDATE),
                                                     (Severity.ERROR, FIX_BACKEND_FIRST)]
    assert "gap_within_floor" in at.FIX_AT_PARITY and "truncated importance sampling" in at.FIX_AT_PARITY
    out, _ = at.attribute([ess, update], ev)
    assert [f.fix for f in out] == [FIX_BACKEND_FIRST, FIX_UPDATE]


def test_attribute_of_an_arm_without_excess_gives_every_cause_no_share():
    """Trainer and rollout agree on every token (d = r = 0): the excess is 0, every share 0.0 (no division by
    it) and the headline is the first problem in layer order."""
    z = np.zeros((3, 4))
    ev = _evidence(z, z)
    out, rec = at.attribute([_f("rollout_bf16_head", Severity.ERROR), _f("trainer_temperature", layer=Layer.SEMANTIC)],
                            ev)
    assert rec["decomposition"]["excess_mean_abs_d"] == 0.0
    assert rec["shares"] == {"rollout_bf16_head": 0.0, "trainer_temperature": 0.0}
    assert [f.share for f in out] == [0.0, 0.0] and rec["headline"] == "found_trainer_temperature"



def test_zero_probability_and_boundary_flips_are_explained_by_the_cause_the_rules_name():
    """Probability-0 tokens outside every claim: without a trainer_cut_differs finding, a sampling penalty (first)
    or a noisy trainer explains them; beside one, only a trainer top-k named does. Boundary flips: a head cause
    (whether or not a cut differs). Nothing else is demoted by a covering claim."""
    ev = _evidence(D, R, trainer_attrs={"self_check": _self_check(0.004)})
    zp = _f("trainer_top_k", name="zero_probability_tokens", layer=Layer.SEMANTIC)
    cut = _f("trainer_top_k", name="trainer_cut_differs", layer=Layer.SEMANTIC)
    flips = _f("rollout_bf16_head", name="topk_boundary_flips")
    cases = [([zp, _f("trainer_dropout")], (Severity.INFO, "trainer_dropout")),
             ([zp, _f("trainer_dropout"), _f("sampling_penalty", layer=Layer.SEMANTIC)],
              (Severity.INFO, "sampling_penalty")),
             ([zp, cut, _f("trainer_dropout")], (Severity.INFO, "trainer_top_k")),  # top-k named by the cut
             ([zp.with_(cause="trainer_bf16_head"), cut.with_(cause="trainer_temperature"), _f("trainer_dropout")],
              (Severity.WARNING, None))]
    for findings, want in cases:
        out, _ = at.attribute(findings, ev)
        assert _sev(out)["zero_probability_tokens"] == want, [f.name for f in findings]
        why = {"trainer_dropout": "logits move from run to run", "sampling_penalty": "came from penalised logits",
               "trainer_top_k": "cuts another top-k/top-p set", None: "[explained"}[want[1]]
        assert (why in out[0].summary) == (want[1] is not None)
    for findings in ([flips], [flips, cut]):
        out, _ = at.attribute(findings, ev)
        assert _sev(out)["topk_boundary_flips"] == (Severity.INFO, "rollout_bf16_head")
    # probability-0 tokens covered by a stale cache: they (and only they) are explained by it
    d = D.copy()
    d[0, :3] = -np.inf
    ev = _evidence(d, np.where(np.isfinite(d), R, np.nan), claims={"stale_prefix_cache": STALE})
    out, _ = at.attribute([zp, flips.with_(cause="trainer_dropout"), _f("stale_prefix_cache", Severity.ERROR)], ev)
    assert _sev(out)["zero_probability_tokens"] == (Severity.INFO, "stale_prefix_cache")
    assert _sev(out)["topk_boundary_flips"] == (Severity.INFO, "trainer_dropout")


def test_a_correction_that_hides_the_backend_mismatch():
    """With no correction configured it is explained by the backend cause; with one configured it stays an
    error and names where the mismatch comes from."""
    ev = _evidence(D, R, trainer_attrs={"self_check": _self_check(0.004)})
    pair = "backend (log pi_old - log mu)"
    for correction, want in (("none", (Severity.INFO, "rollout_bf16_head")), ("tis (cap 2)", (Severity.ERROR, None))):
        hides = Finding(Layer.OBJECTIVE, "correction_hides_backend_mismatch", Severity.ERROR, "s",
                        {"pair": pair, "correction": correction}, arm="a")
        out, _ = at.attribute([hides, _f("rollout_bf16_head")], ev)
        got = {f.name: f for f in out}["correction_hides_backend_mismatch"]
        assert (got.severity, got.explained_by) == want
        assert got.evidence.get("comes_from") == (None if correction == "none" else ["rollout_bf16_head"])
    # a finding about another pair, or a path finding of the same name: never demoted by the backend
    other = Finding(Layer.OBJECTIVE, "ess_collapse", Severity.WARNING, "s", {"pair": "update (log pi - log pi_old)"},
                    arm="a")
    path = Finding(Layer.INFERENCE_PATH, "ess_collapse", Severity.WARNING, "s", {"pair": pair}, arm="a")
    for f in (other, path):
        out, _ = at.attribute([f, _f("rollout_bf16_head")], ev)
        assert (out[0].severity, out[0].explained_by) == (Severity.WARNING, None)


def test_set_shares_marks_what_each_finding_is():
    """Shares and token scopes go to verdicts with a cause only; a finding's own tokens are kept; a floor cause
    carries the floor's share of mean |d|, nothing else does; probability-0 tokens without a share are marked
    outside the sum of |d|."""
    ev = _evidence(D, R, {"stale_prefix_cache": STALE}, {"self_check": _self_check(0.004)})
    own = {"scope": "mine", "n_tokens": 3, "n_sequences": 1}
    findings = [_f("stale_prefix_cache", Severity.ERROR), _f("rollout_bf16_head").with_(tokens=own),
                _f("trainer_batch_variance"), _f("trainer_dropout", Severity.INFO), _f(None, name="no_cause_here"),
                _f("trainer_bf16_head", name="zero_probability_tokens", layer=Layer.SEMANTIC)]
    out, rec = at.attribute(findings, ev)
    got = {f.name: f for f in out}
    assert got["found_stale_prefix_cache"].tokens == {"scope": "stale_prefix_cache", "n_tokens": 20, "n_sequences": 2}
    assert got["found_rollout_bf16_head"].tokens == own and got["found_rollout_bf16_head"].share > 0
    assert got["found_trainer_dropout"].share is None and got["found_trainer_dropout"].tokens is None
    assert got["no_cause_here"].share is None and got["no_cause_here"].tokens is None
    floor = got["found_trainer_batch_variance"]
    assert floor.share == 0.0 and floor.evidence["floor_share_of_mean_abs_d"] == rec["floor_share_of_mean_abs_d"]
    assert rec["floor_share_of_mean_abs_d"] == pytest.approx(0.004 / np.abs(D).mean(), rel=1e-12)
    assert all("floor_share_of_mean_abs_d" not in f.evidence for n, f in got.items() if n != floor.name)
    zp = got["zero_probability_tokens"]
    assert zp.share == 0.0 and zp.evidence["outside_abs_d_sum"] is True
    assert all("outside_abs_d_sum" not in f.evidence for n, f in got.items() if n != zp.name)
    assert rec["also"] == ["found_rollout_bf16_head", "found_trainer_batch_variance", "no_cause_here",
                           "zero_probability_tokens"] and rec["headline"] == "found_stale_prefix_cache"


def test_headline_by_share_then_severity_then_layer_order():
    """The largest share heads (a WARNING over an ERROR); at equal share and severity the earlier layer
    (semantic, inference path, objective); a floor cause only alone; without any share, the first problem in
    layer order (not the most severe); a finding without a share counts as 0."""
    def f(cause, share, sev=Severity.WARNING, layer=Layer.INFERENCE_PATH, name=None):
        return _f(cause, sev, name=name, layer=layer).with_(share=share)

    assert at._headline([f("a", 0.2, Severity.ERROR), f("b", 0.5)]).cause == "b"
    assert at._headline([f("a", 0.5), f("b", 0.5, layer=Layer.SEMANTIC)]).cause == "b"
    assert at._headline([f("a", 0.5, layer=Layer.OBJECTIVE), f("b", 0.5)]).cause == "b"
    assert at._headline([f("a", 0.5), f("b", 0.5, Severity.ERROR)]).cause == "b"
    assert at._headline([f("trainer_batch_variance", 0.0), f("a", 0.0, Severity.INFO)]).cause == "trainer_batch_variance"
    assert at._headline([f("trainer_batch_variance", 0.9), f("a", 0.1)]).cause == "a"
    assert at._headline([f("a", 0.0, Severity.ERROR, Layer.OBJECTIVE), f("b", 0.0, layer=Layer.SEMANTIC)]).cause == "b"
    assert at._headline([f(None, None, name="x"), f("b", 0.6)]).cause == "b"
    assert at._headline([f("a", 0.9, Severity.INFO)]) is None


def test_attribute_of_a_small_arm_still_gives_shares():
    """An arm whose whole excess is 0.12 nats (twelve tokens at 0.01, floor 0): the global cause explains all."""
    d = np.full((3, 4), 0.01)
    out, rec = at.attribute([_f("rollout_bf16_head")], _evidence(d, d))
    assert rec["decomposition"]["excess_mean_abs_d"] == pytest.approx(0.01, rel=1e-12)
    assert rec["shares"] == {"rollout_bf16_head": pytest.approx(1.0, rel=1e-12)} and out[0].share == rec["shares"][
        "rollout_bf16_head"]


# ------------------------------------------------------------------------------ trainer floors
def _gap_trace(gap, bs_floor=None, engine_floor=None, run=None, kernel=None, **trainer_attrs):
    check = (_self_check(bs_floor, run_to_run_rms=run, kernel_mean_abs=kernel)
             if bs_floor is not None or run is not None or kernel is not None else None)
    attrs = {"engine_floor": {"batch_shape": {"mean_abs": engine_floor, "rms": engine_floor}}} if engine_floor else {}
    d = [[gap, -gap] * 4] * 4
    return _scored(d, trainer_attrs={"self_check": check, **trainer_attrs}, attrs=attrs)


@pytest.mark.parametrize("share, severity", [(0.3, Severity.WARNING), (0.2, Severity.INFO)])
def test_a_floor_warns_from_a_quarter_of_the_gap(share, severity):
    gap = 0.02  # above tol_trainer (1e-3 nats)
    tr = _gap_trace(gap, bs_floor=share * gap, engine_floor=share * gap)
    found = {f.name: f for f in trainer.floor_findings(tr)}
    for name, cause in (("trainer_not_batch_invariant", "trainer_batch_variance"),
                        ("engine_not_batch_invariant", "batch_variant_attention")):
        f = found[name]
        assert f.severity == severity and f.evidence["share_of_gap"] == pytest.approx(share, rel=1e-12)
        assert f.evidence["gap_mean_abs_d"] == pytest.approx(gap, rel=1e-12)
        assert f.cause == (cause if severity == Severity.WARNING else None)
    # a gap below tol_trainer never warns, whatever the share
    small = trainer.floor_findings(_gap_trace(5e-4, bs_floor=3e-4), tol=1e-3)
    assert [f.severity for f in small] == [Severity.INFO]
    # a nondeterministic trainer: no batch-shape finding (its own finding says it); no floor: nothing
    assert trainer.floor_findings(_gap_trace(gap, bs_floor=0.3 * gap, run=1e-3)) == []
    assert trainer.floor_findings(_gap_trace(gap)) == []


@pytest.mark.parametrize("trainer_share, engine_share, at_parity", [(0.9, 0.0, True), (0.5, 0.31, True),
                                                                      (0.5, 0.29, False), (0.79, 0.0, False),
                                                                      (0.801, 0.0, True)])
def test_an_arm_whose_gap_is_its_own_floor_is_at_parity_not_warned(trainer_share, engine_share, at_parity):
    """Issue 41: floors together at least PARITY_FLOOR_SHARE (0.8; held-out H100 matrices in its calibration
    record) of the gap -> gap_within_floor (information) and the floor findings are information; below it the floor warns as before."""
    gap = 0.02
    tr = _gap_trace(gap, bs_floor=trainer_share * gap, engine_floor=engine_share * gap or None)
    found = {f.name: f for f in trainer.floor_findings(tr)}
    if at_parity:
        f = found["gap_within_floor"]
        assert f.severity == Severity.INFO and f.cause is None
        assert f.evidence["floors_share_of_gap"] == pytest.approx(trainer_share + engine_share, rel=1e-12)
        assert f.evidence["gap_mean_abs_d"] == pytest.approx(gap, rel=1e-12)  # d = +-gap on every token
        assert all(x.severity == Severity.INFO for x in found.values())
    else:
        assert "gap_within_floor" not in found
        assert found["trainer_not_batch_invariant"].severity == Severity.WARNING
    # another cause named before this topic: never at parity; the floor still warns only where the floors do not
    # cover the gap (covered, it is the platform's floor beside that cause: held-out H100 seeds 15 and 16)
    named = trainer.floor_findings(tr, prior=[_f("stale_prefix_cache", Severity.WARNING)])
    assert "gap_within_floor" not in {f.name for f in named}
    assert {f.name: f.severity for f in named}["trainer_not_batch_invariant"] == (
        Severity.INFO if at_parity else Severity.WARNING)
    # a floor cause named before (information or warning) does not count as another cause
    assert ("gap_within_floor" in {f.name for f in trainer.floor_findings(
        tr, prior=[_f("batch_variant_attention", Severity.WARNING)])}) == at_parity
    # a trainer that does not repeat itself is never at parity; one whose second forward moved nothing is
    assert "gap_within_floor" not in {f.name for f in trainer.floor_findings(
        _gap_trace(gap, bs_floor=trainer_share * gap, run=1e-3))}
    assert ("gap_within_floor" in {f.name for f in trainer.floor_findings(
        _gap_trace(gap, bs_floor=trainer_share * gap, engine_floor=engine_share * gap or None, run=0.0))}) == at_parity
    # a second forward that moved nothing still measures the batch shape; a floor of exactly 0 (a
    # batch-invariant trainer) says nothing
    assert "trainer_not_batch_invariant" in {f.name for f in trainer.floor_findings(
        _gap_trace(gap, bs_floor=trainer_share * gap, run=0.0))}
    assert trainer.floor_findings(_gap_trace(gap, bs_floor=0.0)) == []
    # no gap at all: nothing to be at parity with, and no division by it
    assert "gap_within_floor" not in {f.name for f in trainer.floor_findings(_gap_trace(0.0, bs_floor=1e-3))}


@pytest.mark.parametrize("run_share, expected", [(0.2, Severity.WARNING), (0.05, None)])
def test_run_to_run_counts_from_a_tenth_of_the_background(run_share, expected):
    gap = 0.02
    tr = _gap_trace(gap, run=run_share * gap)
    ev = build(tr)
    # identity sampling: r = mu - trainer = -d, so the background RMS is the gap itself
    assert float(np.sqrt(np.mean(ev.residual[ev.finite_tokens] ** 2))) == pytest.approx(gap, rel=1e-12)
    f = trainer.trainer_determinism(tr, evidence=ev)
    if expected is None:
        assert f is None
    else:
        assert f.severity == expected and f.cause == "trainer_dropout"
        assert f.evidence["run_to_run_rms"] == pytest.approx(run_share * gap)
        assert f.evidence["background_rms"] == pytest.approx(gap, rel=1e-12)
    # train mode with dropout on is an error whatever the movement
    err = trainer.trainer_determinism(_gap_trace(gap, run=run_share * gap, training_mode=True, dropout=0.1))
    assert err.severity == Severity.ERROR and err.evidence["dropout"] == 0.1
    assert trainer.trainer_determinism(_gap_trace(gap, run=0.0)) is None
    assert trainer.trainer_determinism(_gap_trace(gap)) is None  # no self-check
    bare = _gap_trace(gap).drop_vars(["trainer_logprob", "trainer_processed_logprob"])
    assert trainer.trainer_determinism(bare) is None and trainer.floor_findings(bare) == []



def test_trainer_determinism_at_its_edges():
    """Train mode is an error only with a dropout above 0 (recorded); a run-to-run RMS of exactly a tenth of
    the background counts ("at least"); a second forward that moved nothing never counts, even against a
    background of 0; the summary gives the share of the background when there is one. Powers of two: the
    background RMS of d = +-0.5 is exactly 0.5 and a tenth of it exactly 0.05."""
    gap = 0.5
    for attrs in ({"training_mode": True, "dropout": 0.0}, {"training_mode": True},  # train mode, no dropout
                  {"training_mode": False, "dropout": 0.1}):  # dropout configured, eval mode
        assert trainer.trainer_determinism(_gap_trace(gap, run=0.0, **attrs)) is None
    f = trainer.trainer_determinism(_gap_trace(gap, run=0.1, training_mode=True))  # moving: a warning
    assert f.severity == Severity.WARNING and f.evidence["dropout"] == 0.0 and f.evidence["training_mode"] is True
    f = trainer.trainer_determinism(_gap_trace(gap, run=0.05))
    assert f.severity == Severity.WARNING and f.evidence["background_rms"] == 0.5
    assert "10% of the mismatch" in f.summary
    assert trainer.trainer_determinism(_gap_trace(gap, run=0.05 - 2 ** -20)) is None
    # a background of 0 (trainer and engine agree on every token): a second forward that moved nothing is
    # no finding, one that moved is, with no share to give
    assert trainer.trainer_determinism(_gap_trace(0.0, run=0.0)) is None
    f = trainer.trainer_determinism(_gap_trace(0.0, run=1e-3))
    assert f.severity == Severity.WARNING and f.evidence["background_rms"] == 0.0 and "%" not in f.summary


def test_parity_at_exactly_the_share_and_floors_not_finite():
    """Floors of exactly PARITY_FLOOR_SHARE (0.8) of the gap read at parity (0.4 of 0.5: exact in float64);
    a floor that is not finite is not measured (it neither counts toward parity nor warns)."""
    found = {f.name for f in trainer.floor_findings(_gap_trace(0.5, bs_floor=0.4))}
    assert "gap_within_floor" in found
    found = {f.name for f in trainer.floor_findings(_gap_trace(0.5, bs_floor=0.4 - 2 ** -20))}
    assert "gap_within_floor" not in found
    tr = _gap_trace(0.5, bs_floor=np.inf, engine_floor=0.25)
    found = {f.name: f for f in trainer.floor_findings(tr)}
    assert set(found) == {"engine_not_batch_invariant"} and found["engine_not_batch_invariant"].severity == \
        Severity.WARNING and found["engine_not_batch_invariant"].evidence["share_of_gap"] == 0.5



def test_a_floor_warns_at_exactly_a_quarter_of_a_gap_above_tol():
    """FLOOR_SHARE (0.25) is "at least": 0.125 of a gap of 0.5 warns; the gap must be above tol, not at it.
    Each finding's evidence names what its side's floor was measured with (the engine's attention backend, the
    trainer's batch shape)."""
    tr = _gap_trace(0.5, bs_floor=0.125, engine_floor=0.125, shape="padded")
    tr.attrs["engine_effective"] = {"attention_backend": "FLASH_ATTN"}
    found = {f.name: f for f in trainer.floor_findings(tr, tol=0.5 - 2 ** -20)}
    assert {n: f.severity for n, f in found.items()} == {"trainer_not_batch_invariant": Severity.WARNING,
                                                        "engine_not_batch_invariant": Severity.WARNING}
    assert found["trainer_not_batch_invariant"].evidence["share_of_gap"] == 0.25
    assert found["engine_not_batch_invariant"].evidence["attention_backend"] == "FLASH_ATTN"
    assert found["trainer_not_batch_invariant"].evidence["attention_backend"] == "padded"
    assert {f.severity for f in trainer.floor_findings(tr, tol=0.5)} == {Severity.INFO}  # a gap at tol: no warning
    below = _gap_trace(0.5, bs_floor=0.125 - 2 ** -20)
    assert [f.severity for f in trainer.floor_findings(below, tol=0.001)] == [Severity.INFO]


def test_the_callers_tol_trainer_reaches_the_floor_findings():
    """The trainer topic reads ``tol_trainer`` from the caller's options (``trace_findings(options=)`` and
    ``diagnose(data, options)``), not the defaults: a gap of 0.02 nats with a trainer floor at 30% of it warns
    under the default tolerance (1e-3 nats) and is information once the caller's tolerance is above the gap."""
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.options import DiagnoseOptions

    gap = 0.02
    tr = _gap_trace(gap, bs_floor=0.3 * gap)
    wide = DiagnoseOptions(tol_trainer=0.05)

    def severity(findings):
        return {f.severity for f in findings if f.name == "trainer_not_batch_invariant"}

    assert severity(trainer.trace_findings(tr)) == {Severity.WARNING}
    assert severity(trainer.trace_findings(tr, options=wide)) == {Severity.INFO}
    assert severity(diagnose({"a": tr})) == {Severity.WARNING}
    assert severity(diagnose({"a": tr}, wide)) == {Severity.INFO}
    assert severity(diagnose({"a": tr}, tol_trainer=0.05)) == {Severity.INFO}


# ------------------------------------------------------------------------------ localized test
def _loc(claimed_vals, free_vals):
    c, f = np.asarray(claimed_vals, float), np.asarray(free_vals, float)
    r = np.concatenate([c, f])[None, :]
    claim = np.zeros(r.shape, dtype=bool)
    claim[0, :c.size] = True
    ev = _evidence(r, r, {"kv_carried_over": claim})
    return ev, c, f


def _hand_se(c, f):
    return np.sqrt(c.var(ddof=1) / c.size + f.var(ddof=1) / f.size)


def test_localized_test_measures_by_ratio_alone():
    # claimed tokens at 5x the background; the excess far below tol, so only the ratio can measure it
    ev, c, f = _loc([0.05, 0.06, 0.04, 0.05], [0.01, 0.011, 0.009, 0.01, 0.012, 0.008])
    t = ev.localized_test("kv_carried_over", ratio=3.0, tol=10.0)
    assert t["ratio"] == pytest.approx(c.mean() / f.mean(), rel=1e-12) and t["ratio"] > 3
    assert t["excess"] == pytest.approx(c.mean() - f.mean(), rel=1e-12)
    assert t["excess_se"] == pytest.approx(_hand_se(c, f), rel=1e-12)
    assert t["verdict"] == "measured"
    # the same tokens against a ratio they do not reach: the excess is far below tol -> "small"
    assert ev.localized_test("kv_carried_over", ratio=6.0, tol=10.0)["verdict"] == "small"
    # a background of exactly 0: an infinite ratio measures
    ev0, _, _ = _loc([0.05, 0.06], [0.0, 0.0, 0.0])
    assert ev0.localized_test("kv_carried_over", ratio=3.0, tol=10.0)["verdict"] == "measured"


def test_localized_test_measures_by_excess_and_z():
    rng = np.random.default_rng(0)
    c = 0.12 + 0.01 * rng.standard_normal(40)
    f = 0.10 + 0.01 * rng.standard_normal(200)
    ev, c, f = _loc(c, f)
    se = _hand_se(c, f)
    z = (c.mean() - f.mean()) / se
    assert 4 < z and c.mean() / f.mean() < 1.5  # the ratio test alone would not measure it
    t = ev.localized_test("kv_carried_over", ratio=1.5, tol=0.005)
    assert t["z"] == pytest.approx(z, rel=1e-10) and t["verdict"] == "measured"
    # the excess above tol but not z standard errors: inconclusive; below tol with confidence: small
    assert ev.localized_test("kv_carried_over", ratio=1.5, tol=0.005, z=z + 1)["verdict"] == "inconclusive"
    assert ev.localized_test("kv_carried_over", ratio=1.5, tol=c.mean() - f.mean() + 2 * se + 1e-4)["verdict"] == \
        "small"
    assert ev.localized_test("stale_prefix_cache", ratio=1.5, tol=0.005) == {
        "n_tokens": 0, "n_background_tokens": 200, "verdict": "small"}



def test_localized_test_at_its_edges():
    """The default z (4: what every caller uses), the ratio reached exactly ("at least"), an excess plus two
    errors exactly at tol (not below it: inconclusive), a background of no tokens, an error of exactly 0.
    Values are powers of two, so every ratio and sum below is exact in float64."""
    # z = 4.5 by construction (the excess set to 4.5 hand-computed errors): measured at the default z, not at 5
    rng = np.random.default_rng(5)
    c0, f = 0.01 * rng.standard_normal(30), 0.10 + 0.01 * rng.standard_normal(120)
    se = _hand_se(c0, f)
    ev, c, f = _loc(f.mean() + 4.5 * se + (c0 - c0.mean()), f)
    t = ev.localized_test("kv_carried_over", ratio=10.0, tol=1e-6)
    assert t["z"] == pytest.approx(4.5, rel=1e-9) and t["verdict"] == "measured"
    assert ev.localized_test("kv_carried_over", ratio=10.0, tol=1e-6, z=5.0)["verdict"] == "inconclusive"
    # constant values: the error is 0; 0.5 over 0.25 is a ratio of exactly 2
    ev, _, _ = _loc([0.5] * 4, [0.25] * 4)
    t = ev.localized_test("kv_carried_over", ratio=2.0, tol=10.0)
    assert (t["ratio"], t["excess"], t["excess_se"], t["z"], t["verdict"]) == (2.0, 0.25, 0.0, np.inf, "measured")
    assert ev.localized_test("kv_carried_over", ratio=2.5, tol=10.0)["verdict"] == "small"
    # the excess (0.25, no error) exactly at tol is not below it with confidence, nor above it: inconclusive
    assert ev.localized_test("kv_carried_over", ratio=2.5, tol=0.25)["verdict"] == "inconclusive"
    assert ev.localized_test("kv_carried_over", ratio=2.5, tol=0.25 + 2 ** -10)["verdict"] == "small"
    assert ev.localized_test("kv_carried_over", ratio=2.5, tol=0.25 - 2 ** -10)["verdict"] == "measured"
    # equal constant values: no excess, no error: z is 0, the ratio 1
    ev, _, _ = _loc([0.25] * 4, [0.25] * 4)
    t = ev.localized_test("kv_carried_over", ratio=2.0, tol=0.125)
    assert (t["ratio"], t["excess"], t["z"], t["verdict"]) == (1.0, 0.0, 0.0, "small")
    # both sides exactly 0: no ratio (NaN), nothing measured
    ev, _, _ = _loc([0.0] * 3, [0.0] * 3)
    t = ev.localized_test("kv_carried_over", ratio=2.0, tol=0.125)
    assert np.isnan(t["ratio"]) and t["z"] == 0.0 and t["verdict"] == "small"
    # every token claimed: no background tokens, a background of 0 and an infinite ratio
    r = np.array([[0.0625, 0.125, 0.0625]])
    ev = _evidence(r, r, {"kv_carried_over": np.ones(r.shape, dtype=bool)})
    t = ev.localized_test("kv_carried_over", ratio=1000.0, tol=10.0)
    assert t["n_background_tokens"] == 0 and t["background_abs_residual_mean"] == 0.0
    assert t["ratio"] == np.inf and t["verdict"] == "measured"



@pytest.mark.parametrize("claimed, free, se", [
    ([0.5, 0.75], [0.25, 0.25], 0.125),  # var 1/32 over 2 tokens; a constant background adds nothing
    ([0.5, 0.75], [0.25], 0.125),  # one background token: no variance to add
    ([0.5], [0.25, 0.25], 0.5),  # one claimed token: its mean squared stands for its variance
    ([0.5, 0.75], [0.125, 0.375], np.sqrt(1 / 64 + 1 / 64))])  # two background tokens: var 1/32 over 2
def test_localized_test_error_by_hand(claimed, free, se):
    """The excess's standard error written out: var(claimed, ddof 1) / n + var(background, ddof 1) / n, a
    single claimed token counting its own mean squared, a single background token nothing."""
    ev, c, f = _loc(claimed, free)
    t = ev.localized_test("kv_carried_over", ratio=10.0, tol=10.0)
    excess = c.mean() - f.mean()
    assert t["excess_se"] == pytest.approx(se, rel=1e-12) and t["z"] == pytest.approx(excess / se, rel=1e-12)


def test_localized_test_z_and_confidence_bounds_exactly():
    """0.625 against 0.25: an excess of 0.375 with an error of exactly 0.125, z exactly 3."""
    ev, _, _ = _loc([0.5, 0.75], [0.25, 0.25])
    t = ev.localized_test("kv_carried_over", ratio=10.0, tol=0.25, z=3.0)
    assert (t["excess"], t["excess_se"], t["z"], t["verdict"]) == (0.375, 0.125, 3.0, "measured")  # z at least 3
    assert ev.localized_test("kv_carried_over", ratio=10.0, tol=0.25, z=3.0 + 2 ** -20)["verdict"] == "inconclusive"
    # below tol: small only when the excess plus two errors (0.625) is below it
    assert ev.localized_test("kv_carried_over", ratio=10.0, tol=0.5)["verdict"] == "inconclusive"
    assert ev.localized_test("kv_carried_over", ratio=10.0, tol=0.625 + 2 ** -10)["verdict"] == "small"


# ------------------------------------------------------------------------------ version excess
def _two_versions(v0_scale, v1_scale, *, n=8, width=12, seed=3, self_checks=None, trainer_sums=None,
                  engine_sums=None, fresh_only=False):
    """Half the sequences span the update (v0 then v1), half are fresh at v1 (``fresh_only``: none
    span, as under a wait-mode update); |d| ~ scale per version."""
    rng = np.random.default_rng(seed)
    versions, d = [], []
    for i in range(n):
        if i < n // 2:
            v = [0] * width if fresh_only else [0] * (width // 2) + [1] * (width - width // 2)
        else:
            v = [1] * width
        versions.append(v)
        d.append([(v0_scale if x == 0 else v1_scale) * (1 + 0.3 * rng.standard_normal()) for x in v])
    ta = {"scored_by": "policy_version"}
    if self_checks is not None:
        ta["self_check_per_version"] = {str(k): _self_check(v) for k, v in self_checks.items()}
    if trainer_sums is not None:
        ta["weight_checksums_per_version"] = trainer_sums
    attrs = {"engine_weight_checksums": engine_sums} if engine_sums is not None else {}
    return _scored(d, versions=versions, trainer_attrs=ta, attrs=attrs)


def _by_version(tr):
    """|d| per version on the tokens no update record explains: the v1 tokens of a sequence that
    spans the update sat on KV of v0 (kv_carried_over), so they are left out."""
    a = np.abs(tr["trainer_processed_logprob"].values - tr["rollout_logprob"].values)
    pv, m = tr["policy_version"].values, tr["response_mask"].values
    spans = ((pv == 0) & m).any(axis=1)[:, None] & (pv == 1)
    return {v: a[(pv == v) & m & ~spans] for v in (0, 1)}, spans


def _log_over_floors(m1, m0, fl, mean0=None):
    """log of version 1's median over what its floor predicts: the plain log-ratio of the medians less
    the log of the ratio the floors predict, (c + floor 1) / (c + floor 0), with c version 0's mean |r|
    (the floors' own statistic) above its floor; without floors the plain log-ratio of the medians."""
    if fl is None:
        return np.log(m1 / m0)
    c = max(mean0 - fl[0], 0.0)
    return np.log(m1 / m0) - np.log((c + fl[1]) / (c + fl[0]))


def _version_reference(tr, floors=None):
    """Issue 41's per-version statistic written out by hand: median |r| per version against what its own
    floor predicts (version 0's excess over its floor plus its own floor), the log-ratio of version 1's
    to version 0's (the first), and its delete-a-group jackknife error over sequences (sequence i in
    group i mod 20, Quenouille-Tukey), on the tokens no update record explains."""
    a, spans = _by_version(tr)
    fl = floors
    lr = _log_over_floors(np.median(a[1]), np.median(a[0]), fl, np.mean(a[0]))
    absd = np.abs(tr["trainer_processed_logprob"].values - tr["rollout_logprob"].values)
    pv, m = tr["policy_version"].values, tr["response_mask"].values & ~spans
    seqs = [i for i in range(m.shape[0]) if m[i].any()]
    k = min(20, len(seqs))
    est = []
    for g in range(k):
        keep = np.array([i in seqs and seqs.index(i) % k != g for i in range(m.shape[0])])[:, None] & m
        est.append(_log_over_floors(np.median(absd[keep & (pv == 1)]), np.median(absd[keep & (pv == 0)]), fl,
                                    np.mean(absd[keep & (pv == 0)])))
    est = np.array(est)
    se = np.sqrt((k - 1) / k * np.sum((est - est.mean()) ** 2))
    return a, float(np.exp(lr)), float(lr / se)


def test_version_excess_flags_the_later_version_that_stands_out():
    tr = _two_versions(0.01, 0.1)
    ev = build(tr)
    ve = ev.version_excess
    a, ratio, z = _version_reference(tr)
    _, spans = _by_version(tr)
    assert np.array_equal(ev.claims["kv_carried_over"], spans)
    assert ve["abs_residual_median_by_version"] == {str(v): pytest.approx(np.median(a[v]), rel=1e-12) for v in (0, 1)}
    assert ve["abs_residual_mean_by_version"] == {str(v): pytest.approx(a[v].mean(), rel=1e-12) for v in (0, 1)}
    assert ve["reference_version"] == 0 and ve["version_1_over_reference"] == pytest.approx(ratio, rel=1e-12)
    assert ve["z_by_version"]["1"] == pytest.approx(z, rel=1e-9)
    n1 = int((tr["policy_version"].values == 1).sum())
    assert ve["flagged"] == [1] and ev.claims["weights_differ"].sum() == n1
    (f,) = sync.weight_sync(tr, evidence=ev)
    assert (f.name, f.severity, f.cause) == ("weights_differ_at_version", Severity.WARNING, "weights_differ")
    assert f.tokens["n_tokens"] == n1
    # 1.3x: below the ratio (defaults().version_ratio = 1.6); one version only, or scored with one weight set: no test
    assert build(_two_versions(0.01, 0.013)).version_excess["flagged"] == []
    assert evm.version_claims(build(_scored([[0.1] * 6] * 2)), thresholds=mv.VersionThresholds(ratio=3.0)) == {}
    one_set = _two_versions(0.01, 0.1)
    one_set.attrs["trainer"]["scored_by"] = None
    assert "weights_differ" not in build(one_set).claims


def test_only_versions_after_the_first_are_claimed():
    """Both sides load the first version from one checkpoint: a first version that stands above the
    later ones (the H200 clean arms: 2x) is a property of its numerics, never a weight mismatch."""
    tr = _two_versions(0.1, 0.01)
    ve = build(tr).version_excess
    assert ve["reference_version"] == 0 and ve["version_1_over_reference"] < 0.2
    assert ve["flagged"] == [] and sync.weight_sync(tr) == []


def test_version_excess_at_its_edges():
    """Four tokens make a version's median; four sequences make its error; one weight set or no residual: no
    test at all."""
    def ve_of(d, vs):
        ev = build(_scored(d, versions=vs, trainer_attrs={"scored_by": "policy_version"}))
        ev.claims.pop("weights_differ", None)  # the defaults may have claimed it: test the rule itself
        return evm.version_claims(ev)

    ve = ve_of([[0.01] * 6, [0.012] * 6, [0.05] * 6, [0.06] * 4], [[0] * 6, [0] * 6, [1] * 6, [1] * 4])
    assert ve["n_tokens_by_version"] == {"0": 12, "1": 10} and np.isfinite(ve["z_by_version"]["1"])
    # version 1 has three tokens: no median to compare
    assert ve_of([[0.01] * 6, [0.012] * 6, [0.05] * 3 + [0.01] * 3], [[0] * 6, [0] * 6, [1] * 3 + [0] * 3]) == {}
    ve = ve_of([[0.01] * 6, [0.012] * 6, [0.05] * 4 + [0.01] * 2], [[0] * 6, [0] * 6, [1] * 4 + [0] * 2])
    assert ve["n_tokens_by_version"]["1"] == 4 and not np.isfinite(ve["z_by_version"]["1"])  # 3 sequences
    one_set = _two_versions(0.01, 0.1)
    one_set.attrs["trainer"]["scored_by"] = None
    assert evm.version_claims(build(one_set)) == {}
    ev = build(_two_versions(0.01, 0.1))
    ev.claims.pop("weights_differ", None)
    ev.residual = None
    assert evm.version_claims(ev) == {}


def test_a_trainer_that_does_not_repeat_itself_leaves_the_versions_untested():
    """Dropout moves every version's residual by the trainer's own noise: with run-to-run noise a quarter of
    the first version's median |r| or more, no version is claimed (CPU stability runs: 7 of 10 false claims)."""
    tr = _two_versions(0.01, 0.1)
    a, _ = _by_version(tr)
    med0 = float(np.median(a[0]))
    noisy = _two_versions(0.01, 0.1, self_checks={0: None})
    noisy.attrs["trainer"]["self_check"] = _self_check(run_to_run_rms=0.25 * med0 * 1.01)
    ve = build(noisy).version_excess
    assert ve["flagged"] == [] and "run-to-run" in ve["untestable"]
    quiet = _two_versions(0.01, 0.1)
    quiet.attrs["trainer"]["self_check"] = _self_check(run_to_run_rms=0.25 * med0 * 0.99)
    assert build(quiet).version_excess["flagged"] == [1]


def test_version_excess_needs_z_standard_errors_over_sequences_too():
    """10x on version 1, but carried by one sequence of the eight: the ratio is reached, the jackknife
    over sequences does not let it through; at a z just under the measured one it does."""
    rng = np.random.default_rng(7)
    d = [[0.01 * (1 + 0.3 * rng.standard_normal()) for _ in range(8)] for _ in range(8)]
    versions = [[0] * 8 for _ in range(4)] + [[1] * 8 for _ in range(4)]
    for i in (5, 6, 7):  # version 1's other sequences sit at version 0's level
        d[i] = [0.01 * (1 + 0.3 * rng.standard_normal()) for _ in range(8)]
    d[4] = [1.0] * 8
    tr = _scored(d, versions=versions, trainer_attrs={"scored_by": "policy_version"})
    a = np.abs(np.array(d))
    med = {v: np.median(a[np.array(versions) == v]) for v in (0, 1)}
    assert med[1] / med[0] < 1.6  # the median holds: one sequence of four does not move it
    d[5] = d[6] = [1.0] * 8  # three of four sequences of version 1 at 100x: the median moves
    tr = _scored(d, versions=versions, trainer_attrs={"scored_by": "policy_version"})
    ve = build(tr).version_excess
    assert ve["version_1_over_reference"] > 1.6
    z = ve["z_by_version"]["1"]
    assert np.isfinite(z)
    for zz, flagged in ((z + 0.1, []), (z - 0.1, [1])):
        ev = build(tr)
        ev.claims.pop("weights_differ", None)  # the defaults flagged it already: test again at another z
        # the median's z alone: the logit statistic and the upper quartile (three sequences of four at 100x) barred
        median_only = mv.VersionThresholds(z=zz, logit_ratio=np.inf, quartile_ratio=np.inf)
        assert evm.version_claims(ev, thresholds=median_only)["flagged"] == flagged
    # fewer sequences than defaults().min_fit_sequences (4): no claim, whatever the ratio
    few = _scored([[0.01] * 8, [0.011] * 8, [1.0] * 8], versions=[[0] * 8, [0] * 8, [1] * 8],
                  trainer_attrs={"scored_by": "policy_version"})
    ve = build(few).version_excess
    assert ve["version_1_over_reference"] > 50 and ve["flagged"] == [] and not np.isfinite(ve["z_by_version"]["1"])


# ------------------------------------------------------------------------------ checksums
def test_compare_checksums_by_hand():
    eng = {"a": "1", "b": "2", "lm_head.weight": "9", "only_e": "7"}
    trn = {"a": "1", "b": "3", "model.embed_tokens.weight": "9", "c": "4"}
    cmp = compare_checksums(eng, trn)
    # lm_head / embed_tokens: tied, present on one side each -> neither missing nor extra
    assert cmp == {"n_compared": 2, "differ": ["b"], "missing_in_engine": ["c"], "only_in_engine": ["only_e"],
                   "not_finite": [], "equal": False}
    assert compare_checksums({"a": "1", "x": "0"}, {"a": "1"})["equal"]  # extra engine tensors: still equal
    assert not compare_checksums({"a": "1"}, {"a": "1", "lm_head.weight": "9"})["equal"]  # untied: missing


def test_a_tensor_with_nan_or_inf_is_never_equal_even_to_itself():
    """Checksums of tensors holding NaN or infinities carry NOT_FINITE: the same string on both sides is
    not comparable (a NaN is equal to nothing), so the tensor is listed under not_finite and never equal."""
    from rlparity.trace.weights import NOT_FINITE, tensors_not_equal

    bad = NOT_FINITE + "0000abcd"
    for eng, trn in (({"a": "1", "w": bad}, {"a": "1", "w": bad}), ({"a": "1", "w": bad}, {"a": "1", "w": "ab"}),
                     ({"a": "1", "w": "ab"}, {"a": "1", "w": bad})):
        cmp = compare_checksums(eng, trn)
        assert cmp == {"n_compared": 2, "differ": [], "missing_in_engine": [], "only_in_engine": [],
                       "not_finite": ["w"], "equal": False}
        assert tensors_not_equal(cmp) == ["w"]
    # an engine holding NaN in a tensor at a version: that version differs, and no other version equals it
    attrs = {"engine_weight_checksums": {"0": {"w": "00"}, "1": {"w": bad}},
             "trainer": {"weight_checksums_per_version": {"0": {"w": "00"}, "1": {"w": bad}}}}
    out = versions_that_differ(attrs, [0, 1])
    assert list(out) == [1] and out[1]["not_finite"] == ["w"] and out[1]["same_as"] == []


V0 = {"model.layers.0.w": "00", "model.layers.1.w": "01", "lm_head.weight": "0h"}
V1 = {"model.layers.0.w": "10", "model.layers.1.w": "11", "lm_head.weight": "1h"}


def test_versions_that_differ_reads_the_engine_loads_in_order():
    partial = {k: v for k, v in V1.items() if ".layers.1." not in k}  # the update left layer 1 out
    attrs = {"engine_weight_checksums": {"0": V0, "1": partial},
             "trainer": {"weight_checksums_per_version": {"0": V0, "1": V1}}}
    assert engine_effective(attrs)[1] == {**V1, "model.layers.1.w": "01"}  # layer 1 keeps v0's values
    out = versions_that_differ(attrs, [0, 1])
    assert list(out) == [1] and out[1]["differ"] == ["model.layers.1.w"] and out[1]["same_as"] == []
    # the trainer scored version 1 with version 0's weights: same_as names it
    stale = {"engine_weight_checksums": {"0": V0, "1": V1}, "trainer": {"weight_checksums_per_version": {"0": V0,
                                                                                                            "1": V0}}}
    assert versions_that_differ(stale, [0, 1])[1]["same_as"] == [0]
    # one fingerprint covers a trace only when it holds one version
    assert trainer_checksums({"trainer": {"weight_checksums": V0}}, [0]) == {0: V0}
    assert trainer_checksums({"trainer": {"weight_checksums": V0}}, [0, 1]) == {}
    assert versions_that_differ({"engine_weight_checksums": {"0": V0}}, [0]) == {}


def test_weight_sync_names_the_side_from_the_fingerprints():
    partial = {k: v for k, v in V1.items() if ".layers.1." not in k}
    tr = _two_versions(0.01, 0.1, engine_sums={"0": V0, "1": partial}, trainer_sums={"0": V0, "1": V1})
    ev = build(tr)
    assert ev.version_excess == {}  # the fingerprints already name the version
    (f,) = sync.weight_sync(tr, evidence=ev)
    assert (f.name, f.severity, f.cause) == ("engine_weights_differ", Severity.ERROR, "partial_weight_sync")
    assert f.evidence["tensors"] == ["model.layers.1.w"] and f.evidence["layers"] == [1]
    assert f.evidence["n_tensors_compared"] == 3
    tr = _two_versions(0.01, 0.1, engine_sums={"0": V0, "1": V1}, trainer_sums={"0": V0, "1": V0})
    (f,) = sync.weight_sync(tr)
    assert (f.name, f.cause, f.evidence["trainer_weights_equal_engine_version"]) == (
        "trainer_weights_stale", "trainer_stale_weights", 0)
    assert sync.weight_sync(tr.drop_vars(["trainer_logprob", "trainer_processed_logprob"])) == []
    assert sync.trace_findings(_two_versions(0.01, 0.011)) == []
    # an unscored trace: the topic builds no evidence (that would refuse: no trainer side) and finds nothing
    assert sync.trace_findings(tr.drop_vars(["trainer_logprob", "trainer_processed_logprob"])) == []


# ------------------------------------------------------------------------------ issue 41: a higher floor is no sync fault
@pytest.mark.parametrize("fresh_only", [False, True], ids=["keep", "wait"])
def test_a_version_with_a_higher_floor_is_not_a_weight_mismatch(fresh_only):
    """Version 1's weights give a 5x higher numeric floor (its self-check says so) and 5x the
    residual on every token, fresh or spanning the update: no ``weights_differ_at_version``."""
    from rlparity.diagnose import diagnose
    from rlparity.metrics.floors import version_floors

    tr = _two_versions(0.01, 0.05, self_checks={0: 0.008, 1: 0.04}, fresh_only=fresh_only)
    assert version_floors(tr) == {0: 0.008, 1: 0.04}
    a, ratio, _ = _version_reference(tr, {0: 0.008, 1: 0.04})
    ev = build(tr)
    ve = ev.version_excess
    assert np.median(a[1]) / np.median(a[0]) > 3  # against the first version alone, it would be flagged
    assert ve["measured_against"] == "each version's own floor" and ve["flagged"] == []
    assert ve["version_1_over_reference"] == pytest.approx(ratio, rel=1e-12) and ratio < 1.5
    assert "weights_differ" not in ev.claims and sync.weight_sync(tr, evidence=ev) == []
    assert "weights_differ_at_version" not in {f.name for f in diagnose({"a": tr})}
    # without the per-version floors the numbers cannot tell: the old comparison stands
    bare = _two_versions(0.01, 0.05, fresh_only=fresh_only)
    assert build(bare).version_excess["flagged"] == [1]
    # fingerprints recorded on both sides and equal: the weights were the same, whatever the numbers
    same = _two_versions(0.01, 0.05, fresh_only=fresh_only, engine_sums={"0": V0, "1": V1},
                         trainer_sums={"0": V0, "1": V1})
    ve = build(same).version_excess
    assert ve["flagged"] == [] and ve["fingerprints_equal"] == [0, 1] and sync.weight_sync(same) == []


@pytest.mark.parametrize("fresh_only", [False, True], ids=["keep", "wait"])
def test_a_real_partial_sync_is_still_named(fresh_only):
    """The engine kept version 0's values of one layer: version 1's tokens carry 10x the residual
    everywhere while the trainer's own floor barely moves; flagged by the numbers, and named
    engine_weights_differ when the checksums were recorded."""
    from rlparity.diagnose import diagnose

    tr = _two_versions(0.01, 0.1, self_checks={0: 0.008, 1: 0.009}, fresh_only=fresh_only)
    a, ratio, z = _version_reference(tr, {0: 0.008, 1: 0.009})
    ve = build(tr).version_excess
    assert ve["flagged"] == [1]
    assert ve["version_1_over_reference"] == pytest.approx(ratio, rel=1e-12)
    c = np.mean(a[0]) - 0.008  # version 0's mean above its floor, kept at version 1
    assert ratio == pytest.approx(np.median(a[1]) / np.median(a[0]) * (c + 0.008) / (c + 0.009), rel=1e-12)
    assert ve["z_by_version"]["1"] == pytest.approx(z, rel=1e-9)
    (f,) = sync.weight_sync(tr)
    assert f.name == "weights_differ_at_version" and "over its own floor" in f.summary
    assert "weights_differ_at_version" in {g.name for g in diagnose({"a": tr})}
    # a higher floor at version 1 does not hide an excess far above it
    assert build(_two_versions(0.01, 0.2, self_checks={0: 0.008, 1: 0.02}, fresh_only=fresh_only)
                 ).version_excess["flagged"] == [1]
    partial = {k: v for k, v in V1.items() if ".layers.1." not in k}
    tr = _two_versions(0.01, 0.1, self_checks={0: 0.008, 1: 0.009}, fresh_only=fresh_only,
                       engine_sums={"0": V0, "1": partial}, trainer_sums={"0": V0, "1": V1})
    (f,) = sync.weight_sync(tr)
    assert (f.name, f.evidence["layers"]) == ("engine_weights_differ", [1])


# ------------------------------------------------------------------------------ issue 41: a sync the numbers cannot check
def _versions_trace(rows, *, scale=0.01, seed=5, trainer_attrs=None, attrs=None):
    """Rows of policy versions (one list a sequence), |d| ~ scale on every token, scored per version."""
    rng = np.random.default_rng(seed)
    d = [[scale * (1 + 0.3 * rng.standard_normal()) for _ in row] for row in rows]
    return _scored(d, versions=rows, trainer_attrs={"scored_by": "policy_version", **(trainer_attrs or {})}, attrs=attrs)


def _unchecked(tr):
    return [f for f in sync.weight_sync(tr) if f.name == "weights_unchecked_at_version"]


def test_a_version_every_token_of_which_another_cause_explains_is_said_unchecked():
    """Every sequence spans the update, so every version-1 token sat on version 0's KV (kv_carried_over
    claims them): no token is left to read version 1's weights by. Said, with the cause, as information."""
    span = [[0] * 6 + [1] * 6] * 8
    (f,) = _unchecked(_versions_trace(span))
    assert (f.severity, f.cause, f.evidence["versions"]) == (Severity.INFO, None, [1])
    assert "version 1 has 0 token(s) no other cause explains (kv_carried_over" in f.summary
    # two fresh sequences of version-1 tokens: 3 tokens are too few to read (MIN_VERSION_TOKENS = 4) ...
    (f,) = _unchecked(_versions_trace(span[:6] + [[1] * 2, [1] * 1]))
    assert "version 1 has 3 token(s)" in f.evidence["why"]
    # ... 4 are read (8 sequences hold the two versions' tokens): checked, nothing said
    assert mv.MIN_VERSION_TOKENS == 4 and _unchecked(_versions_trace(span[:6] + [[1] * 2, [1] * 2])) == []
    # 4 tokens in one sequence: leaving it out leaves none, so no standard error over sequences
    (f,) = _unchecked(_versions_trace(span[:7] + [[1] * 4]))
    assert "the tokens of version 1 no other cause explains sit in 1 sequence(s)" in f.evidence["why"]
    # the first version without free tokens leaves every later one unchecked
    tr = _versions_trace([[0] * 3 + [1] * 9] + [[1] * 12] * 7)
    (f,) = _unchecked(tr)
    assert f.evidence["versions"] == [1] and "version 0 has 3 token(s)" in f.evidence["why"]
    assert "standard error" not in f.evidence["why"]


def test_a_sync_unchecked_for_noise_or_too_few_sequences_is_said_and_a_checked_one_is_not():
    """The trainer's run-to-run noise above a quarter of version 0's median |r| leaves the test
    untestable; three sequences give no z (min_fit_sequences 4); fingerprints that agree, a trainer
    that scored with one weight set, or a version the numbers did test say nothing."""
    from rlparity.config.defaults import defaults

    rows = [[0] * 12] * 4 + [[1] * 12] * 4
    a, _ = _by_version(_versions_trace(rows))
    quarter = 0.25 * np.median(a[0])  # version 0's median |r| (the residual is -d here), a quarter of it
    (f,) = _unchecked(_versions_trace(rows, trainer_attrs={"self_check": _self_check(run_to_run_rms=1.01 * quarter)}))
    assert f"run-to-run noise ({1.01 * quarter:.3g} nats)" in f.summary
    # under a quarter: the test runs, nothing is said
    assert _unchecked(_versions_trace(rows, trainer_attrs={"self_check": _self_check(run_to_run_rms=0.99 * quarter)})) == []
    few = _versions_trace([[0] * 12, [0] * 12, [1] * 12])
    assert defaults().min_fit_sequences == 4
    (f,) = _unchecked(few)
    assert f.evidence["versions"] == [1] and "3 sequence(s) hold the tokens of version 1 and of version 0" in f.summary
    assert "(a standard error needs 4)" in f.summary
    assert _unchecked(_versions_trace([[0] * 12] * 2 + [[1] * 12] * 2)) == []  # 4 sequences: a z
    # 4 sequences, but version 1's tokens in one of them: leaving it out leaves none
    (f,) = _unchecked(_versions_trace([[0] * 12] * 3 + [[1] * 12]))
    assert "the tokens of version 1 no other cause explains sit in 1 sequence(s)" in f.evidence["why"]
    # a flagged version is checked: nothing unchecked beside it
    flagged = _two_versions(0.01, 0.1)
    assert build(flagged).version_excess["flagged"] == [1] and sync.sync_unchecked(flagged, build(flagged)) is None
    span = [[0] * 6 + [1] * 6] * 8
    same = _versions_trace(span, trainer_attrs={"weight_checksums_per_version": {"0": V0, "1": V1}},
                           attrs={"engine_weight_checksums": {"0": V0, "1": V1}})
    assert _unchecked(same) == []
    one_set = _versions_trace(span)
    one_set.attrs["trainer"]["scored_by"] = None
    assert _unchecked(one_set) == []
    assert _unchecked(_versions_trace([[0] * 12] * 8)) == []  # one version: nothing to check



def test_a_partial_sync_that_moves_few_tokens_far_is_flagged_by_the_mean():
    """A partial sync seen on the held-out H100 matrices: version 1's median |r| is version 0's, but two tokens of
    every version-1 sequence sit 40x higher. The median test cannot see it; the mean test (its ratio written out
    by hand here) flags it. The same trace without the far tokens is flagged by neither."""
    rng = np.random.default_rng(5)
    n, width = 24, 12
    versions = [[1] * width if i % 2 else [0] * width for i in range(n)]
    base = [[0.01 * (1 + 0.3 * rng.standard_normal()) for _ in range(width)] for _ in range(n)]
    far = [[x * (40 if versions[i][j] == 1 and j in (3, 8) else 1) for j, x in enumerate(row)]
           for i, row in enumerate(base)]
    ta = {"scored_by": "policy_version"}
    tr = _scored(far, versions=versions, trainer_attrs=ta)
    a, _ = _by_version(tr)
    ve = build(tr).version_excess
    assert np.median(a[1]) / np.median(a[0]) < 1.6  # the median alone: not flagged
    assert ve["version_1_over_reference"] == pytest.approx(np.median(a[1]) / np.median(a[0]), rel=1e-12)
    assert ve["mean_over_reference_by_version"]["1"] == pytest.approx(np.mean(a[1]) / np.mean(a[0]), rel=1e-12)
    assert ve["flagged"] == [1] and ve["flagged_by"] == {"1": ["mean"]}
    quiet = build(_scored(base, versions=versions, trainer_attrs=ta)).version_excess
    assert quiet["flagged"] == [] and quiet["mean_over_reference_by_version"]["1"] < 1.6


# ------------------------------------------------------------------------------ edges the mutation run found
def test_decomposition_edges_padding_infinite_tokens_and_empty_parts():
    # a ragged trace (padding) with one token the trainer gives probability 0 (d = -inf)
    d = [[0.1, -0.2, 0.3, -np.inf], [0.05, 0.02]]
    tr = _scored(d, trainer_attrs={"self_check": _self_check(0.01)})
    ev = build(tr)
    dec = at.decompose(ev)
    fin = np.array([0.1, -0.2, 0.3, 0.05, 0.02])
    assert dec.n_tokens == 5 and dec.total == pytest.approx(np.abs(fin).sum(), rel=1e-12)
    assert dec.background == pytest.approx(np.abs(fin).mean(), rel=1e-12)
    assert dec.semantic == pytest.approx(0.0, abs=1e-15)  # identity sampling: |r| = |d|
    assert dec.global_ == pytest.approx(5 * (np.abs(fin).mean() - 0.01), rel=1e-12)
    # a claim whose tokens sit below the background explains nothing (never a negative part)
    low = np.zeros(ev.mask.shape, dtype=bool)
    low[1, :2] = True
    ev.claim("stale_prefix_cache", low, "low")
    dec = at.decompose(ev)
    assert dec.localized == {"stale_prefix_cache": 0.0}
    assert dec.background == pytest.approx(np.abs([0.1, -0.2, 0.3]).mean(), rel=1e-12)
    # every token claimed: the background is 0
    ev.claim("kv_carried_over", ev.mask, "all")
    assert at.decompose(ev).background == 0.0
    # no tokens, no mismatch: no floor share; per-token values divide by max(N, 1)
    empty = at.Decomposition(0, 0.0, 0.01, 0.0, 2.0, 0.0, {"x": 4.0})
    assert empty.floor_share is None and at.Decomposition(10, 0.0, 0.01, 0.0, 0.0, 0.0).floor_share is None
    assert at.Decomposition(10, 0.5, 0.01, 0.0, 0.0, 0.0).floor_share == pytest.approx(0.01 / 0.05)
    assert empty.to_dict()["semantic_mean_abs"] == 2.0 and empty.to_dict()["localized_mean_abs"] == {"x": 4.0}
    per = at.Decomposition(4, 2.0, 0.01, 0.1, 0.4, 0.8, {"x": 1.2}).to_dict()
    assert per["excess_mean_abs_d"] == pytest.approx(0.6) and per["semantic_mean_abs"] == pytest.approx(0.1)
    assert per["localized_mean_abs"] == {"x": pytest.approx(0.3)}


def test_no_global_part_means_no_global_estimates():
    ev = _evidence(D, R, trainer_attrs={"self_check": _self_check(0.002)})
    zero = at.Decomposition(60, 1.0, 0.01, 0.0, 0.0, 0.0)
    assert at._global_estimates([_f("rollout_bf16_head")], ev, zero) == {}
    small = at.Decomposition(60, 1.0, 0.01, 0.0, 0.0, 0.5)  # half a nat in all: still split
    assert at._global_estimates([_f("rollout_bf16_head")], ev, small) == {"rollout_bf16_head": 0.5}
    assert at._global_estimates([_f("rollout_bf16_head", Severity.INFO)], ev, small) == {}


def test_engine_weights_differ_keeps_the_numbers_and_names_at_most_20_tensors():
    names = [f"model.layers.{i}.w" for i in range(25)]
    f = sync.engine_weights_differ({"differ": names, "missing_in_engine": [], "n_compared": 25}, 1,
                                   effect={"version_excess": {"flagged": [1]}})
    assert f.evidence["tensors"] == sorted(names)[:20] and f.evidence["n_tensors_differ"] == 25
    assert f.evidence["version_excess"] == {"flagged": [1]} and f.evidence["layers"] == list(range(25))
    assert "version_excess" not in sync.engine_weights_differ(
        {"differ": names[:1], "missing_in_engine": [], "n_compared": 1}, 1).evidence


def test_zero_probability_tokens_split_between_two_localized_causes_are_explained():
    """A stale cache and KV carried over an update may each hold some of the probability-0 tokens (held-out H100
    matrix, seed 1: one each, named the trainer's cut, a false alarm): together they cover them."""
    d = np.full((4, 6), 0.01)
    d[0, 1] = d[2, 3] = -np.inf
    stale = np.zeros(d.shape, bool)
    stale[0] = True
    carried = np.zeros(d.shape, bool)
    carried[2, 2:] = True
    ev = _evidence(d, np.where(np.isfinite(d), d, np.nan), claims={"stale_prefix_cache": stale,
                                                                   "kv_carried_over": carried})
    assert at._covering_claim(ev) in ("stale_prefix_cache", "kv_carried_over")
    carried[2, 3] = False  # one of two outside every claim: 50% < 90%
    ev = _evidence(d, np.where(np.isfinite(d), d, np.nan), claims={"stale_prefix_cache": stale,
                                                                   "kv_carried_over": carried})
    assert at._covering_claim(ev) is None


def test_covering_claim_names_the_cause_holding_most_and_needs_nine_in_ten():
    """Ten probability-0 tokens: a stale cache holding 7 and carried KV 2 cover 9 of 10 (0.9: "at least") and the
    stale cache is named, whatever the claims' order; with 8 of 10 covered nothing is."""
    d = np.full((2, 10), 0.01)
    d[0] = -np.inf
    r = np.where(np.isfinite(d), d, np.nan)
    big, small = np.zeros(d.shape, bool), np.zeros(d.shape, bool)
    big[0, :7] = True
    small[0, 7:9] = True
    for claims in ({"kv_carried_over": small, "stale_prefix_cache": big},
                   {"stale_prefix_cache": big, "kv_carried_over": small}):
        assert at._covering_claim(_evidence(d, r, claims=claims)) == "stale_prefix_cache"
    small[0, 8] = False
    assert at._covering_claim(_evidence(d, r, claims={"kv_carried_over": small, "stale_prefix_cache": big})) is None


def test_floor_excess_ratio_by_hand():
    """A later version is expected at the first version's level above its floor plus its own floor."""
    # c = 0.02 - 0.004 = 0.016; version 1 expected at 0.016 + 0.012 = 0.028; 0.05 / 0.028, version 0 at 1
    assert mv.floor_excess_ratio(0.05, 0.02, 0.012, 0.004) == pytest.approx(0.05 / 0.028, rel=1e-12)
    # all floor (c clipped at 0): the plain ratio over the floors, (0.05 / 0.04) / (0.01 / 0.02) = 2.5
    assert mv.floor_excess_ratio(0.05, 0.01, 0.04, 0.02) == pytest.approx(2.5, rel=1e-12)
    # level exactly as predicted: 1; equal floors: the plain ratio of the levels
    assert mv.floor_excess_ratio(0.028, 0.02, 0.012, 0.004) == pytest.approx(1.0, rel=1e-12)
    assert mv.floor_excess_ratio(0.03, 0.02, 0.005, 0.005) == pytest.approx(1.5, rel=1e-12)
    # c from the first version's mean (0.02 - 0.004 = 0.016) while the levels are medians (0.003 below the
    # floor): predicted (0.016 + 0.012) / (0.016 + 0.004) = 1.4, (0.009 / 0.003) / 1.4 = 15 / 7
    assert mv.floor_excess_ratio(0.009, 0.003, 0.012, 0.004, ref_mean=0.02) == pytest.approx(15 / 7, rel=1e-12)
    # a mean under its floor: c = 0, the plain ratio over the floors, (0.009 / 0.003) / 3 = 1
    assert mv.floor_excess_ratio(0.009, 0.003, 0.012, 0.004, ref_mean=0.0035) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("fresh_only", [False, True], ids=["keep", "wait"])
def test_a_higher_floor_far_below_the_residual_does_not_hide_a_partial_sync(fresh_only):
    """Issue 41, the H100 matrices: version 1's self-check floor 3x version 0's, both far below the
    residual (0.004 and 0.012 against 0.02), and version 1's residual 2.5x version 0's. Dividing by the
    floors reads 0.83x and misses it; against version 0's excess over its floor (read from its mean, the
    floors' statistic) plus version 1's floor it reads about 1.8x and is flagged (the hand reference)."""
    floors = {0: 0.004, 1: 0.012}
    tr = _two_versions(0.02, 0.05, self_checks=floors, fresh_only=fresh_only)
    a, ratio, z = _version_reference(tr, floors)
    m1, m0 = np.median(a[1]), np.median(a[0])
    assert (m1 / floors[1]) / (m0 / floors[0]) < 1.0  # over the floors alone: not seen
    c = np.mean(a[0]) - floors[0]
    assert ratio == pytest.approx(m1 / m0 * (c + floors[0]) / (c + floors[1]), rel=1e-12) and ratio > 1.6
    ve = build(tr).version_excess
    assert ve["version_1_over_reference"] == pytest.approx(ratio, rel=1e-12)
    assert ve["z_by_version"]["1"] == pytest.approx(z, rel=1e-9)
    assert ve["flagged"] == [1]
    # the same residuals with version 1's floor as high as its residual: all floor, not claimed
    tr = _two_versions(0.02, 0.05, self_checks={0: 0.004, 1: 0.05}, fresh_only=fresh_only)
    assert build(tr).version_excess["flagged"] == []


def test_an_excess_without_spread_is_infinitely_many_errors_above_zero():
    """Every version-1 token 10x every version-0 token: each delete-a-group jackknife ratio is the same,
    the error is 0, and the log-ratio (ln 10 > 0) is +inf errors above 0, flagged by the median too
    (before, 0/0 gave no z and only the mean's rounding noise flagged it)."""
    n, width = 8, 12
    versions, d = [], []
    for i in range(n):
        v = [0] * width if i < 2 else [0] * (width // 2) + [1] * (width - width // 2) if i < n // 2 else [1] * width
        versions.append(v)
        d.append([0.01 if x == 0 else 0.1 for x in v])
    ve = build(_scored(d, versions=versions, trainer_attrs={"scored_by": "policy_version"})).version_excess
    assert ve["version_1_over_reference"] == pytest.approx(10.0)
    assert ve["z_by_version"]["1"] == np.inf and "median" in ve["flagged_by"]["1"] and ve["flagged"] == [1]
    # the same with no excess: a ratio of exactly 1 has a log of 0 and no z, and nothing is flagged
    same = [[0.01] * len(v) for v in versions]
    ve = build(_scored(same, versions=versions, trainer_attrs={"scored_by": "policy_version"})).version_excess
    assert np.isnan(ve["z_by_version"]["1"]) and ve["flagged"] == []


# ------------------------------------------------------------------------------ issue 41: the version test at the logits
def _peaked_versions(v1_abs, *, p0=0.5, p1=0.95, v0_abs=0.01, n=8, width=10, seed=11):
    """Half the sequences at version 0, half at version 1 (none span: a wait-mode update). The trainer gives
    version 0's tokens probability ``p0`` and version 1's ``p1`` (more peaked); |d| ~ ``v0_abs`` / ``v1_abs``
    per version, alternating in sign; the rollout reads trainer - d."""
    rng = np.random.default_rng(seed)
    versions = [[0] * width if i < n // 2 else [1] * width for i in range(n)]
    d = np.array([[(v0_abs if x == 0 else v1_abs) * (1 + 0.3 * rng.standard_normal()) * (-1) ** j
                   for j, x in enumerate(row)] for row in versions])
    lp_trainer = np.array([[np.log(p0 if x == 0 else p1) for x in row] for row in versions])
    tr = from_rollouts(prompt_token_ids=[[1, 2, 3]] * n, token_ids=[[5] * width] * n,
                       rollout_logprobs=(lp_trainer - d).tolist(), policy_versions=versions, attrs={"arm": "a"})
    for var in ("trainer_logprob", "trainer_processed_logprob"):
        tr[var] = (("sequence", "position"), lp_trainer)
    tr.attrs["trainer"] = {"model": "m", "scored_by": "policy_version"}
    return tr, d, lp_trainer, np.array(versions)


def _logit_reference(d, lp_trainer, versions):
    """The logit statistic by hand: |r| / (1 - p), p the smaller of the two sides' probabilities; version 1's
    median over version 0's, and its delete-a-group jackknife (sequence i in group i mod 20) in z."""
    mu = lp_trainer - d
    q = 1.0 - np.exp(np.minimum(mu, lp_trainer))
    s = np.abs(d) / q

    def log_ratio(rows):
        return np.log(np.median(s[rows][versions[rows] == 1]) / np.median(s[rows][versions[rows] == 0]))

    n = d.shape[0]
    est = np.array([log_ratio(np.array([i for i in range(n) if i != g])) for g in range(n)])
    se = np.sqrt((n - 1) / n * np.sum((est - est.mean()) ** 2))
    lr = log_ratio(np.arange(n))
    return float(np.exp(lr)), float(lr / se)


def test_logit_scale_by_hand():
    """|r| / (1 - p) with p the smaller side's probability, 1 - p at least LOGIT_Q_MIN."""
    absr = np.array([0.01, 0.02, 0.5, 1e-9, np.nan])
    mu = np.log([0.5, 0.9, 0.3, 1.0, 0.5])
    matched = np.log([0.6, 0.8, 1.0, 1.0, 0.5])
    out = mv.logit_scale(absr, mu, matched)
    assert out[:4] == pytest.approx([0.01 / 0.5, 0.02 / 0.2, 0.5 / 0.7, 1e-9 / mv.LOGIT_Q_MIN], rel=1e-9)
    assert np.isnan(out[4])


def test_a_version_of_more_peaked_tokens_is_read_at_the_logits():
    """Version 1's tokens are peaked (p 0.95 against 0.5): the same logit disagreement moves their logprobs 10x
    less. A weight mismatch that quadruples the logit disagreement reads 0.4x in median |r| (not seen) and 4x at
    the logits (flagged by the logit statistic alone, its ratio and z the hand reference's); one that leaves the
    logit disagreement as it is reads 1x at the logits and 0.1x in |r|: not flagged."""
    tr, d, lp, versions = _peaked_versions(0.004)  # e = 0.004 / 0.05 = 0.08 at version 1, 0.01 / 0.5 = 0.02 at 0
    ratio, z = _logit_reference(d, lp, versions)
    ve = build(tr).version_excess
    assert ve["version_1_over_reference"] < 0.5 and ve["mean_over_reference_by_version"]["1"] < 0.5
    assert ve["logit_median_over_reference_by_version"]["1"] == pytest.approx(ratio, rel=1e-9)
    assert ve["logit_median_z_by_version"]["1"] == pytest.approx(z, rel=1e-9)
    assert ratio > 3 and z > 2.5 and ve["flagged"] == [1] and ve["flagged_by"] == {"1": ["logit_median"]}
    (f,) = sync.weight_sync(tr)
    assert f.name == "weights_differ_at_version" and "at the logits" in f.summary and f"{ratio:.3g}x" in f.summary
    # the same logit disagreement on both versions: nothing
    tr, d, lp, versions = _peaked_versions(0.001)
    ratio, _ = _logit_reference(d, lp, versions)
    ve = build(tr).version_excess
    assert ve["logit_median_over_reference_by_version"]["1"] == pytest.approx(ratio, rel=1e-9)
    assert 0.7 < ratio < 1.4 and ve["flagged"] == []


def test_the_logit_statistic_has_its_own_ratio():
    """defaults().version_logit_ratio, not version_ratio, gates the logit statistic: just above and below the
    measured ratio."""
    tr, d, lp, versions = _peaked_versions(0.004)
    ratio, _ = _logit_reference(d, lp, versions)
    for logit_ratio, flagged in ((ratio * 1.01, []), (ratio * 0.99, [1])):
        ev = build(tr)
        ev.claims.pop("weights_differ", None)
        assert evm.version_claims(ev, thresholds=mv.VersionThresholds(logit_ratio=logit_ratio))["flagged"] == flagged
        ev = build(tr)
        ev.claims.pop("weights_differ", None)  # version_ratio far below: the median still reads 0.4x, not flagged
        low = mv.VersionThresholds(ratio=1.01, logit_ratio=logit_ratio)
        assert evm.version_claims(ev, thresholds=low)["flagged"] == flagged


def test_the_logit_statistic_keeps_the_floor_model():
    """With per-version floors, the logit statistic's ratio is its plain ratio over the ratio the floors
    predict, (c + f1) / (c + f0) with c version 0's mean |r| above its floor: the same division as the
    median's (written out here in float64, not through floor_excess_ratio)."""
    tr, d, lp, versions = _peaked_versions(0.004)
    tr.attrs["trainer"]["self_check_per_version"] = {"0": _self_check(0.002), "1": _self_check(0.003)}
    mu = lp - d
    s = np.abs(d) / (1.0 - np.exp(np.minimum(mu, lp)))
    m = {v: np.median(np.abs(d)[versions == v]) for v in (0, 1)}
    sv = {v: np.median(s[versions == v]) for v in (0, 1)}
    c = max(float(np.mean(np.abs(d)[versions == 0])) - 0.002, 0.0)
    predicted = (c + 0.003) / (c + 0.002)
    ve = build(tr).version_excess
    assert ve["measured_against"] == "each version's own floor"
    assert ve["logit_median_over_reference_by_version"]["1"] == pytest.approx(sv[1] / sv[0] / predicted, rel=1e-9)
    assert ve["version_1_over_reference"] == pytest.approx(m[1] / m[0] / predicted, rel=1e-9)


@pytest.mark.parametrize("trainer_share, engine_share, kernel_share, at_parity", [
    (0.3, 0.12, 0.39, True), (0.3, 0.12, 0.37, False), (0.3, 0.0, 0.51, True), (0.3, 0.0, 0.49, False),
    (0.0, 0.0, 0.85, True), (0.4, 0.0, 0.41, True), (0.42, 0.0, 0.42, True),
    # a trainer batch floor above its own kernel floor (left padding without position ids): the kernel floor does
    # not count, however much the sum would be
    (0.5, 0.12, 0.2, False), (0.5, 0.0, 0.49, False), (0.79, 0.0, 0.5, False)])
def test_the_kernel_floor_counts_toward_parity(trainer_share, engine_share, kernel_share, at_parity):
    """Issue 41 (clean H100 arms read 33-63% floors): the self-check's kernel floor (the same sequences under a
    second attention implementation) is part of what the two sides' floors cover; the sum is checked by hand."""
    gap = 0.02
    tr = _gap_trace(gap, bs_floor=trainer_share * gap or None, engine_floor=engine_share * gap or None,
                    kernel=kernel_share * gap, run=0.0)
    found = {f.name: f for f in trainer.floor_findings(tr)}
    assert ("gap_within_floor" in found) == at_parity
    if at_parity:
        f = found["gap_within_floor"]
        assert f.evidence["floors_share_of_gap"] == pytest.approx(trainer_share + engine_share + kernel_share, rel=1e-12)
        assert f.evidence["kernel_floor_mean_abs"] == pytest.approx(kernel_share * gap, rel=1e-12)
        assert "the trainer's attention kernel against float32" in f.summary
        assert all(x.severity == Severity.INFO for x in found.values())
    elif trainer_share >= trainer.FLOOR_SHARE:
        assert found["trainer_not_batch_invariant"].severity == Severity.WARNING
    # the kernel floor alone is no finding of its own, and a trace without it reads as before
    assert not any("kernel" in name for name in found)
    before = {f.name for f in trainer.floor_findings(_gap_trace(gap, bs_floor=trainer_share * gap or None,
                                                                engine_floor=engine_share * gap or None, run=0.0))}
    assert ("gap_within_floor" in before) == (trainer_share + engine_share >= trainer.PARITY_FLOOR_SHARE
                                              and trainer_share + engine_share > 0)
