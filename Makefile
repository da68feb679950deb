# Two commands do all the set-up on a fresh machine with only Python:
#   make run   - create .venv, install (the guard as pure Python: quick), start the gateway
#                on 127.0.0.1:8080 in front of the built-in simulator (ARGS="--upstream URL"
#                for a real provider; other ARGS, such as --port, keep the simulator)
#   make test  - create .venv, install the test extras with the guard compiled, run lint,
#                types, the docs build and the whole suite
# and, when wanted:
#   make compiled-guard - compile the guard with mypyc (about 90 s on two cores; about half
#                the guard's CPU per event), for `make run` too; the container image
#                always ships it compiled
#   make examples       - the SDKs the README's client examples use, and nothing else
#   make docs           - build the documentation site (docs/, mkdocs.yml) into site/, strictly
#                (installs the `docs` extra only)
#   make image-test     - build the container image with podman and serve a stream through it
#   make test-redis-cluster - every Redis-backed test again, its Redis a three-master Cluster
#                (5 to 9 minutes on two shared cores; .ci/run runs it)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: run test test-guard-python lint typecheck docs bench clean compiled-guard examples \
	image-test test-redis-cluster

# The schema check's modules setup.py compiles with the guard (its SCHEMA_WALKER).
SCHEMA_WALKER := incremental.py bounds.py check.py reader.py
# setup.py compiles the guard with mypyc at install (unless PURE_PYTHON_GUARD=1): a change
# to its source reinstalls.
INSTALL_INPUTS := pyproject.toml setup.py \
	$(wildcard gateway/guard/*.py $(addprefix gateway/schema/,$(SCHEMA_WALKER)))
# What a compiling install leaves beside the guard's source (and the schema check's walker,
# compiled with it), and the group's shared module.
COMPILED_GUARD := gateway/guard/*.so gateway/schema/*.so gateway_guard__mypyc*.so

# The pip the venv comes with (Python 3.11's does editable installs): upgrading it first
# cost about 10 s of a first `make run` on a loaded two-core machine.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The quick install for `make run`: the guard as pure Python (it behaves the same; the
# gateway logs that it is not compiled, and gateway_build_info{guard="python"} says so).
# A compiled guard older than this install's inputs is removed, never left to shadow its
# newer source, and so are the marks of the installs that compiled it: the next
# `make test` compiles it again.
# Built without build isolation, with only setuptools: an isolated build would install
# mypy (the compiler) first, for nothing.
$(VENV)/.installed-run: $(INSTALL_INPUTS) | $(BIN)/python
	rm -f $(COMPILED_GUARD) $(VENV)/.compiled-guard $(VENV)/.installed-test $(VENV)/.installed-perf
	$(BIN)/python -m pip install --quiet 'setuptools>=77.0.3'
	PURE_PYTHON_GUARD=1 $(BIN)/python -m pip install --quiet --no-build-isolation -e .
	touch $@

# The guard compiled with mypyc, in place beside its source (the install `make test` runs).
$(VENV)/.compiled-guard: $(INSTALL_INPUTS) | $(VENV)/.installed-run
	$(BIN)/python -m pip install --quiet -e .
	touch $@

compiled-guard: $(VENV)/.compiled-guard

# The requirements of one extra of pyproject.toml, one a line, into a file for pip -r.
# `pip install -e '.[extra]'` would build and install the project again, and without
# PURE_PYTHON_GUARD=1 that compiles the guard (about 3 minutes on two cores): an extra
# the project's code does not need is installed alone.
extra-requirements = $(BIN)/python -c "import sys, tomllib; \
	print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies'][sys.argv[1]]))" \
	$(1) > $(VENV)/requirements-$(1).txt

# The SDKs of the README's client examples (openai, anthropic, google-genai, ollama), and
# nothing else: they talk to a gateway `make run` serves, not to this package.
$(VENV)/.installed-examples: pyproject.toml | $(BIN)/python
	$(call extra-requirements,examples)
	$(BIN)/python -m pip install --quiet -r $(VENV)/requirements-examples.txt
	touch $@

examples: $(VENV)/.installed-examples

# The documentation tools (the `docs` extra: mkdocs, its theme), and nothing else: the
# site is built from docs/ and mkdocs.yml, and imports nothing of the package.
$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	$(call extra-requirements,docs)
	$(BIN)/python -m pip install --quiet -r $(VENV)/requirements-docs.txt
	touch $@

# The test extras include the pinned Node SDKs the suite drives (when node and npm exist).
# Installed with the guard compiled: `make test` tests the compiled guard (and
# `make test-guard-python` its source).
$(VENV)/.installed-test: $(INSTALL_INPUTS) tests/node_sdks.py | $(VENV)/.installed-run
	$(BIN)/python -m pip install --quiet -e '.[test]'
	$(BIN)/python -m tests.node_sdks
	touch $@ $(VENV)/.compiled-guard $(VENV)/.installed-docs

$(VENV)/.installed-perf: $(INSTALL_INPUTS) | $(VENV)/.installed-run
	$(BIN)/python -m pip install --quiet -e '.[test,perf]'
	touch $@ $(VENV)/.installed-test $(VENV)/.compiled-guard $(VENV)/.installed-docs

# The simulator stays unless something names what to front: --upstream or --config in
# ARGS, or GATEWAY_UPSTREAM_URL, GATEWAY_ROUTES or GATEWAY_CONFIG in the environment
# (make sees the environment as variables). ARGS="--port 8090" alone keeps it.
FRONTS := $(filter --upstream --upstream=% --config --config=%,$(ARGS))$(GATEWAY_UPSTREAM_URL)$(GATEWAY_ROUTES)$(GATEWAY_CONFIG)

run: $(VENV)/.installed-run
	$(BIN)/gateway serve $(if $(strip $(FRONTS)),,--simulator) $(ARGS)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check gateway tests
	$(BIN)/ruff format --check gateway tests

# --strict fails on any warning: a broken link or anchor, a page left out of the nav
# (never with --quiet, which hides the warnings --strict counts and so passes anyway).
docs: $(VENV)/.installed-docs
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

# Every test of a Redis user (marked `redis`: the limits, the stream store behind resume and
# the cache, issued keys, receipts) again with its Redis a three-master Cluster instead of
# one server (tests/integration/redis_server.py): a command that touches two slots fails
# (CROSSSLOT), one sent to the wrong node is redirected. `make test` runs a representative
# test of each user on a cluster (the `cluster` params); this runs them all.
test-redis-cluster: export PYTHONDONTWRITEBYTECODE :=
test-redis-cluster: $(VENV)/.installed-test
	TEST_REDIS_MODE=cluster $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal \
		-m redis tests/integration $(ARGS)

# The container image, built and served for real (tests/image/): podman builds the
# Dockerfile on a local base made with debootstrap from Debian's packages (no container
# registry is reachable; made once, then cached in podman's image store), runs it as its
# own non-root user, sends a stream through it to the built-in simulator and stops it with
# SIGTERM. Needs root, podman and debootstrap (.ci/run installs them).
image-test: $(VENV)/.installed-test
	GATEWAY_IMAGE_TEST=1 $(BIN)/python -m pytest -v -s tests/image $(ARGS)

bench: $(VENV)/.installed-perf
	$(BIN)/python tests/perf/bench_sse.py
	$(BIN)/python tests/perf/bench_gateway.py $(ARGS)

clean:
	rm -rf $(VENV) build site *.egg-info .mypy_cache .ruff_cache .hypothesis \
		$(COMPILED_GUARD) tests/perf/.venv-litellm .venv-codex
