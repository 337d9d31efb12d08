"""``rlparity floor STORE``: the floors a store's arms recorded (the trainer's and the engine's own
floors beside the backend gap); ``rlparity experiment floors`` measures them on a model."""

from __future__ import annotations

from pathlib import Path

import typer

from rlparity.cli.common import echo_json
from rlparity.cli.contract import EXIT_OK, BadInput


def floor_cmd(
    source: Path = typer.Argument(..., help="a scored store: the floors its arms recorded (to measure floors on a "
                                            "model: rlparity experiment floors --model MODEL --out DIR)"),
    as_json: bool = typer.Option(False, "--json", help="print strict JSON"),
):
    """The floors every arm of a store recorded (the trainer's batch-shape, run-to-run and kernel
    floors, the engine's batch spread) beside the arm's backend gap (mean |d|). Measuring floors on a model
    under every trainer shape is ``rlparity experiment floors``."""
    path = Path(source)
    if not (path.is_dir() and ((path / ".zattrs").exists() or (path / "zarr.json").exists())):
        raise BadInput(f"{source} is not a store: `rlparity floor STORE` reads the floors a store's arms recorded; to "
                       "measure the floors of a model run `rlparity experiment floors --model MODEL --out DIR`")
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.evidence import trainer_floor
    from rlparity.trace import open_arms

    arms = open_arms(path)
    report = diagnose(arms)
    rows = {}
    for arm, ds in arms.items():
        gap = report.attribution.get(arm, {}).get("decomposition", {}).get("mean_abs_d")
        f = trainer_floor(ds)
        rows[arm] = {"gap_mean_abs_d": gap, "trainer_batch_mean_abs": f["batch_shape_mean_abs"],
                     "trainer_run_to_run_mean_abs": f["run_to_run_mean_abs"],
                     "engine_batch_mean_abs": f["engine_batch_mean_abs"],
                     "trainer_kernel_mean_abs": f["kernel_mean_abs"],
                     "findings": [f"{x.name} ({x.severity.value})" for x in report
                                  if x.arm == arm and x.name.endswith(("batch_invariant", "not_deterministic",
                                                                       "within_floor"))]}
    if as_json:
        echo_json(rows)
    else:
        for arm, r in rows.items():
            typer.echo(f"{arm}: gap {_g(r['gap_mean_abs_d'])}; trainer batch {_g(r['trainer_batch_mean_abs'])}, "
                       f"run to run {_g(r['trainer_run_to_run_mean_abs'])}, kernel "
                       f"{_g(r['trainer_kernel_mean_abs'])}; engine batch "
                       f"{_g(r['engine_batch_mean_abs'])} (nats, mean |x|) {'; '.join(r['findings'])}")
    raise typer.Exit(EXIT_OK)


def _g(v) -> str:
    return "n/a" if v is None or v != v else f"{v:.3g}"


__all__ = ["floor_cmd"]
