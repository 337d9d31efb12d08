from rlparity.cli.main import run

run()
