"""The statistics behind the trainer topic's constants, on matrices held out from the scored one (issue 41).

``RUN_TO_RUN_SHARE`` (``trainer_not_deterministic``), ``FLOOR_SHARE`` (``trainer_not_batch_invariant``,
``engine_not_batch_invariant``) and ``PARITY_FLOOR_SHARE`` (``gap_within_floor``) are compared here with
what they split, per arm and by the arm's ground truth (``attrs["faults"]["causes"]``, which the
statistics never read):

* run-to-run: the trainer's run-to-run RMS over the background RMS (the residual on the tokens no
  cause explains), on arms with ``trainer_dropout`` injected and on every other arm;
* floors: each side's floor (mean ``|x|``) over the gap (mean ``|d|``), and the two together, on
  clean arms (nothing injected) and on arms with a cause.

Each matrix is read in the blind view (every settings echo stripped, as a user's own run gives it).
The output says, per constant, the range on each side of it and whether it separates them.

    python scripts/calibrate_floors.py --out benchmarks/results/calibration_floors.json \\
        h100-seed1=/work/h100/fxA/faults.zarr+/work/h100/fxB/faults.zarr cpu-seed0=/work/stab/arms-idle-seed0.zarr
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def arm_statistics(trace) -> dict:
    """The three ratios of one arm (NaN where a floor is not measured), from the diagnosis's own evidence."""
    from rlparity.diagnose.evidence import build, trainer_floor
    from rlparity.diagnose.trainer import _gap
    from rlparity.metrics import core

    ev = build(trace)
    f = trainer_floor(trace, ev.side)
    gap = _gap(ev)
    background = float(core.masked_rms(ev.residual, ev.unclaimed())) if ev.residual is not None else float("nan")
    run = float(f["run_to_run_rms"])
    floors = [float(f[f"{k}_mean_abs"]) for k in ("batch_shape", "engine_batch")]
    measured = [x for x in floors if np.isfinite(x) and x > 0]
    return {"gap_mean_abs_d": gap, "run_to_run_over_background": run / background if background > 0 else float("nan"),
            "trainer_floor_share": floors[0] / gap if gap > 0 else float("nan"),
            "engine_floor_share": floors[1] / gap if gap > 0 else float("nan"),
            "floors_share": sum(measured) / gap if gap > 0 and measured else float("nan")}


def _range(values) -> dict:
    v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
    if v.size == 0:
        return {"n": 0}
    return {"n": int(v.size), "min": float(v.min()), "median": float(np.median(v)), "max": float(v.max())}


def calibrate(matrices: dict) -> dict:
    """Per matrix and over all: the ranges of each ratio on each side of its constant."""
    from rlparity.diagnose.scoring import blind_view, truth
    from rlparity.diagnose.trainer import FLOOR_SHARE, PARITY_FLOOR_SHARE, RUN_TO_RUN_SHARE

    rows = []
    for name, arms in matrices.items():
        for arm, trace in arms.items():
            causes = truth(trace)
            if causes is None:
                continue
            rows.append({"matrix": name, "arm": arm, "causes": list(causes), **arm_statistics(blind_view(trace))})
    dropout = [r for r in rows if "trainer_dropout" in r["causes"]]
    other = [r for r in rows if "trainer_dropout" not in r["causes"]]
    clean = [r for r in rows if not r["causes"]]
    faulty = [r for r in rows if r["causes"] and "trainer_dropout" not in r["causes"]]
    key = "run_to_run_over_background"
    out = {
        "RUN_TO_RUN_SHARE": {"value": RUN_TO_RUN_SHARE, "with_dropout": _range(r[key] for r in dropout),
                             "without_dropout": _range(r[key] for r in other),
                             "without_dropout_nonzero": _range(r[key] for r in other if r[key] > 0)},
        "FLOOR_SHARE": {"value": FLOOR_SHARE,
                        **{f"{side}_{group}": _range(r[f"{side}_floor_share"] for r in rs)
                           for side in ("trainer", "engine") for group, rs in (("clean", clean), ("faulty", faulty))}},
        "PARITY_FLOOR_SHARE": {"value": PARITY_FLOOR_SHARE, "clean": _range(r["floors_share"] for r in clean),
                               "faulty": _range(r["floors_share"] for r in faulty)},
    }
    d, o = out["RUN_TO_RUN_SHARE"]["with_dropout"], out["RUN_TO_RUN_SHARE"]["without_dropout"]
    out["RUN_TO_RUN_SHARE"]["separates"] = bool(d.get("n") and o.get("n") and d["min"] >= RUN_TO_RUN_SHARE > o["max"])
    c, f = out["PARITY_FLOOR_SHARE"]["clean"], out["PARITY_FLOOR_SHARE"]["faulty"]
    out["PARITY_FLOOR_SHARE"]["faulty_arms_at_or_above"] = sum(
        r["floors_share"] >= PARITY_FLOOR_SHARE for r in faulty if np.isfinite(r["floors_share"]))
    out["PARITY_FLOOR_SHARE"]["clean_arms_at_or_above"] = sum(
        r["floors_share"] >= PARITY_FLOOR_SHARE for r in clean if np.isfinite(r["floors_share"]))
    out["FLOOR_SHARE"]["clean_arms_at_or_above"] = sum(
        r["trainer_floor_share"] >= FLOOR_SHARE for r in clean if np.isfinite(r["trainer_floor_share"]))
    return {"constants": out, "arms": rows, "n_clean": len(clean), "n_faulty": len(faulty) + len(dropout),
            "clean_range": c, "faulty_range": f}


def main() -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from blind_matrices import load_matrix

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("matrices", nargs="+", help="NAME=example:EXAMPLE or NAME=STORE[+STORE...]")
    ap.add_argument("--scored", nargs="*", default=[],
                    help="matrices the constants are checked on but not chosen from (NAME=SPEC), reported apart")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from rlparity.config.provenance import make_attrs

    out = {"provenance": make_attrs(note="blind view; truth from attrs['faults'], which the statistics never read")}
    for part, items in (("held_out", a.matrices), ("scored", a.scored)):
        if items:
            res = calibrate({m.partition("=")[0]: load_matrix(m.partition("=")[2]) for m in items})
            out[part] = {"sources": {m.partition("=")[0]: m.partition("=")[2] for m in items}, **res}
            print(part, json.dumps(res["constants"], indent=1, default=float))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
