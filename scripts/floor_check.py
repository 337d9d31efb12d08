"""Two floor readings of one trainer, side by side (issue 41: "rlparity's own floor numbers disagree
about 50x"): the trainer's self-check (every Scorer run rescores a few sequences alone, twice:
``attrs["trainer"]["self_check"]``, what the diagnosis reads) and an independent rescoring of the
whole rollout at batch 1, 16 and 64 (:func:`rlparity.experiments.floors.floor_run`, what
``rlparity experiment floors`` and the old ``rlparity floor MODEL`` report), in a bf16 and a
float32 body.

    python scripts/floor_check.py --out DIR [--device cuda] [--size small] [--dtypes bfloat16,float32]

Writes ``DIR/floor_check.json``: per body dtype and shape, the gap (mean |d| against the engine), the
independent floor against batch 1 (mean |x| over every token), the self-check's batch-shape and
run-to-run floors (mean |x| over its sequences), and the self-check's sequences rescored by the
batch-1 arm against the same sequences in the shape's own batch (the independent reading of what the
self-check claims to measure).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def compare(arms: dict, reference: str = "batch1") -> dict:
    """The two readings per shape (module docstring)."""
    from rlparity.diagnose.evidence import trainer_floor
    from rlparity.metrics import core

    ref = arms[reference]
    mask = ref["response_mask"].values.astype(bool)
    mu = ref["rollout_logprob"].values
    rows = {}
    for name, ds in arms.items():
        pi = ds["trainer_processed_logprob"].values
        pi_ref = ref["trainer_processed_logprob"].values
        floor = trainer_floor(ds, "processed")
        check = (ds.attrs.get("trainer") or {}).get("self_check") or {}
        picked = np.zeros(mask.shape[0], bool)
        picked[list(check.get("sequences") or [])] = True
        sub = mask & picked[:, None]
        rows[name] = {
            "gap_mean_abs_d": float(core.masked_mean(np.abs(pi - mu), mask)),
            "independent_floor_vs_batch1_mean_abs": float(core.masked_mean(np.abs(pi - pi_ref), mask)),
            "independent_floor_vs_batch1_max_abs": float(core.masked_max_abs(pi - pi_ref, mask)),
            "independent_floor_on_self_check_sequences": float(core.masked_mean(np.abs(pi - pi_ref), sub))
            if sub.any() else None,
            "bitwise_equal_to_batch1": bool(np.array_equal(np.where(mask, pi, 0), np.where(mask, pi_ref, 0))),
            "self_check_batch_shape_mean_abs": floor["batch_shape_mean_abs"],
            "self_check_run_to_run_mean_abs": floor["run_to_run_mean_abs"],
            "self_check_sequences": list(check.get("sequences") or []),
            "self_check_share_of_gap": floor["batch_shape_mean_abs"]
            / float(core.masked_mean(np.abs(pi - mu), mask)),
        }
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--n-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    from rlparity.config.settings import SamplingSettings
    from rlparity.experiments.floors import SHAPES, floor_run
    from rlparity.models import make_model, make_prompts

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = {"device": a.device} if a.device != "cpu" else {}
    model = str(make_model(a.size, progress=False, **dev))
    shapes = {k: SHAPES[k] for k in ("batch1", "batch16", "batch64")}
    result = {"model": a.size, "device": a.device, "n_prompts": a.n_prompts, "max_tokens": a.max_tokens}
    try:
        import torch

        result["card"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - a record, not a requirement
        result["card"] = "unknown"
    for dtype in a.dtypes.split(","):
        t0 = time.perf_counter()
        arms = floor_run(model, make_prompts(a.n_prompts), SamplingSettings(temperature=0.7, top_k=20,
                         max_tokens=a.max_tokens, seed=0), shapes=shapes, dtype=dtype, device=a.device)
        result[dtype] = {"shapes": compare(arms), "engine_floor": arms["batch1"].attrs.get("engine_floor"),
                         "seconds": round(time.perf_counter() - t0, 1)}
        print(dtype, json.dumps(result[dtype]["shapes"], default=str)[:2000], flush=True)
    (out / "floor_check.json").write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
