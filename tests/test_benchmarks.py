"""Every script in benchmarks/ runs once at a small size, so none can rot (a smoke run: no timing
asserts; the speed targets are ratios each script reports, read by hand). A new benchmark without a
smoke row here fails the first test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

# script -> (small-size arguments, what its JSON output must hold); "{out}" is a JSON file path
SMOKE = {
    "metrics.py": (["--tokens", "20000", "--repeats", "1", "--out", "{out}"],
                   lambda r: r["tokens"] > 10000 and r["max_abs_diff_vs_numpy"] < 1e-9
                   and r["max_abs_diff_fast_vs_general"] < 1e-9),
    "head_chunking.py": (["--vocab", "4096", "--tokens", "64", "--hidden", "32", "--chunks", "16"], None),
    "rescoring.py": (["--vocab", "1024", "--sequences", "4", "--length", "48", "--prompt", "16", "--batch", "2",
                      "--repeats", "1", "--no-memory", "--out", "{out}"],
                     lambda r: r["tokens"] == 4 * 48 and {row["method"] for row in r["rows"]} >= {
                         "bare", "scorer_fp32_new", "score_end_to_end_first", "score_end_to_end",
                         "score_end_to_end_no_self_check", "score_end_to_end_no_kernel_check",
                         "score_padded_fp32_head", "score_padded_bf16_head",
                         "score_packed_fp32_head", "score_packed_bf16_head", "score_packed_flex_fp32_head"}
                     and {(row["layout"], row["head_dtype"]) for row in r["rows"] if row["method"].startswith("score_")}
                     == {(lay, head) for lay in ("padded", "packed") for head in ("float32", "bfloat16")}
                     and {row["method"] for row in r["rows"] if row.get("attention") == "flex_attention"}
                     == {"score_packed_flex_fp32_head", "score_packed_flex_bf16_head"}
                     and all(row["flops_per_s"] > 0 for row in r["rows"] if row["method"] != "fingerprint")
                     # the self-check's kernel pass: on in the default row, off in its own row and wherever the
                     # self-check is
                     and {row["method"]: row["kernel_check"] for row in r["rows"] if "kernel_check" in row} == {
                         "score_end_to_end_first": "auto", "score_end_to_end": "auto",
                         "score_end_to_end_no_kernel_check": "off", "score_end_to_end_no_self_check": "off",
                         **{f"score_{lay}_{h}_head": "off" for lay in ("padded", "packed", "packed_flex")
                            for h in ("fp32", "bf16")}}
                     # each self-check pass timed from the scored trace's record, inside the row's own call
                     and {row["method"]: set(row["self_check_pass_s"]) for row in r["rows"]
                          if "self_check_pass_s" in row} == {"score_end_to_end": {"alone", "grouped", "again", "kernel"},
                                                            "score_end_to_end_no_kernel_check": {"alone", "grouped", "again"}}
                     and all(0 < sum(row["self_check_pass_s"].values()) < row["median_s"] * 1.5
                             for row in r["rows"] if "self_check_pass_s" in row)
                     # the weight checksums alone: every value of the Llama (vocab 1024, hidden 64, 2 layers, MLP 256,
                     # untied head) once, 2 bytes each
                     and [(row["tensors"], row["bf16_bytes"]) for row in r["rows"] if row["method"] == "fingerprint"]
                     == [(3 + 2 * 9, 2 * (2 * 1024 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 256 + 2 * 64) + 64))]
                     and all(row["gb_per_s"] > 0 for row in r["rows"] if row["method"] == "fingerprint")),
    "lazy_summary.py": (["--tokens", "100000", "--block", "32", "--repeats", "1", "--out", "{out}"],
                        lambda r: r["same_count"] and r["same_mean_abs"] < 1e-9 and r["q99_diff"] < 1e-9
                        and r["peak_rss_mb"]["lazy"] > 0),
    "lazy_objective.py": (["--tokens", "60000", "--block", "16", "--out", "{out}"],
                          lambda r: r["max_rel_diff"] < 1e-12 and r["lazy_peak_rss_mb"] > 0),
    "store_integrity.py": (["--tokens", "20000", "--repeats", "1", "--out", "{out}"],
                           lambda r: r["same_values"] and r["tokens"] > 10000),
    "recorder.py": (["--steps", "3", "--sequences", "8", "--length", "16", "--step-seconds", "0.05", "--weights-mb", "1",
                     "--tensors", "8", "--repeats", "1", "--out", "{out}"],
                    lambda r: r["tokens"] > 0 and r["bytes_per_token"] > 0 and r["modes"]["inline"]["store_files"] > 0
                    and r["median_step_s"] > 0),
    # start one vLLM engine each (the engine tests' lane)
    "layer_capture.py": (["--sequences", "1", "--length", "32", "--repeats", "1", "--out", "{out}"],
                         lambda r: r["sequences"] == 1 and r["length"] == 32),
    "capture_client.py": (["--prompts", "3", "--prompt-length", "4", "--max-tokens", "8", "--repeats", "2", "--profile",
                           "--out", "{out}"],
                          lambda r: r["trace_matches_outputs"] and r["tokens"] == 24 and r["us_per_token"]["median"] > 0
                          and "capture" in r["profile"]),
    "capture.py": (["--prompts", "4", "--max-tokens", "8", "--repeats", "2", "--profile", "--save-outputs",
                    "{out}.outputs.json", "--out", "{out}"],
                   lambda r: r["same_tokens_as_generate"] and r["vs_generate"] > 0 and r["tokens"] == 32
                   and r["same_params_as_generate"] and r["generate_reproducible"]
                   and r["token_agreement"]["capture_vs_generate"]["share_equal"] == 1.0
                   and r["capture_conversion_us_per_token"]["median_us"] > 0 and len(r["capture_own_s"]) == 2
                   # the capture pauses the collector in its call of vLLM, the baseline never (issue 39)
                   and r["capture_gc_pause"] is True and r["gc_enabled_in_llm_generate"] == {
                       "generate": True, "capture": False, "generate_gc_paused": False, "capture_unpaused": True,
                       **({"generate_list_logprobs": True} if r["flat_logprobs"] else {}), "generate_no_logprobs": True}
                   and set(r["paired_vs_generate"]) == set(r["median_s"]) - {"generate"}
                   and len(r["young_collection_after_pause"]["young_count"]) == 3
                   and set(r["profile"]["gc"]) == {"capture", "generate"}
                   and 0 < r["inner_generate_paired"]["min"] and len(r["gc_s"]["capture"]) == 2
                   and r["profile"]["generate_s"] <= r["profile"]["total_s"]
                   and r["paired"]["vs_generate"]["min"] > 0 and len(r["client_cpu_s"]["capture"]) == 2
                   and (not r["flat_logprobs"] or "generate_list_logprobs" in r["median_s"])
                   and set(r["logprobs_containers_us_per_token"]) >= {"vllm_fill_list", "vllm_fill_flat", "read_flat"}),
}
ENGINE = {"layer_capture.py", "capture.py"}


def test_every_benchmark_has_a_smoke_run():
    assert sorted(SMOKE) == sorted(p.name for p in BENCH.glob("*.py"))


@pytest.mark.parametrize("script", [pytest.param(s, marks=pytest.mark.engine) if s in ENGINE else s for s in sorted(SMOKE)])
def test_benchmark_runs_at_a_small_size(script, tmp_path, request):
    if script in ("head_chunking.py", "rescoring.py", *ENGINE):
        pytest.importorskip("torch")
    if script in ENGINE:
        request.getfixturevalue("release_engines")()  # the script's engine needs the engine lock
    args, holds = SMOKE[script]
    res, out = _run(script, args, tmp_path)
    if script == "head_chunking.py":
        rows = json.loads(res.stdout)["rows"]
        assert len(rows) == 2 and all(r["same_result"] for r in rows)  # chunked = unchunked
    if holds is not None:
        assert holds(json.loads(out.read_text())), out.read_text()[:2000]


def test_capture_client_benchmark_replays_saved_outputs(tmp_path):
    """``capture_client.py --outputs``: vLLM's own output objects rebuilt from the JSON that ``capture.py
    --save-outputs`` writes give that JSON back, and the capture's trace holds their tokens and logprobs."""
    pytest.importorskip("vllm")
    sys.path.insert(0, str(BENCH))
    try:
        from capture_client import outputs_json, synthetic, vllm_outputs
    finally:
        sys.path.remove(str(BENCH))
    saved = synthetic(prompts=3, prompt_length=5, tokens=7, seed=1)
    back = outputs_json(vllm_outputs(saved), saved["model"], saved["sampling"], saved["effective_config"])
    assert back == json.loads(json.dumps(saved))  # every field through vLLM's classes and back
    (tmp_path / "outputs.json").write_text(json.dumps(saved))
    _, out = _run("capture_client.py", ["--outputs", str(tmp_path / "outputs.json"), "--repeats", "1", "--out", "{out}"],
                  tmp_path)
    r = json.loads(out.read_text())
    assert r["trace_matches_outputs"] and r["tokens"] == 21 and r["source"].endswith("outputs.json"), r


def test_lazy_benchmark_of_summary_dashboard_and_diagnose_runs_at_a_small_size(tmp_path):
    """``lazy_summary.py --all``: the streamed summary + verl dashboard + diagnose agree with the
    same calls in memory (a sample small enough that diagnose judges one sequence in 4)."""
    _, out = _run("lazy_summary.py", ["--all", "--tokens", "60000", "--block", "16", "--repeats", "1",
                                      "--sample-tokens", "16000", "--out", "{out}"], tmp_path)
    r = json.loads(out.read_text())
    assert r["same_count"] and r["same_findings"] and r["n_findings"] > 0, r
    assert r["dashboard_max_rel_diff"] < 1e-9 and "one sequence in 4" in r["sample"], r
    assert r["peak_rss_mb"]["lazy"] > 0 and set(r["parts_s"]["lazy"]) == {"summary", "dashboard", "diagnose"}


def test_recorder_benchmark_runs_without_dask(tmp_path):
    """The GPU image has no dask: the recorder writes without it (only the timed lazy open needs it)."""
    out = tmp_path / "result.json"
    hide = ("import runpy, sys; sys.modules.update(dict.fromkeys(['dask', 'dask.array'])); "
            f"sys.argv = sys.argv[1:]; runpy.run_path({str(BENCH / 'recorder.py')!r}, run_name='__main__')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, "-c", hide, "recorder.py", "--steps", "2", "--sequences", "4", "--length", "8",
                          "--step-seconds", "0.01", "--weights", "random", "--weights-mb", "1", "--tensors", "4",
                          "--repeats", "1", "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["tokens"] > 0 and r["modes"]["background"]["open_lazy_s"] is None, r


def _flop_setup():
    """(torch, ``rescoring.flops``, a seeded eager-attention Llama (hidden 64, 3 layers, vocabulary 300),
    FlopCounterMode)."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import LlamaConfig, LlamaForCausalLM

    sys.path.insert(0, str(BENCH))
    try:
        from rescoring import flops
    finally:
        sys.path.remove(str(BENCH))
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300, attn_implementation="eager")
    torch.manual_seed(0)
    return torch, flops, LlamaForCausalLM(cfg).eval(), FlopCounterMode


def test_rescoring_flops_match_torchs_flop_counter():
    """``rescoring.flops``: the projections and the head equal torch's FlopCounterMode on an eager-attention
    Llama; the attention term is the hand count (eager attention multiplies the full S x S, causal is half
    of it plus the diagonal)."""
    torch, flops, model, FlopCounterMode = _flop_setup()
    cfg, n, s = model.config, 3, 20
    with torch.inference_mode(), FlopCounterMode(display=False) as fc:
        model(input_ids=torch.randint(0, 300, (n, s)))
    full_attention = 3 * n * 4 * s * s * 64  # layers x sequences x (QK^T + AV, 2 FLOPs each) x S^2 x hidden
    causal_attention = 3 * n * 2 * 64 * s * (s + 1)
    assert flops(cfg, {"length": s}, n * s, n * s) - causal_attention == fc.get_total_flops() - full_attention
    # the head over fewer rows: 2 x hidden x vocab less a row
    assert flops(cfg, {"length": s}, n * s, n * s) - flops(cfg, {"length": s}, n * s, n * s - 1) == 2 * 64 * 300


def test_rescoring_flops_of_the_scorers_layouts_match_torchs_flop_counter():
    """What ``Scorer.score`` multiplies, padded and packed, counted by FlopCounterMode (eager attention): the
    useful FLOPs of ``rescoring.flops`` (causal attention within each sequence, the head over the response rows)
    plus the masked attention the kernels also multiply: each row's full S x S, where a packed row's S is the
    micro-batch's tokens together."""
    torch, flops, model, FlopCounterMode = _flop_setup()
    import numpy as np

    from rlparity.config.settings import TrainerSettings
    from rlparity.score import Scorer
    from rlparity.trace import from_rollouts

    cfg, n, s, prompt, batch = model.config, 4, 20, 6, 2
    ids = torch.randint(0, 300, (n, s)).numpy()
    trace = from_rollouts(prompt_token_ids=[r[:prompt].tolist() for r in ids], token_ids=[r[prompt:].tolist() for r in ids],
                          rollout_logprobs=[np.full(s - prompt, -1.0)] * n, temperature=[0.7] * n, top_k=[50] * n,
                          top_p=[1.0] * n)
    useful = flops(cfg, {"length": s}, n * s, n * (s - prompt))
    causal = 3 * n * 2 * 64 * s * (s + 1)  # layers x sequences x 4 hidden per (query, key) pair, causal
    for layout, rows, row_len in (("padded", n, s), ("packed", n // batch, batch * s)):
        scorer = Scorer(model, batch_size=batch, progress=False, tokenize_prompts=False, compile_head=False,
                        settings=TrainerSettings(layout=layout, self_check=0, fingerprint=False))
        with FlopCounterMode(display=False) as fc:
            scorer.score(trace)
        assert fc.get_total_flops() == useful - causal + 3 * rows * 4 * row_len ** 2 * 64, layout


def test_rescoring_flops_of_ragged_sequences_match_torchs_flop_counter():
    """``--ragged``: ``rescoring.flops`` with per-sequence ``lengths`` is the sum of what FlopCounterMode counts
    for each sequence run alone (eager attention: its full L x L less the causal half), and
    ``ragged_lengths`` stays within LOW x .. 1 x the response length, the prompt added, seeded."""
    torch, flops, model, FlopCounterMode = _flop_setup()
    sys.path.insert(0, str(BENCH))
    try:
        from rescoring import ragged_lengths
    finally:
        sys.path.remove(str(BENCH))
    cfg, lengths = model.config, [7, 20, 13]
    counted = 0
    for n in lengths:
        with torch.inference_mode(), FlopCounterMode(display=False) as fc:
            model(input_ids=torch.randint(0, 300, (1, n)))
        counted += fc.get_total_flops() - 3 * 4 * n * n * 64 + 3 * 2 * 64 * n * (n + 1)  # full -> causal
    assert flops(cfg, {"length": 20, "lengths": lengths}, sum(lengths), sum(lengths)) == counted
    shape = {"prompt": 16, "length": 116, "sequences": 400}
    got = ragged_lengths(shape, 0.25)
    assert got == ragged_lengths(shape, 0.25) and len(got) == 400
    assert min(got) == 16 + 25 and max(got) == 116 and len(set(got)) > 50  # 25 = ceil(0.25 x 100)
    with pytest.raises(SystemExit, match="--ragged 0"):
        ragged_lengths(shape, 0.0)


def _run(script, args, tmp_path):
    out = tmp_path / "result.json"
    argv = [a.replace("{out}", str(out)) for a in args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run([sys.executable, str(BENCH / script), *argv], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{script} failed:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res, out
