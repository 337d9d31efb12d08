"""``rlparity floor MODEL|STORE``: what parity can be on this hardware (the trainer's and the
engine's own floors beside the backend gap)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlparity.cli.common import check_model, comma_list, device_option, echo_json
from rlparity.cli.contract import EXIT_OK, BadInput, engine_logs


def floor_cmd(
    source: str = typer.Argument(..., help="a model (built-in name, path or hub id: captures and rescores under "
                                            "every trainer shape) or a scored store (reads the floors it recorded)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="with a model: where to save the run's store"),
    shapes: Optional[str] = typer.Option(None, help="comma list of trainer shapes (default: all; see "
                                                     "rlparity.experiments.floors.SHAPES)"),
    n_prompts: int = typer.Option(16, min=1),
    max_tokens: int = typer.Option(32, min=1),
    device: str = device_option(help="the trainer's device"),
    dtype: str = typer.Option("float32", help="body dtype on both sides"),
    as_json: bool = typer.Option(False, "--json", help="print strict JSON"),
):
    """The trainer's floor under real trainer shapes and the engine's batch spread, each against
    the backend gap (mean |d|) with its share; on a store, the floors every arm recorded."""
    from rlparity.metrics import table_records

    path = Path(source)
    if path.exists() and ((path / ".zattrs").exists() or (path / "zarr.json").exists()):
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
                         "findings": [f"{x.name} ({x.severity.value})" for x in report
                                      if x.arm == arm and x.name.endswith(("batch_invariant", "not_deterministic"))]}
        if as_json:
            echo_json(rows)
        else:
            for arm, r in rows.items():
                typer.echo(f"{arm}: gap {_g(r['gap_mean_abs_d'])}; trainer batch {_g(r['trainer_batch_mean_abs'])}, "
                           f"run to run {_g(r['trainer_run_to_run_mean_abs'])}; engine batch "
                           f"{_g(r['engine_batch_mean_abs'])} (nats, mean |x|) {'; '.join(r['findings'])}")
        raise typer.Exit(EXIT_OK)
    if path.exists() and path.is_file():
        raise BadInput(f"{source} is a file: pass a model (checkpoint folder, hub id or built-in name) or a store")
    check_model(source)
    engine_logs()
    from rlparity.cli.common import model_path, output_store
    from rlparity.config.settings import SamplingSettings
    from rlparity.experiments.floors import REFERENCE, SHAPES, floor_run
    from rlparity.metrics.floors import floor_table
    from rlparity.models import make_prompts

    if out is not None:
        output_store(out)  # before the run, not after it
    chosen = SHAPES
    picked = comma_list(shapes, "--shapes", list(SHAPES))
    if picked:
        chosen = {REFERENCE: SHAPES[REFERENCE], **{s: SHAPES[s] for s in picked}}
    arms = floor_run(model_path(source), make_prompts(n_prompts), SamplingSettings(temperature=0.7, top_k=20,
                     max_tokens=max_tokens, seed=0), shapes=chosen, dtype=dtype, device=device,
                     log=lambda m: typer.echo(m, err=True))
    table = floor_table(arms, REFERENCE)
    if out is not None:
        from rlparity.trace import save

        save(arms, out)
    if as_json:
        echo_json({"table": table_records(table), "engine_floor": table.attrs.get("engine_floor")})
    else:
        typer.echo(f"backend gap (mean |d|, {REFERENCE}): {_g(float(table['gap_mean_abs_d']))} nats; engine batch "
                   f"spread: {_g((table.attrs.get('engine_floor') or {}).get('batch_shape', {}).get('mean_abs'))}")
        typer.echo(f"{'shape':<26} {'floor mean':>11} {'floor max':>11} {'share':>7} {'speed':>7}")
        for s in table["shape"].values.tolist():
            r = table.sel(shape=s)
            typer.echo(f"{s:<26} {_g(float(r['floor_mean_abs'])):>11} {_g(float(r['floor_max_abs'])):>11} "
                       f"{float(r['share_of_gap']):>7.0%} {float(r['relative_throughput']):>6.2f}x")
    raise typer.Exit(EXIT_OK)


def _g(v) -> str:
    return "n/a" if v is None or v != v else f"{v:.3g}"


__all__ = ["floor_cmd"]
