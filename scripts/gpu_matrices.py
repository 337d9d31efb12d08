"""Held-out fault matrices on a GPU host in one process, each engine started once for every seed (issue 41).

What ``rlparity experiment faults --size small --dtype bfloat16 --device cuda --sigma 0.2 --n-prompts 8
--max-tokens 32 --inflight-tokens 128 --update-after 0.1 --seed N --example h100-faults-sN`` writes, for
several seeds at once (:func:`rlparity.experiments.faults.run_matrix_repeats`): per seed an example store
``OUT/<card>-faults-s<N>.zarr`` and ``OUT/faults-s<N>.json`` (scores as recorded), and on stdout one line per
phase with the seconds since the start (engine starts, each arm's capture and scoring, diagnosis, saving),
so a slow run says where its time went.

    python3 scripts/gpu_matrices.py --seeds 15 16 --card h100 --out $OUT/m
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {message}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--card", default="h100", help="names the example stores (h100, h200)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--arms", default=None, help="'single', 'pairs' or a comma list (default: every arm)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="small", help="built-in model (small on a GPU; tiny-bf16 to try it on a CPU)")
    a = ap.parse_args()

    from rlparity.config.provenance import write_json
    from rlparity.datasets import save_example
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.scoring import ARM_RESULT_COLUMNS, score_matrix
    from rlparity.experiments.faults.matrix import MATRIX_DESCRIPTION, MatrixSettings, run_matrix_repeats
    from rlparity.experiments.faults.recipes import parse_arms
    from rlparity.experiments.gallery import provenance
    from rlparity.metrics import table_records
    from rlparity.models import make_model

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log("imports done")
    model = str(make_model(a.size, progress=False, **({"device": a.device} if a.device != "cpu" else {})))
    log(f"model {model}")
    settings = MatrixSettings(n_prompts=8, max_tokens=32, sigma=0.2, device=a.device, dtype="bfloat16",
                              inflight_tokens=128, update_after=0.1, seed=a.seeds[0])
    chosen = parse_arms(a.arms, platform="cuda" if a.device.startswith("cuda") else "cpu")
    per_seed = run_matrix_repeats(model, chosen, settings, seeds=tuple(a.seeds), workdir=out / "checkpoints", log=log)
    log("matrices captured and scored")
    for seed, traces in per_seed.items():
        report = diagnose(traces)
        scores = score_matrix(traces, report)
        log(f"seed {seed}: diagnosed and scored")
        write_json(out / f"faults-s{seed}.json", {
            "summary": scores.attrs, "settings": settings.model_copy(update={"seed": seed}).model_dump(),
            "per_arm": table_records(scores[list(ARM_RESULT_COLUMNS)], "arm"),
            "headlines": report.summary_lines()})
        prov = provenance(a.device, Path(model).name, f"scripts/gpu_matrices.py --seeds {' '.join(map(str, a.seeds))}",
                          f"the fault matrix, seed {seed}: {MATRIX_DESCRIPTION}")
        save_example(traces, out / f"{a.card}-faults-s{seed}.zarr", prov)
        log(f"seed {seed}: saved")


if __name__ == "__main__":
    main()
