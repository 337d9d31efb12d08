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
time) to the result, with the collector's seconds and collections in that capture and in one ``generate``. Odd repeats run the methods in reverse order (no method always follows the same one).

Where the capture's extra time goes: every method's ``LLM.generate`` call is timed (wall and CPU) by one
wrapper; ``capture_inner_generate_s`` / ``_cpu_s`` is the capture's own call of vLLM, ``inner_generate_paired`` /
``inner_generate_cpu_paired`` its ratio to ``generate`` (above 1: vLLM itself ran slower inside the capture),
``capture_own_s`` / ``capture_own_cpu_s`` the rest of each capture (rlparity's work), and
``capture_conversion_us_per_token`` what the capture adds after vLLM returns (``Engine._trace``), timed again on
the last ``generate``'s own outputs without the engine. ``gc_s`` / ``gc_full_collections``: seconds in Python's
garbage collector and its full collections during each call. A full collection walks the whole heap of this
process (about 0.3 s at the 0.7M objects of a CPU engine's client, 2026-12-07) and falls on whichever call pushes
the objects promoted since the last one past a quarter of the heap: with the same calls in every repeat, on the
same method each time. Each timed call therefore starts after an untimed ``gc.collect()``, so none pays for
the garbage of the calls before it. The capture pauses the collector in its
call of vLLM (``rlparity.capture.gc_pause``, ``defaults().capture_gc_pause``; ``--gc-pause on|off``, recorded as
``capture_gc_pause``); ``generate`` never does (``gc_enabled_in_llm_generate``: the collector's state in each row's
call), so ``vs_generate`` stays the capture against vLLM's own generate. Two more rows show what the pause alone
does (``--no-gc-rows`` drops them): ``generate_gc_paused`` (vLLM's generate in the same pause) and the capture with
the other setting (``capture_unpaused`` or ``capture_gc_paused``); ``paired_vs_generate`` holds every row's paired
ratio to ``generate``. ``young_collection_after_pause``: the collection a paused generate owes once the collector is
on again, and what a full collection then finds. ``same_params_as_generate``: the capture's call of
``LLM.generate`` (watched in the warm-up) got the same inputs and ``SamplingParams`` (every field) as
``generate``; ``token_agreement`` compares the capture's tokens with generate's, and generate's with its own
warm-up (``generate_reproducible``): where vLLM's numerics depend on the batch (bf16 on a GPU, requests reaching
the engine core while it already steps), the same seeds need not give the same tokens, the capture aside.

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
import gc
import io
import json
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


def profile_capture(eng, prompts, sampling, generate, top: int = 25) -> dict:
    """cProfile of one capture: the functions by cumulative seconds, vLLM's generate apart; and the garbage
    collector's seconds and collections per generation (``gc``) in that capture and in one plain ``generate()``
    (vLLM's own call, the collector as found) profiled the same way (cProfile does not see the collector: its time
    falls in whichever function allocated)."""
    clock = GcClock()
    gc.callbacks.append(clock)
    try:
        gc.collect()
        clock.reset()
        prof = cProfile.Profile()
        prof.enable()
        t = time.perf_counter()
        generate()
        base = {"total_s": time.perf_counter() - t, "gc_s": clock.seconds, "gc_collections": list(clock.collections)}
        prof.disable()
        gc.collect()
        clock.reset()
        prof = cProfile.Profile()
        prof.enable()
        eng.capture(prompts, sampling, progress=False)
        prof.disable()
        own_gc = {"capture": {"gc_s": clock.seconds, "gc_collections": list(clock.collections)}, "generate": base}
    finally:
        gc.callbacks.remove(clock)
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
    return {"total_s": total, "generate_s": generate, "gc": own_gc,
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


class GcClock:
    """Seconds and collections of Python's garbage collector (``gc.callbacks``) since the last :meth:`reset`."""

    def __init__(self):
        self.seconds, self.collections, self._t0 = 0.0, [0, 0, 0], 0.0

    def __call__(self, phase, info):
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.collections[info["generation"]] += 1

    def reset(self):
        self.seconds, self.collections = 0.0, [0, 0, 0]


def young_collection_after_pause(generate, repeats: int = 3) -> dict:
    """What vLLM's generate leaves behind when the collector is paused around it (``rlparity.capture.gc_pause``),
    ``repeats`` times after an untimed ``gc.collect()``: the young generation's count at the end of the call
    (``young_count``: what the young collection owed will walk), the seconds of that collection run explicitly
    still inside the pause (``gc.collect(0)``; without it the first allocation after the pause starts the same
    collection), then a full ``gc.collect()``: its seconds and the unreachable objects it finds (the cyclic garbage
    of the call, which waited for a collection). Medians, and the counts of each repeat."""
    from rlparity.capture.gc_pause import gc_paused

    young, counts, full, unreachable = [], [], [], []
    for _ in range(repeats):
        gc.collect()
        with gc_paused():
            out = generate()
            counts.append(gc.get_count()[0])
            t = time.perf_counter()
            gc.collect(0)
            young.append(time.perf_counter() - t)
        t = time.perf_counter()
        unreachable.append(gc.collect())
        full.append(time.perf_counter() - t)
        del out
    return {"young_count": counts, "young_collect_s": statistics.median(young),
            "full_collect_s": statistics.median(full), "full_collect_unreachable": statistics.median(unreachable)}


def token_agreement(a, b) -> dict:
    """How far two token arrays ``(sequences, positions)`` agree: equal or not, the share of equal positions, and
    per sequence the first position where they differ (the median and the smallest; None where all agree)."""
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return {"equal": False, "shapes": [list(a.shape), list(b.shape)]}
    diff = a != b
    first = [int(np.argmax(row)) for row in diff if row.any()]
    return {"equal": not diff.any(), "share_equal": float(1 - diff.mean()), "sequences_differing": len(first),
            "first_difference_median": statistics.median(first) if first else None,
            "first_difference_min": min(first) if first else None}


def conversion_cost(eng, requests, outputs, tokens: int, repeats: int = 5) -> dict:
    """Microseconds per token of what the capture adds after vLLM returns (``Engine._trace``: completions, attrs,
    the trace), timed on ``outputs`` of a plain ``generate`` (no engine work), min and median of ``repeats``."""
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        eng._trace(requests, outputs, 0.0, "default", eng.policy_version, 0, False)
        ts.append((time.perf_counter() - t) / tokens * 1e6)
    return {"min_us": min(ts), "median_us": statistics.median(ts), "seconds_median": statistics.median(ts) * tokens / 1e6}


class WatchedGenerate:
    """``LLM.generate`` with what its last call was sent and took (wall and this process's CPU seconds)."""

    def __init__(self, generate):
        self.generate, self.inputs, self.params, self.wall, self.cpu = generate, None, None, 0.0, 0.0
        self.gc_enabled: bool | None = None  # whether the collector ran during the last call

    def __call__(self, inputs, params, **kw):
        self.inputs, self.params, self.gc_enabled = inputs, params, gc.isenabled()
        t, c = time.perf_counter(), time.process_time()
        try:
            return self.generate(inputs, params, **kw)
        finally:
            self.wall, self.cpu = time.perf_counter() - t, time.process_time() - c


def same_params(sent, params) -> bool:
    """Whether two lists of ``SamplingParams`` hold the same values in every field."""
    fields = lambda q: {f: getattr(q, f) for f in getattr(q, "__struct_fields__", ())} or repr(q)  # noqa: E731
    return len(sent) == len(params) and all(fields(x) == fields(y) for x, y in zip(sent, params))


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
    p.add_argument("--gc-pause", choices=["on", "off"], default=None,
                   help="the capture's setting defaults().capture_gc_pause (default: the defaults' value, on)")
    p.add_argument("--no-gc-rows", action="store_true",
                   help="skip the generate_gc_paused row and the capture row with the other gc-pause setting")
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop repeating (at least one repeat) and skip the profile once another repeat would end "
                        "past this many seconds from the start, so a caller's time limit still gets the JSON")
    p.add_argument("--save-outputs", default=None,
                   help="write the last generate's outputs here as JSON (capture_client.py --outputs replays them)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--out-dir", default=None, help="write capture_<card>.json into this folder")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import torch
    import vllm

    from rlparity.capture import Engine, EngineSettings
    from rlparity.capture.gc_pause import gc_paused
    from rlparity.capture.requests import make_requests
    from rlparity.config import defaults, defaults_context
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
    pause = defaults().capture_gc_pause if a.gc_pause is None else a.gc_pause == "on"
    other = "capture_unpaused" if pause else "capture_gc_paused"  # the capture row with the other setting
    res["capture_gc_pause"] = pause  # the setting the capture row ran with (defaults().capture_gc_pause)
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
        def capture_with(setting: bool):
            def run():
                with defaults_context(capture_gc_pause=setting):
                    return eng.capture(prompts, sampling, progress=False)
            return run

        def generate_paused():
            with gc_paused():
                return llm.generate(inputs, params, use_tqdm=False)

        # generate is vLLM's own call with the collector as found (never paused): the baseline of vs_generate
        methods = {"generate": lambda: llm.generate(inputs, params, use_tqdm=False), "capture": capture_with(pause)}
        if not a.no_gc_rows:  # what the pause alone does: to vLLM's own generate, and to the capture
            methods["generate_gc_paused"] = generate_paused
            methods[other] = capture_with(not pause)
        if flat:
            methods["generate_list_logprobs"] = lambda: llm.generate(inputs, listed, use_tqdm=False)
        if not a.no_baseline_without_logprobs:
            methods["generate_no_logprobs"] = lambda: llm.generate(inputs, bare, use_tqdm=False)
        # every method's LLM.generate call goes through one watcher (the same small cost for all): what the
        # capture sends, and the wall and CPU time of its own call of vLLM
        watch = WatchedGenerate(llm.generate)
        llm.generate = watch
        gc_on: dict[str, bool | None] = {}  # whether the collector ran in each method's LLM.generate call
        for name, fn in methods.items():  # warm-up
            out = fn()
            gc_on[name] = watch.gc_enabled
            if name == "generate":
                first_tokens = np.array([list(o.outputs[0].token_ids) for o in out])
            elif name == "capture":
                res["same_params_as_generate"] = bool(same_params(watch.params, params) and watch.inputs == inputs)
            del out
        times: dict[str, list[float]] = {k: [] for k in methods}
        cpu: dict[str, list[float]] = {k: [] for k in methods}  # this process's CPU seconds: the engine core runs apart
        gc_s: dict[str, list[float]] = {k: [] for k in methods}
        gc_full: dict[str, list[int]] = {k: [] for k in methods}
        inner: dict[str, list[float]] = {"wall": [], "cpu": []}  # the capture's own LLM.generate call
        clock = GcClock()
        gc.callbacks.append(clock)
        last: dict = {}
        late = False
        names = list(methods)
        for r in range(a.repeats):
            t_repeat = time.perf_counter()
            for name in (names if r % 2 == 0 else names[::-1]):  # alternate the order: no method always follows another
                last.pop(name, None)
                gc.collect()  # untimed: no call inherits the garbage collector's debt of the one before (see gc_s)
                clock.reset()
                t, c = time.perf_counter(), time.process_time()
                last[name] = methods[name]()
                times[name].append(time.perf_counter() - t)
                cpu[name].append(time.process_time() - c)
                gc_s[name].append(clock.seconds)
                gc_full[name].append(clock.collections[2])
                if name == "capture":
                    inner["wall"].append(watch.wall)
                    inner["cpu"].append(watch.cpu)
            print(f"# repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in times.items()), file=sys.stderr)
            took = time.perf_counter() - t_repeat
            late = a.budget_s is not None and time.perf_counter() - t_start + took > a.budget_s
            if late:
                print(f"# --budget-s {a.budget_s}: stopping after {r + 1} repeats", file=sys.stderr)
                break
        gc.callbacks.remove(clock)
        res["repeats_done"] = len(times["capture"])
        res["gc_enabled_in_llm_generate"] = gc_on  # the baseline's True, the capture's (not capture_gc_pause)
        assert gc_on["generate"] is True or not gc.isenabled(), "the baseline generate must run unpaused"
        res["young_collection_after_pause"] = young_collection_after_pause(methods["generate"])
        # the same seeds give the same tokens where the engine's numerics do not depend on the batch: the capture's
        # trace against generate's, and generate against its own warm-up (a difference there is vLLM's, not the capture's)
        gen_tokens = np.array([list(o.outputs[0].token_ids) for o in last["generate"]])
        cap_tokens = last["capture"]["token_id"].values[:, :a.max_tokens]
        same = bool(np.array_equal(cap_tokens, gen_tokens))
        res["token_agreement"] = {"capture_vs_generate": token_agreement(cap_tokens, gen_tokens),
                                  "generate_vs_its_warm_up": token_agreement(gen_tokens, first_tokens)}
        res["generate_reproducible"] = res["token_agreement"]["generate_vs_its_warm_up"]["equal"]
        res["capture_conversion_us_per_token"] = conversion_cost(eng, requests, last["generate"], res["tokens"])
        if a.save_outputs:
            from capture_client import outputs_json  # benchmarks/ is the script's folder

            Path(a.save_outputs).write_text(json.dumps(outputs_json(last["generate"], path, sampling.model_dump(),
                                                                    eng.effective_config())))
        del last
        llm.generate = watch.generate
        if a.profile and not late:
            with defaults_context(capture_gc_pause=pause):
                res["profile"] = profile_capture(eng, prompts, sampling, methods["generate"])
    shutil.rmtree(work, ignore_errors=True)  # the random checkpoint (3 GB at 1.5b)
    med = {k: statistics.median(v) for k, v in times.items()}
    res.update({"times_s": times, "median_s": med, "vs_generate": med["capture"] / med["generate"],
                "paired": {f"vs_{base}": paired(times["capture"], times[base]) for base in times if base != "capture"},
                # every row against the baseline, repeat by repeat (capture_unpaused: the capture without the pause)
                "paired_vs_generate": {k: paired(v, times["generate"]) for k, v in times.items() if k != "generate"},
                "client_cpu_s": cpu,
                "client_cpu_paired": {f"vs_{base}": paired(cpu["capture"], cpu[base]) for base in cpu if base != "capture"},
                "gc_s": gc_s, "gc_full_collections": gc_full,
                # the capture split: its own LLM.generate call, and the rest (rlparity's own work)
                "capture_inner_generate_s": inner["wall"], "capture_inner_generate_cpu_s": inner["cpu"],
                "capture_own_s": [c - g for c, g in zip(times["capture"], inner["wall"])],
                "capture_own_cpu_s": [c - g for c, g in zip(cpu["capture"], inner["cpu"])],
                "inner_generate_paired": paired(inner["wall"], times["generate"]),
                "inner_generate_cpu_paired": paired(inner["cpu"], cpu["generate"]),
                "same_tokens_as_generate": same, "goal_vs_generate": 1.05,
                "tokens_per_s": {k: res["tokens"] / v for k, v in med.items()},
                "wall_s": round(time.perf_counter() - t_start, 1)})
    if "generate_no_logprobs" in med:
        res["logprobs_cost"] = med["generate"] / med["generate_no_logprobs"]
    pair = res["paired"]["vs_generate"]
    print(f"{a.shape} on {card}: {a.prompts} prompts x {a.max_tokens} tokens, median of {a.repeats}: generate "
          f"{med['generate']:.3f} s, capture {med['capture']:.3f} s -> vs_generate {res['vs_generate']:.3f} "
          f"(paired: min {pair['min']:.3f}, median {pair['median']:.3f}; goal <= 1.05; this process's CPU time: "
          f"{res['client_cpu_paired']['vs_generate']['median']:.3f}); the capture's own LLM.generate / generate "
          f"{res['inner_generate_paired']['median']:.3f}, its own work {statistics.median(res['capture_own_s']):.3f} s "
          f"({res['capture_conversion_us_per_token']['median_us']:.2f} us a token on generate's outputs); same "
          f"tokens: {same} (same params: {res['same_params_as_generate']}; generate reproduces its own: "
          f"{res['generate_reproducible']})"
          + (f"; logprobs cost vLLM {res['logprobs_cost']:.2f}x" if "logprobs_cost" in res else "")
          + (f"; vLLM's list logprobs {med['generate_list_logprobs'] / med['generate']:.3f}x the flat ones"
             if "generate_list_logprobs" in med else ""))
    young = res["young_collection_after_pause"]
    print(f"garbage collector: capture_gc_pause {pause}; median seconds in it: "
          + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in gc_s.items())
          + "; paired median vs generate: " + ", ".join(f"{k} {v['median']:.3f}" for k, v in res["paired_vs_generate"].items())
          + f"; after a paused generate: the young collection owed {young['young_collect_s'] * 1e3:.1f} ms "
          f"({statistics.median(young['young_count'])} young objects), a full collection "
          f"{young['full_collect_s'] * 1e3:.1f} ms finding {young['full_collect_unreachable']} unreachable objects")
    if "profile" in res:
        print(res["profile"]["text"])
        print("profile's garbage collector:", json.dumps(res["profile"]["gc"]))
    from rescoring import card_tag, write  # benchmarks/ is the script's folder

    write(res, a.out, a.out_dir and Path(a.out_dir) / f"capture_{card_tag(card, 'cuda' if cuda else 'cpu')}.json")
    return res


if __name__ == "__main__":
    main()
