"""How far the partial-sync evidence reaches at a matrix's size (issue 41): per arm of stored fault matrices, in
the blind view, the version-excess statistics (``ArmEvidence.version_excess``: version 1's residual over version
0's, each against its own floor, as a ratio and a jackknife z per statistic) beside whether ``partial_weight_sync``
was injected (from the arm's name, which the statistics never read).

It answers: where a partial sync is missed, is its signal inside what arms without one show? The null is every arm
without ``partial_weight_sync`` (``trainer_stale_weights`` left out: a version effect of its own); for each
matrix size it gives the null's largest z per arm (quantiles), and the missed sync arms' z beside it.

    python scripts/version_excess_power.py --out benchmarks/results/version_excess_power.json \\
        cpu-seed0=/work/stab/arms-idle-seed0.zarr h100-s11=/work/gpu51/s11/h100-faults-s11.zarr
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

STATS = (("median", "z_by_version", None), ("mean", "mean_z_by_version", "mean_over_reference_by_version"),
         ("logit_median", "logit_median_z_by_version", "logit_median_over_reference_by_version"),
         ("upper_quartile", "upper_quartile_z_by_version", "upper_quartile_over_reference_by_version"))


def arm_rows(name: str, spec: str) -> list[dict]:
    """One row per arm of one matrix: the version-1 z and ratio per statistic, flagged, the injected truth."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from blind_matrices import load_matrix

    from rlparity.diagnose.evidence import build
    from rlparity.diagnose.scoring import blind_view

    rows = []
    for arm, trace in load_matrix(spec).items():
        ve = build(blind_view(trace)).version_excess or {}
        z = {s: (ve.get(zk) or {}).get("1", math.nan) for s, zk, _ in STATS}
        ratio = {s: ((ve.get(rk) or {}).get("1", math.nan) if rk else ve.get("version_1_over_reference", math.nan))
                 for s, _, rk in STATS}
        rows.append({"matrix": name, "arm": arm, "sync_injected": "partial_weight_sync" in arm.split("+"),
                     "flagged": bool(ve.get("flagged")), "z": z, "ratio": ratio,
                     "tokens_by_version": ve.get("n_tokens_by_version")})
    return rows


def summary(rows: list[dict]) -> dict:
    """Per matrix size (tokens of version 1): the null's largest z per arm (quantiles), the sync arms caught."""
    import numpy as np

    out = {}
    for size in sorted({str((r["tokens_by_version"] or {}).get("1")) for r in rows}):
        here = [r for r in rows if str((r["tokens_by_version"] or {}).get("1")) == size]
        null = [max(r["z"].values()) for r in here if not r["sync_injected"] and "trainer_stale_weights" not in r["arm"]
                and not any(math.isnan(v) for v in r["z"].values())]
        sync = [r for r in here if r["sync_injected"] and not any(math.isnan(v) for v in r["z"].values())]
        q = np.quantile(null, [0.5, 0.9, 0.95, 0.99, 1.0]).round(3).tolist() if null else []
        out[f"version_1_tokens={size}"] = {
            "null_arms": len(null), "null_max_z_quantiles_50_90_95_99_100": q,
            "null_flagged": sum(r["flagged"] for r in here if not r["sync_injected"]
                                and "trainer_stale_weights" not in r["arm"]),
            "sync_arms_measurable": len(sync), "sync_arms_flagged": sum(r["flagged"] for r in sync),
            "missed_sync_arms": [{"matrix": r["matrix"], "arm": r["arm"], "max_z": round(max(r["z"].values()), 3)}
                                 for r in sync if not r["flagged"]]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("matrices", nargs="+", help="NAME=STORE[+STORE...] or NAME=example:EXAMPLE")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from rlparity.config.provenance import make_attrs

    rows = []
    for item in a.matrices:
        name, _, spec = item.partition("=")
        rows += arm_rows(name, spec)
        print(name, "done", flush=True)
    s = summary(rows)
    print(json.dumps(s, indent=1))
    Path(a.out).write_text(json.dumps({"provenance": make_attrs(), "summary": s, "arms": rows}, indent=1,
                                      default=str) + "\n")


if __name__ == "__main__":
    main()
