"""The ``rlparity`` root app, built by :func:`build_app`: the root options and every command,
added here and nowhere else (importing a command module registers nothing; no command module
imports this one or :mod:`rlparity.cli.main`).
"""

from __future__ import annotations

import typer

from rlparity.cli.contract import EXIT_CODES_HELP, INVOCATION, BadInput

# commands that moved (issue 35: one command per job): the old name answers, in one line, with the new one (exit 2)
MOVED = {"ablate": "rlparity experiment ablation", "rl-run": "rlparity experiment rl",
         "faults run": "rlparity experiment faults"}


def moved_command(old: str) -> typer.models.CommandFunctionType:
    """A hidden command under the old name ``old`` that says where the job moved (exit 2)."""
    def moved(ctx: typer.Context) -> None:
        new = MOVED[old]
        raise BadInput(f"`rlparity {old}` is now `{new}` (the same job, one command): see `{new} --help`")

    moved.__doc__ = f"Moved: {MOVED[old]}."
    return moved


MOVED_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def _print_version(value: bool) -> None:
    if value:
        from rlparity import __version__

        typer.echo(f"rlparity {__version__}")
        raise typer.Exit(0)


def _root(debug: bool = typer.Option(False, "--debug", help="show the traceback of an internal error (exit 3)"),
          engine_logs: bool = typer.Option(False, "--engine-logs", help="show vLLM's log lines on stderr (default: "
                                                                         "a file under runs/logs, made when an "
                                                                         "engine starts)"),
          version: bool = typer.Option(False, "--version", help="print the version and exit", is_eager=True,
                                       callback=_print_version)) -> None:
    INVOCATION["debug"] = debug
    INVOCATION["engine_logs"] = engine_logs


def build_app() -> typer.Typer:
    """The root app with every command, in the order ``rlparity --help`` lists them."""
    from rlparity.cli import (book, data_sources, diagnosis, doctor, experiment, faults, floors, layers, path, replay,
                              traces)

    app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                      help="Capture vLLM rollouts, rescore them with the trainer, and diagnose parity. "
                           + EXIT_CODES_HELP)
    app.callback()(_root)
    commands = {
        "make-model": traces.make_model_cmd, "capture": traces.capture_cmd, "score": traces.score_cmd,
        "summary": traces.summary_cmd, "run": traces.run_cmd,
        "diagnose": diagnosis.diagnose_cmd, "check": diagnosis.check_cmd, "findings": diagnosis.findings_cmd,
        "doctor": doctor.doctor_cmd, "replay": replay.replay_cmd, "bisect": replay.bisect_cmd,
        "profiles": path.profiles_cmd, "audit": path.audit_cmd,
        "import": data_sources.import_cmd, "gallery": data_sources.gallery_cmd, "examples": data_sources.examples_cmd,
    }
    for name, command in commands.items():
        app.command(name)(command)
    fault_app = faults.build_app()
    fault_app.command("run", hidden=True, context_settings=MOVED_SETTINGS)(moved_command("faults run"))
    app.add_typer(fault_app, name="faults")
    app.command("floor")(floors.floor_cmd)
    app.add_typer(layers.build_app(), name="layers")
    app.command("verify-weights")(layers.verify_weights_cmd)
    app.add_typer(experiment.build_app(), name="experiment")
    for old in ("ablate", "rl-run"):
        app.command(old, hidden=True, context_settings=MOVED_SETTINGS)(moved_command(old))
    app.command("book")(book.book_cmd)
    return app


__all__ = ["MOVED", "build_app"]
