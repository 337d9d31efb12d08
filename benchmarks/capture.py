"""Benchmark: rlparity's capture against vLLM's own ``LLM.generate`` on the same engine (issue 39).

Both sides run on one engine instance (``rlparity.capture.Engine``, the offline engine that
``rlparity capture`` starts), on the same prompts (token ids), with the same ``SamplingParams`` (built by
``SamplingSettings.to_vllm`` with each request's seed, ``logprobs=0``: the sampled token's logprob):

* ``generate``: ``llm.generate(prompts, params)``, the outputs as vLLM returns them (the baseline);
* ``capture``: ``Engine.capture(prompts, sampling)``: the same call plus what rlparity adds (requests,
  per-token records, the trace with its provenance attrs);
* ``generate_list_logprobs``: ``generate`` with vLLM's default logprobs container (``flat_logprobs=False``:
  a ``{token: Logprob}`` dict per token, what a plain ``SamplingParams(logprobs=0)`` returns; the capture asks
  for the flat form where vLLM has it);
* ``generate_no_logprobs``: ``generate`` with ``logprobs=None`` (what requesting logprobs costs vLLM).

Methods run round-robin, ``--repeats`` times each after one warm-up of each; medians. The result's
``vs_generate`` is capture / generate (time ratio of the medians; the target is <= 1.05); ``paired`` holds
the ratio of each repeat's pair (capture and generate run back to back), min and median, steadier on a
shared machine. ``client_cpu_s`` / ``client_cpu_paired``: the same for the CPU seconds of this process
alone (vLLM's engine core runs in a process of its own, so this is the client's work: vLLM's output
processing, logprobs containers and detokenizing, plus what rlparity adds), the steadiest measure on a busy
CPU. ``logprobs_containers_us_per_token`` (timed before the engine starts): vLLM's own code filling a
request's logprobs the list way and the flat way, and rlparity reading them back, microseconds per token.
``--profile`` adds a cProfile of one capture (the functions outside vLLM's own generate, by cumulative
time) to the result.

Models: ``tiny`` is the project's built tiny model (``rlparity.models.make_model``, the CPU default);
``small`` (hidden 512, 8 layers, vocabulary 32000) and ``1.5b`` (Qwen2-1.5B's shape as a Llama, vocabulary
151936) are random-weight Llamas with the project's tokenizer padded to the vocabulary, written to a
temporary checkpoint in the same run (no download).

    python benchmarks/capture.py --prompts 16 --max-tokens 32                  # CPU, tiny model
    python benchmarks/capture.py --shape 1.5b --prompts 256 --max-tokens 512 --out-dir results   # GPU
"""

from __future__ import annotations

import argparse
import cProfile
import io
import platform
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "small": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 8, "vocab_size": 32000, "tie_word_embeddings": False},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True},
}


def build_model(shape: str, device: str, work: Path) -> tuple[str, int]:
    """(checkpoint path, the tokenizer's base vocabulary: prompts draw below it)."""
    from rlparity.models import build_tokenizer, make_model

    base = len(build_tokenizer())
    if shape == "tiny":
        return str(make_model("tiny", progress=False)), base
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = SHAPES[shape]
    tok = build_tokenizer(vocab_pad_to=cfg["vocab_size"])
    torch.manual_seed(0)
    config = LlamaConfig(**cfg, max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    out = work / f"llama-{shape}"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return str(out), base


def profile_capture(eng, prompts, sampling, top: int = 25) -> dict:
    """cProfile of one capture: the functions by cumulative seconds, vLLM's generate apart."""
    prof = cProfile.Profile()
    prof.enable()
    eng.capture(prompts, sampling, progress=False)
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt
    rows = []
    for (file, line, name), (_cc, calls, tt, ct, _callers) in stats.stats.items():
        rows.append({"function": f"{Path(file).name}:{line}:{name}", "calls": calls, "cumulative_s": ct, "own_s": tt,
                     "in_rlparity": "rlparity" in file})
    rows.sort(key=lambda r: -r["cumulative_s"])
    generate = next((r["cumulative_s"] for r in rows if r["function"].endswith(":generate")
                     and "llm" in r["function"]), None)
    # the capture call's own cumulative time (pstats' total_tt can fall short of it)
    total = max(total, next((r["cumulative_s"] for r in rows if r["in_rlparity"] and r["function"].endswith(":capture")),
                            total))
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(top)
    return {"total_s": total, "generate_s": generate,
            "outside_generate_s": None if generate is None else total - generate,
            "rlparity_top": [r for r in rows if r["in_rlparity"]][:top], "text": text.getvalue()[-6000:]}


def containers_cost(sequences: int = 64, tokens: int = 128, repeats: int = 15) -> dict | None:
    """Microseconds per token, client side and without an engine, of vLLM's own code filling a request's logprobs
    container as its output processor does with ``logprobs=0`` (a list of ``{token: Logprob}`` dicts, or one
    ``FlatLogprobs``), and of reading the sampled logprobs back (:func:`rlparity.capture.offline.sampled_logprobs`;
    ``read_list_before``: the per-token dict lookup it replaced); fastest and median of ``repeats``. None where
    vLLM has no flat container."""
    import numpy as np

    from rlparity.capture.offline import sampled_logprobs
    try:
        from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs
        create_sample_logprobs(True)
    except (ImportError, TypeError):
        return None
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 32000, size=(sequences, tokens)).tolist()
    lps = (-rng.random((sequences, tokens))).tolist()

    def fill(flat: bool):
        out = []
        for ids, values in zip(toks, lps):
            c = create_sample_logprobs(flat)
            for t, v in zip(ids, values):
                append_logprobs_for_next_position(c, [t], [v], [None], 1, 0)
            out.append(c)
        return out

    lists, flats = fill(False), fill(True)
    before = lambda cs: [[float(step[t].logprob) for step, t in zip(c, ids)] for c, ids in zip(cs, toks)]  # noqa: E731
    after = lambda cs: [sampled_logprobs(c, ids) for c, ids in zip(cs, toks)]  # noqa: E731
    assert before(lists) == after(lists) == after(flats) == lps
    res = {}
    for name, fn, arg in (("vllm_fill_list", fill, False), ("vllm_fill_flat", fill, True),
                          ("read_list_before", before, lists), ("read_list", after, lists), ("read_flat", after, flats)):
        ts = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn(arg)
            ts.append((time.perf_counter() - t) / (sequences * tokens) * 1e6)
        res[name] = {"min_us": min(ts), "median_us": statistics.median(ts)}
    return res


def paired(num: list[float], den: list[float]) -> dict:
    """min and median of the ratios of the repeats' pairs ``num[i] / den[i]``, and the ratios."""
    ratios = [x / y for x, y in zip(num, den)]
    return {"min": min(ratios), "median": statistics.median(ratios), "ratios": ratios}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=["tiny", *SHAPES], default="tiny")
    p.add_argument("--device", default="cpu", help="where the random model is built (cuda on a GPU host)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-length", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-k", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default=None, help="the engine's dtype (default: float32 for tiny, else bfloat16)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--no-baseline-without-logprobs", action="store_true",
                   help="skip the generate_no_logprobs row")
    p.add_argument("--profile", action="store_true", help="add a cProfile of one capture to the result")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop repeating (at least one repeat) and skip the profile once another repeat would end "
                        "past this many seconds from the start, so a caller's time limit still gets the JSON")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--out-dir", default=None, help="write capture_<card>.json into this folder")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch
    import vllm

    from rlparity.capture import Engine, EngineSettings
    from rlparity.capture.requests import make_requests
    from rlparity.config.settings import SamplingSettings

    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-capture-"))
    path, base_vocab = build_model(a.shape, a.device, work)
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(4, base_vocab, size=a.prompt_length)] for _ in range(a.prompts)]
    sampling = SamplingSettings(temperature=a.temperature, top_k=a.top_k, max_tokens=a.max_tokens, seed=0,
                                ignore_eos=True)
    dtype = a.dtype or ("float32" if a.shape == "tiny" else "bfloat16")
    settings = EngineSettings(dtype=dtype, gpu_memory_utilization=a.gpu_memory_utilization,
                              max_model_len=max(1024, a.prompt_length + a.max_tokens + 8))
    cuda = torch.cuda.is_available() and a.device.startswith("cuda")
    card = torch.cuda.get_device_name() if cuda else (platform.processor() or platform.machine())
    res: dict = {"shape": a.shape, "dtype": dtype, "prompts": a.prompts, "prompt_length": a.prompt_length,
                 "max_tokens": a.max_tokens, "tokens": a.prompts * a.max_tokens, "repeats": a.repeats,
                 "sampling": sampling.model_dump(), "card": card, "vllm": vllm.__version__, "torch": torch.__version__,
                 "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}
    res["logprobs_containers_us_per_token"] = containers_cost()
    t0 = time.perf_counter()
    with Engine(path, settings) as eng:
        eng.start()
        res["engine_start_s"] = round(time.perf_counter() - t0, 1)
        llm = eng.llm
        requests = make_requests(prompts, sampling)
        inputs = [{"prompt_token_ids": r.token_ids} for r in requests]
        params = [r.sampling.to_vllm(r.seed) for r in requests]  # what Engine.capture sends
        bare = [r.sampling.to_vllm(r.seed) for r in requests]
        for q in bare:
            q.logprobs = None
        listed = [r.sampling.to_vllm(r.seed) for r in requests]
        flat = any(getattr(q, "flat_logprobs", False) for q in listed)
        for q in listed:
            q.flat_logprobs = False
        res["flat_logprobs"] = flat
        methods = {"generate": lambda: llm.generate(inputs, params, use_tqdm=False),
                   "capture": lambda: eng.capture(prompts, sampling, progress=False)}
        if flat:
            methods["generate_list_logprobs"] = lambda: llm.generate(inputs, listed, use_tqdm=False)
        if not a.no_baseline_without_logprobs:
            methods["generate_no_logprobs"] = lambda: llm.generate(inputs, bare, use_tqdm=False)
        for fn in methods.values():  # warm-up
            fn()
        times: dict[str, list[float]] = {k: [] for k in methods}
        cpu: dict[str, list[float]] = {k: [] for k in methods}  # this process's CPU seconds: the engine core runs apart
        last: dict = {}
        late = False
        for r in range(a.repeats):
            t_repeat = time.perf_counter()
            for name, fn in methods.items():
                last.pop(name, None)
                t, c = time.perf_counter(), time.process_time()
                last[name] = fn()
                times[name].append(time.perf_counter() - t)
                cpu[name].append(time.process_time() - c)
            print(f"# repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()), file=sys.stderr)
            took = time.perf_counter() - t_repeat
            late = a.budget_s is not None and time.perf_counter() - t_start + took > a.budget_s
            if late:
                print(f"# --budget-s {a.budget_s}: stopping after {r + 1} repeats", file=sys.stderr)
                break
        res["repeats_done"] = len(times["capture"])
        # the same seeds give the same tokens: the capture's trace holds what generate returned
        same = bool(np.array_equal(last["capture"]["token_id"].values[:, :a.max_tokens],
                                   np.array([list(o.outputs[0].token_ids) for o in last["generate"]])))
        del last
        if a.profile and not late:
            res["profile"] = profile_capture(eng, prompts, sampling)
    shutil.rmtree(work, ignore_errors=True)  # the random checkpoint (3 GB at 1.5b)
    med = {k: statistics.median(v) for k, v in times.items()}
    res.update({"times_s": times, "median_s": med, "vs_generate": med["capture"] / med["generate"],
                "paired": {f"vs_{base}": paired(times["capture"], times[base]) for base in times if base != "capture"},
                "client_cpu_s": cpu,
                "client_cpu_paired": {f"vs_{base}": paired(cpu["capture"], cpu[base]) for base in cpu if base != "capture"},
                "same_tokens_as_generate": same, "goal_vs_generate": 1.05,
                "tokens_per_s": {k: res["tokens"] / v for k, v in med.items()},
                "wall_s": round(time.perf_counter() - t_start, 1)})
    if "generate_no_logprobs" in med:
        res["logprobs_cost"] = med["generate"] / med["generate_no_logprobs"]
    pair = res["paired"]["vs_generate"]
    print(f"{a.shape} on {card}: {a.prompts} prompts x {a.max_tokens} tokens, median of {a.repeats}: generate "
          f"{med['generate']:.3f} s, capture {med['capture']:.3f} s -> vs_generate {res['vs_generate']:.3f} "
          f"(paired: min {pair['min']:.3f}, median {pair['median']:.3f}; goal <= 1.05; this process's CPU time: "
          f"{res['client_cpu_paired']['vs_generate']['median']:.3f}); same tokens: {same}"
          + (f"; logprobs cost vLLM {res['logprobs_cost']:.2f}x" if "logprobs_cost" in res else "")
          + (f"; vLLM's list logprobs {med['generate_list_logprobs'] / med['generate']:.3f}x the flat ones"
             if "generate_list_logprobs" in med else ""))
    if "profile" in res:
        print(res["profile"]["text"])
    from rescoring import card_tag, write  # benchmarks/ is the script's folder

    write(res, a.out, a.out_dir and Path(a.out_dir) / f"capture_{card_tag(card, 'cuda' if cuda else 'cpu')}.json")
    return res


if __name__ == "__main__":
    main()
