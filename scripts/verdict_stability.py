"""How often does a verdict change between runs of the same command? (issue 42)

Runs the CI-size fault matrix (notebook 07 with ``ci=True``: the tiny-bf16 model, 4 prompts x 16
tokens per phase) ``--runs`` times, each with another seed (prompts, sampling seeds and the
version-1 perturbation; :func:`rlparity.experiments.faults.run_matrix_repeats`, each engine started
once for every seed) and, with ``--load``, a second process busy on the other core for the
whole run. Every run is diagnosed and scored against its ground truth; per arm the script reports
how many runs gave the modal headline, how many named a cause that was not injected, and how many
missed one. Results go to ``--out`` as JSON (one record per run and arm) and a Markdown table.

Each seed's arms are saved (``--out``/``arms-<condition>-seed<k>.zarr``), so the verdicts can be
scored again by later code without an engine (``--rescore``). Every run is also scored blind
(:func:`rlparity.diagnose.scoring.score_views`: every settings echo stripped, issue 41).

usage: python scripts/verdict_stability.py --runs 10 [--load] [--seed0 0] --out artifacts/stability
       python scripts/verdict_stability.py --rescore artifacts/stability [--condition idle]
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


def score_runs(runs: dict, elapsed: float, condition: str) -> list[dict]:
    from rlparity.diagnose.scoring import score_views

    load = os.getloadavg()[0]
    out = []
    for seed, arms in runs.items():
        for view, scores in score_views(arms, title="fault matrix").items():
            df = scores[["headline", "headline_right", "missed", "false_named"]].to_dataframe()
            out += [{"seed": seed, "arm": arm, "condition": condition, "view": view, "headline": str(r.headline),
                     "headline_right": bool(r.headline_right), "missed": str(r.missed),
                     "false_named": str(r.false_named), "matrix_s_per_seed": round(elapsed / len(runs), 1),
                     "loadavg_1min_at_end": round(load, 2)}
                    for arm, r in df.iterrows()]
            out.append({"seed": seed, "arm": "(matrix)", "condition": condition, "view": view,
                        **{k: v for k, v in scores.attrs.items() if isinstance(v, (int, float))}})
    return out


def rates(records: list[dict]) -> str:
    """Per view, the matrix rates over the seeds: min / median / max."""
    import numpy as np

    lines = ["| view | rate | min | median | max |", "|---|---|---|---|---|"]
    for view in ("full", "blind"):
        ms = [r for r in records if r["arm"] == "(matrix)" and r.get("view") == view]
        for k in ("headline_right_single", "headline_right_pairs", "recall_overall", "false_alarms_total",
                  "clean_arms_with_problems", "every_cause_headline_right_single", "every_cause_recall",
                  "dominance_agreement"):
            v = np.array([m[k] for m in ms if k in m], dtype=float)
            if v.size:
                lines.append(f"| {view} | {k} | {np.nanmin(v):.3g} | {np.nanmedian(v):.3g} | {np.nanmax(v):.3g} |")
    return "\n".join(lines)


def table(records: list[dict], view: str = "full") -> str:
    by_arm: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["arm"] != "(matrix)" and r.get("view", "full") == view:
            by_arm[r["arm"]].append(r)
    lines = ["| arm | runs | modal headline | runs with it | headline right | false alarm | missed |",
             "|---|---|---|---|---|---|---|"]
    for arm, rs in by_arm.items():
        modal, k = Counter(r["headline"] for r in rs).most_common(1)[0]
        lines.append(f"| {arm} | {len(rs)} | {modal or '(none)'} | {k} | {sum(r['headline_right'] for r in rs)} | "
                     f"{sum(bool(r['false_named']) for r in rs)} | {sum(bool(r['missed']) for r in rs)} |")
    return "\n".join(lines)


def _report(out: Path, tag: str, records: list[dict]) -> None:
    (out / f"records-{tag}.json").write_text(json.dumps(records, indent=1))
    for seed in sorted({r["seed"] for r in records}):
        wrong = [r["arm"] for r in records if r["seed"] == seed and r["arm"] != "(matrix)" and r["view"] == "full"
                 and (not r["headline_right"] or r["false_named"] or r["missed"])]
        print(f"seed {seed}: not clean: {wrong}")
    text = "\n\n".join([f"## full\n\n{table(records)}", f"## blind\n\n{table(records, 'blind')}",
                         f"## rates\n\n{rates(records)}"])
    (out / f"table-{tag}.md").write_text(text + "\n")
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed0", type=int, default=0)
    ap.add_argument("--load", action="store_true", help="keep a second process busy on another core")
    ap.add_argument("--out", default="artifacts/stability")
    ap.add_argument("--rescore", default=None, help="score the arms a previous run saved there again (no engine)")
    ap.add_argument("--condition", default="idle", help="with --rescore: the condition whose arms to score")
    a = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as tests/conftest.py: spinning threads collapse under load
    if a.rescore:
        import re

        import rlparity

        src = Path(a.rescore)
        runs = {int(re.search(r"seed(\d+)", p.name).group(1)): {k: v.load() for k, v in rlparity.trace.as_arms(p).items()}
                for p in sorted(src.glob(f"arms-{a.condition}-seed*.zarr"))}
        if not runs:
            raise SystemExit(f"no arms-{a.condition}-seed*.zarr under {src}: run the matrix first (without --rescore)")
        _report(src, f"{a.condition}-rescored", score_runs(runs, float("nan"), a.condition))
        return
    from rlparity.models import make_model

    model = str(make_model("tiny-bf16", progress=False))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "loaded" if a.load else "idle"
    stop = mp.Event()
    burner = mp.Process(target=_burn, args=(stop,), daemon=True) if a.load else None
    if burner:
        burner.start()
    import rlparity
    from rlparity.experiments import faults as fx

    try:
        t0 = time.perf_counter()
        runs = fx.run_matrix_repeats(model, None, fx.MatrixSettings(n_prompts=4, max_tokens=16, device="cpu"),
                                     seeds=range(a.seed0, a.seed0 + a.runs), workdir=out / "work",
                                     log=lambda m: print(f"[{time.perf_counter() - t0:7.1f} s] {m}", flush=True))
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        if burner:
            burner.join(5)
    for seed, arms in runs.items():
        rlparity.trace.save(arms, out / f"arms-{tag}-seed{seed}.zarr")
    _report(out, tag, score_runs(runs, elapsed, tag))


if __name__ == "__main__":
    main()
