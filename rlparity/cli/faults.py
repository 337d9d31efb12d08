"""``rlparity faults``: the fault library (named causes injected into real engines and trainers)
and how often the diagnosis names them (``list``, ``run``, ``score``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlparity.cli.common import check_model, command_group, device_option, echo_json, output_store
from rlparity.cli.contract import EXIT_OK, engine_logs


def list_cmd():
    """Every fault: what it changes, and where it can run."""
    from rlparity.diagnose.causes import CAUSES
    from rlparity.experiments.faults import FAULTS, PAIR_CAUSES

    for name, f in FAULTS.items():
        where = ", ".join(f.platforms) + (f" (not on CPU: {f.not_on})" if f.not_on else "")
        pairs = (" [pairs]" if name in PAIR_CAUSES else "") + (" [MoE models only]" if f.moe else "")
        typer.echo(f"{name:<24} {CAUSES[name].layer.value:<15} {f.what}; runs on {where}{pairs}")
    raise typer.Exit(EXIT_OK)


def run_cmd(
    out: Path = typer.Option(..., "--out", "-o", help="zarr store to write (one arm per set of causes)"),
    model: Optional[str] = typer.Option(None, help="local checkpoint directory (version 0); default: --size",
                                        callback=check_model),
    size: str = typer.Option("tiny", help="built-in model when --model is not given (tiny, tiny-bf16, small)"),
    arms: Optional[str] = typer.Option(None, help="'single', 'pairs', or arms like 'clean,raw_logprobs+"
                                           "stale_prefix_cache' (default: clean, every single cause, "
                                           "every pair of the pair causes)"),
    device: str = device_option(),
    n_prompts: int = typer.Option(4, min=2, help="prompts per phase (before, across and after the update)"),
    max_tokens: int = typer.Option(16, min=4),
    sigma: float = typer.Option(0.05, min=1e-6, help="relative size of the weight update"),
    as_json: bool = typer.Option(False, "--json", help="print the scores as strict JSON"),
):
    """Run the fault matrix on real engines, save it, and print how often the diagnosis is right."""
    engine_logs()
    from rlparity.cli.common import model_path
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.scoring import score_matrix
    from rlparity.experiments.faults import MatrixSettings, parse_arms, run_matrix
    from rlparity.trace import save

    output_store(out)
    chosen = parse_arms(arms, platform="cuda" if device.startswith("cuda") else "cpu")
    path = model_path(model or size)
    traces = run_matrix(path, chosen, MatrixSettings(n_prompts=n_prompts, max_tokens=max_tokens, sigma=sigma,
                                                     device=device), log=lambda m: typer.echo(m, err=True))
    save(traces, out)
    scores = score_matrix(traces, diagnose(traces))
    _show(scores, as_json)
    typer.echo(f"wrote {out}", err=True)
    raise typer.Exit(EXIT_OK)


def score_cmd(
    store: Path = typer.Argument(..., help="a fault-matrix store (rlparity faults run)"),
    as_json: bool = typer.Option(False, "--json", help="print the scores as strict JSON"),
):
    """Diagnose every arm of a fault matrix and compare the verdicts with the causes injected:
    recall and false alarms per cause, the headline per arm, the confusion matrix."""
    from rlparity.diagnose import diagnose
    from rlparity.diagnose.scoring import score_matrix
    from rlparity.trace import open_arms

    arms = open_arms(store)
    scores = score_matrix(arms, diagnose(arms))
    _show(scores, as_json)
    raise typer.Exit(EXIT_OK)


def _show(scores, as_json: bool) -> None:
    from rlparity.diagnose.scoring import format_scores
    from rlparity.metrics import table_records

    if as_json:
        echo_json({"summary": scores.attrs,
                   "causes": table_records(scores[["n_present", "recall", "false_alarms", "n_headline"]], "cause"),
                   "arms": table_records(scores[["n_true_causes", "headline", "headline_cause", "headline_right",
                                          "missed", "false_named", "unattributed"]], "arm"),
                   "confusion": {"true_cause": scores["true_cause"].values.tolist(),
                                 "named_cause": scores["named_cause"].values.tolist(),
                                 "counts": scores["confusion"].values.tolist()}})
    else:
        typer.echo(format_scores(scores))


def build_app() -> typer.Typer:
    """The ``rlparity faults`` sub-app with its commands."""
    return command_group("Inject named causes of a mismatch into real engines and trainers (alone and in "
                         "pairs) and score how often the diagnosis names each one.",
                         {"list": list_cmd, "run": run_cmd, "score": score_cmd})


__all__ = ["build_app"]
