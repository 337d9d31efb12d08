"""Benchmark: what rlparity's capture adds to vLLM's generate, per token, without an engine (issue 39).

``Engine.capture`` is run with a stand-in for ``vllm.LLM`` whose ``generate`` hands back outputs made before
the clock starts, so what is timed is the capture's own client work: requests, ``SamplingParams``, the sampled
logprobs read out of vLLM's containers, completions, attrs and the trace, validated. The outputs are vLLM's own
classes (``RequestOutput``, ``CompletionOutput`` and the ``FlatLogprobs`` that vLLM's ``append_logprobs_for_next_position``
fills for ``logprobs=0``), either synthetic (random tokens and logprobs, the text decoded by the project's
tokenizer) or, with ``--outputs``, the real outputs of a ``generate`` that ``benchmarks/capture.py --save-outputs``
wrote (JSON). ``trace_matches_outputs``: the trace's token ids and rollout logprobs are the outputs' own, bitwise.

The same share, on a GPU host's real outputs, is ``capture_conversion_us_per_token`` of ``capture.py``; this
script measures it anywhere, in seconds, at the GPU benchmark's size:

    python benchmarks/capture_client.py                                   # 256 prompts x 512 tokens, synthetic
    python benchmarks/capture_client.py --outputs outputs.json --profile  # saved real outputs, plus a cProfile
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def synthetic(prompts: int, prompt_length: int, tokens: int, seed: int = 0) -> dict:
    """Outputs of ``prompts`` requests of ``tokens`` sampled tokens each, in the JSON form of :func:`outputs_json`."""
    import numpy as np

    from rlparity.models import build_tokenizer

    tok = build_tokenizer()
    rng = np.random.default_rng(seed)
    high = len(tok)
    out = []
    for i in range(prompts):
        ids = rng.integers(4, high, size=tokens).tolist()
        lps = (-rng.exponential(2.0, size=tokens)).tolist()
        out.append({"request_id": str(i), "prompt_token_ids": rng.integers(4, high, size=prompt_length).tolist(),
                    "num_cached_tokens": 0,
                    "outputs": [{"index": 0, "text": tok.decode(ids), "token_ids": ids, "logprobs": lps,
                                 "ranks": rng.integers(1, 21, size=tokens).tolist(),
                                 "decoded_tokens": tok.convert_ids_to_tokens(ids), "finish_reason": "length"}]})
    return {"model": "synthetic", "sampling": {"temperature": 0.7, "top_k": 20, "max_tokens": tokens, "seed": 0,
                                               "ignore_eos": True},
            "effective_config": {}, "outputs": out}


def outputs_json(outputs, model: str, sampling: dict, effective_config: dict) -> dict:
    """vLLM ``RequestOutput``s with sampled-token logprobs (``logprobs=0``) as JSON (what ``--outputs`` reads).

    Parameters
    ----------
    outputs : list of vllm.RequestOutput
        What ``LLM.generate`` returned.
    model : str
        The model the engine ran.
    sampling : dict
        ``SamplingSettings.model_dump()`` of the requests.
    effective_config : dict
        ``Engine.effective_config()`` of the engine.

    Returns
    -------
    dict
        ``model``, ``sampling``, ``effective_config`` and per request its id, prompt ids, cached prompt tokens and
        outputs (index, text, token ids, the logprob, rank and decoded text of each sampled token, finish reason).
    """
    from rlparity.capture.offline import sampled_logprobs

    def one(c):
        lp = c.logprobs
        starts = getattr(lp, "start_indices", None)
        ranks = [lp.ranks[i] for i in starts] if starts is not None else [step[t].rank for step, t in
                                                                           zip(lp, c.token_ids)]
        decoded = ([lp.decoded_tokens[i] for i in starts] if starts is not None
                   else [step[t].decoded_token for step, t in zip(lp, c.token_ids)])
        return {"index": c.index, "text": c.text, "token_ids": list(c.token_ids),
                "logprobs": sampled_logprobs(lp, list(c.token_ids)), "ranks": ranks, "decoded_tokens": decoded,
                "finish_reason": c.finish_reason}

    return {"model": model, "sampling": sampling, "effective_config": effective_config,
            "outputs": [{"request_id": o.request_id, "prompt_token_ids": list(o.prompt_token_ids),
                         "num_cached_tokens": o.num_cached_tokens, "outputs": [one(c) for c in o.outputs]}
                        for o in outputs]}


def vllm_outputs(saved: dict) -> list:
    """The ``RequestOutput``s of :func:`outputs_json`'s JSON, their logprobs filled by vLLM's own code (flat)."""
    from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs
    from vllm.outputs import CompletionOutput, RequestOutput

    def logprobs(c):
        lp = create_sample_logprobs(True)
        for t, v, r, d in zip(c["token_ids"], c["logprobs"], c["ranks"], c["decoded_tokens"]):
            append_logprobs_for_next_position(lp, [t], [v], [d], r, 0)
        return lp

    return [RequestOutput(o["request_id"], None, list(o["prompt_token_ids"]), None,
                          [CompletionOutput(c["index"], c["text"], list(c["token_ids"]), float(sum(c["logprobs"])),
                                            logprobs(c), finish_reason=c["finish_reason"]) for c in o["outputs"]],
                          True, num_cached_tokens=o["num_cached_tokens"])
            for o in saved["outputs"]]


class StandInLLM:
    """What ``Engine.capture`` calls on ``vllm.LLM``: ``generate`` returns the outputs given, no engine runs."""

    def __init__(self, outputs, tokenizer):
        self.outputs, self._tokenizer = outputs, tokenizer
        self.llm_engine = SimpleNamespace(vllm_config=None)

    def generate(self, inputs, params, use_tqdm=True):
        """The outputs given (one per input)."""
        assert len(inputs) == len(params) == len(self.outputs)
        return self.outputs

    def get_tokenizer(self):
        """The tokenizer given."""
        return self._tokenizer


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--prompt-length", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--outputs", default=None, help="real outputs saved by capture.py --save-outputs (JSON)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--profile", action="store_true", help="add a cProfile of one capture to the result")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from rlparity.capture import Engine, EngineSettings
    from rlparity.config.settings import SamplingSettings
    from rlparity.models import build_tokenizer

    saved = (json.loads(Path(a.outputs).read_text()) if a.outputs
             else synthetic(a.prompts, a.prompt_length, a.max_tokens))
    outputs = vllm_outputs(saved)
    prompts = [o["prompt_token_ids"] for o in saved["outputs"]]
    sampling = SamplingSettings(**saved["sampling"])
    tokens = sum(len(c["token_ids"]) for o in saved["outputs"] for c in o["outputs"])
    eng = Engine(saved["model"], EngineSettings(), llm=StandInLLM(outputs, build_tokenizer()))
    eng.effective_config = lambda: saved["effective_config"]  # read back from a running engine otherwise
    trace = eng.capture(prompts, sampling, progress=False)  # warm-up (the weights' fingerprint is taken once)
    want = [c for o in saved["outputs"] for c in o["outputs"]]
    tok, lp = trace["token_id"].values, trace["rollout_logprob"].values
    matches = all(tok[i, :len(c["token_ids"])].tolist() == c["token_ids"]
                  and lp[i, :len(c["logprobs"])].tolist() == c["logprobs"] for i, c in enumerate(want))
    wall, cpu = [], []
    for _ in range(a.repeats):
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        eng.capture(prompts, sampling, progress=False)
        wall.append((time.perf_counter() - t) / tokens * 1e6)
        cpu.append((time.process_time() - c) / tokens * 1e6)
    res = {"source": a.outputs or "synthetic", "prompts": len(prompts), "tokens": tokens, "repeats": a.repeats,
           "us_per_token": {"median": statistics.median(wall), "min": min(wall), "cpu_median": statistics.median(cpu),
                            "cpu_min": min(cpu)},
           "seconds_median": statistics.median(wall) * tokens / 1e6, "trace_matches_outputs": bool(matches),
           "trace_positions": int(np.prod(tok.shape)), "date": time.strftime("%Y-%m-%d")}
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        eng.capture(prompts, sampling, progress=False)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(30)
        res["profile"] = text.getvalue()[-6000:]
    print(f"{res['source']}: {len(prompts)} prompts, {tokens} tokens: the capture's own work "
          f"{res['us_per_token']['median']:.3f} us a token (median of {a.repeats}; CPU "
          f"{res['us_per_token']['cpu_median']:.3f}), {res['seconds_median'] * 1e3:.1f} ms a capture; "
          f"trace = outputs: {matches}")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2))
    return res


if __name__ == "__main__":
    main()
