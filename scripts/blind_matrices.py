"""Score fault matrices as recorded and blind, side by side (issue 41), and write the rates as JSON.

Each input is a fault-matrix store (``rlparity experiment faults --out DIR`` writes ``DIR/faults.zarr``;
several stores of one seed, e.g. the singles and the pairs run apart, are joined with ``+``) or the name
of a shipped example. Per matrix and view (``full``: as recorded; ``blind``: every settings echo
stripped, :func:`rlparity.diagnose.scoring.blind_view`): headline right on single causes and pairs,
recall, false alarms, clean arms with a problem, the same counting every injected cause, and the
dominance agreement; plus per arm what was missed or named but absent.

    python scripts/blind_matrices.py --out benchmarks/results/blind_matrices.json \\
        h200=example:h200-faults h100-seed1=/tmp/fxA/faults.zarr+/tmp/fxB/faults.zarr
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RATES = ("n_arms", "headline_right_single", "headline_right_pairs", "recall_overall", "false_alarms_total",
         "clean_arms_with_problems", "clean_arms_with_floor_warnings", "recipes_not_injected", "every_cause_headline_right_single",
         "every_cause_headline_right_pairs", "every_cause_recall", "pairs_with_dominance", "dominance_ties",
         "dominance_agreement")


def load_matrix(spec: str) -> dict:
    """The arms of ``example:NAME`` or of one or more stores joined by ``+`` (the first store's clean arm kept)."""
    import rlparity
    from rlparity.datasets import load_example

    if spec.startswith("example:"):
        return {k: v.load() for k, v in load_example(spec.split(":", 1)[1]).items()}
    arms: dict = {}
    for path in spec.split("+"):
        for name, ds in rlparity.trace.as_arms(path).items():
            arms.setdefault(name, ds.load())
    return arms


def score(arms: dict) -> dict:
    from rlparity.diagnose.scoring import score_views

    out = {}
    for view, s in score_views(arms).items():
        bad = {}
        for arm in s["arm"].values.tolist():
            r = s.sel(arm=arm)
            if not bool(r["headline_right"]) or r["missed"].item() or r["false_named"].item():
                bad[arm] = {"headline": r["headline"].item(), "right": bool(r["headline_right"]),
                            "missed": r["missed"].item(), "named_but_absent": r["false_named"].item()}
        out[view] = {"rates": {k: s.attrs[k] for k in RATES if k in s.attrs}, "arms_not_clean": bad}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("matrices", nargs="+", help="NAME=example:EXAMPLE or NAME=STORE[+STORE...]")
    ap.add_argument("--out", required=True, help="the JSON to write")
    ap.add_argument("--note", default="", help="where and how the matrices were captured")
    a = ap.parse_args()
    from rlparity.config.provenance import make_attrs

    results = {}
    for item in a.matrices:
        name, _, spec = item.partition("=")
        if not spec:
            raise SystemExit(f"{item!r}: give NAME=example:EXAMPLE or NAME=STORE[+STORE...]")
        results[name] = {"source": spec, **score(load_matrix(spec))}
        for view in ("full", "blind"):
            r = results[name][view]["rates"]
            print(f"{name:14s} {view:5s} single {r['headline_right_single']:.0%} pairs {r['headline_right_pairs']:.0%} "
                  f"recall {r['recall_overall']:.0%} false {r['false_alarms_total']} clean-with-problem "
                  f"{r['clean_arms_with_problems']} floor-warned {r['clean_arms_with_floor_warnings']} | every cause: {r['every_cause_headline_right_single']:.0%} "
                  f"{r['every_cause_headline_right_pairs']:.0%} {r['every_cause_recall']:.0%} | dominance "
                  f"{r['dominance_agreement']:.0%} of {r['pairs_with_dominance']} ({r['dominance_ties']} ties)",
                  flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"provenance": make_attrs(note=a.note), "matrices": results}, indent=1,
                                      default=str) + "\n")


if __name__ == "__main__":
    main()
