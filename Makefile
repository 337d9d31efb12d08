VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup quickstart test base-install book clean

setup:
	bash scripts/setup.sh $(VENV) cpu,test

# the main job: build the tiny model, capture with real vLLM on CPU, rescore, summarise, write the trace
quickstart: setup
	$(VENV)/bin/rlparity run --out runs/quickstart.zarr

# two lanes at once: the tests that start vLLM engines, and beside them the others (scripts/test_lanes.py)
test:
	$(PY) scripts/test_lanes.py --durations=30 tests

# `pip install .` without extras in a fresh virtualenv, then the commands that need no engine on a fixture
base-install:
	bash scripts/base_install.sh .venv-base

# execute every notebook on the small built-in model and build the book offline (book/_build/html)
book: setup
	$(PY) -m rlparity --debug book  # --debug: a failed build shows its whole log (the traceback), not one line

clean:
	rm -rf runs artifacts .cache book/_build
