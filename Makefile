# `make test` (ruff first: `make lint`) and `make bench` work on a fresh machine with only
# Python 3.11+ and a C compiler: they create .venv and install what is needed first. torch is
# pinned to the CPU build that lies on these machines' disk (a looser pin would download a
# multi-GB CUDA build).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ember-installed
TORCH  ?= torch==2.13.0
# The model zoo's timm (ember/bench/zoo.py) needs torchvision. torchvision 0.28.0, the one made
# for torch 2.13, is a CUDA build: installed without its dependencies (pip would otherwise
# fetch a CUDA torch), its C extension does not load beside the CPU torch, and then its
# _meta_registrations.py fails at import on two unconditional
# @torch.library.register_fake("torchvision::nms"/"qnms"). The sed below makes them
# conditional on the extension having loaded (idempotent: it matches only the unpatched lines).
TIMM   ?= timm==1.0.29 torchvision==0.28.0
# Options for `python -m ember bench`, e.g. make bench BENCH_FLAGS="--quick --only S1"
BENCH_FLAGS ?=
# Processes running the tests (pytest-xdist; each file's tests in one process). CI's two cores:
# two processes take the suite from about 24 to 11 minutes there (2026-12-06); 0 runs them in
# this process, as plain `pytest` does.
TEST_WORKERS ?= 2
# Then the model zoo's tiny configs in inference, eager against ember (about 2-3 minutes on 2
# cores; torch.compile's first calls would add about 20 s per model): empty to skip it, or
# e.g. BENCH_MODELS="--models" for the whole CPU zoo with torch.compile (about 25 minutes)
BENCH_MODELS ?= --models --quick --modes infer --variants eager,ember

.PHONY: test bench lint clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m pip install -q --no-deps $(TIMM)
	sed -i -E 's/^@torch\.library\.register_fake\(("torchvision::[a-z_]+")\)$$/@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda fn: fn))/' \
	    "$$($(BIN)/python -c 'import importlib.util as u, os; print(os.path.join(u.find_spec("torchvision").submodule_search_locations[0], "_meta_registrations.py"))')"
	$(BIN)/python -c 'import timm; timm.create_model("resnet18")'
	touch $(STAMP)

test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: $(STAMP)
	$(BIN)/python -m ember bench $(BENCH_FLAGS)
	$(if $(strip $(BENCH_MODELS)),$(BIN)/python -m ember bench $(BENCH_MODELS) --out ember-bench/models)

lint: $(STAMP)
	$(BIN)/ruff check ember tests

clean:
	rm -rf $(VENV) ember-bench
