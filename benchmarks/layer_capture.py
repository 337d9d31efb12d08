"""Benchmark: the cost of a per-layer capture (issue 25) against a plain generate, in one run.

On one eager vLLM engine (``enforce_eager=True``: the hooks need it) and the same probe sequences:

* ``plain``: the prefill of every sequence with ``max_tokens=1``, one request at a time, no hooks
  (the baseline every ratio is taken against);
* ``capture``: the same prefills with rlparity's layer hooks on
  (:func:`rlparity.capture.layers.capture_layers`: copies of every site's output kept in the
  worker, read back after each sequence, logits at the vocabulary sample computed by the engine's
  head);
* ``profile``: the capture plus the trainer's states on the same tokens and the comparison
  (:func:`rlparity.experiments.layers.profile_arm`);
* ``plain_batched``: all prefills in one ``generate`` call (what an RL loop's engine does).

Each runs ``--repeats`` times round-robin after a warm-up; medians. Memory: the bytes of states a
capture keeps and sends per sequence (exact: the copies), the client's peak RSS increase during
the profile (Linux ``VmHWM`` after a reset), and on CUDA the worker allocator's peak above what was
allocated before the prefill (which includes the prefill's own activations).

    python benchmarks/layer_capture.py                                   # CPU, the built-in tiny model
    python benchmarks/layer_capture.py --shape 1.5b --device cuda --out layer_capture_h200.json

``--shape 1.5b``: a Llama of Qwen2-1.5B's shape (hidden 1536, 28 layers, 12 heads / 2 KV heads,
MLP 8960, tied embeddings, vocab 151936) with random weights in bf16, written to a temporary
checkpoint (no tokenizer: the engine runs with ``skip_tokenizer_init``), 4 sequences x 512 tokens.
Needs the project on ``PYTHONPATH`` (vLLM, torch, transformers, numpy, xarray).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "tiny": {"sequences": 4, "length": 340},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
             "sequences": 4, "length": 512},
}


def _rss_peak_reset() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def build_model(a, work: Path) -> tuple[str, int, bool]:
    """(checkpoint path, vocabulary size, whether it has a tokenizer)."""
    if a.shape == "tiny":
        from rlparity.models import make_model

        path = make_model("tiny", progress=False)
        return str(path), int(json.loads((path / "config.json").read_text())["vocab_size"]), True
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {k: v for k, v in SHAPES[a.shape].items() if k not in ("sequences", "length")}
    torch.manual_seed(0)
    config = LlamaConfig(**cfg, max_position_embeddings=4096)
    with torch.device(a.device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    out = work / f"llama-{a.shape}"
    model.save_pretrained(out)
    del model
    if a.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return str(out), cfg["vocab_size"], False


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--device", default="cpu", help="the trainer's device (cuda on a GPU host)")
    p.add_argument("--sequences", type=int, default=None)
    p.add_argument("--length", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gpu-memory-utilization", type=float, default=None, help="default 0.5 on CUDA (the trainer "
                   "shares the GPU)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch
    import vllm
    from vllm import SamplingParams

    from rlparity.capture import Engine, EngineSettings
    from rlparity.capture.layers import capture_layers
    from rlparity.experiments.layers import profile_arm
    from rlparity.score import Scorer
    from rlparity.trace.layers import vocab_columns

    shape = SHAPES[a.shape]
    n_seq, length = a.sequences or shape["sequences"], a.length or shape["length"]
    work = Path(tempfile.mkdtemp(prefix="bench-layer-capture-"))
    path, vocab, has_tok = build_model(a, work)
    rng = np.random.default_rng(0)
    seqs = [[1] + [int(t) for t in rng.integers(4, vocab, size=length - 1)] for _ in range(n_seq)]
    dtype = "float32" if a.shape == "tiny" else "bfloat16"
    extra = {} if has_tok else {"skip_tokenizer_init": True}
    util = a.gpu_memory_utilization or (0.5 if a.device.startswith("cuda") else None)
    settings = EngineSettings(enforce_eager=True, dtype=dtype, head_dtype="float32", enable_prefix_caching=True,
                              gpu_memory_utilization=util, max_model_len=max(1024, length + 8),
                              extra=extra)
    cols = vocab_columns(vocab)
    res: dict = {"shape": a.shape, "device": a.device, "sequences": n_seq, "length": length, "dtype": dtype,
                 "vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version(),
                 "date": time.strftime("%Y-%m-%d"), "path": "eager (enforce_eager=True)"}
    if a.device.startswith("cuda"):
        res["device_name"] = torch.cuda.get_device_name()
    t0 = time.perf_counter()
    with Engine(path, settings) as eng:
        eng.start()
        res["engine_start_s"] = round(time.perf_counter() - t0, 1)
        trainer = Scorer(path, dtype=dtype, head_dtype="float32", device=a.device, progress=False)
        llm = eng.llm
        params = SamplingParams(max_tokens=1, temperature=0.0)
        salt = iter(range(10 ** 9))

        def plain():
            for s in seqs:
                llm.generate([{"prompt_token_ids": s, "cache_salt": f"bench-{next(salt)}"}], params, use_tqdm=False)

        def plain_batched():
            llm.generate([{"prompt_token_ids": s, "cache_salt": f"bench-{next(salt)}"} for s in seqs], params,
                         use_tqdm=False)

        last: dict = {}

        def capture():
            last["caps"] = [capture_layers(eng, [s], vocab_ids=cols)[0] for s in seqs]

        def profile():
            _rss_peak_reset()
            before = _rss_mib("VmRSS")
            last["profile"] = profile_arm(eng, trainer, seqs, vocab_ids=cols)
            last["rss_extra_mib"] = _rss_mib("VmHWM") - before

        methods = {"plain": plain, "plain_batched": plain_batched, "capture": capture, "profile": profile}
        for fn in methods.values():  # warm-up
            fn()
        times: dict = {k: [] for k in methods}
        for _ in range(a.repeats):
            for k, fn in methods.items():
                if a.device.startswith("cuda"):
                    torch.cuda.synchronize()
                t = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        caps = last["caps"]
        res.update({
            "seconds": {k: round(v, 4) for k, v in med.items()},
            "ratio_vs_plain": {k: round(v / med["plain"], 2) for k, v in med.items()},
            "tokens": n_seq * length, "n_sites": int(caps[0]["states"].shape[0]) + 1,
            "hidden_size": int(caps[0]["states"].shape[-1]),
            "payload_mib_per_sequence": round(statistics.mean(c["payload_bytes"] for c in caps) / 2 ** 20, 2),
            "device_peak_extra_mib": round(max(c["device_peak_extra_bytes"] for c in caps) / 2 ** 20, 1),
            "client_rss_extra_mib_profile": round(last["rss_extra_mib"], 1),
            "max_relative_error_vs_trainer": float(np.nanmax(
                last["profile"]["layer_diff_rms"].values / last["profile"]["layer_state_rms"].values)),
        })
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
