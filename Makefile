# Two commands matter: `make run` and `make test`. Both bootstrap .venv themselves.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?=

.PHONY: run test docs docs-build docs-gen docs-check lint typecheck contracts proto proto-check unit component integration conformance clients bench-core clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,examples,docs]'
	@touch $(STAMP)

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
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis site
