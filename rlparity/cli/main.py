"""The ``rlparity`` entry point: the root app (:func:`rlparity.cli.app.build_app`) run under the
exit-code contract every command follows.

Exit codes (the same for every command, written in ``rlparity --help`` and README):

* 0: pass / ok (parity holds, settings match, the command did its job)
* 1: parity broken or settings differ (a readable report says what and how to fix it)
* 2: bad input (one line naming what is wrong and how to fix it; no traceback)
* 3: internal error (a bug in rlparity or a library: the traceback with ``--debug``)

JSON output (``--json``) is strict: NaN and infinities are ``null``. Only the entry points
(:mod:`rlparity.cli` for the console script, :mod:`rlparity.__main__` for ``python -m rlparity``) import
this module.
"""

from __future__ import annotations

import sys
import traceback

import typer

from rlparity.cli.contract import (
    EXIT_BAD_INPUT,
    EXIT_CODES_HELP,
    EXIT_FAIL,
    EXIT_INTERNAL,
    EXIT_OK,
    INVOCATION,
    BadInput,
    option_defaults,
)
from rlparity.config.defaults import defaults


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

    args = sys.argv[1:] if argv is None else list(argv)
    INVOCATION.update({"debug": "--debug" in args, "engine_logs": False, "argv": args})
    if "--debug" not in args:
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)

    try:
        from rlparity.cli.app import build_app

        defaults()  # RLPARITY_DEFAULTS is read here, under the exit-code contract
        code = build_app()(args=args, prog_name="rlparity", standalone_mode=False)
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
        if not hasattr(e, "format_message"):
            e.show()
            return EXIT_BAD_INPUT
        ctx = getattr(e, "ctx", None)  # a usage error: one line, as every refusal
        hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
        typer.echo(f"rlparity: error: {_one_line(ValueError(e.format_message()))}{hint}", err=True)
        return EXIT_BAD_INPUT
    except _bad_input_types() as e:
        if INVOCATION["debug"]:
            traceback.print_exc()
        typer.echo(f"rlparity: error: {_one_line(e)}", err=True)
        return EXIT_BAD_INPUT
    except Exception as e:  # noqa: BLE001 - the contract: anything else is ours
        if INVOCATION["debug"]:
            traceback.print_exc()
        typer.echo(f"rlparity: internal error: {type(e).__name__}: {_one_line(e)} "
                   "(a bug: re-run with --debug for the traceback and report it)", err=True)
        return EXIT_INTERNAL


def run() -> None:  # console-script entry point
    sys.exit(main())


__all__ = ["EXIT_BAD_INPUT", "EXIT_CODES_HELP", "EXIT_FAIL", "EXIT_INTERNAL", "EXIT_OK", "BadInput", "main",
           "option_defaults", "run"]
