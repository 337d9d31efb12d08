"""The ``rlparity`` command line: one typer app and the exit-code contract every command follows.

Exit codes (the same for every command, written in ``rlparity --help`` and README):

* 0: pass / ok (parity holds, settings match, the command did its job)
* 1: parity broken or settings differ (a readable report says what and how to fix it)
* 2: bad input (one line naming what is wrong and how to fix it; no traceback)
* 3: internal error (a bug in rlparity or a library: the traceback with ``--debug``)

JSON output (``--json``) is strict: NaN and infinities are ``null``.
"""

from __future__ import annotations

import sys
import traceback

import typer

from rlparity.config.defaults import Defaults, defaults

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_CODES_HELP = ("Exit codes: 0 pass/ok; 1 parity broken or settings differ; 2 bad input (one line says what "
                   "and how to fix it); 3 internal error (traceback with --debug).")

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Capture vLLM rollouts, rescore them with the trainer, and diagnose parity. "
                       + EXIT_CODES_HELP)
_STATE: dict = {"debug": False, "engine_log": None}


class BadInput(ValueError):
    """Raised by a command for input it refuses; printed as one line, exit code 2."""


def _print_version(value: bool) -> None:
    if value:
        from rlparity import __version__

        typer.echo(f"rlparity {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="show the traceback of an internal error (exit 3)"),
          engine_logs: bool = typer.Option(False, "--engine-logs", help="show vLLM's log lines on stderr (default: "
                                                                         "a file under runs/logs, made when an "
                                                                         "engine starts)"),
          version: bool = typer.Option(False, "--version", help="print the version and exit", is_eager=True,
                                       callback=_print_version)) -> None:
    _STATE["debug"] = debug


def option_defaults() -> Defaults:
    """The defaults the commands' options show (read when the CLI is imported). A broken
    ``RLPARITY_DEFAULTS`` is not raised here, at import, but by :func:`main` (one line, exit 2)."""
    try:
        return defaults()
    except ValueError:
        return Defaults()


def _bad_input_types() -> tuple[type[BaseException], ...]:
    import yaml

    return (ValueError, OSError, yaml.YAMLError)


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines) if len(lines) <= 6 else " ".join(lines[:6]) + " ..."


def main(argv: list[str] | None = None) -> int:
    """Run the CLI under the exit-code contract (the ``rlparity`` console script)."""
    import warnings

    from rlparity.cli import commands  # noqa: F401  (registers every command on ``app``)
    from rlparity.config.logs import engine_logs_to_file

    args = sys.argv[1:] if argv is None else list(argv)
    # stdout carries the command's result (text or --json); the engines' log lines go to a file
    # under runs/logs (--engine-logs: to stderr), chosen before anything imports vLLM and made only
    # when a command starts an engine
    show = "--engine-logs" in args
    log_file = engine_logs_to_file("runs/logs", show=show)
    _STATE["engine_log"] = str(log_file) if log_file else None
    if "--debug" not in args:
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)

    try:
        defaults()  # RLPARITY_DEFAULTS is read here, under the exit-code contract
        code = app(args=args, prog_name="rlparity", standalone_mode=False)
        return int(code or 0) if isinstance(code, int) else 0
    except typer.Exit as e:  # raised by commands in non-standalone mode too
        return int(e.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except typer.TyperException as e:  # usage: unknown option, bad choice, ... (typer >= 0.26 has its own click)
        if type(e).__name__ == "NoArgsIsHelpError":  # `rlparity` alone: the help, not an error
            ctx = getattr(e, "ctx", None)
            typer.echo(ctx.get_help() if ctx is not None else str(e))
            return EXIT_OK
        e.show()
        return EXIT_BAD_INPUT
    except _bad_input_types() as e:
        if _STATE["debug"]:
            traceback.print_exc()
        typer.echo(f"rlparity: error: {_one_line(e)}", err=True)
        return EXIT_BAD_INPUT
    except Exception as e:  # noqa: BLE001 - the contract: anything else is ours
        if _STATE["debug"]:
            traceback.print_exc()
        typer.echo(f"rlparity: internal error: {type(e).__name__}: {_one_line(e)} "
                   "(a bug: re-run with --debug for the traceback and report it)", err=True)
        return EXIT_INTERNAL


def engine_log_file() -> str | None:
    """Where this invocation sends vLLM's log lines (None with --engine-logs); the file exists once
    an engine has logged."""
    return _STATE.get("engine_log")


def run() -> None:  # console-script entry point
    sys.exit(main())


__all__ = ["EXIT_BAD_INPUT", "EXIT_FAIL", "EXIT_INTERNAL", "EXIT_OK", "BadInput", "app", "main", "option_defaults", "run"]
