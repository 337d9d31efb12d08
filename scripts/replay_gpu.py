"""Replay and bisect on a GPU (issue 38): the user's own tokens replayed through vLLM, one knob at a
time, then pairs of knobs, then where the winner's worst tokens part, layer by layer.

On the GPU host (vLLM 0.26: no ``trace_decode_token_ids``, so the replay is a prefill with
``prompt_logprobs``; the project on PYTHONPATH), one call of at most 300 s:

    export PYTHONPATH=/tmp/site:$PWD RLPARITY_ENGINE_LOCK=off VLLM_USE_FLASHINFER_SAMPLER=0 \
        VLLM_WORKER_MULTIPROC_METHOD=spawn
    python scripts/replay_gpu.py --out $OUT --device cuda --layers --deadline 200

What it does (the built-in ``small`` model built on the device, a bf16 body; one engine start per
arm, 30-70 s each on an H200):

1. builds ``small`` (``make_model("small", device="cuda")``) and captures ``--n-prompts`` prompts
   under the ``pipelinerl-parity`` profile with a bf16 body (processed logprobs, fp32 LM head, no
   prefix caching, no async scheduling), temperature 0.7, top-k 20; ``--plant bf16_head`` captures
   with a bf16 LM head instead (a planted knob bisect must name first), ``--plant attention_backend`` with
   ``TRITON_ATTN`` instead of the default FlashAttention (the knob replays with FlashAttention);
2. scores the capture with the trainer (transformers, bf16 body, fp32 head, on the device): the gap
   each knob closes (``explained``) is what decides whether pairs run;
3. replays the captured tokens under the capture's own settings, twice, in the capture's engine
   (the baseline and the replay floor), flips one knob at a time (``--knobs``), then pairs of the
   knobs that moved tokens where no single knob closes ``defaults().bisect_explained_share`` of the
   gap (``--pairs``), then with ``--layers`` hands the winner's worst tokens to the per-layer
   localisation (two eager engines); at most ``--budget`` engine starts beside the capture's, none
   after ``--deadline`` seconds of the bisection;
4. writes ``$OUT/replay_results.json`` after the capture and at the end: replay against capture,
   the floor, every knob and pair ranked by its shift in floor units with the share of the trainer
   gap it closes, the pair decision, the layer hand-off's sentence and sites, what did not run and
   why, the engine starts and the wall time, versions and the card.

``--device cpu --size tiny --dtype float32`` runs the same on a CPU (a test run of the script).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GPU_KNOBS = "head_precision,async_scheduling,max_num_seqs,attention_backend,prefix_cache_warm,chunked_prefill,eager," \
            "batch_invariant,prefix_caching"


DASK_IMPORTS: list[str] = []


class _DaskWatch:
    """A meta-path finder that records where this project's code executes ``import dask`` (xarray
    probes for dask and takes its absence; those are left out) and lets the normal finders answer."""

    def find_spec(self, name, path=None, target=None):
        if name == "dask":
            import traceback as tb

            frames = [f for f in tb.extract_stack()[:-1] if "importlib" not in f.filename
                      and not f.filename.startswith("<frozen")]
            last = frames[-1] if frames else None
            if last is not None and last.filename.startswith(str(ROOT)):
                DASK_IMPORTS.append(f"{last.filename}:{last.lineno}")
        return None


sys.meta_path.insert(0, _DaskWatch())


def versions() -> dict:
    from rlparity.config.provenance import library_versions

    out = {**library_versions(), "date": time.strftime("%Y-%m-%d")}
    try:
        import torch

        out["device_name"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception as err:  # noqa: BLE001 - a record, not a requirement
        out["device_name"] = f"unknown ({type(err).__name__})"
    return out


def stale_capture(pool, model: str, settings, sampling, n: int):
    """A capture with prefix caching on and a stale cache; returns version 1's path and the trace.

    Prompts that share a long prefix (the CPU build caches blocks of 128 tokens) are prefilled by
    version 0, version 1 (``perturbed_checkpoint``, in a temporary folder) is loaded without a cache
    reset, and the same prompts are sampled: their prompt KV comes from version 0. The trainer and
    the bisection then run version 1.
    """
    import tempfile

    from rlparity.capture.checkpoints import perturbed_checkpoint
    from rlparity.experiments.ablation import shared_prefix_prompts

    v1 = str(perturbed_checkpoint(model, Path(tempfile.mkdtemp(prefix="rlparity-stale-")) / "v1", sigma=0.05, seed=0))
    prompts = shared_prefix_prompts(n, prefix_problems=32, seed=0)
    eng = pool.get(model, settings.replace(enable_prefix_caching=True))
    eng.capture(prompts, sampling.model_copy(update={"max_tokens": 1}), arm="prefill", progress=False)
    eng.update_weights(v1, 1, clear_cache=False)
    trace = eng.capture(prompts, sampling, arm="capture", progress=False)
    return v1, trace.assign_attrs(model=v1)


def partial(bis, trace) -> dict:
    """The bisection so far: the plan's entries, the arms replayed, and the knobs' rows once the baseline and
    the floor exist (``knob_table``), for a run that a time limit may cut off."""
    from rlparity.experiments.bisect import BASELINE, FLOOR
    from rlparity.metrics.replay import knob_table

    out: dict = {"plan": list(bis.plan), "arms": sorted(bis.arms), "engine_start_attempts": bis.attempts,
                 "wall_s": round(time.perf_counter() - bis.t0, 1)}
    knobs = [n for n in bis.arms if n not in (BASELINE, FLOOR)]
    if BASELINE in bis.arms and FLOOR in bis.arms and knobs:
        try:
            out["knobs"] = knob_table(bis.arms, baseline=BASELINE, floor=FLOOR, source=trace, knobs=knobs, top=3)
        except Exception as err:  # noqa: BLE001 - progress only; the final report is computed apart
            out["knobs_error"] = f"{type(err).__name__}: {err}"
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder for replay_results.json")
    p.add_argument("--device", default="cuda", help="cuda (GPU host) or cpu (a test run)")
    p.add_argument("--size", default=None, help="built-in model (default: small on cuda, tiny on cpu)")
    p.add_argument("--dtype", default=None, help="engine body dtype (default: bfloat16 on cuda, float32 on cpu)")
    p.add_argument("--n-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--knobs", default=GPU_KNOBS, help="comma list, in the order their engines start")
    p.add_argument("--budget", type=int, default=8, help="most engine starts of knobs, pairs and the layer "
                   "hand-off (the capture's engine replays the baseline and is not counted)")
    p.add_argument("--pairs", default="auto", help="auto, always or never")
    p.add_argument("--layers", action="store_true", help="hand the winner's worst tokens to the layer localisation")
    p.add_argument("--layer-tokens", type=int, default=None)
    p.add_argument("--deadline", type=float, default=None, help="no engine start after this many seconds of the "
                   "bisection")
    p.add_argument("--plant", default="none", choices=("none", "bf16_head", "stale_prefix_cache", "attention_backend"),
                   help="capture with a planted fault: a bf16 LM head, TRITON_ATTN instead of the default attention "
                   "kernel, or prefix caching on and a stale cache "
                   "(prompts with a shared prefix prefilled by version 0, then version 1 loaded without a cache reset)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--eager", action="store_true", help="capture (and so replay) without CUDA graphs / "
                   "compilation: an engine starts in about half the time")
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "replay_results.json"
    cpu = a.device == "cpu"
    size = a.size or ("tiny" if cpu else "small")
    dtype = a.dtype or ("float32" if cpu else "bfloat16")
    t0 = time.perf_counter()
    results: dict = {"command": "python scripts/replay_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
                     "device": a.device, "model": size, "body_dtype": dtype, **versions(), "status": "running"}

    def write() -> None:
        from rlparity.config.provenance import to_json

        results["elapsed_s"] = round(time.perf_counter() - t0, 1)
        results["dask_imports"] = DASK_IMPORTS  # the GPU host has no dask: who imported it here (none expected)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(to_json(results, indent=1))
        tmp.replace(path)

    try:
        from transformers import AutoTokenizer

        from rlparity.capture.pool import EnginePool
        from rlparity.config.profiles import load_profile
        from rlparity.config.settings import SamplingSettings
        from rlparity.experiments.bisect import BisectOptions, Bisection, report
        from rlparity.models import make_model, make_prompts

        model = str(make_model(size, progress=False, **({} if cpu else {"device": a.device})))
        from rlparity.score import Scorer

        settings = load_profile("pipelinerl-parity").replace(dtype=dtype)
        if a.plant == "bf16_head":
            settings = settings.replace(head_dtype="bfloat16")
        elif a.plant == "attention_backend":
            settings = settings.replace(attention_backend="TRITON_ATTN")
        if not cpu:
            settings = settings.replace(gpu_memory_utilization=a.gpu_memory_utilization)
        if a.eager:
            settings = settings.replace(enforce_eager=True)
        sampling = SamplingSettings(temperature=0.7, top_k=20, max_tokens=a.max_tokens, seed=0)
        with EnginePool() as pool:
            t1 = time.perf_counter()
            if a.plant == "stale_prefix_cache":
                model, trace = stale_capture(pool, model, settings, sampling, a.n_prompts)
            else:
                trace = pool.get(model, settings).capture(make_prompts(a.n_prompts), sampling, arm="capture",
                                                          progress=False)
            results["capture"] = {"seconds": round(time.perf_counter() - t1, 1),
                                  "n_tokens": int(trace["response_mask"].sum()), "plant": a.plant,
                                  "cached_prompt_tokens": trace["cached_prompt_tokens"].values.tolist()
                                  if "cached_prompt_tokens" in trace else None,
                                  "engine_effective": trace.attrs.get("engine_effective")}
            t1 = time.perf_counter()
            trace = Scorer(model, dtype=dtype, head_dtype="float32", device=a.device, progress=False).score(trace)
            results["score_s"] = round(time.perf_counter() - t1, 1)
            write()
            def progress(line: str) -> None:  # at each engine start: what ran so far, so a run cut off keeps it
                print(line, flush=True)
                results["progress"] = partial(bis, trace)
                write()

            options = BisectOptions(knobs=a.knobs.split(","), budget=a.budget, pairs=a.pairs, layers=a.layers,
                                    layer_tokens=a.layer_tokens, deadline_s=a.deadline)
            bis = Bisection(model, trace, options, pool=pool, log=progress)
            arms, record = bis.run()
        rep = report(arms, trace, record, tokenizer=AutoTokenizer.from_pretrained(model))
        results.update(status="done", bisect=rep, plan=record["plan"])
        results["bisect"]["layers"] = {k: v for k, v in (rep["layers"] or {}).items() if k != "tokens"} | \
            {"tokens": (rep["layers"] or {}).get("tokens", [])[:10]}
        write()
        cap, fl = rep["replay_vs_capture"], rep["floor"]
        print(f"{rep['mode']} replay vs capture: mean {cap['mean_abs']:.3g} max {cap['max_abs']:.3g}; floor mean "
              f"{fl['mean_abs']:.3g} max {fl['max_abs']:.3g}", flush=True)
        for r in rep["knobs"]:
            print(f"{r['rank']}. {r['knob']}: {r['floor_units']:.3g} x floor, mean |d| {r['mean_abs']:.3g}, "
                  f"moved {r['share_moved']:.1%}, closes {r.get('explained')}", flush=True)
        print(f"pairs: {rep['pairs']['why']}", flush=True)
        print(f"layers: {(rep['layers'] or {}).get('sentence') or rep['layers']}", flush=True)
        for p_ in rep["not_run"]:
            print(f"{p_['status']}: {p_['knob']}: {p_['reason']}", flush=True)
        print(f"{rep['engine_starts']} engine starts, {rep['wall_s']:.1f} s; wrote {path}", flush=True)
        return 0
    except Exception as err:  # noqa: BLE001 - the record says what failed
        results.update(status="failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
        write()
        print(results["traceback"], file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
