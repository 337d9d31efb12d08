"""Benchmark: what the run recorder (:class:`rlparity.record.Recorder`) costs a training loop per
step, and what its store costs on disk per token (issue 36).

A simulated run: ``--steps`` synthetic steps shaped like the tiny model's RL step (``--sequences``
responses of up to ``--length`` tokens, prompts of ``--prompt`` tokens, pi_old and pi_theta,
rewards, advantages, a weight digest per step); each step's batch is built before the clock starts,
so only :meth:`Recorder.step` is timed, in both write modes: ``background`` (the default; the loop
waits for the metrics and alarms, ``recorder_seconds`` in the store, while a thread writes and
commits) and ``inline`` (the write and commit inside ``step()``). Reported: the median seconds the
loop waits per step, per 1000 tokens, how fast the background writer commits steps,
the recorder's share of a step of ``--step-seconds`` (default: the median wall time of the shipped
H200 RL example's steps, read from ``rlparity/data/examples/h200-rl.zarr``; pass a CPU step's time
to judge CPU), the store's bytes per real token, and the cost of a weight digest (the tiny model's
float32 parameters, or ``--weights-mb`` of random tensors: every value, as before this benchmark's
change and now, a sample of 16 tensors, every k-th value of each tensor) when torch is installed.
The issue's goal: <= 2% of the tiny model's step.

Each step first simulates the training step (``--simulate sleep``: the reference step's time asleep,
as a GPU step leaves the CPU free; ``none``: back to back, the writer's throughput), so the loop's
wall with the recorder against the same loop without it is the overhead a run pays per step (opening
the recorder and the final close, which commits the queued steps, are reported apart).

    python benchmarks/recorder.py --steps 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
EXAMPLE = Path(__file__).resolve().parents[1] / "rlparity" / "data" / "examples" / "h200-rl.zarr"


def shipped_step_seconds() -> float | None:
    """The median wall seconds of a step of the shipped H200 RL run (tiny model, 128 x 24 tokens)."""
    from rlparity.trace.storage.paths import _read_meta

    meta = _read_meta(EXAMPLE) or {}
    walls = [v["rl"]["seconds"]["wall"] for k, v in meta.items()
             if k.endswith(".zattrs") and "/" in k and isinstance(v.get("rl"), dict)]
    return statistics.median(walls) if walls else None


def batch(k: int, sequences: int, length: int, prompt: int) -> dict:
    rng = np.random.default_rng(k)
    lengths = rng.integers(max(1, length // 2), length + 1, sequences)
    mu = [np.log(rng.uniform(0.05, 0.99, n)) for n in lengths]
    pi = [np.minimum(m + rng.normal(0, 0.01, n), 0.0) for m, n in zip(mu, lengths)]
    return {"prompt_token_ids": [rng.integers(0, 50, prompt) for _ in range(sequences)],
            "token_ids": [rng.integers(0, 50, n) for n in lengths], "rollout_logprobs": mu, "trainer_logprobs": pi,
            "trainer_updated_logprobs": [np.minimum(p + 1e-3, 0.0) for p in pi], "policy_versions": k, "trainer_version": k,
            "rewards": rng.uniform(0, 1, sequences), "advantages": rng.normal(0, 1, sequences), "weight_version": k,
            "weight_digest": {f"layer.{i}": int(rng.integers(0, 2**32)) for i in range(32)}}


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _reference_checksum(tensor) -> str:
    """The checksum as rlparity computed it before this benchmark's change (bf16 copy, a second copy to
    normalise zeros, bytes copied out, ``torch.isfinite`` over every value): the same CRC, timed beside."""
    import zlib

    import torch

    b = tensor.detach().to("cpu", torch.bfloat16) + 0.0
    crc = f"{zlib.crc32(b.contiguous().view(torch.int16).numpy().tobytes()) & 0xFFFFFFFF:08x}"
    return crc if bool(torch.isfinite(b).all()) else "not-finite:" + crc


def digest_cost(mb: float, tensors: int, repeats: int, weights: str, strides: list[int]) -> dict | None:
    """Seconds of one weight digest (the fastest of ``repeats``): every value of every tensor (the
    implementation before it was made cheaper, and now), a sample of 16 tensors, and every k-th value
    of every tensor for each ``strides`` k."""
    try:
        import torch
    except ImportError:
        return None
    from rlparity.record import weight_digest

    if weights == "tiny":  # the tiny model's parameters as TRL's trainer holds them (float32)
        from transformers import AutoModelForCausalLM

        from rlparity.models import make_model

        model = AutoModelForCausalLM.from_pretrained(str(make_model("tiny-bf16", progress=False)), dtype=torch.float32)
        named = [(n, p.detach()) for n, p in model.named_parameters()]
    else:
        n = int(mb * 2**20 / 4 / tensors)
        named = [(f"model.layers.{i}.weight", torch.randn(n)) for i in range(tensors)]
    values = sum(t.numel() for _, t in named)
    out = {"weights": weights, "weights_mb": values * 4 / 2**20, "tensors": len(named), "values": values}

    def timed(fn) -> float:  # the fastest of the repeats: on a shared host the others measure the neighbours
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    out["every_value_before_s"] = timed(lambda: {n: _reference_checksum(t) for n, t in named})
    out["every_tensor_s"] = timed(lambda: weight_digest(named))
    out["sample_16_s"] = timed(lambda: weight_digest(named, sample=16))
    for k in strides:
        out[f"stride_{k}_s"] = timed(lambda k=k: weight_digest(named, stride=k))
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def _has_dask() -> bool:
    import importlib

    try:
        importlib.import_module("dask.array")
    except ImportError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sequences", type=int, default=128, help="responses per step (the tiny RL run: 16 x 8)")
    ap.add_argument("--length", type=int, default=24, help="most response tokens (the tiny RL run: 24)")
    ap.add_argument("--prompt", type=int, default=12, help="prompt tokens")
    ap.add_argument("--step-seconds", type=float, default=None,
                    help="the training step the recorder is compared with (default: the shipped H200 RL step)")
    ap.add_argument("--simulate", choices=("sleep", "none"), default="sleep",
                    help="between steps, sleep for the reference step (a GPU step) or nothing (the writer's throughput)")
    ap.add_argument("--weights-mb", type=float, default=64.0)
    ap.add_argument("--tensors", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--weights", choices=("tiny", "random"), default="tiny",
                    help="digest the tiny model's float32 parameters (8.5M values, TRL's trainer) or --weights-mb "
                         "of random tensors")
    ap.add_argument("--strides", default="61,251", help="sampled digests to time: every k-th value of each tensor")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()

    from rlparity.record import Recorder, open_run

    batches = [batch(k, a.sequences, a.length, a.prompt) for k in range(a.steps)]
    tokens = [sum(len(t) for t in b["token_ids"]) for b in batches]
    ref = a.step_seconds if a.step_seconds is not None else shipped_step_seconds()
    sim = ref if a.simulate == "sleep" else 0.0

    def simulated_step() -> None:  # a GPU step: the CPU is free meanwhile (time.sleep releases it)
        if sim:
            time.sleep(sim)

    t_base = time.perf_counter()
    for _ in batches:
        simulated_step()
    base = time.perf_counter() - t_base
    modes = {}
    for mode, background in (("background", True), ("inline", False)):
        blocked = []
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "run.zarr"
            t_open = time.perf_counter()
            rec = Recorder(path, model="synthetic", sampling={"temperature": 0.7, "top_k": 20}, background=background)
            t_all = time.perf_counter()
            for b in batches:
                simulated_step()
                t = time.perf_counter()
                rec.step(**b)
                blocked.append(time.perf_counter() - t)
            wall = time.perf_counter() - t_all
            rec.close()
            fixed = {"open_s": t_all - t_open, "close_s": time.perf_counter() - t_all - wall}
            run = open_run(path)
            live = run["recorder_seconds"].values.tolist()
            size = du(path)
            open_lazy = None
            if _has_dask():  # a lazy open needs dask (the GPU image has none; writing never does)
                t = time.perf_counter()
                open_run(path, chunks=8)
                open_lazy = time.perf_counter() - t
            files = sum(1 for _ in path.rglob("*") if _.is_file())
        steady = blocked[1:] if len(blocked) > 1 else blocked  # the first step creates the arrays
        med = statistics.median(steady)
        modes[mode] = {"median_step_s": med, "first_step_s": blocked[0], "loop_wall_s": wall, **fixed,
                       "loop_overhead_share": (wall - base) / base if base else None,
                       "median_metrics_and_alarms_s": statistics.median(live[1:] if len(live) > 1 else live),
                       "share_of_step": med / ref if ref else None, "store_bytes": size,
                       "bytes_per_token": size / sum(tokens), "store_files": files, "open_lazy_s": open_lazy}
    bg = modes["background"]
    med, med_live = bg["median_step_s"], bg["median_metrics_and_alarms_s"]
    result = {
        "steps": a.steps, "sequences": a.sequences, "length": a.length, "tokens": int(sum(tokens)),
        "simulated_step": a.simulate, "loop_without_recorder_s": base,
        "modes": modes, "median_step_s": med, "share_of_step": bg["share_of_step"], "goal_share": 0.02,
        "reference_step_s": ref,
        "reference": "--step-seconds" if a.step_seconds is not None else f"median wall of {EXAMPLE.name}'s steps",
        "per_1000_tokens_s": med / (statistics.median(tokens) / 1000), "bytes_per_token": bg["bytes_per_token"],
        "digest": digest_cost(a.weights_mb, a.tensors, a.repeats, a.weights, [int(k) for k in a.strides.split(",")]),
    }
    inline = modes["inline"]
    share = f"{100 * result['share_of_step']:.2f}% of a {ref:.3g} s step" if ref else "no reference step"
    print(f"{a.steps} steps of {a.sequences} x <= {a.length} tokens: the loop waits a median {1000 * med:.1f} ms a "
          f"step ({1000 * med_live:.1f} metrics and alarms) = {share} (goal <= 2%); the loop's wall grew "
          f"{_pct(bg['loop_overhead_share'])} against the simulated steps alone ({a.simulate}); inline writing: "
          f"{1000 * inline['median_step_s']:.1f} ms a step, wall {_pct(inline['loop_overhead_share'])}; "
          f"{result['bytes_per_token']:.1f} bytes per token on disk ({bg['store_files']} files)")
    if result["digest"]:
        g = result["digest"]
        strided = ", ".join(f"1 value in {k[7:-2]} {1000 * v:.1f} ms" for k, v in g.items() if k.startswith("stride_"))
        print(f"weight digest of {g['weights_mb']:.3g} MB ({g['weights']}, {g['tensors']} tensors): every value "
              f"{1000 * g['every_tensor_s']:.1f} ms (before: {1000 * g['every_value_before_s']:.1f} ms), 16 tensors "
              f"{1000 * g['sample_16_s']:.1f} ms, {strided}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
