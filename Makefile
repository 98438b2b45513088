# `make test` and `make bench` work on a fresh machine with only Python 3.11+ and a C compiler:
# they create .venv and install what is needed first. torch is pinned to the CPU build that
# lies on these machines' disk (a looser pin would download a multi-GB CUDA build).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ember-installed
TORCH  ?= torch==2.13.0
# Options for `python -m ember bench`, e.g. make bench BENCH_FLAGS="--quick --only S1"
BENCH_FLAGS ?=

.PHONY: test bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m ember bench $(BENCH_FLAGS)

lint: $(STAMP)
	$(BIN)/ruff check ember tests

clean:
	rm -rf $(VENV) ember-bench
