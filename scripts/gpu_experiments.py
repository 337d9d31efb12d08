"""Run the chapters' experiments on a GPU host and write their numbers as JSON (no plotting).

Usage (after the two-run vLLM install of ../shared/gpu/README.md):
    python3 scripts/gpu_experiments.py head OUT_DIR [--size tiny] [--vocab-pad-to N]
    python3 scripts/gpu_experiments.py ablation OUT_DIR [--dtype bfloat16]

Each experiment writes OUT_DIR/<name>.json with the tables, the findings and the effective
engine configuration, and keeps going after a failure (the traceback lands in the JSON).
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path


def _dump(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {path}", flush=True)


def run_head(out: Path, size: str, vocab_pad_to: int | None, n_prompts: int, max_tokens: int) -> None:
    from rlparity.capture import EngineSettings, SamplingSettings
    from rlparity.capture.pool import shared_pool
    from rlparity.diagnose import diagnose
    from rlparity.experiments import head
    from rlparity.models import make_model, make_prompts

    t0 = time.time()
    name = f"head_{size}" + (f"_v{vocab_pad_to}" if vocab_pad_to else "")
    res: dict = {"size": size, "vocab_pad_to": vocab_pad_to}
    try:
        model = str(make_model(size, Path("/tmp/models") / name, vocab_pad_to=vocab_pad_to, device="cuda",
                               progress=False))
        prompts = make_prompts(n_prompts, seed=0)
        sampling = SamplingSettings(temperature=0.7, top_k=20, max_tokens=max_tokens, seed=0)
        arms = head.head_matrix(model, prompts, sampling, dtype="bfloat16", device="cuda",
                                engine=EngineSettings(gpu_memory_utilization=0.3))
        shared_pool().close()
        table = head.head_table(arms)
        res["table"] = table.drop_vars(["arm", "matched"]).to_dataframe().reset_index().to_dict(orient="records")
        res["matched_advantage"] = head.matched_advantage(table)
        res["gap_by_logit_rms"] = head.gap_by_logit(arms, n_bins=6)["abs_log_ratio_rms"].to_dict()["data"]
        res["findings"] = diagnose(arms).to_dict()["findings"]
        res["engine_effective"] = {k: v.attrs.get("engine_effective") for k, v in arms.items()}
    except Exception:  # keep what was measured, say what broke
        res["error"] = traceback.format_exc()
        print(res["error"], flush=True)
    res["seconds"] = time.time() - t0
    _dump(out / f"{name}.json", res)


def run_ablation(out: Path, dtype: str, n_prompts: int, max_tokens: int) -> None:
    from rlparity.capture import SamplingSettings
    from rlparity.capture.pool import shared_pool
    from rlparity.diagnose.path import ablation_findings
    from rlparity.experiments import ablation as abl
    from rlparity.models import make_model
    from rlparity.score import Scorer

    t0 = time.time()
    res: dict = {"dtype": dtype}
    try:
        model = str(make_model("tiny", Path("/tmp/models/tiny"), device="cuda", progress=False))
        sampling = SamplingSettings(temperature=0.7, top_k=20, max_tokens=max_tokens, seed=0)
        scorer = Scorer(model, dtype=dtype, head_dtype="float32", device="cuda", progress=False)
        arms = abl.ablation(model, abl.shared_prefix_prompts(n_prompts), sampling,
                            engine={"dtype": dtype, "gpu_memory_utilization": 0.3}, scorer=scorer,
                            batch_max_tokens=max_tokens)
        shared_pool().close()
        table = abl.ablation_table(arms)
        res["table"] = table.to_dataframe().reset_index().to_dict(orient="records")
        res["moved"] = abl.moved_settings(table)
        res["batch"] = abl.batch_table(arms).to_dataframe().reset_index().to_dict(orient="records")
        res["findings"] = [f.to_dict() for f in ablation_findings(arms)]
        res["engine_effective"] = {k: v.attrs.get("engine_effective") for k, v in arms.items()}
    except Exception:
        res["error"] = traceback.format_exc()
        print(res["error"], flush=True)
    res["seconds"] = time.time() - t0
    _dump(out / f"ablation_{dtype}.json", res)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", choices=["head", "ablation"])
    p.add_argument("out", type=Path)
    p.add_argument("--size", default="tiny")
    p.add_argument("--vocab-pad-to", type=int, default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--n-prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=48)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.experiment == "head":
        run_head(a.out, a.size, a.vocab_pad_to, a.n_prompts, a.max_tokens)
    else:
        run_ablation(a.out, a.dtype, a.n_prompts, a.max_tokens)


if __name__ == "__main__":
    main()
