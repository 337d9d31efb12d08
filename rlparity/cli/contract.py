"""What every command shares and the root sets per invocation: the exit codes, the bad-input
error, the options' defaults, and the root options (``--debug``, ``--engine-logs``).

Importing it does nothing: the root callback (:mod:`rlparity.cli.app`) records the options of one
invocation, and only a command that starts or imports vLLM calls :func:`engine_logs`.
"""

from __future__ import annotations

from pathlib import Path

from rlparity.config.defaults import Defaults, defaults

EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_CODES_HELP = ("Exit codes: 0 pass/ok; 1 parity broken or settings differ; 2 bad input (one line says what "
                   "and how to fix it); 3 internal error (traceback with --debug).")
# the root options of the invocation being run (set by the root callback, read by the commands)
INVOCATION: dict = {"debug": False, "engine_logs": False, "argv": []}


class BadInput(ValueError):
    """Raised by a command for input it refuses; printed as one line, exit code 2."""


def option_defaults() -> Defaults:
    """The defaults the commands' options show (read when a command module is imported). A broken
    ``RLPARITY_DEFAULTS`` is not raised here but by :func:`rlparity.cli.main.main` (one line, exit 2)."""
    try:
        return defaults()
    except ValueError:
        return Defaults()


def engine_logs() -> Path | None:
    """For a command that starts (or imports) vLLM, called before it imports vLLM: send the engines'
    log lines to ``runs/logs/vllm-<time>-<pid>.log`` (made when an engine starts; ``--engine-logs``:
    to stderr instead) and return that file. Commands without vLLM never call it, so they leave
    the environment and the working directory alone."""
    from rlparity.config.logs import engine_logs_to_file

    return engine_logs_to_file("runs/logs", show=INVOCATION["engine_logs"])


def invocation_command() -> str:
    """The command line of this invocation (``rlparity ARGS``), for provenance records."""
    return " ".join(["rlparity", *INVOCATION["argv"]])


__all__ = ["EXIT_BAD_INPUT", "EXIT_CODES_HELP", "EXIT_FAIL", "EXIT_INTERNAL", "EXIT_OK", "INVOCATION", "BadInput",
           "engine_logs", "invocation_command", "option_defaults"]
