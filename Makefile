# Two commands matter: `make run` and `make test`. Both bootstrap .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?=

.PHONY: run test test-compiled docs docs-build docs-gen docs-check lint typecheck contracts proto proto-check unit component integration conformance clients bench-core clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,examples,docs]'
	@touch $(STAMP)

# The compiled core (docs/development "The compiled core"): luftpause installed (not
# editable) into its own venv with LUFTPAUSE_MYPYC=1, so that mypyc compiles
# luftpause.scheduler.core and the simulator's engine model (setup.py); then the tests
# that import them run against them, and fail unless the compiled build is the one
# loaded (LUFTPAUSE_EXPECT_CORE).
# .ci/run runs it after `make test`. (mypyc reads the core's imports' types, so immutables
# is installed before the build.) /build is removed first: a compiled build's
# objects there must not end up in a pure wheel built later.
VENV_MYPYC := .venv-mypyc
PY_MYPYC := $(VENV_MYPYC)/bin/python
CORE_TESTS := tests/unit/test_core_*.py tests/unit/test_config.py tests/unit/test_probe.py \
	tests/unit/test_quotas.py tests/unit/test_sim.py tests/unit/test_engine_*.py \
	tests/unit/test_sim_prompts.py tests/unit/test_sim_figures.py

test-compiled:
	@test -x $(PY_MYPYC) || $(PYTHON) -m venv $(VENV_MYPYC)
	$(PY_MYPYC) -m pip install --quiet -c constraints.txt 'setuptools>=69' wheel mypy \
		immutables pytest pytest-asyncio pytest-timeout hypothesis
	rm -rf build
	LUFTPAUSE_MYPYC=1 $(PY_MYPYC) -m pip install --quiet --no-build-isolation -c constraints.txt .
	rm -rf build
	$(PY_MYPYC) -c "import importlib; \
		ms = [importlib.import_module(f'luftpause.{m}') for m in ('scheduler.core.decide', 'fakes.engine.model')]; \
		assert all(m.__file__.endswith('.so') for m in ms), ms; print('compiled:', *(m.__file__ for m in ms))"
	LUFTPAUSE_EXPECT_CORE=compiled $(PY_MYPYC) -m pytest -q -p no:cacheprovider $(CORE_TESTS)

run: $(STAMP)
	$(VENV)/bin/luftpause up $(if $(CONFIG),--config $(CONFIG),)

# Unit and component tests run on two workers (they start no processes of their own);
# the integration tier runs alone, its processes timed against each other.
test: $(STAMP) lint typecheck contracts proto-check docs-check
	$(PY) -m pytest -q -n 2 tests/unit tests/component
	$(PY) -m pytest -q tests/integration

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests tools examples
	$(VENV)/bin/ruff format --check src tests tools examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy

contracts: $(STAMP)
	$(VENV)/bin/lint-imports

# Generated gRPC code is committed; proto-check fails when it no longer matches the .proto.
proto: $(STAMP)
	$(PY) tools/gen_proto.py

proto-check: $(STAMP)
	$(PY) tools/gen_proto.py --check

# The documentation site (mkdocs.yml, docs/): `make docs` serves it on http://127.0.0.1:8000
# and rebuilds on every change. The suite builds it with --strict and checks every link
# (tests/component/test_docs_site.py). The reference pages generated from the code
# (configuration, CLI, metrics, gRPC) are committed; docs-check fails when one is stale.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

docs-build: $(STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict --site-dir site

docs-gen: $(STAMP)
	$(PY) tools/gen_docs.py

docs-check: $(STAMP)
	$(PY) tools/gen_docs.py --check

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

component: $(STAMP)
	$(PY) -m pytest -q tests/component

integration: $(STAMP)
	$(PY) -m pytest -q tests/integration

# The MCP conformance suite against the runtime (npm: Node 22 + the suite, into .cache/node).
# `make test` runs these too.
conformance: $(STAMP)
	$(PY) -m pytest -q -m conformance

# Claude Code, Codex CLI and Gemini CLI (npm, pinned) connect to the runtime, and Claude Code and Codex run
# a task through the proxy; `make test` runs these too.
clients: $(STAMP)
	$(PY) -m pytest -q -rA tests/integration/test_clients.py tests/integration/test_harness_clis.py

bench-core: $(STAMP)
	$(PY) tools/bench/core.py

clean:
	rm -rf $(VENV) $(VENV_MYPYC) build .mypy_cache .ruff_cache .pytest_cache .hypothesis site
