"""Every correction's counterfactual, with the model's real gradient, on the shipped CPU captures
whose weights this machine can rebuild (the tiny bf16 model: rlparity.models.make_model("tiny-bf16")
gives the same fingerprint as the captures' model_fingerprint).

Each arm is one real vLLM capture (32 or 8 sequences of 12 tokens). The reward is a fixed function
of the tokens (share of even token ids: the captures hold no response text to grade) and every
sequence is one group (their prompts have one sample each), so the advantages are not all zero.
The attribution (rlparity.diagnose.diagnose) names the causes each correction would hide.

    python scripts/counterfactual_examples.py [--out benchmarks/results/counterfactuals_cpu.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from rlparity.capture.build import model_info
from rlparity.datasets import example_path
from rlparity.diagnose import diagnose
from rlparity.experiments.counterfactual import correction_gradients
from rlparity.models import make_model
from rlparity.trace import open_arms

ARMS = [("cpu-semantic", "processed-head_fp32"), ("cpu-semantic", "raw-head_fp32"),
        ("cpu-head", "rollout-float32_trainer-float32"), ("cpu-head", "rollout-bfloat16_trainer-float32")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parents[1] / "benchmarks/results/counterfactuals_cpu.json")
    a = ap.parse_args()
    model = str(make_model("tiny-bf16", progress=False))
    fp = model_info(model)["model_fingerprint"]
    out = {"model": "tiny-bf16", "model_fingerprint": fp, "script": "scripts/counterfactual_examples.py", "arms": []}
    for ex, arm in ARMS:
        t = open_arms(example_path(ex))[arm].load()
        if t.attrs.get("model_fingerprint") != fp:
            raise SystemExit(f"{ex}/{arm} was captured with other weights ({t.attrs.get('model_fingerprint')} != {fp})")
        causes = sorted({f.cause for f in diagnose({arm: t}).problems() if f.cause})
        m = t["response_mask"].values.astype(bool)
        reward = np.where(m, t["token_id"].values % 2 == 0, 0).sum(1) / m.sum(1)
        t = t.assign(one_group=("sequence", np.zeros(t.sizes["sequence"], int)))
        rows = correction_gradients(t, model, rewards=reward, causes=causes, dtype="float32", group_by="one_group")
        out["arms"].append({"example": ex, "arm": arm, "causes": causes, "n_sequences": int(t.sizes["sequence"]),
                            "n_tokens": int(m.sum()), "rows": rows})
        print(ex, arm, causes)
        for r in rows:
            print(f"  {r['correction']:>20} drops {r['dropped_token_share']:.3f} tok {r['dropped_sequence_share']:.3f} "
                  f"seq, ESS {r['ess']:.3f}, cos parity {r['cosine_vs_parity']:.4f}, cos full IS "
                  f"{r['cosine_vs_full_is']:.4f}, norm x{r['norm_ratio_vs_parity']:.3f}, hides {r['hides']}")
    a.out.write_text(json.dumps(out, indent=1, default=float).replace("NaN", "null") + "\n")


if __name__ == "__main__":
    main()
