"""``python -m rlparity ARGS`` = ``rlparity ARGS`` (e.g. where the console script is not on PATH)."""

from rlparity.cli.main import run

if __name__ == "__main__":
    run()
