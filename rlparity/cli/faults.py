"""``rlparity faults``: the fault library (named causes injected into real engines and trainers)
and how often the diagnosis names them (``list``, ``score``; the matrix runs with
``rlparity experiment faults``)."""

from __future__ import annotations

from pathlib import Path

import typer

from rlparity.cli.common import command_group, echo_json
from rlparity.cli.contract import EXIT_OK


def list_cmd():
    """Every fault: what it changes, and where it can run."""
    from rlparity.diagnose.causes import CAUSES
    from rlparity.experiments.faults.recipes import FAULTS, PAIR_CAUSES

    for name, f in FAULTS.items():
        where = ", ".join(f.platforms) + (f" (not on CPU: {f.not_on})" if f.not_on else "")
        pairs = (" [pairs]" if name in PAIR_CAUSES else "") + (" [MoE models only]" if f.moe else "")
        typer.echo(f"{name:<24} {CAUSES[name].layer.value:<15} {f.what}; runs on {where}{pairs}")
    raise typer.Exit(EXIT_OK)


def score_cmd(
    store: Path = typer.Argument(..., help="a fault-matrix store (rlparity experiment faults)"),
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
                         {"list": list_cmd, "score": score_cmd})


__all__ = ["build_app"]
