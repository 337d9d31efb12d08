VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup quickstart test book clean

setup:
	bash scripts/setup.sh $(VENV) cpu,test

# the main job: build the tiny model, capture with real vLLM on CPU, rescore, summarise, write the trace
quickstart: setup
	$(VENV)/bin/rlparity run --out runs/quickstart.zarr

test:
	$(PY) -m pytest -q tests

# execute every notebook on the small built-in model and build the book offline (book/_build/html)
book: setup
	$(PY) -m rlparity.cli.book

clean:
	rm -rf runs artifacts .cache book/_build
