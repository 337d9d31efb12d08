"""``rlparity doctor RUN``: the page a user reads first about a recorded run (per step the
mismatch against its floors, per lag, the alarms, the cause of each window and the first step
naming it, and why the mismatch grows); :func:`rlparity.diagnose.doctor.doctor` does the work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from rlparity.cli.common import echo_json
from rlparity.cli.contract import EXIT_FAIL, EXIT_OK, BadInput


def read_runs(path: Path) -> dict[str, dict[int, Any]]:
    """``{run: {step: trace}}`` of a run store (one run, named after the folder) or of a store of
    RL step arms (grouped by run, :func:`rlparity.metrics.rl.run_steps`).

    Parameters
    ----------
    path : Path
        The store.

    Returns
    -------
    dict[str, dict[int, xarray.Dataset]]
        The runs' steps.

    Raises
    ------
    BadInput
        Nothing readable is there, the run holds no committed step, or the arms are no RL steps.
    """
    from rlparity.record import is_run_store, open_run, run_record, step_trace
    from rlparity.trace import StoreError

    if not (path.is_dir() and ((path / ".zattrs").exists() or (path / "zarr.json").exists())):
        raise BadInput(f"{path} is not a store: `rlparity doctor RUN` reads a run store (rlparity.record.Recorder) "
                       "or a store of RL steps <run>@step_NNN (rlparity experiment rl)")
    if is_run_store(path):
        try:
            run = open_run(path)
        except StoreError as err:
            raise BadInput(str(err)) from None
        name = path.name[:-5] if path.name.endswith(".zarr") else path.name
        return {name: {k: step_trace(run, k) for k in range(int(run_record(run).steps))}}
    from rlparity.metrics.rl import run_steps
    from rlparity.trace import open_arms

    try:
        arms = open_arms(path)
    except StoreError as err:
        raise BadInput(str(err)) from None
    if not arms:
        raise BadInput(f"{path} holds no arm: nothing to read")
    try:
        where = run_steps(arms)
    except ValueError as err:
        raise BadInput(f"{path} is neither a run store nor a store of RL steps: {err}") from None
    runs: dict[str, dict[int, Any]] = {}
    for arm, (run, step) in where.items():
        runs.setdefault(run, {})[step] = arms[arm]
    return runs


CARDS = ("H100", "H200", "cpu")


def _check_card(value: str | None) -> str | None:
    """``--card``: one of :data:`CARDS` (any case), refused in one line otherwise."""
    if value is None:
        return None
    for c in CARDS:
        if value.lower() == c.lower():
            return c
    raise BadInput(f"--card {value!r}: give one of {', '.join(CARDS)} (the card the run ran on)")


def doctor_cmd(
    run: Path = typer.Argument(..., help="a run store (rlparity.record.Recorder) or a store of RL steps "
                                         "<run>@step_NNN (e.g. the example h200-rl: rlparity examples)"),
    window: int = typer.Option(10, min=1, help="steps per window (the diagnosis is aggregated, and the growth "
                                               "decomposed, per window)"),
    boot: int = typer.Option(200, min=0, help="bootstrap replicates of the growth decomposition's intervals"),
    as_json: bool = typer.Option(False, "--json", help="print strict JSON"),
    model: Path = typer.Option(None, "--model", help="the trainer at the weights of the counterfactual step (a local "
                                                     "path): each correction's real policy gradient against the parity "
                                                     "and the full-IS gradients (cosine, norm ratio), on CPU"),
    device: str = typer.Option(None, "--card", callback=_check_card,
                               help="the card the run ran on (H100, H200 or cpu), matched against the baseline table's "
                                    "rows; default: a shipped example's prefix, else the trainer's device from the "
                                    "attrs"),
    tokenizer: Path = typer.Option(None, "--tokenizer", help="a local tokenizer folder: the top tokens by KL with "
                                                             "their text"),
):
    """Is my number normal, when did it change, why does it grow: per step the mismatch (mean |d|,
    k3) beside the recorded floors, per policy lag, the recorder's alarms, the cause of each window
    of steps (every step diagnosed alone) and the first step naming it, and the change of mean |d|
    against the first window split into response length, confidence, low-probability tokens,
    policy lag and a residual. Exit 1 when a cause is named or an alarm at error level fired, 2 on
    bad input."""
    from rlparity.diagnose.doctor import doctor

    path = Path(run)
    if not path.exists():  # a shipped example by name (rlparity examples), e.g. h200-rl
        from rlparity.datasets import example_path, list_examples

        if str(run) in list_examples():
            path = example_path(str(run))
            device = device or {"h100": "H100", "h200": "H200", "cpu": "cpu"}.get(str(run).split("-")[0])
    decode = None
    if tokenizer is not None:
        from transformers import AutoTokenizer

        if not Path(tokenizer).is_dir():
            raise BadInput(f"--tokenizer {tokenizer} is not a folder: give a local tokenizer folder (e.g. the model's)")
        decode = AutoTokenizer.from_pretrained(str(tokenizer)).decode
    if model is not None and not Path(model).is_dir():
        raise BadInput(f"--model {model} is not a folder: give the local checkpoint of the trainer at that step")
    runs = read_runs(path)
    report = doctor(runs, window=window, n_boot=boot, source=str(run), decode=decode, device=device)
    if model is not None:
        from rlparity.experiments.counterfactual import correction_gradients

        for name, r in report.runs.items():
            c = r.counterfactual
            if c:
                c["rows"] = correction_gradients(runs[name][c["step"]], str(model), causes=c["causes"])
    if as_json:
        echo_json(report.to_dict())
    else:
        typer.echo(str(report))
    raise typer.Exit(EXIT_FAIL if report.problem else EXIT_OK)


__all__ = ["doctor_cmd", "read_runs"]
