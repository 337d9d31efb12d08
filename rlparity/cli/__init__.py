"""The ``rlparity`` command line (typer). It imports every layer and nothing imports it.

``rlparity --help`` lists the commands; every command follows one exit-code contract
(:data:`rlparity.cli.main.EXIT_CODES_HELP`): 0 pass/ok, 1 parity broken or settings differ,
2 bad input, 3 internal error.
"""

from rlparity.cli import commands  # noqa: F401  (registers the commands)
from rlparity.cli.main import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INTERNAL, EXIT_OK, app, main, run

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAIL", "EXIT_INTERNAL", "EXIT_OK", "app", "main", "run"]

if __name__ == "__main__":  # pragma: no cover
    run()
