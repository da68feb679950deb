# Two commands do all the set-up on a fresh machine with only Python:
#   make run   - create .venv, install, start the gateway on 127.0.0.1:8080 in front of
#                the built-in simulator (ARGS="--upstream URL" for a real provider)
#   make test  - create .venv, install the test extras, run lint, types, the docs build and
#                the whole suite
#   make docs  - build the documentation site (docs/, mkdocs.yml) into site/, strictly
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: run test test-guard-python lint typecheck docs bench clean

# setup.py compiles the guard with mypyc at install: a change to its source reinstalls.
INSTALL_INPUTS := pyproject.toml setup.py $(wildcard gateway/guard/*.py)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed-run: $(INSTALL_INPUTS) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# The test extras include the pinned Node SDKs the suite drives (when node and npm exist).
$(VENV)/.installed-test: $(INSTALL_INPUTS) tests/node_sdks.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m tests.node_sdks
	touch $@ $(VENV)/.installed-run

$(VENV)/.installed-perf: $(INSTALL_INPUTS) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,perf]'
	touch $@ $(VENV)/.installed-run $(VENV)/.installed-test

run: $(VENV)/.installed-run
	$(BIN)/gateway serve $(or $(ARGS),--simulator)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check gateway tests
	$(BIN)/ruff format --check gateway tests

# --strict fails on any warning: a broken link or anchor, a page left out of the nav
# (never with --quiet, which hides the warnings --strict counts and so passes anyway).
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

TYPECHECK := $(BIN)/mypy --strict gateway

typecheck: $(VENV)/.installed-test
	$(TYPECHECK)

# Five workers on two cores: many tests wait (on deadlines, a drain, a real Prometheus, a
# wheel build) rather than compute; measured back to back, 5 beat 4 by about 10 s and 6
# was no faster. worksteal hands a worker that ran out of tests part of another's, so that
# no worker is left with a long tail of them at the end.
PYTEST_WORKERS ?= 5

# An environment with PYTHONDONTWRITEBYTECODE set (as some containers have) makes every
# interpreter the suite starts (each worker, each gateway process, each tool) compile
# gateway/ and tests/ again, and pytest rewrite the asserts of every test module again in
# each worker. The tests run with bytecode written: the first process writes what the
# others read (__pycache__ is ignored by git).
#
# mypy (about 9 s cold, one core) runs beside the suite rather than before it; its report
# is printed after the suite's, and either failing fails `make test`.
test: export PYTHONDONTWRITEBYTECODE :=
test: lint docs
	@echo "$(TYPECHECK) (beside the tests; its report follows theirs)"
	@$(TYPECHECK) > $(VENV)/typecheck.out 2>&1 & typecheck=$$!; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(ARGS); tests=$$?; \
	wait $$typecheck; types=$$?; \
	echo "$(TYPECHECK):"; cat $(VENV)/typecheck.out; \
	[ $$tests -eq 0 ] && [ $$types -eq 0 ]

# The guard's own tests against its Python source (the fallback where nothing compiles).
test-guard-python: $(VENV)/.installed-test
	PURE_PYTHON_GUARD=1 $(BIN)/python -m pytest -n $(PYTEST_WORKERS) tests/unit $(ARGS)

bench: $(VENV)/.installed-perf
	$(BIN)/python tests/perf/bench_sse.py
	$(BIN)/python tests/perf/bench_gateway.py $(ARGS)

clean:
	rm -rf $(VENV) build site *.egg-info .mypy_cache .ruff_cache .hypothesis \
		gateway/guard/*.so gateway_guard__mypyc*.so tests/perf/.venv-litellm
