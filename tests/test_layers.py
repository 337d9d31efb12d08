"""Per-layer divergence (issue 25): the profile's arithmetic against a float64 reference written
another way, the trainer's hooks against transformers' own hidden states, the rules that name a
cause from where the divergence starts, the store round trip, bad input; and, on real engines
(notebook 09, run once), every CPU scenario located at its layer and module, the clean arm within
its floor, the partial sync caught by the live weight check and by ``rlparity verify-weights``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlparity.metrics import layers as ml
from rlparity.trace.layers import layer_dataset, sites, with_layers

N_LAYERS = 2
SITES = sites(N_LAYERS)


def _index(label: str) -> int:
    from rlparity.trace.layers import site_label

    return [site_label(*s) for s in SITES].index(label)


def synthetic_profile(start: str | None, *, n_seq: int = 3, length: int = 20, floor: float = 1e-6, jump: float = 1e-2,
                      cached: int = 0, pos0_clean: bool = False, only_seqs: list[int] | None = None, seed: int = 0):
    """A layer dataset whose relative error sits at ``floor`` up to site ``start`` and at ``jump``
    from there on (``cached`` leading positions not computed; ``pos0_clean``: position 0 stays at
    the floor; ``only_seqs``: only these sequences diverge)."""
    rng = np.random.default_rng(seed)
    n = len(SITES)
    state = rng.uniform(0.5, 2.0, size=(n, n_seq, length))
    rel = floor * rng.uniform(0.5, 1.0, size=(n, n_seq, length))
    if start is not None:
        k = _index(start)
        rows = only_seqs if only_seqs is not None else list(range(n_seq))
        for i in rows:
            rel[k:, i] = jump
            if pos0_clean:
                rel[k:, i, 0] = floor * 0.7
    diff = rel * state
    diff[:, :, :cached] = np.nan
    state[:, :, :cached] = np.nan
    ids = [[int(t) for t in rng.integers(4, 30, size=length)] for _ in range(n_seq)]
    return layer_dataset(SITES, diff, state, ids, [cached] * n_seq, floor=np.full(n, floor),
                         attrs={"comparison": "trainer", "path": "eager (forward hooks)"})


# ------------------------------------------------------------------------------ arithmetic
def test_site_errors_and_pooling_match_a_float64_reference():
    rng = np.random.default_rng(1)
    S, L, H, V = len(SITES), 11, 16, 7
    ref = {"states": rng.normal(size=(S - 1, L, H)).astype(np.float32), "logits": rng.normal(size=(L, V)) * 5}
    pos = np.arange(4, L)  # four positions served from a cache: not computed by the engine
    eng = {"states": ref["states"][:, pos] + rng.normal(scale=1e-3, size=(S - 1, len(pos), H)),
           "logits": ref["logits"][pos] + rng.normal(scale=1e-2, size=(len(pos), V)), "positions": pos}
    diff, state = ml.site_errors(eng, ref, L)
    assert np.isnan(diff[:, :4]).all() and np.isnan(state[:, :4]).all()
    # reference: norms with float64 loops, RMS = norm / sqrt(n)
    for k in range(S):
        for j, p in enumerate(pos):
            a = eng["logits"][j] if k == S - 1 else eng["states"][k, j]
            b = ref["logits"][p] if k == S - 1 else ref["states"][k, p]
            a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
            assert diff[k, p] == pytest.approx(np.linalg.norm(a - b) / np.sqrt(a.size), rel=1e-12)
            assert state[k, p] == pytest.approx(np.linalg.norm(b) / np.sqrt(b.size), rel=1e-12)
    # pooled: the relative error of the stacked states (every computed position of one site at once)
    pooled = ml.pooled_relative_error(diff, state, axis=-1)
    for k in range(S - 1):
        a = np.asarray(eng["states"][k], dtype=np.float64)
        b = np.asarray(ref["states"][k][pos], dtype=np.float64)
        assert pooled[k] == pytest.approx(np.linalg.norm(a - b) / np.linalg.norm(b), rel=1e-12)
    assert np.isnan(ml.pooled_relative_error(diff[:, :4], state[:, :4], axis=-1)).all()


def test_first_divergence_finds_the_entry_site_and_the_floor_decides():
    ds = synthetic_profile("L1.attention", floor=1e-6, jump=1e-2)
    first = ml.first_divergence(ds, floor_ratio=4.0)
    assert first["site"] == "L1.attention" and first["layer"] == 1 and first["module"] == "attention"
    assert first["ratio_to_floor"] > 1e3 and first["max_ratio_before"] < 1.0
    assert all(q["diverges"] and q["first_position"] == 0 for q in first["sequences"])
    # the same jump inside the floor band is no divergence
    within = synthetic_profile("L1.attention", floor=1e-6, jump=3e-6)
    assert ml.first_divergence(within, floor_ratio=4.0) is None
    assert ml.within_floor(within, floor_ratio=4.0)["max_ratio_to_floor"] < 4.0
    # per-site relative error pooled over positions, by dim
    rel = ml.relative_error(ds, dim="full_position")
    assert rel.dims == ("site", "layer_sequence")
    assert float(rel.sel(site="L1.attention").min()) == pytest.approx(1e-2, rel=1e-9)


# ------------------------------------------------------------------------------ the trainer's hooks
def test_trainer_sites_are_transformers_own_hidden_states(tiny_model, scorer_fp32):
    """Independent reference: output_hidden_states (layer outputs; the last one after the final
    norm) and the model's own logits at the same vocabulary columns."""
    import torch

    from rlparity.score.layers import trainer_layer_states
    from rlparity.trace.layers import vocab_columns

    seq = [1] + [int(t) for t in np.random.default_rng(0).integers(4, 40, size=30)]
    cols = vocab_columns(scorer_fp32.module.config.vocab_size, 16, seed=3)
    got = next(trainer_layer_states(scorer_fp32, [seq], vocab_ids=cols))
    with torch.no_grad():
        out = scorer_fp32.module(input_ids=torch.tensor([seq]), output_hidden_states=True)
    hs = [h[0].numpy() for h in out.hidden_states]
    assert np.array_equal(got["states"][_index("embedding")], hs[0])
    for layer in range(N_LAYERS - 1):
        assert np.allclose(got["states"][_index(f"L{layer}.output")], hs[layer + 1], rtol=0, atol=1e-6)
    assert np.allclose(got["states"][_index("final_norm")], hs[-1], rtol=0, atol=1e-6)
    assert np.allclose(got["logits"], out.logits[0][:, cols].numpy(), rtol=0, atol=1e-4)
    # residual bookkeeping: layer output = input + attention + mlp
    x = hs[0]
    o = got["states"][_index("L0.attention")] + got["states"][_index("L0.mlp")] + x
    assert np.allclose(o, got["states"][_index("L0.output")], atol=1e-5)


# ------------------------------------------------------------------------------ the rules
def _trace_with(profile, **attrs):
    from rlparity.testing import synthetic_trace

    t = synthetic_trace(n_sequences=8, arm="a")
    t.attrs.update(attrs)
    return with_layers(t, profile)


def _finding(trace, prior=()):
    from rlparity.diagnose.layers import divergence_start

    return divergence_start(trace, floor_ratio=4.0, prior=prior)


def test_each_start_names_its_cause():
    eff = {"head_dtype": "bfloat16", "dtype": "float32"}
    head = _finding(_trace_with(synthetic_profile("lm_head"), engine_effective=eff,
                                trainer={"head_dtype": "float32", "dtype": "float32"}))
    assert (head.name, head.evidence["site"], head.cause) == ("divergence_starts_at", "lm_head", "rollout_bf16_head")
    trainer_head = _finding(_trace_with(synthetic_profile("lm_head"), engine_effective={**eff, "head_dtype": "float32"},
                                        trainer={"head_dtype": "bfloat16"}))
    assert trainer_head.cause == "trainer_bf16_head"
    stale = _finding(_trace_with(synthetic_profile("L0.attention", cached=8, only_seqs=[0, 1, 2])))
    assert stale.cause == "stale_prefix_cache" and stale.evidence["first_position"] == 8
    kernel = _finding(_trace_with(synthetic_profile("L0.attention", pos0_clean=True)))
    assert kernel.cause == "batch_variant_attention" and not kernel.evidence["position_0_over"]
    updated = _finding(_trace_with(synthetic_profile("L1.mlp"), weight_updates=[{"version": 1}]))
    assert updated.cause == "partial_weight_sync" and updated.evidence["layer"] == 1
    assert updated.evidence["tensors"] == [f"model.layers.1.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    assert updated.severity.value == "error"
    never = _finding(_trace_with(synthetic_profile("L1.mlp")))
    assert never.cause == "weights_differ"
    # layer 0 attention with position 0 diverging too: weights, not the kernel
    w0 = _finding(_trace_with(synthetic_profile("L0.attention"), weight_updates=[{"version": 1}]))
    assert w0.cause == "partial_weight_sync"
    clean = _finding(_trace_with(synthetic_profile(None)))
    assert clean.name == "layers_within_floor" and clean.severity.value == "info"


def test_divergence_takes_part_in_the_attribution():
    from rlparity.diagnose import diagnose

    t = _trace_with(synthetic_profile("lm_head"), engine_effective={"head_dtype": "bfloat16"},
                    trainer={**{"head_dtype": "float32"}})
    report = diagnose({"a": t})
    f = next(f for f in report if f.name == "divergence_starts_at")
    assert f.cause == "rollout_bf16_head" and f.share is not None and f.tokens["n_tokens"] > 0
    assert "divergence_starts_at" in report.names()
    with pytest.raises(ValueError, match="layer_floor_ratio"):
        diagnose({"a": t}, layer_floor_ratio=0.5)


def test_profile_round_trips_through_a_store(tmp_path):
    from rlparity.trace import load, save

    t = _trace_with(synthetic_profile("L1.attention", cached=3))
    save(t, tmp_path / "s.zarr")
    back = load(tmp_path / "s.zarr")
    for v in ("layer_diff_rms", "layer_state_rms", "layer_floor", "layer_cached", "layer_token_id"):
        assert np.array_equal(back[v].values, t[v].values, equal_nan=True), v
    assert back.attrs["layer_capture"]["comparison"] == "trainer"
    assert ml.first_divergence(back)["site"] == "L1.attention"


def test_bad_input_is_one_line_exit_2(cli, tmp_path):
    r = cli("layers", "show", tmp_path / "none.zarr")
    assert r.exit_code == 2 and "no such store" in r.stderr and "Traceback" not in r.output
    r = cli("layers", "run", "--out", tmp_path / "x.zarr", "--scenarios", "clean,bogus")
    assert r.exit_code == 2 and "bogus" in r.stderr
    r = cli("verify-weights", "tiny", "--trainer", tmp_path / "missing")
    assert r.exit_code == 2 and "--trainer" in r.stderr
    with pytest.raises(ValueError, match="one value per site"):
        layer_dataset(SITES, np.zeros((len(SITES), 1, 2)), np.ones((len(SITES), 1, 2)), [[1, 2]], [0],
                      floor=np.zeros(3))


# ------------------------------------------------------------------------------ real engines (notebook 09)
@pytest.fixture(scope="module")
def nb09(executed_notebook):
    out = executed_notebook("09_layers")
    return json.loads((out / "results.json").read_text()), out


@pytest.mark.engine
def test_notebook_09_locates_every_cpu_scenario(nb09):
    res, out = nb09
    loc = res["located"]
    want = {"partial_weight_sync": ("L1.attention", "partial_weight_sync"),
            "partial_weight_sync@clean-engine": ("L1.attention", "partial_weight_sync"),
            "stale_prefix_cache": ("L0.attention", "stale_prefix_cache"),
            "stale_prefix_cache@clean-engine": ("L0.attention", "stale_prefix_cache"),
            "trainer_bf16_head": ("lm_head", "trainer_bf16_head"),
            "rollout_bf16_head": ("lm_head", "rollout_bf16_head"),
            "rollout_bf16_head@clean-engine": ("lm_head", "rollout_bf16_head")}
    for arm, (site, cause) in want.items():
        assert (loc[arm]["site"], loc[arm]["cause"]) == (site, cause), (arm, loc[arm])
    for arm in ("partial_weight_sync", "stale_prefix_cache", "trainer_bf16_head", "rollout_bf16_head"):
        assert loc[arm]["ratio_to_floor"] > 100, (arm, loc[arm])  # far above the floor, not at its edge
    # the stale cache: the divergence starts right after the cached positions (blocks of 128 tokens)
    stale = next(f for f in res["findings"] if f["arm"] == "stale_prefix_cache" and f["name"] == "divergence_starts_at")
    cached = stale["evidence"]["cached_positions"]
    assert min(cached) >= 128 and stale["evidence"]["first_position"] == min(cached)
    # the clean arm within its floor at every site; the floor itself at float32 rounding (engine vs
    # transformers, eager, CPU); the engine against itself bitwise equal
    assert loc["clean"]["finding"] == "layers_within_floor" and res["clean"]["max_ratio_to_floor"] < 4
    assert max(res["floor"]["per_site"].values()) < 1e-5
    assert res["engine_floor"]["max"] == 0.0 and loc["clean@clean-engine"]["finding"] == "layers_within_floor"
    assert "batch_variant_attention" in res["not_run"]


@pytest.mark.engine
def test_partial_sync_caught_by_the_live_weight_check(nb09, cli, tiny_model):
    res, out = nb09
    check = res["verify_weights"]
    layer1 = {f"model.layers.1.{m}.weight" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                      "mlp.down_proj")}
    # the 2-d weights of layer 1 (the update perturbed those; its norms are equal in both versions)
    assert set(check["compare"]["differ"]) == layer1 and check["compare"]["missing_in_engine"] == []
    assert check["probed_linear_layers"] == 8  # the CPU build's repacked linears, read through their kernel
    assert res["verify_weights_clean"]["equal"] and res["verify_weights_clean"]["compare"]["n_compared"] == 21
    # the fingerprint prompts (greedy, the trainer's reading of the same tokens) see it too
    fp = res["fingerprints"]
    assert fp["clean"]["max_abs_d"] < 1e-3 < fp["partial_weight_sync"]["mean_abs_d"], fp
    ckpt = out / "checkpoints"
    r = cli("verify-weights", tiny_model, "--update", ckpt / "v1-without-layer-1", "--trainer", ckpt / "v1",
            "--engine", '{"enforce_eager": true}')  # eager: the faster start
    assert r.exit_code == 1, r.output
    assert "model.layers.1.self_attn.q_proj.weight (layer 1)" in r.stdout and "layers [1]" in r.stdout
