"""How often does a verdict change between runs of the same command? (issue 42)

Runs the CI-size fault matrix (notebook 07 with ``ci=True``: the tiny-bf16 model, 4 prompts x 16
tokens per phase) ``--runs`` times, each with another seed (prompts, sampling seeds and the
version-1 perturbation) and, with ``--load``, a second process busy on the other core for the
whole run. Every run is diagnosed and scored against its ground truth; per arm the script reports
how many runs gave the modal headline, how many named a cause that was not injected, and how many
missed one. Results go to ``--out`` as JSON (one record per run and arm) and a Markdown table.

usage: python scripts/verdict_stability.py --runs 10 [--load] [--seed0 0] --out artifacts/stability
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from collections import Counter, defaultdict
from pathlib import Path


def _burn(stop) -> None:  # a busy loop on one core until told to stop
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def one_run(model: str, seed: int, workdir: Path) -> list[dict]:
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.scoring import score_matrix
    from rlparity.experiments import faults as fx

    t0 = time.perf_counter()
    arms = fx.run_matrix(model, None, fx.MatrixSettings(n_prompts=4, max_tokens=16, device="cpu", seed=seed),
                         workdir=workdir / f"seed-{seed}", log=lambda m: None)
    report = diagnose(arms, title="fault matrix")
    scores = score_matrix(arms, report)
    elapsed = time.perf_counter() - t0
    df = scores[["headline", "headline_right", "missed", "false_named"]].to_dataframe()
    load = os.getloadavg()[0]
    return [{"seed": seed, "arm": arm, "headline": str(r.headline), "headline_right": bool(r.headline_right),
             "missed": str(r.missed), "false_named": str(r.false_named), "elapsed_s": round(elapsed, 1),
             "loadavg_1min_at_end": round(load, 2)} for arm, r in df.iterrows()]


def table(records: list[dict]) -> str:
    by_arm: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_arm[r["arm"]].append(r)
    lines = ["| arm | runs | modal headline | runs with it | headline right | false alarm | missed |",
             "|---|---|---|---|---|---|---|"]
    for arm, rs in by_arm.items():
        modal, k = Counter(r["headline"] for r in rs).most_common(1)[0]
        lines.append(f"| {arm} | {len(rs)} | {modal or '(none)'} | {k} | {sum(r['headline_right'] for r in rs)} | "
                     f"{sum(bool(r['false_named']) for r in rs)} | {sum(bool(r['missed']) for r in rs)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--load", action="store_true", help="keep a second process busy on another core")
    ap.add_argument("--out", default="artifacts/stability")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from rlparity.models import make_model

    model = str(make_model("tiny-bf16", progress=False))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "loaded" if a.load else "idle"
    stop = mp.Event()
    burner = mp.Process(target=_burn, args=(stop,), daemon=True) if a.load else None
    if burner:
        burner.start()
    records: list[dict] = []
    try:
        for seed in range(a.seed0, a.seed0 + a.runs):
            rs = one_run(model, seed, out / "work")
            for r in rs:
                r["condition"] = tag
            records += rs
            wrong = [r["arm"] for r in rs if not r["headline_right"] or r["false_named"] or r["missed"]]
            print(f"seed {seed}: {len(rs)} arms in {rs[0]['elapsed_s']} s, load {rs[0]['loadavg_1min_at_end']}; "
                  f"not clean: {wrong}", flush=True)
            (out / f"records-{tag}.json").write_text(json.dumps(records, indent=1))
    finally:
        stop.set()
        if burner:
            burner.join(5)
    (out / f"table-{tag}.md").write_text(table(records) + "\n")
    print(table(records))


if __name__ == "__main__":
    main()
