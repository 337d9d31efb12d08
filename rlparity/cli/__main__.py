"""``python -m rlparity.cli ARGS`` = ``rlparity ARGS``."""

from rlparity.cli.main import run

if __name__ == "__main__":
    run()
