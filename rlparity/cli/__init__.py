"""The ``rlparity`` command line (typer). It imports every layer and nothing imports it.

``rlparity --help`` lists the commands; every command follows one exit-code contract
(:data:`rlparity.cli.contract.EXIT_CODES_HELP`): 0 pass/ok, 1 parity broken or settings differ,
2 bad input, 3 internal error. Importing this package imports no command module and registers
nothing: :func:`build_app` builds the root app with every command, :func:`main` runs it.
"""

from rlparity.cli.app import build_app
from rlparity.cli.contract import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_INTERNAL, EXIT_OK
from rlparity.cli.main import main, run

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAIL", "EXIT_INTERNAL", "EXIT_OK", "build_app", "main", "run"]
