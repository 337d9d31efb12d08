"""Inflight weight updates: lag and the stale prefix-cache finding on traces built by hand; the
update path on a real AsyncLLM (weights loaded through the worker extension, per-token versions
true under keep / wait / abort, per-version rescoring); the offline engine between batches; and
notebook 04, which runs the whole matrix on two engines."""

import json

import numpy as np
import pytest

from rlparity.diagnose import diagnose
from rlparity.diagnose import inflight as di
from rlparity.metrics import core
from rlparity.metrics import inflight as mi
from rlparity.trace import from_rollouts, latest_version, with_factors

T_UPDATE = 10.0  # the synthetic update pauses at t=10 s and resumes at t=10.2 s


def _trace(versions, *, d=None, stale=None, cached=None, submit=None, attempts=None, arm="keep-noclear-prefix_on",
           reset=False, latest=None, finish=None, scored_by="policy_version"):
    """A trace with per-token ``versions``; ``d`` per token (trainer = rollout + d); update records."""
    n = len(versions)
    lp = [[-1.0] * len(v) for v in versions]
    tr = from_rollouts(prompt_token_ids=[[1] * 200] * n, token_ids=[[5] * len(v) for v in versions],
                       rollout_logprobs=lp, policy_versions=versions, finish_reasons=finish or ["length"] * n,
                       cached_prompt_tokens=cached if cached is not None else [0] * n,
                       attrs={"arm": arm, "weight_updates": [
                           {"version": 1, "mode": "keep", "clear_cache": reset, "cache_reset": reset,
                            "t_pause": T_UPDATE, "t_resume": T_UPDATE + 0.2, "pause_s": 0.2}]})
    if latest is not None:
        tr.attrs["latest_policy_version"] = latest
    w = tr.sizes["position"]
    tr["prefix_cache_stale"] = (("sequence",), np.array(stale if stale is not None else [False] * n))
    tr["submit_time"] = (("sequence",), np.array(submit if submit is not None else [0.0] * n, dtype=float))
    tr["attempt"] = (("sequence",), np.array(attempts if attempts is not None else [0] * n))
    times = np.full((n, w), np.nan)
    for i, v in enumerate(versions):
        times[i, :len(v)] = [T_UPDATE - 1 + 0.1 * j if x == 0 else T_UPDATE + 0.3 + 0.1 * j for j, x in enumerate(v)]
    tr["token_time"] = (("sequence", "position"), times)
    if d is not None:
        dd = np.full((n, w), np.nan)
        for i, row in enumerate(d):
            dd[i, :len(row)] = row
        for var in ("trainer_logprob", "trainer_processed_logprob"):
            tr[var] = (("sequence", "position"), -1.0 + dd)
        tr.attrs["trainer"] = {"model": "m", "scored_by": scored_by}
    return tr


def test_lag_per_token_and_sequence_as_pipelinerl_logs_it():
    tr = _trace([[0, 0, 1, 1], [1, 1], [0, 0, 0]])
    lg = mi.lag(tr)
    assert lg.attrs["latest_version"] == 1 == latest_version(tr)
    assert np.array_equal(np.nan_to_num(lg.values, nan=-9), [[1, 1, 0, 0], [0, 0, -9, -9], [1, 1, 1, -9]])
    per_seq = mi.lag_summary(tr, dim="position")
    assert per_seq["lag_max"].values.tolist() == [1, 0, 1]
    assert per_seq["lag_mean"].values.tolist() == pytest.approx([0.5, 0.0, 1.0])
    tot = mi.lag_summary(tr)
    assert float(tot["offpolicy_share"]) == pytest.approx(5 / 9) and float(tot["lag_mean"]) == pytest.approx(5 / 9)
    # the engine's version at the end of the capture is the latest, even if no token has it yet
    assert float(mi.lag_summary(tr, latest=3)["lag_max"]) == 3
    tr.attrs["latest_policy_version"] = 2
    assert float(mi.lag_summary(tr)["lag_mean"]) == pytest.approx((5 / 9) + 1)
    # the numpy core: NaN on padding, nothing averaged from it; an empty row is NaN
    lag = core.token_lag(np.array([[0, 1, -1], [-1, -1, -1]]), np.array([[1, 1, 0], [0, 0, 0]], bool), latest=1)
    s = core.lag_stats(lag, np.array([[1, 1, 0], [0, 0, 0]], bool), axis=-1)
    assert s["lag_mean"][0] == 0.5 and np.isnan(s["lag_mean"][1]) and s["n_tokens"].tolist() == [2, 0]
    h = mi.lag_histogram({"a": _trace([[0, 0, 1, 1], [1, 1], [0, 0, 0]])})
    assert h["n_tokens"].sel(arm="a").values.tolist() == [4, 5]
    assert h["n_sequences"].sel(arm="a").values.tolist() == [1, 2]  # by each sequence's oldest token


def _stale_arm(stale_d=0.3, floor=1e-5, reset=False):
    # 2 sequences in flight across the update (v0 then v1), 3 submitted after it with cache hits
    versions = [[0, 0, 1, 1], [0, 0, 0, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]]
    stale = [False, False, not reset, not reset, not reset]
    d = [[floor, -floor, 0.05, -0.05], [floor, floor, -floor, 0.05]] + [[stale_d if not reset else floor] * 3] * 3
    tr = _trace(versions, d=d, stale=stale, cached=[0, 0, 128, 128, 128], submit=[0, 0, 11, 11, 11], reset=reset,
                arm=mi.arm_name("keep", reset, True))
    return with_factors(tr, mode="keep", clear_cache=reset, prefix_caching=True)  # as inflight_matrix records them


def test_stale_prefix_cache_finding_states_the_effect_against_the_noise_floor():
    tr = _stale_arm()
    ev = mi.stale_evidence(tr)
    assert ev["n_stale_sequences"] == 3 and ev["stale_cached_prompt_share"] == pytest.approx(128 / 200)
    assert ev["stale_abs_log_ratio_mean"] == pytest.approx(0.3)
    # the floor: sequences without stale hits, tokens of the version that prefilled them (the v1
    # tokens of the kept requests sat on v0 KV and are not part of it)
    assert ev["floor_abs_log_ratio_mean"] == pytest.approx(1e-5)
    f = di.stale_prefix_cache(tr)
    assert f.name == "stale_prefix_cache_after_update" and f.severity.value == "error"
    assert f.layer.value == "inference_path" and "clear_cache=True" in f.fix and "enable_prefix_caching=False" in f.fix
    assert f.evidence["stale_over_floor"] == pytest.approx(3e4)
    # below the ratio: the hits may be on blocks written after the update -> a warning, not an error
    weak = di.stale_prefix_cache(_stale_arm(stale_d=2e-5), stale_ratio=3.0)
    assert weak.severity.value == "warning"
    # a reset cache: no stale hit, no finding
    assert di.stale_prefix_cache(_stale_arm(reset=True)) is None
    # unscored: the recorded hits alone are an error (the effect is not measured)
    bare = _stale_arm().drop_vars(["trainer_logprob", "trainer_processed_logprob"])
    bare.attrs.pop("trainer")
    f = di.stale_prefix_cache(bare)
    assert f.severity.value == "error" and "stale_abs_log_ratio_mean" not in f.evidence


def test_carried_kv_and_one_version_scoring_are_named():
    tr = _stale_arm()
    carried = mi.carried_tokens(tr)
    assert carried.sum() == 3 and carried[0].tolist()[:4] == [False, False, True, True]
    f = di.kv_carried_over(tr)
    assert f.severity.value == "warning" and f.evidence["carried_abs_residual_mean"] == pytest.approx(0.05)
    # an update that reset the cache recomputed the kept requests' KV: nothing carried
    assert mi.carried_tokens(_stale_arm(reset=True)).sum() == 0
    one = _trace([[0, 1]], d=[[0.0, 0.0]], scored_by=None)
    assert di.scored_at_one_version(one).name == "scored_at_one_version"
    assert di.scored_at_one_version(_trace([[0, 1]], d=[[0.0, 0.0]])) is None


def test_diagnose_names_the_stale_arms_of_a_matrix():
    arms = {mi.arm_name("keep", False, True): _stale_arm(), mi.arm_name("keep", True, True): _stale_arm(reset=True)}
    for a, tr in arms.items():
        tr.attrs["arm"] = a
    report = diagnose(arms)
    stale = {f.arm for f in report if f.name == "stale_prefix_cache_after_update"}
    assert stale == {"keep-noclear-prefix_on"}
    matrix = next(f for f in report if f.name == "inflight_stale_arms")
    assert matrix.evidence["stale_arms"] == ["keep-noclear-prefix_on"]
    ratio = matrix.evidence["keep-noclear-prefix_on_over_keep-clear-prefix_on"]
    assert ratio == pytest.approx(0.3 / 1e-5)
    table = mi.inflight_table(arms)
    assert table["n_stale_sequences"].values.tolist() == [3, 0]
    assert table["after_abs_log_ratio_mean"].sel(arm="keep-noclear-prefix_on") == pytest.approx(0.3)
    assert table["n_mixed_sequences"].values.tolist() == [2, 2]
    assert table["pause_s"].values.tolist() == [0.2, 0.2]
    gap = mi.gap_by_update_time(arms, edges=[-2, 0, 2])
    assert gap["n_tokens"].values.tolist() == [[5, 12], [5, 12]]  # v0 tokens before, v1 after
    assert gap["policy_version_mean"].values[:, 0].tolist() == [0, 0]
    lag_layer = [f for f in report if f.name == "policy_lag" and f.arm == "keep-noclear-prefix_on"]
    assert lag_layer and lag_layer[0].evidence["offpolicy_share"] == pytest.approx(5 / 17)
    # layer order: inflight findings come before the objective's
    layers = [f.layer.value for f in report]
    assert "objective" not in layers or layers.index("objective") > max(
        i for i, f in enumerate(report) if f.name.startswith(("stale_", "kv_", "policy_lag")))
    # the cell is the recorded factors, not the label: a relabelled arm keeps its cell
    relabelled = {"a": arms["keep-noclear-prefix_on"], "b": arms["keep-clear-prefix_on"]}
    assert mi.reset_ratios(mi.inflight_table(relabelled))["a"]["reset_arm"] == "b"
    assert not mi.is_inflight({"keep-fresh": _trace([[0, 1]], d=[[0.0, 0.0]])})
    with pytest.raises(ValueError, match="records no inflight cell"):
        mi.arm_cell(_trace([[0, 1]], d=[[0.0, 0.0]]), "keep-fresh")


def test_figures_draw_the_tables():
    from rlparity.plot import inflight as pi

    arms = {mi.arm_name("keep", False, True): _stale_arm(), mi.arm_name("keep", True, True): _stale_arm(reset=True)}
    table = mi.inflight_table(arms)
    fig = pi.plot_gap_by_update_time(mi.gap_by_update_time(arms, n_bins=4), table)
    assert len(fig.data) == 2 and fig.layout.yaxis.type == "log"
    assert len(pi.plot_lag_histogram(mi.lag_histogram(arms)).data) == 2
    assert len(pi.plot_inflight_bars(table).data) == 3


def test_the_default_context_is_lowered_to_a_shorter_model(tmp_path):
    """The inflight experiment (and every engine) on a model with max_position_embeddings below the
    default max_model_len 1024 gets the model's length; a longer model, a value the user chose, and
    a hub id (no local config) are left as they are (tests/test_engine.py starts such an engine)."""
    from rlparity.capture.engine_config import fit_to_model
    from rlparity.config.settings import EngineSettings
    from rlparity.experiments.inflight import base_settings

    def model(**cfg):
        d = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        return d

    assert fit_to_model(model(max_position_embeddings=512), base_settings()).max_model_len == 512
    assert fit_to_model(model(text_config={"max_position_embeddings": 300}), EngineSettings()).max_model_len == 300
    assert fit_to_model(model(max_position_embeddings=4096), base_settings()).max_model_len == 1024
    assert fit_to_model(model(max_position_embeddings=512), EngineSettings(max_model_len=2048)).max_model_len == 2048
    assert fit_to_model(model(max_position_embeddings=512), EngineSettings(max_model_len=None)).max_model_len is None
    assert fit_to_model("org/some-hub-model", EngineSettings()).max_model_len == 1024
    kept = base_settings()
    assert fit_to_model(model(), kept) is kept


def test_weight_sources_and_pause_arguments_are_checked(tmp_path, tiny_model):
    import torch

    from rlparity.capture.checkpoints import perturbed_checkpoint, resolve_source
    from rlparity.capture.weights import pause_call, versions_for

    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        resolve_source(tmp_path / "nope")
    with pytest.raises(TypeError, match="state dict"):
        resolve_source(42)
    path, cleanup, desc = resolve_source({"w": torch.ones(2, 2)})
    assert path.exists() and "1 tensors" in desc
    cleanup()
    assert not path.exists()

    async def new(*, mode="abort", wait_for_inflight_requests=None, clear_cache=True):  # vLLM 0.26
        pass

    async def old(*, wait_for_inflight_requests=False):  # before pause modes
        pass

    assert pause_call(new, "keep", False) == ({"mode": "keep", "clear_cache": False}, False)
    assert pause_call(old, "wait", True) == ({"wait_for_inflight_requests": True}, True)
    with pytest.raises(NotImplementedError, match="keep"):
        pause_call(old, "keep", False)
    assert versions_for(5, 0, [(2, 1), (4, 2)]) == [0, 0, 1, 1, 2]
    assert versions_for(3, 0, [(0, 1)]) == [1, 1, 1]
    v1 = perturbed_checkpoint(tiny_model, tmp_path / "v1", sigma=0.05)
    again = perturbed_checkpoint(tiny_model, tmp_path / "v1b", sigma=0.05)
    from safetensors.torch import load_file

    a, b = load_file(str(v1 / "model.safetensors")), load_file(str(again / "model.safetensors"))
    base = load_file(str(next(iter(sorted(__import__("pathlib").Path(tiny_model).glob("*.safetensors"))))))
    assert all(torch.equal(a[k], b[k]) for k in a)  # deterministic
    changed = [k for k in a if not torch.equal(a[k], base[k])]
    assert changed and all(".layers." in k for k in changed)
    assert (v1 / "config.json").exists() and (v1 / "tokenizer.json").exists()


def test_matrix_settings_are_checked_before_any_engine_starts(tmp_path):
    """inflight_matrix's settings, as keywords or as one InflightSettings, are checked before any
    weights are read or an engine starts; an unknown keyword names the settings."""
    from rlparity.experiments.inflight import InflightSettings, inflight_matrix

    with pytest.raises(ValueError, match=r"modes \['pause'\]"):
        inflight_matrix(tmp_path, modes=["pause"])
    with pytest.raises(ValueError, match="update_after=1.5"):
        inflight_matrix(tmp_path, settings=InflightSettings(update_after=1.5))
    with pytest.raises(ValueError, match=r"modes \[\]"):  # a keyword beside settings= replaces its field
        inflight_matrix(tmp_path, settings=InflightSettings(modes=("keep",)), modes=[])
    with pytest.raises(TypeError, match="unexpected keyword argument "
                       "'mode'; use one of the fields of InflightSettings: modes, clear_cache"):
        inflight_matrix(tmp_path, mode="keep")


def test_score_versions_takes_each_token_from_its_own_weights(tiny_model, tmp_path):
    """Without an engine: a trace whose sequences switch from version 0 to 1 mid-way is scored
    per version; each token equals the full forward of its own version's weights, and the
    latest reading equals version 1 everywhere."""
    from rlparity.capture.checkpoints import perturbed_checkpoint
    from rlparity.models import make_prompts
    from rlparity.score import Scorer, score_versions
    from rlparity.train import generate_trace

    v1 = str(perturbed_checkpoint(tiny_model, tmp_path / "v1", sigma=0.05))
    tr = generate_trace(tiny_model, make_prompts(3), n=2, max_new_tokens=12, seed=0)
    mask = tr["response_mask"].values
    pv = np.where(mask, (np.arange(tr.sizes["position"])[None, :] >= 5).astype(np.int64), -1)
    pv[0] = np.where(mask[0], 0, -1)  # one sequence entirely version 0
    tr["policy_version"] = (("sequence", "position"), pv)
    s0, s1 = Scorer(tiny_model, progress=False), Scorer(v1, progress=False)
    out = score_versions(tr, {0: s0, 1: s1})
    a0, a1 = s0.score(tr), s1.score(tr)
    for var in ("trainer_logprob", "trainer_processed_logprob", "trainer_entropy"):
        got = out[var].values
        assert np.allclose(got[mask & (pv == 0)], a0[var].values[mask & (pv == 0)], atol=1e-6)
        assert np.allclose(got[mask & (pv == 1)], a1[var].values[mask & (pv == 1)], atol=1e-6)
        assert not np.allclose(a0[var].values[mask & (pv == 1)], a1[var].values[mask & (pv == 1)], atol=1e-3)
    assert np.allclose(out["trainer_latest_processed_logprob"].values[mask],
                       a1["trainer_processed_logprob"].values[mask], atol=1e-6)
    assert out.attrs["trainer"]["per_version"] == {"1": v1, "0": tiny_model}
    again = score_versions(out, {0: s0, 1: s1})  # a scored trace scored again (it failed its checksum before)
    assert np.array_equal(again["trainer_logprob"].values[mask], out["trainer_logprob"].values[mask])
    assert again.attrs["scored_token_checksum"] == out.attrs["scored_token_checksum"]
    with pytest.raises(ValueError, match=r"no checkpoint for policy version\(s\) \[1\]"):
        score_versions(tr, {0: s0})
    assert "trainer_latest_logprob" not in score_versions(tr.assign(policy_version=tr["policy_version"].clip(max=0)),
                                                          {0: s0}, latest=False)


# ------------------------------------------------------------------------------ real engines
SAMPLING_KW = {"temperature": 0.7, "top_k": 20, "seed": 0}


@pytest.fixture(scope="module")
def v1_weights(tiny_model, tmp_path_factory):
    from rlparity.capture.checkpoints import perturbed_checkpoint

    return str(perturbed_checkpoint(tiny_model, tmp_path_factory.mktemp("inflight") / "v1", sigma=0.05))


@pytest.fixture(scope="module")
def scorers(tiny_model, v1_weights):
    from rlparity.score import Scorer

    return {0: Scorer(tiny_model, progress=False), 1: Scorer(v1_weights, progress=False)}


@pytest.fixture(scope="module")
def async_engine(tiny_model, release_engines):
    from rlparity.capture.async_engine import AsyncEngine
    from rlparity.experiments.inflight import base_settings

    release_engines()
    with AsyncEngine(tiny_model, base_settings(enable_prefix_caching=True)) as eng:
        yield eng


def _prompts(n):
    from rlparity.experiments.ablation import shared_prefix_prompts

    both = shared_prefix_prompts(2 * n)
    return both[:n], both[n:]


def _abs_d(tr, mask):
    return float(np.abs(tr["trainer_processed_logprob"].values - tr["rollout_logprob"].values)[mask].mean())


@pytest.mark.engine
def test_mid_sequence_update_gives_both_versions_each_scored_by_its_own_weights(async_engine, tiny_model,
                                                                                 v1_weights, scorers):
    """keep + clear_cache: the workers report each request's tokens at the update (the boundary),
    the stream agrees once drained; sequences carry v0 then v1, and scoring each token at its own
    version matches the engine to the float32 floor on both sides of the boundary, while one set
    of weights for all tokens does not."""
    from rlparity.capture import SamplingSettings
    from rlparity.score import score_versions

    eng = async_engine
    before, _ = _prompts(6)
    s = SamplingSettings(max_tokens=48, **SAMPLING_KW)
    fut = eng.capture_async(before, s, arm="mid")
    assert eng.wait_tokens(6 * 16)
    rec = eng.update_weights(v1_weights, 1, mode="keep", clear_cache=True)
    tr = fut.result(timeout=300)
    assert rec["boundary_source"]["worker"] == 6 and rec["tensors"] > 0 and rec["cache_reset"]
    assert rec["stream_behind"] == 0  # once drained, the client had every token the workers had produced
    pv, mask = tr["policy_version"].values, tr["response_mask"].values
    mixed = [i for i in range(pv.shape[0]) if {0, 1} <= set(pv[i][mask[i]].tolist())]
    assert len(mixed) >= 4, pv
    for i in range(pv.shape[0]):
        assert (np.diff(pv[i][mask[i]]) >= 0).all()
    # tokens that arrived after the resume but were produced before the pause keep version 0
    t_resume = tr.attrs["weight_updates"][-1]["t_resume"]
    assert np.all(tr["token_time"].values[mask & (pv == 1)] >= rec["t_pause"])
    assert tr.attrs["weight_updates"][-1]["version"] == 1 and tr.attrs["latest_policy_version"] == 1
    scored = score_versions(tr, scorers, latest=True)
    assert scored.attrs["trainer"]["scored_by"] == "policy_version"
    v0_tok, v1_tok = mask & (pv == 0), mask & (pv == 1)
    own0, own1 = _abs_d(scored, v0_tok), _abs_d(scored, v1_tok)
    assert own0 < 1e-4 and own1 < 1e-4, (own0, own1)  # each token matches its own weights
    all_v0 = scorers[0].score(tr)
    latest = float(np.abs(scored["trainer_latest_processed_logprob"].values - tr["rollout_logprob"].values)[v0_tok].mean())
    assert _abs_d(all_v0, v1_tok) > 100 * own1 and latest > 100 * own0, (_abs_d(all_v0, v1_tok), latest)
    assert t_resume > rec["t_pause"]
    eng.update_weights(tiny_model, 0, mode="wait", clear_cache=True)


@pytest.mark.engine
def test_stale_prefix_cache_is_recorded_and_measured(async_engine, tiny_model, v1_weights, scorers):
    """Same-prefix requests after an update that kept the cache hit v0 KV (recorded as stale, d far
    above the floor); after a reset they are fresh and match v1. A state dict works as a source."""
    from safetensors.torch import load_file

    from rlparity.capture import SamplingSettings
    from rlparity.score import score_versions

    eng = async_engine
    before, after = _prompts(4)
    s = SamplingSettings(max_tokens=16, **SAMPLING_KW)
    eng.capture(before, s.model_copy(update={"max_tokens": 1}))
    eng.update_weights(load_file(str(__import__("pathlib").Path(v1_weights) / "model.safetensors")), 1,
                       mode="keep", clear_cache=False)
    stale = score_versions(eng.capture(after, s), scorers)
    assert stale["prefix_cache_stale"].values.all() and (stale["cached_prompt_tokens"].values >= 128).all()
    eng.reset_prefix_cache()
    fresh = score_versions(eng.capture(after, s), scorers)
    assert not fresh["prefix_cache_stale"].values.any()
    assert fresh["prefix_cache_generation"].values[0] == stale["prefix_cache_generation"].values[0] + 1
    m_s, m_f = stale["response_mask"].values, fresh["response_mask"].values
    d_stale, d_fresh = _abs_d(stale, m_s), _abs_d(fresh, m_f)
    assert d_fresh < 1e-4 and d_stale > 3 * d_fresh and d_stale > 1e-3, (d_stale, d_fresh)
    assert di.stale_prefix_cache(stale).severity.value == "error"
    assert di.stale_prefix_cache(fresh) is None
    eng.update_weights(tiny_model, 0, mode="wait", clear_cache=True)


@pytest.mark.engine
def test_abort_keeps_the_aborted_sequences_and_resubmits_them(async_engine, tiny_model, v1_weights):
    from rlparity.capture import SamplingSettings

    eng = async_engine
    before, _ = _prompts(4)
    s = SamplingSettings(max_tokens=48, **SAMPLING_KW)
    fut = eng.capture_async(before, s, arm="abort", resubmit_aborted=True)
    assert eng.wait_tokens(4 * 16)
    eng.update_weights(v1_weights, 1, mode="abort", clear_cache=True)
    tr = fut.result(timeout=300)
    fin, att = tr["finish_reason"].values.astype(str), tr["attempt"].values
    pv, mask = tr["policy_version"].values, tr["response_mask"].values
    aborted = fin == "abort"
    assert aborted.sum() >= 3 and (att[aborted] == 0).all()
    assert (pv[aborted][mask[aborted]] == 0).all()  # aborted before the update: old weights only
    again = att == 1
    assert again.sum() == aborted.sum() and (pv[again][mask[again]] == 1).all()
    assert (tr["response_length"].values[again] == 48).all()
    assert sorted(tr["prompt_index"].values[again]) == sorted(tr["prompt_index"].values[aborted])
    # wait: everything in flight finishes on the old weights first
    fut = eng.capture_async(before, s, arm="wait")
    assert eng.wait_tokens(4 * 16)
    rec = eng.update_weights(tiny_model, 0, mode="wait", clear_cache=True)
    tr = fut.result(timeout=300)
    assert (tr["policy_version"].values[tr["response_mask"].values] == 1).all()
    assert (tr["finish_reason"].values.astype(str) == "length").all() and rec["version"] == 0


@pytest.mark.engine
def test_offline_engine_updates_between_batches(pool, tiny_model, v1_weights, scorers, async_engine):
    from conftest import fp32_parity_settings

    from rlparity.capture import SamplingSettings
    from rlparity.score import score_versions

    async_engine.close()  # one engine at a time
    eng = pool.get(tiny_model, fp32_parity_settings().replace(enable_prefix_caching=True))
    before, after = _prompts(4)
    s = SamplingSettings(max_tokens=16, **SAMPLING_KW)
    eng.capture(before, s, progress=False)
    rec = eng.update_weights(v1_weights, 1, clear_cache=False)
    stale = eng.capture(after, s, progress=False)
    assert rec["version"] == 1 and (stale["policy_version"].values[stale["response_mask"].values] == 1).all()
    assert stale["prefix_cache_stale"].values.all() and stale.attrs["latest_policy_version"] == 1
    eng.reset_prefix_cache()
    fresh = score_versions(eng.capture(after, s, progress=False), scorers)
    assert not fresh["prefix_cache_stale"].values.any() and _abs_d(fresh, fresh["response_mask"].values) < 1e-4
    eng.update_weights(tiny_model, 0, clear_cache=True)
    back = eng.capture(after, s, progress=False)
    assert (back["policy_version"].values[back["response_mask"].values] == 0).all()
    assert not back["prefix_cache_stale"].values.any()


# ------------------------------------------------------------------------------ notebook 04
@pytest.fixture(scope="module")
def nb04(executed_notebook):
    out = executed_notebook("04_inflight")
    return json.loads((out / "results.json").read_text()), out


@pytest.mark.engine
def test_notebook_04_runs_the_matrix_on_two_engines(nb04):
    import rlparity.trace as T

    res, out = nb04
    stale_arm = "keep-noclear-prefix_on"
    r = res["reset_ratios"][stale_arm]
    assert r["reset_arm"] == "keep-clear-prefix_on" and r["ratio"] >= 3, r
    flagged = set(res["flagged_stale_arms"])
    assert stale_arm in flagged
    assert not any(("-clear-" in a) or a.endswith("prefix_off") for a in flagged), flagged
    assert res["engine_starts"] == 2
    lag = res["lag_by_mode"]
    assert lag["keep"]["n_mixed_sequences"] > 0 and lag["wait"]["n_mixed_sequences"] == 0
    assert lag["abort"]["aborted_tokens"] > 0
    arms = T.open_arms(out / "inflight.zarr")
    assert len(arms) == 12 and all(a.attrs["trainer"]["scored_by"] == "policy_version" for a in arms.values())
