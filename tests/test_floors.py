"""Floors (issue 24): the trainer shapes rescoring the same tokens, the batch-invariant mode, the floor
statistics and what the summary and the diagnosis report beside the gap. No engine: the rollout
is a trace of real prompts with responses the tiny model wrote (transformers generate)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rlparity.config.settings import TrainerSettings
from rlparity.metrics.floors import floor_stats, floor_table, recorded_floors, trainer_floor
from rlparity.score import Scorer


@pytest.fixture(scope="module")
def rollout(tiny_model):
    from rlparity.models import make_prompts
    from rlparity.train import generate_trace

    # prompts of different lengths, so batches pad and packed rows differ from padded ones
    return generate_trace(tiny_model, make_prompts(12, seed=5), n=2, max_new_tokens=10, seed=0)


def _score(model, trace, batch_size=16, **settings):
    return Scorer(model, batch_size=batch_size, progress=False, settings=TrainerSettings(**settings)).score(trace)


def _alone_float64(model, trace):
    """An independent reference: every sequence alone, the whole model in float64 (no batching, no
    padding, no packing), log-softmax of the sampled token."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlparity.trace import sequences

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64).eval()
    out = np.full(trace["token_id"].shape, np.nan)
    with torch.no_grad():
        for i, (p, r) in enumerate(sequences(trace)):
            logits = m(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1: len(p) - 1 + len(r)]
            out[i, : len(r)] = torch.log_softmax(logits, -1).gather(1, torch.tensor(r)[:, None])[:, 0].numpy()
    return out


def test_every_layout_reads_the_same_logprobs_as_each_sequence_alone(tiny_model, rollout):
    ref = _alone_float64(tiny_model, rollout)
    mask = rollout["response_mask"].values
    for settings in ({}, {"layout": "packed"}, {"layout": "left_padded"}, {"batch_invariant": True},
                     {"order": "shuffled"}, {"attn_implementation": "eager"}, {"gradient_checkpointing": True}):
        s = _score(tiny_model, rollout, **settings)
        err = np.abs(s["trainer_logprob"].values - ref)[mask]
        # float32 against float64: the layouts differ only by rounding
        assert np.nanmax(err) < 5e-5, (settings, np.nanmax(err))
        shape = s.attrs["trainer"]["shape"]
        assert shape["layout"] == settings.get("layout", "padded") and shape["batch_invariant"] == bool(
            settings.get("batch_invariant"))
    # a packed row without its block-diagonal mask would let sequences attend to each other: the
    # check above would fail by nats, not 1e-5 (the reference is the sequences alone)


def test_a_packed_row_through_flex_attention_reads_each_sequence_alone(tiny_model, rollout):
    """FlexAttention reads a packed row's sequences from its restarting position ids (no dense mask is
    passed: ``batching.VARLEN_ATTENTION``); one packed forward of six sequences against each alone in
    float64. Without the document mask the sequences would attend to each other: nats, not 1e-5."""
    few = rollout.isel(sequence=slice(0, 6))
    s = _score(tiny_model, few, layout="packed", attn_implementation="flex_attention", self_check=0)
    err = np.abs(s["trainer_logprob"].values - _alone_float64(tiny_model, few))[few["response_mask"].values]
    assert np.nanmax(err) < 5e-5, np.nanmax(err)
    assert s.attrs["trainer"]["shape"]["layout"] == "packed"


def test_batch_invariant_mode_does_not_depend_on_the_batch(tiny_model, rollout):
    """The same sequence scored with other companions, in another order: bit-for-bit the same in
    batch-invariant mode (each sequence alone at a fixed bucket)."""
    few = rollout.isel(sequence=[0, 5])
    a = _score(tiny_model, rollout, batch_invariant=True)
    b = _score(tiny_model, few, batch_invariant=True, order="shuffled")
    for var in ("trainer_logprob", "trainer_processed_logprob"):
        x, y = a[var].values[[0, 5]], b[var].values
        w = min(x.shape[1], y.shape[1])
        np.testing.assert_array_equal(x[:, :w], y[:, :w])
    assert a.attrs["trainer"]["self_check"]["batch_shape_processed"]["max_abs"] == 0.0


def test_floor_statistics_equal_a_numpy_reference(tiny_model, rollout):
    a = _score(tiny_model, rollout, batch_size=1)
    b = _score(tiny_model, rollout, batch_size=16, layout="left_padded")
    mask = rollout["response_mask"].values
    x, y = a["trainer_processed_logprob"].values, b["trainer_processed_logprob"].values
    diff = (x - y)[mask & np.isfinite(x) & np.isfinite(y)]
    f = trainer_floor(a, b)
    assert float(f["floor_mean_abs"]) == pytest.approx(np.mean(np.abs(diff)), rel=1e-12)
    assert float(f["floor_rms"]) == pytest.approx(np.sqrt(np.mean(diff ** 2)), rel=1e-12)
    assert float(f["floor_max_abs"]) == pytest.approx(np.max(np.abs(diff)), rel=1e-12)
    per_seq = trainer_floor(a, b, dim="position")
    assert per_seq["floor_mean_abs"].sizes == {"sequence": rollout.sizes["sequence"]}
    i = int(np.argmax(per_seq["floor_max_abs"].values))
    row = np.abs(x[i] - y[i])[mask[i]]
    assert float(per_seq["floor_max_abs"][i]) == pytest.approx(row.max(), rel=1e-12)
    core = floor_stats(x, y, mask, axis=-1)
    np.testing.assert_allclose(core["floor_mean_abs"], per_seq["floor_mean_abs"].values)
    # the table: each shape against batch 1, the gap of batch 1, the share
    table = floor_table({"batch1": a, "left16": b}, "batch1")
    assert float(table["floor_mean_abs"].sel(shape="batch1")) == 0.0
    gap = np.mean(np.abs(x - a["rollout_logprob"].values)[mask & np.isfinite(x)])
    assert float(table["gap_mean_abs_d"]) == pytest.approx(gap, rel=1e-12)
    assert float(table["share_of_gap"].sel(shape="left16")) == pytest.approx(np.mean(np.abs(diff)) / gap, rel=1e-9)
    with pytest.raises(ValueError, match="same tokens"):
        trainer_floor(a, b.isel(sequence=slice(0, 3)))


def test_summary_and_dashboards_report_the_floor_beside_the_gap(tiny_model, rollout):
    from rlparity.metrics import as_dashboard, summary

    s = _score(tiny_model, rollout, layout="left_padded")
    f = recorded_floors(s)
    assert f["batch_shape_mean_abs"] > 0 and f["run_to_run_mean_abs"] == 0
    sm = summary(s)
    assert float(sm["trainer_floor"]) == f["batch_shape_mean_abs"]
    assert float(sm["trainer_floor_share"]) == pytest.approx(f["batch_shape_mean_abs"] / float(sm["abs_log_ratio_mean"]))
    assert np.isnan(float(sm["engine_floor"]))  # the rollout came from transformers, no engine floor probed
    assert summary(s, dim="position")["trainer_floor"].ndim == 0  # one number per rescoring
    dash = as_dashboard(s, "verl")
    assert dash.info["trainer_floor"] == f["batch_shape_mean_abs"]



def _float64_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Causal attention of one unpadded sequence in float64, written out (the kernel check's reference)."""
    import torch

    rep = query.shape[1] // key.shape[1]
    k, v = key.double().repeat_interleave(rep, 1), value.double().repeat_interleave(rep, 1)
    scores = (query.double() @ k.transpose(-1, -2)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    n = query.shape[2]
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    return (scores.softmax(-1) @ v).to(query.dtype).transpose(1, 2).contiguous(), None


def _alone_bf16(model, trace, pick, attn, together=False):
    """An independent reference for the kernel check: the picked sequences through a separately loaded bf16
    model with attention ``attn`` ("float64": :func:`_float64_attention`), the head in float32; each alone, or
    ``together`` in one right-padded batch with an attention mask (the self-check's grouped shape; with right
    padding the causal mask alone already keeps every real query off the padding, so the float64 reference
    needs no mask)."""
    import torch
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from rlparity.trace import sequences

    if attn == "float64":
        AttentionInterface.register("test_float64", _float64_attention)
        AttentionMaskInterface.register("test_float64", sdpa_mask)
        attn = "test_float64"
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16, attn_implementation=attn).eval()
    seqs = sequences(trace)
    rows = [seqs[i][0] + seqs[i][1] for i in pick]
    groups = [list(range(len(pick)))] if together else [[j] for j in range(len(pick))]
    out = {}
    with torch.no_grad():
        for g in groups:
            width = max(len(rows[j]) for j in g)
            ids = torch.tensor([rows[j] + [0] * (width - len(rows[j])) for j in g])
            mask = torch.tensor([[1] * len(rows[j]) + [0] * (width - len(rows[j])) for j in g])
            hidden = m.model(input_ids=ids, attention_mask=mask).last_hidden_state
            for row, j in enumerate(g):
                p, r = seqs[pick[j]]
                h = hidden[row, len(p) - 1: len(p) - 1 + len(r)]
                logits = h.float() @ m.lm_head.weight.float().T
                out[j] = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(r)[:, None])[:, 0].numpy()
    return np.concatenate([out[j] for j in range(len(pick))])


def test_the_kernel_check_measures_the_attention_kernels_rounding(tiny_model, rollout):
    """Issue 41: the self-check scores its sequences (together, in the trainer's micro-batch) once more with the
    attention in float32 and records how far the trainer's bf16 kernel is from it; the reference computes that
    attention in float64 by hand on the same right-padded batch. The model gets its own implementation back; a
    float32 model's check reads exactly 0."""
    from rlparity.score.loading import FLOAT32_ATTENTION

    scorer = Scorer(tiny_model, dtype="bfloat16", batch_size=16, progress=False)
    assert scorer.module.config._attn_implementation == "sdpa"
    t0 = time.perf_counter()
    s = scorer.score(rollout)
    wall = time.perf_counter() - t0
    check = s.attrs["trainer"]["self_check"]
    assert check["kernel_check"] == f"sdpa vs {FLOAT32_ATTENTION}"
    # what each pass cost (issue 39): four passes, each inside the call's own wall time
    assert set(check["pass_s"]) == {"alone", "grouped", "again", "kernel"} and min(check["pass_s"].values()) > 0
    assert sum(check["pass_s"].values()) < wall
    assert scorer.module.config._attn_implementation == "sdpa"  # switched back after the check
    pick = check["sequences"]
    ref = np.abs(_alone_bf16(tiny_model, rollout, pick, "sdpa", together=True)
                 - _alone_bf16(tiny_model, rollout, pick, "float64", together=True))
    got = check["kernel_raw"]
    assert got["n_tokens"] == ref.size
    assert ref.mean() > 1e-4  # bf16 kernels do round: a check that read 0 would not measure them
    assert got["mean_abs"] == pytest.approx(ref.mean(), rel=0.1)
    assert recorded_floors(s)["kernel_mean_abs"] == check["kernel_processed"]["mean_abs"] > 0
    # eager attention (scores and probabilities rounded to bf16) is farther from float64 than the check's reference
    eager = np.abs(_alone_bf16(tiny_model, rollout, pick, "eager", together=True)
                   - _alone_bf16(tiny_model, rollout, pick, "float64", together=True))
    assert eager.mean() > 2 * got["mean_abs"]
    f32 = Scorer(tiny_model, dtype="float32", batch_size=16, progress=False).score(rollout)
    assert f32.attrs["trainer"]["self_check"]["kernel_raw"]["max_abs"] == 0.0
    # off, or a second implementation equal to the model's own: no kernel pass
    off = Scorer(tiny_model, dtype="bfloat16", batch_size=16, progress=False,
                 settings=TrainerSettings(kernel_check="off")).score(rollout)
    assert "kernel_raw" not in off.attrs["trainer"]["self_check"]
    assert set(off.attrs["trainer"]["self_check"]["pass_s"]) == {"alone", "grouped", "again"}
    assert np.isnan(recorded_floors(off)["kernel_mean_abs"])
    same = Scorer(tiny_model, dtype="bfloat16", batch_size=16, progress=False,
                  settings=TrainerSettings(kernel_check="sdpa")).score(rollout)
    assert "kernel_check" not in same.attrs["trainer"]["self_check"]
    # an implementation the model cannot run: recorded as not run, the scoring goes on
    bad = Scorer(tiny_model, dtype="bfloat16", batch_size=16, progress=False,
                 settings=TrainerSettings(kernel_check="no_such_kernel")).score(rollout)
    assert bad.attrs["trainer"]["self_check"]["kernel_check"].startswith("sdpa vs no_such_kernel: not run (")
    assert "kernel_raw" not in bad.attrs["trainer"]["self_check"]
    assert set(bad.attrs["trainer"]["self_check"]["pass_s"]) == {"alone", "grouped", "again"}  # the failed pass: not timed


def test_the_floor_command_reads_every_floor_a_store_recorded(tiny_model, rollout, tmp_path):
    """``rlparity floor STORE --json``: per arm the gap and each recorded floor, the kernel floor included, equal
    to the self-check's record (a bf16 trainer: every kernel floor above 0; kernel_check off: none)."""
    import json

    from rlparity.trace import save
    from tests.conftest import run_cli

    on = Scorer(tiny_model, dtype="bfloat16", progress=False).score(rollout)
    off = Scorer(tiny_model, dtype="bfloat16", progress=False, settings=TrainerSettings(kernel_check="off")).score(rollout)
    save({"on": on, "off": off}, tmp_path / "s.zarr")
    res = run_cli("floor", tmp_path / "s.zarr", "--json")
    assert res.exit_code == 0, res.stderr
    rows = json.loads(res.stdout)
    check = on.attrs["trainer"]["self_check"]
    assert rows["on"]["trainer_kernel_mean_abs"] == pytest.approx(check["kernel_processed"]["mean_abs"], rel=1e-12)
    assert rows["on"]["trainer_kernel_mean_abs"] > 0
    assert rows["on"]["trainer_batch_mean_abs"] == pytest.approx(check["batch_shape_processed"]["mean_abs"], rel=1e-12)
    assert rows["off"]["trainer_kernel_mean_abs"] is None or np.isnan(rows["off"]["trainer_kernel_mean_abs"])
    mask = rollout["response_mask"].values
    d = on["trainer_processed_logprob"].values - on["rollout_logprob"].values
    assert rows["on"]["gap_mean_abs_d"] == pytest.approx(np.abs(d[mask & np.isfinite(d)]).mean(), rel=1e-9)


@pytest.mark.parametrize("k, batch_size, groups", [(8, 16, [[0, 2, 3, 4, 5, 6, 7, 8]]),
                                                   (8, 3, [[0, 2, 3], [4, 5, 6], [7, 8]]),
                                                   (3, 1, [[0], [2], [3]])])
def test_the_self_check_runs_one_pass_alone_and_three_in_micro_batches(k, batch_size, groups):
    """Issue 39: the self-check's passes and shapes, read from the forwards it asks for (``stats`` is the scorer's
    forward, given as a callable): ``alone`` one batch-1 forward per picked sequence (sequences without a response
    skipped), then ``grouped``, ``again`` and ``kernel`` the same sequences in micro-batches of ``batch_size``;
    each floor compares the passes it names, by hand on made-up logprobs (the batched scoring 0, alone 0.1, grouped
    0.3, again 0.3 + 0.01 on odd calls, kernel 0.5)."""
    from contextlib import nullcontext

    from rlparity.score.selfcheck import self_check

    seqs = [([1], [5, 6])] + [([1], [])] + [([1, 2], [7])] * 8  # sequence 1 has no response
    n, width = len(seqs), 2
    calls, kernel_on = [], []

    def stats(seqs_, batches, sampling, replay=None):
        calls.append(("kernel" if kernel_on else "plain", [list(b) for b in batches]))
        alone = all(len(b) == 1 for b in batches) and len(calls) == 1
        value = 0.5 if kernel_on else (0.1 if alone else 0.3 + 0.01 * (len(calls) % 2))
        arr = np.full((n, width), np.nan)
        for b in batches:
            for i in b:
                arr[i, : len(seqs_[i][1])] = value
        return {"trainer_logprob": arr, "trainer_processed_logprob": arr}

    def switch():
        kernel_on.append(1)
        return nullcontext()

    scored = np.full((n, width), np.nan)
    for i, (_, r) in enumerate(seqs):
        scored[i, : len(r)] = 0.0
    result = {"trainer_logprob": scored, "trainer_processed_logprob": scored}
    out = self_check(stats, seqs, {}, result, k=k, batch_size=batch_size, kernel=("a vs b", switch))
    pick = [i for g in groups for i in g]
    assert out["sequences"] == pick
    assert calls == [("plain", [[i] for i in pick]), ("plain", groups), ("plain", groups), ("kernel", groups)]
    assert list(out["pass_s"]) == ["alone", "grouped", "again", "kernel"]
    assert out["shape_main"].startswith(f"micro-batches of up to {batch_size} ") and out["shape_check"] == "batch 1"
    assert out["shape_run_to_run"] == f"the {len(pick)} sequences in batches of up to {batch_size}, twice"
    tokens = sum(len(seqs[i][1]) for i in pick)
    for key in ("raw", "processed"):
        assert out[f"batch_shape_{key}"]["mean_abs"] == pytest.approx(0.1, rel=1e-12)
        assert out[f"run_to_run_{key}"]["mean_abs"] == pytest.approx(0.01, rel=1e-9)
        assert out[f"kernel_{key}"]["mean_abs"] == pytest.approx(0.2, rel=1e-9)  # against grouped, not again
        assert out[f"batch_shape_{key}"]["n_tokens"] == tokens
